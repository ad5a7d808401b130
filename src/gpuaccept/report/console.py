"""Console output of ``gpuaccept run``: rich on a terminal, plain prefixed lines elsewhere.

Plain lines start with a stable bracketed tag (``[ENV]``, ``[HEALTH]``,
``[COMPUTE]``, ``[MEMORY]``, ``[TRAIN]``, ``[RESULT]``) so that Slurm logs and
``kubectl logs`` can be grepped.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

from rich.markup import escape

from gpuaccept.model import (
    NOT_JUDGED,
    CheckResult,
    Metric,
    NodeReport,
    Status,
    Verdict,
    fault_tag,
    fault_text,
    not_judged_note,
    state_label,
)
from gpuaccept.nextsteps import next_steps, step_lines
from gpuaccept.report.views import (
    bound_text,
    failed_names,
    headline_metric,
    reference_text,
    shown_name,
    threshold_met,
    value_text,
)
from gpuaccept.trainspeed import summary_lines

if TYPE_CHECKING:  # the run's plan, read by shape: the report side imports nothing of the node engine
    from gpuaccept.node.suite import PlannedCheck, SuitePlan

_STYLE = {Status.PASS.value: "green", Status.WARN.value: "yellow", Status.FAIL.value: "bold red",
          Status.ERROR.value: "bold red", Status.SKIP.value: "dim", NOT_JUDGED: "cyan"}


def key_metric(result: CheckResult, pattern: str | None = None) -> Metric | None:
    """The metric shown in the summary: :func:`gpuaccept.report.views.headline_metric` (the same in every
    rendering); ``pattern`` is the check's declared ``key_metric``."""
    return headline_metric(result, pattern)


def describe_key(result: CheckResult, pattern: str | None) -> tuple[str, str]:
    """(value text, expectation text) for the summary table, the expectation in the value's unit. A value that
    misses its bound is shown with the bound in the bound's own unit (``gemm_fp32_tflops=0.005567 TFLOP/s`` and
    ``misses >= 100,000 TFLOP/s``); a performance figure with neither is ``not judged``."""
    m = key_metric(result, pattern)
    if m is None:
        return "", ""
    where = f" [{m.device}]" if m.device and m.device != "cpu" else ""
    value = f"{m.name}={value_text(m)}{where}"
    missed = threshold_met(m) is False
    expect = ""
    if m.threshold is not None:
        expect = ("misses " if missed else "") + bound_text(m)
    if m.expected is not None:
        expect = (expect + " " if expect else "") + f"({reference_text(m, 'spec')})"
    elif m.threshold is None and m.name in result.not_judged:
        expect = "(not judged: no expectation)"
    return value, expect


def metric_line(m: Metric) -> str:
    """``gemm_bf16_tflops [cuda:0] = 612 TFLOP/s (threshold >= 593.6, spec 989.4) dtype=bf16``."""
    where = f" [{m.device}]" if m.device else ""
    extra = []
    if m.threshold is not None:
        extra.append(f"threshold {bound_text(m)}")
    if m.expected is not None:
        extra.append(reference_text(m, "spec"))
    tags = " ".join(f"{k}={v}" for k, v in m.tags.items())
    return (f"{m.name}{where} = {value_text(m)}" + (f" ({', '.join(extra)})" if extra else "")
            + (f" {tags}" if tags else ""))


def next_step_lines(report: NodeReport, result: CheckResult, run_dir: str = "") -> list[str]:
    """``likely: ...`` and ``next: ...`` lines under a failed check (none for any other); ``run_dir`` locates
    its log."""
    fault = fault_text(result.fault)
    return ([f"fault: {fault}"] if fault else []) + step_lines(next_steps(result, report, run_dir=run_dir or None))


def result_notes(report: NodeReport) -> list[str]:
    """What the final line adds in parentheses, each note a clause (joined by ``; ``): "CPU only" on a pass (it is
    no GPU acceptance; a failure needs no such warning), and the performance figures not judged."""
    cpu = f"CPU only: {report.cpu_only}" if report.cpu_only and report.verdict is Verdict.SUCCESS else ""
    return [n for n in (cpu, not_judged_note(report.not_judged())) if n]


def result_line(report: NodeReport) -> str:
    """The final line: the verdict, what failed, and :func:`result_notes` in parentheses."""
    notes = result_notes(report)
    tail = f" ({'; '.join(notes)})" if notes else ""
    if report.verdict is Verdict.SUCCESS:
        return "[RESULT] SUCCESS" + tail
    if report.verdict is Verdict.INTERRUPTED:
        return ("[RESULT] INTERRUPTED: " + (", ".join(failed_names(report)) or "no check failed before the stop")
                + tail)
    if report.verdict is Verdict.NOTHING_MEASURED:
        return "[RESULT] NOTHING MEASURED: every check skipped (see the reasons above); not a pass" + tail
    return "[RESULT] FAILURE: " + ", ".join(failed_names(report)) + tail


