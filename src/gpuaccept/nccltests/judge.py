"""Judge a parsed nccl-tests run, and find and run its binaries.

Judgement (:func:`judge`): the run fails when any row has ``#wrong`` > 0, when the footer
says ``Out of bounds values : N FAILED`` or ``Avg bus bandwidth ... FAILED``
(``NCCL_TESTS_MIN_BW``), when the lowest busbw at the judged sizes is below the expectation,
or when nccl-tests exited 7: a data or bandwidth failure. (nccl-tests 2.17's ``src/common.h``
has ``testNumResults = 7``, and ``main`` in ``src/common.cu`` returns it when ``errors[0]`` (wrong
elements) is non-zero or the average busbw is below 0.9 x ``NCCL_TESTS_MIN_BW``; builds before
``testNotImplemented``/``testInvalidUsage`` were added return 5 for the same, which is judged by the
footer alone.) Another non-zero exit, or output that ends before the footer, is an error. The busbw
expectation and bound come from :mod:`gpuaccept.nccltests.busbw`, shared with the collectives check.

The judged sizes are those >= ``judge_min_bytes`` (default 0: only the largest size), both
placements; nccl-tests' "Avg bus bandwidth" averages all sizes, so small ones drag it down and it
is reported, not judged. Equivalent by hand: the last row's smaller busbw of ``all_reduce_perf -b
8M -e 1G -f 2 -g 8``. Old versions' ``error`` column is the largest numerical error, not a count, so
there only the footer's out-of-bounds count is judged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.errors import UsageError
from gpuaccept.hw.fabric_expect import Expectation
from gpuaccept.model import Metric, Status
from gpuaccept.nccltests.busbw import Reference, busbw_reference, busbw_verdict, describe
from gpuaccept.nccltests.parse import NcclTestsResult, Row

TESTS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv", "gather",
         "scatter", "hypercube")
"""Test names, each run as ``<name>_perf``."""
OP_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter"}
"""Metric names use the op spelling of ``checks/collectives.py`` (allreduce, ...), else the test name."""
DEFAULT_DIRS = ("/workspace/nccl-tests/build",)
EXIT_DATA_OR_BW = 7


def canonical_test(name: str) -> str:
    """``all_reduce``, ``all_reduce_perf`` or ``allreduce`` -> ``all_reduce``; UsageError when unknown."""
    base = name.removesuffix("_perf")
    by_op = {v: k for k, v in OP_NAMES.items()}
    base = by_op.get(base, base)
    if base not in TESTS:
        raise UsageError(f"unknown nccl-tests binary {name!r}; known: {', '.join(TESTS)}")
    return base


def search_dirs(env: Mapping[str, str]) -> list[str]:
    """Where binaries are looked for, in order: ``$PATH``, ``$NCCL_TESTS_DIR``, /workspace/nccl-tests/build."""
    dirs = [d for d in env.get("PATH", "").split(os.pathsep) if d]
    if env.get("NCCL_TESTS_DIR"):
        dirs += [env["NCCL_TESTS_DIR"], str(Path(env["NCCL_TESTS_DIR"]) / "build")]
    return dirs + list(DEFAULT_DIRS)


def places_looked(env: Mapping[str, str]) -> str:
    where = ["$PATH"] + (["$NCCL_TESTS_DIR (" + env["NCCL_TESTS_DIR"] + ")"] if env.get("NCCL_TESTS_DIR") else
                         ["$NCCL_TESTS_DIR (unset)"])
    return ", ".join(where + list(DEFAULT_DIRS))


def find_binary(test: str, env: Mapping[str, str] | None = None) -> str | None:
    """Absolute path of ``<test>_perf`` in :func:`search_dirs`, or None."""
    env = os.environ if env is None else env
    return shutil.which(f"{canonical_test(test)}_perf", path=os.pathsep.join(search_dirs(env)))


@dataclass
class RunOutput:
    """What one binary run left: argv, exit code (None: killed at the timeout), stdout, stderr tail."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str


def run_binary(path: str, args: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> RunOutput:
    """Run ``path args...`` in its own process group (session) and capture its output; a run past ``timeout_s`` is
    killed with its whole group, so a wrapper script's children go too (returncode None)."""
    argv = [path, *args]
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, errors="replace", start_new_session=True,
                          env=dict(env) if env is not None else None) as p:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(p.pid)
            try:
                out, err = p.communicate(timeout=5.0)
            except subprocess.TimeoutExpired:  # a process that left the group still holds the pipes
                p.kill()
                out, err = "", ""
            return RunOutput(argv, None, out or "", (err or "")[-4000:])
    return RunOutput(argv, p.returncode, out, err[-4000:])


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class Judgement:
    status: Status
    reason: str
    metrics: list[Metric] = field(default_factory=list)


def _low(row: Row) -> float:
    return min(m.busbw_gbs for m in (row.out_of_place, row.in_place) if m is not None)


