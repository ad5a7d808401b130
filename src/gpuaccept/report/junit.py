"""JUnit XML for CI systems (Jenkins, GitLab, GitHub test reporters): one testcase per check per node.

Layout: ``<testsuites>`` holding one ``<testsuite>`` per node (``name`` and
``hostname`` = host); each check is a ``<testcase classname=HOST name=CHECK
time=duration_s>``. ``fail`` becomes ``<failure>``, ``error`` ``<error>``,
``skip`` ``<skipped>``, each with the reason as ``message`` and the
out-of-bound metrics as text; ``warn`` passes with the reason in
``<system-out>``. A node of a cluster that never reported is a testcase named
``report`` with an ``<error>``. Characters XML 1.0 cannot hold (terminal
escapes from tool output) are replaced.

A ``run --budget`` report: each check the budget left out is a testcase with
``<skipped>`` whose message says why (so a CI dashboard shows it was not run,
rather than dropping it), a deeper re-run is a testcase of its own named
``CHECK (re-run)``, a suspect result that was not re-run says why in its
testcase's output, and the node's ``budget`` property sums the plan up.

With an outlier analysis (a cluster report's own, or ``analysis``), each testsuite's ``outlier_analysis``
property says what it compared: ``12 SKU/metric group(s): 12 not compared (fewer than 3 nodes); nothing was
compared: no outlier can be found``, so a run without outliers is not read as a clean comparison.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from typing import Any

from gpuaccept.argtypes import fmt_s
from gpuaccept.model import CheckResult, ClusterReport, NodeReport, Status, fault_text
from gpuaccept.report.budget_view import budget_view
from gpuaccept.report.views import (
    NodeView,
    analysis_coverage,
    analysis_of,
    bound_text,
    check_host,
    fmt_tags,
    fmt_value,
    metric_status,
    node_views,
    not_judged,
    outliers,
    reference_note,
    reference_text,
    value_text,
)

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def xml_text(text: object) -> str:
    """``text`` with terminal colour codes removed and characters illegal in XML 1.0 replaced by U+FFFD."""
    return _XML_BAD.sub("\ufffd", _ANSI.sub("", str(text)))


def _seconds(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) and x >= 0 else "0.000"


def _judged_lines(check: CheckResult) -> list[str]:
    """One line per metric that missed its threshold."""
    out = []
    for m in check.metrics:
        st = metric_status(m)
        if m.threshold is None or st is Status.PASS:
            continue
        where = f" on {m.device}" if m.device else ""
        tags = fmt_tags(m.tags, skip=("stat", "mode"))
        ref = f", {reference_text(m)}" if m.expected is not None and m.expected_source else ""
        out.append(f"{st.value.upper()}: {m.name}{where} = {value_text(m)} "
                   f"(threshold {bound_text(m)}, {m.threshold.source}{ref})"
                   + (f" [{tags}]" if tags else ""))
    return out


def _not_judged_lines(check: CheckResult) -> list[str]:
    """``NOT JUDGED: gemm_fp32_tflops, ...``: the performance figures measured with neither bound nor reference."""
    if not check.not_judged:
        return []
    return [f"NOT JUDGED: {', '.join(check.not_judged)} (performance figures with no threshold and no expectation)"]


def _fabric_lines(check: CheckResult) -> list[str]:
    """One line per metric whose expectation was derived from the fabric: measured next to derived."""
    out = []
    for m in check.metrics:
        if not reference_note(m):
            continue
        where = f" on {m.device}" if m.device else ""
        bound = f", threshold {bound_text(m)} ({m.threshold.source})" if m.threshold is not None else ""
        out.append(f"EXPECTED: {m.name}{where} = {fmt_value(m.value, m.unit)}, {reference_text(m)}{bound}")
    return out


def _testcase(suite: ET.Element, node: NodeView, check: CheckResult, outlier_lines: list[str]) -> None:
    host = check_host(check, node)
    name = check.name + (f" rank {check.rank}" if check.rank is not None else "") + \
        (" (re-run)" if check.is_rerun else "")
    case = ET.SubElement(suite, "testcase", classname=xml_text(host), name=xml_text(name),
                         time=_seconds(check.duration_s))
    reason = xml_text(check.reason)
    fault = fault_text(check.fault)
    if fault:  # the code as a property of the testcase (JUnit readers show testcase properties) and in the text
        props = ET.SubElement(case, "properties")
        for key in ("code", "severity", "origin", "action"):
            ET.SubElement(props, "property", name=f"fault_{key}", value=xml_text(str((check.fault or {}).get(key, ""))))
    body = "\n".join([reason, *([f"FAULT: {xml_text(fault)}"] if fault else []), *_judged_lines(check),
                      *_fabric_lines(check), *outlier_lines]).strip()
    if check.status is Status.FAIL:
        ET.SubElement(case, "failure", message=reason, type="fail").text = xml_text(body)
    elif check.status is Status.ERROR:
        ET.SubElement(case, "error", message=reason, type="error").text = xml_text(body)
    elif check.status is Status.SKIP:
        ET.SubElement(case, "skipped", message=reason)
    else:
        lines = ([f"WARN: {reason}"] if check.status is Status.WARN else [reason]) + _judged_lines(check) + \
            _not_judged_lines(check) + _fabric_lines(check) + outlier_lines
        ET.SubElement(case, "system-out").text = xml_text("\n".join(lines))


def _coverage_text(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None) -> str:
    """``140 SKU/metric group(s): 100 compared ..., 40 not compared (fewer than 3 nodes); 2 outlier(s) in the
    100 compared group(s) of 140``; empty without an analysis."""
    from gpuaccept.results.coverage import coverage_line, outlier_line

    if analysis_coverage(report, analysis) is None:
        return ""
    found = analysis_of(report, analysis)
    return f"{coverage_line(found)}; {outlier_line(found, len(outliers(report, analysis)))}"


def render_junit(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None = None) -> str:
    """The report as a JUnit XML document (UTF-8 text with an XML declaration).

    Outliers (from ``analysis``, default the cluster report's own) are listed
    in the output of their check's testcase; they do not fail it.
    """
    nodes = node_views(report)
    outs = outliers(report, analysis)
    coverage = _coverage_text(report, analysis)
    root = ET.Element("testsuites", name=xml_text(f"gpuaccept {report.run_id}"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_time = 0.0
    for node in nodes:
        suite = ET.SubElement(root, "testsuite", name=xml_text(node.host), hostname=xml_text(node.host))
        props = ET.SubElement(suite, "properties")
        for key, prop in (("run_id", report.run_id), ("verdict", node.verdict.value),
                           ("profile", node.report.profile if node.report else ""),
                           ("cpu_only", node.report.cpu_only if node.report and node.report.cpu_only else ""),
                           ("backend", report.backend if isinstance(report, ClusterReport) else "")):
            if prop:
                ET.SubElement(props, "property", name=key, value=xml_text(prop))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        time_s = 0.0
        if node.missing:
            case = ET.SubElement(suite, "testcase", classname=xml_text(node.host), name="report", time="0.000")
            msg = xml_text(f"node did not report: {node.reason or 'missing'}")
            ET.SubElement(case, "error", message=msg, type="missing").text = msg
            counts["tests"] += 1
            counts["errors"] += 1
        if coverage:  # JUnit has no properties above a testsuite: each node's says how its values were compared
            ET.SubElement(props, "property", name="outlier_analysis", value=xml_text(coverage))
        figures = not_judged([node])
        if figures:  # JUnit has no such state: a property counts and names them, each testcase says which
            ET.SubElement(props, "property", name="not_judged", value=xml_text(
                f"{len(figures)}: " + ", ".join(f"{c} {m}" for _, c, m in figures)))
        budget = budget_view(node.report) if node.report is not None else None
        if budget is not None:
            ET.SubElement(props, "property", name="budget", value=xml_text(budget.summary()))
        not_rerun = {r.name: r.why for r in budget.by_state("not re-run")} if budget is not None else {}
        for check in node.checks:
            lines = [f"OUTLIER: {o.metric}" + (f" on {o.device}" if o.device else "")
                     + f" = {o.value:g} (median {o.median if o.median is not None else float('nan'):g}, "
                     f"z={o.z if o.z is not None else float('nan'):.2f})"
                     for o in outs if o.host == check_host(check, node) and o.check == check.name
                     and not check.is_rerun]  # the analysis judged the first pass
            if check.name in not_rerun and not check.is_rerun:
                lines.append(f"BUDGET: suspect: {not_rerun[check.name]}")
            _testcase(suite, node, check, lines)
            counts["tests"] += 1
            counts["failures"] += check.status is Status.FAIL
            counts["errors"] += check.status is Status.ERROR
            counts["skipped"] += check.status is Status.SKIP
            time_s += check.duration_s if math.isfinite(check.duration_s) else 0.0
        for left in budget.by_state("left out") if budget is not None else []:
            assert budget is not None
            case = ET.SubElement(suite, "testcase", classname=xml_text(node.host), name=xml_text(left.name),
                                 time="0.000")
            why = f"left out by --budget {fmt_s(budget.budget_s)}: {left.why}"
            ET.SubElement(case, "skipped", message=xml_text(why))
            counts["tests"] += 1
            counts["skipped"] += 1
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", _seconds(time_s))
        suite.set("timestamp", xml_text((node.report.started if node.report else report.started).rstrip("Z")))
        total_time += time_s
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", _seconds(total_time))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