class PlainConsole:
    """Line-oriented output for logs: one line per event, stable prefixes."""

    def __init__(self, stream: IO[str], keys: dict[str, str | None], verbose: bool = False) -> None:
        self.stream = stream
        self.keys = keys
        self.verbose = verbose
        self.run_dir = ""  # set by header()

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def header(self, plan: SuitePlan, run_dir: str) -> None:
        self.run_dir = run_dir
        names = ", ".join(c.name for c in plan.checks)
        self._print(f"[ENV] gpuaccept profile={plan.profile} device={plan.device} checks={names}")
        self._print(f"[ENV] report directory: {run_dir}")
        for note in plan.notes:
            self._print(f"[PLAN] note: {note}")

    def on_start(self, check: PlannedCheck, i: int, n: int) -> None:
        """A check starts (the runner's ``RunEvents.on_start``)."""
        self._print(f"[{check.tag}] {check.name}: running ({i}/{n}, timeout {check.timeout_s:g} s)")

    def on_end(self, check: PlannedCheck, result: CheckResult) -> None:
        """A check ended (the runner's ``RunEvents.on_end``)."""
        value, expect = describe_key(result, check.key_metric)
        extra = f" {value}" + (f" {expect}" if expect else "") if value else ""
        self._print(f"[{check.tag}] {check.name}: {state_label(result.state)} "
                    f"{result.duration_s:.1f}s{extra} - {result.reason}{fault_tag(result)}")
        if self.verbose:
            for m in result.metrics:
                self._print(f"[{check.tag}]   {metric_line(m)}")

    def summary(self, report: NodeReport, tags: dict[str, str], where: str = "") -> None:
        """The table of results, the next steps under each failure, ``where`` (the report directory line,
        :func:`gpuaccept.report.runfiles.where_line`; else the run id), then the verdict line."""
        speed = summary_lines(report)
        width = max([12, *(len(shown_name(r)) for r in report.checks)])  # one column, long names too
        for i, r in enumerate(report.checks):
            value, expect = describe_key(r, self.keys.get(r.name))
            self._print(f"[RESULT] {shown_name(r):<{width}} {state_label(r.state):<5} {value} {expect}".rstrip())
            for line in speed.get(i, []):
                self._print(f"[RESULT]   {line}")
            for line in next_step_lines(report, r, self.run_dir):
                self._print(f"[RESULT]   {line}")
        self._print(f"[RESULT] {where}" if where else f"[RESULT] report: {report.run_id}")
        self._print(result_line(report))


class RichConsole:
    """Live progress and a summary table on a terminal."""

    def __init__(self, stream: IO[str], keys: dict[str, str | None], verbose: bool = False) -> None:
        from rich.console import Console

        self.console = Console(file=stream)
        self.keys = keys
        self.verbose = verbose
        self.run_dir = ""  # set by header()
        self._status: Any = None

    def header(self, plan: SuitePlan, run_dir: str) -> None:
        self.run_dir = run_dir
        self.console.print(f"[bold]gpuaccept[/] profile [cyan]{plan.profile}[/] on [cyan]{plan.device}[/], "
                           f"{len(plan.checks)} checks -> {run_dir}")
        for note in plan.notes:
            self.console.print(f"[yellow]note:[/] {escape(note)}")

    def on_start(self, check: PlannedCheck, i: int, n: int) -> None:
        self._status = self.console.status(f"[{i}/{n}] {check.name} (timeout {check.timeout_s:g} s)")
        self._status.start()

    def on_end(self, check: PlannedCheck, result: CheckResult) -> None:
        if self._status is not None:
            self._status.stop()
        style = _STYLE[result.state]
        self.console.print(f"[{style}]{state_label(result.state):<5}[/] {escape(check.name):<10} "
                           f"{result.duration_s:5.1f}s  {escape(result.reason + fault_tag(result))}", highlight=False)
        if self.verbose:
            for m in result.metrics:
                self.console.print(f"      {escape(metric_line(m))}", highlight=False)

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()

    def summary(self, report: NodeReport, tags: dict[str, str], where: str = "") -> None:
        """The table, the next steps of each failure under it, ``where`` and the verdict line."""
        from rich.table import Table

        table = Table(title=f"gpuaccept {report.run_id}")
        for col in ("check", "status", "key metric", "expectation", "time"):
            table.add_column(col)
        for r in report.checks:
            value, expect = describe_key(r, self.keys.get(r.name))
            table.add_row(escape(shown_name(r)), f"[{_STYLE[r.state]}]{state_label(r.state)}[/]", escape(value),
                          escape(expect),
                          f"{r.duration_s:.1f}s")
        self.console.print(table)
        for i, lines in summary_lines(report).items():
            name = escape(shown_name(report.checks[i]))
            self.console.print(f"[bold]{name}[/] against the GEMM rate:", highlight=False)
            for line in lines:
                self.console.print(f"  {escape(line)}", highlight=False)
        for r in report.checks:
            steps = next_step_lines(report, r, self.run_dir)
            if steps:
                self.console.print(f"[bold red]{escape(shown_name(r))}[/] next steps:", highlight=False)
                for step in steps:
                    self.console.print(f"  {escape(step)}", highlight=False)
        if where:
            self.console.print(escape(where), highlight=False)
        line = result_line(report)
        style = "bold green" if report.verdict is Verdict.SUCCESS else "bold red"
        self.console.print(f"[{style}]{escape(line)}[/]", highlight=False)