def _wrong_total(rows: list[Row]) -> float | None:
    seen = [m.wrong for r in rows for m in (r.out_of_place, r.in_place) if m is not None and m.wrong is not None]
    return float(sum(seen)) if seen else None


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def judge(result: NcclTestsResult, test: str, *, min_busbw_gbs: float | None = None, judge_min_bytes: int = 0,
          returncode: int | None = 0, source: str = "param:min_busbw_gbs", fabric: Expectation | None = None,
          baseline: Reference | None = None) -> Judgement:
    """Status, reason and metrics of one parsed run (pure; see the module docstring).

    Metrics: ``<op>_busbw_large_gbs`` (GB/s, the lowest busbw of both placements at the judged sizes,
    with the expectation and bound of :func:`gpuaccept.nccltests.busbw.busbw_reference`: ``baseline``,
    else ``min_busbw_gbs``, else the ``fabric`` expectation), ``<op>_wrong`` (sum of ``#wrong``),
    ``<op>_avg_busbw_gbs`` and ``<op>_out_of_bounds`` from the footer.
    """
    op = OP_NAMES.get(test, test)
    rows = [r for r in result.rows if r.out_of_place is not None or r.in_place is not None]
    floor = judge_min_bytes or max(r.size_bytes for r in rows)
    large = [r for r in rows if r.size_bytes >= floor] or [max(rows, key=lambda r: r.size_bytes)]
    low = min(large, key=_low)
    tags: dict[str, str | int | float] = {"op": op, "size_bytes": low.size_bytes, "type": low.type}
    ref = busbw_reference(fabric, min_busbw_gbs=min_busbw_gbs, min_source=source, baseline=baseline)
    metrics = [Metric(f"{op}_busbw_large_gbs", _low(low), "GB/s", expected=ref.expected, threshold=ref.threshold,
                      tags=tags, expected_source=ref.expected_source, performance=True)]
    problems: list[str] = []
    warnings: list[str] = []
    wrong = _wrong_total(rows) if result.check_column == "#wrong" else None
    if wrong is not None:
        metrics.append(Metric(f"{op}_wrong", wrong, "count", tags={"op": op}))
        bad = [r for r in rows if any(m is not None and m.wrong for m in (r.out_of_place, r.in_place))]
        if bad:
            problems.append(f"#wrong > 0 at {len(bad)} sizes (first {_size(bad[0].size_bytes)} {bad[0].type})")
    f = result.footer
    if f is not None:
        metrics.append(Metric(f"{op}_out_of_bounds", float(f.out_of_bounds), "count", tags={"op": op}))
        if f.avg_busbw_gbs is not None:
            metrics.append(Metric(f"{op}_avg_busbw_gbs", f.avg_busbw_gbs, "GB/s", tags={"op": op}))
        if not f.out_of_bounds_ok:
            problems.append(f"Out of bounds values: {f.out_of_bounds} FAILED")
        if f.avg_busbw_ok is False:
            problems.append(f"Avg bus bandwidth {f.avg_busbw_gbs:g} GB/s FAILED (below 0.9 x NCCL_TESTS_MIN_BW)")
    verdict = busbw_verdict(_low(low), ref)
    if verdict is not Status.PASS and ref.threshold is not None:
        miss = (f"busbw {_low(low):.4g} GB/s at {_size(low.size_bytes)} is below {ref.threshold.value:g} GB/s "
                f"({ref.threshold.source})")
        (problems if verdict is Status.FAIL else warnings).append(miss)
    hosts = result.hosts
    where = f"{len(result.devices)} ranks on {len(hosts)} hosts" if result.devices else "ranks unknown"
    what = (f"{test}_perf, {where}: busbw {_low(low):.4g} GB/s at {_size(low.size_bytes)} "
            f"({'sizes >= ' + _size(floor) if judge_min_bytes else 'largest size'}, lowest placement)")
    if ref.expected is not None or ref.threshold is not None:
        what += f"; {describe(ref)}"
    if returncode == EXIT_DATA_OR_BW and not problems:
        problems.append("nccl-tests exited 7: a data or bandwidth failure (wrong elements, or average bus bandwidth "
                        "below NCCL_TESTS_MIN_BW)")
    if problems:
        return Judgement(Status.FAIL, f"{what}; " + "; ".join(problems), metrics)
    if returncode not in (0, EXIT_DATA_OR_BW):
        said = "; ".join(result.errors) or "no error line"
        code = "was killed at the timeout" if returncode is None else f"exited {returncode}"
        return Judgement(Status.ERROR, f"{what}; nccl-tests {code} ({said})", metrics)
    if f is None:
        return Judgement(Status.ERROR, f"{what}; the output ends before the footer (crashed or cut off)", metrics)
    if warnings:
        return Judgement(Status.WARN, f"{what}; " + "; ".join(warnings), metrics)
    tail = "" if ref.threshold is not None else " (no busbw expectation: not judged)"
    return Judgement(Status.PASS, what + tail, metrics)


def result_details(result: NcclTestsResult, run: RunOutput | None = None) -> dict[str, Any]:
    """The parsed run for a report: devices, rows (compact), footer, and the argv and exit code when run here."""
    d: dict[str, Any] = {
        "program": result.program, "hosts": result.hosts, "check_column": result.check_column,
        "time_column": result.time_column,
        "devices": [[x.rank, x.host, x.device, x.pci, x.name] for x in result.devices],
        "device_columns": ["rank", "host", "device", "pci", "name"],
        "rows": [[r.size_bytes, r.count, r.type, r.redop, r.root,
                  *(None if m is None else [m.time_us, m.algbw_gbs, m.busbw_gbs, m.wrong]
                    for m in (r.out_of_place, r.in_place))] for r in result.rows],
        "row_columns": ["size_bytes", "count", "type", "redop", "root", "out_of_place [time_us, algbw_gbs, "
                        "busbw_gbs, wrong]", "in_place [time_us, algbw_gbs, busbw_gbs, wrong]"],
        "footer": None if result.footer is None else vars(result.footer),
        "errors": result.errors,
    }
    if run is not None:
        d["argv"] = run.argv
        d["returncode"] = run.returncode
    return d
