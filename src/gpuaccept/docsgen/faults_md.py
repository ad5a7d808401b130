"""docs/reference/fault-codes.md: the fault catalogue (``gpuaccept/data/faults.yaml``) as a table (pure)."""

from __future__ import annotations

from gpuaccept.docsgen.markdown import GENERATED, cell, code, table
from gpuaccept.faults import STEPS, Fault, Rule, load


def _rule(r: Rule) -> str:
    parts = []
    if r.check:
        parts.append(f"check {r.check}")
    if r.status:
        parts.append(r.status.value.upper())
    if r.xid is not None:
        parts.append(f"Xid {r.xid}")
    if r.reason:
        parts.append(f"reason ~ {r.reason.pattern}")
    if r.metric:
        parts.append(f"metric {r.metric} below its bound")
    if r.source:
        parts.append(f"bound from {r.source}")
    if r.details:
        parts.append(f"details.{r.details}")
    return ", ".join(parts)


def _row(f: Fault) -> list[str]:
    return [code(f.code), cell(f.title), f.severity, f.part, f.origin, cell(" → ".join(f.ladder)),
            cell(f.evidence), cell("; ".join(_rule(r) for r in f.rules))]


def page() -> str:
    """The whole page."""
    head = [
        GENERATED, "", "# Fault codes", "",
        "Every FAIL and ERROR in a report carries a stable code from this catalogue "
        "(`src/gpuaccept/data/faults.yaml`): `fault.code` in report.json, the console line, Markdown, JUnit "
        "(property `fault_code`), Prometheus (label `code`), the Slurm drain reason (code first, so `sinfo -R` "
        "shows it) and the Kubernetes node condition. A code is never reused for another meaning.", "",
        "- **severity**: critical (the node cannot run jobs correctly), major (jobs run, wrong or slow), "
        "minor (degraded, or nothing known);",
        "- **origin**: `node` (the node is at fault) or `job` (a job or its leftovers caused it: the drain reason "
        "says `gpuaccept:job`);",
        "- **ladder**: the remediation to try first, then the next when it does not clear, from "
        + ", ".join(f"`{s}`" for s in STEPS) + ". Every rung but `rerun` takes the node out of service: "
        "`healthcheck --slurm drain` and `node-status` drain or taint only for those, and re-run a `rerun`-first "
        "code once before it can drain. For a GPU whose driver reports a recovery action "
        "(`nvmlDeviceGetGpuRecoveryAction`: 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset), that "
        "action is taken first (`fault.action`).",
        "- **names**: the results the code is given to; entries are tried in this order, the first that matches "
        "wins (a code the check set itself, `details.code`, wins over all).", "",
    ]
    rows = [_row(f) for f in load()]
    return "\n".join(head) + table(["code", "title", "severity", "part", "origin", "ladder", "evidence", "names"],
                                   rows) + "\n"
