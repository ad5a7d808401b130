"""Putting ranks' results together (pure functions plus one reader of a run directory).

- :func:`merge_rank_outcomes`: the ranks of one node-local spawn (plain
  ``gpuaccept run`` on a multi-GPU node, or two gloo ranks on CPU) become one
  outcome: the worst status, every rank's metrics (each tagged with its rank),
  and each rank's details under ``details.ranks``.
- :func:`missing_rank_result`: the CheckResult recorded for a rank that never reported.
- :func:`read_run_dir`: a run directory of ``gpuaccept run --distributed`` as one
  NodeReport: rank 0's ``report.json`` plus anything in the ranks' own
  ``rank-<r>.jsonl`` files that it lacks (rank 0 may have died before gathering).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuaccept.checks.base import Outcome
from gpuaccept.errors import InputError
from gpuaccept.model import CheckResult, NodeReport, Status, Verdict, worst

RANK_JSONL_GLOB = "rank-*.jsonl"


def rank_jsonl_name(rank: int) -> str:
    """The file each rank appends its own CheckResults to, in the run directory."""
    return f"rank-{rank}.jsonl"


def merge_rank_outcomes(outcomes: Mapping[int, Outcome], labels: Mapping[int, str] | None = None,
                        lead: Sequence[int] = ()) -> Outcome:
    """One outcome for a check whose ranks all ran on this node.

    Status: the worst rank's. Reason: rank 0's when every rank passed, else the
    failing ranks' reasons, those in ``lead`` (e.g. ranks whose process died, the
    likely cause) first, each prefixed ``rank r`` (``labels[r]`` appended when
    given). Metrics: all ranks', in rank order. A skip on every rank stays a skip.
    """
    if not outcomes:
        raise ValueError("no rank outcomes to merge")
    labels = labels or {}
    ranks = sorted(outcomes)
    status = worst(*(outcomes[r].status for r in ranks))
    metrics = [m for r in ranks for m in outcomes[r].metrics]
    for r in ranks:
        for m in outcomes[r].metrics:
            m.tags.setdefault("rank", r)
    details: dict[str, Any] = {"world_size": len(ranks), "ranks": {str(r): outcomes[r].details for r in ranks}}
    bad = [r for r in ranks if outcomes[r].status in (Status.FAIL, Status.ERROR, Status.WARN)]
    bad = [r for r in lead if r in bad] + [r for r in bad if r not in lead]
    if not bad:
        reason = outcomes[ranks[0]].reason
    else:
        parts = []
        for r in bad[:3]:
            text = outcomes[r].reason
            prefix = f"rank {r}"
            if not text.startswith(prefix):
                text = f"{prefix}{' (' + labels[r] + ')' if r in labels else ''}: {text}"
            parts.append(text)
        reason = "; ".join(parts) + (f"; and {len(bad) - 3} more ranks" if len(bad) > 3 else "")
    needs_gpu = all(outcomes[r].needs_gpu for r in ranks) and status is Status.SKIP
    return Outcome(status, reason, metrics, details, needs_gpu=needs_gpu)


def missing_rank_result(check: str, rank: int, host: str, why: str) -> CheckResult:
    """The result rank 0 records for a rank that never delivered one."""
    return CheckResult(check, Status.ERROR, f"rank {rank} ({host}) did not report: {why}", rank=rank, host=host,
                       details={"missing_rank": True, "distributed": True})


def order_results(results: list[CheckResult], order: list[str]) -> list[CheckResult]:
    """Stable order for a merged report: by the suite's check order, then rank."""
    pos = {name: i for i, name in enumerate(order)}
    return sorted(results, key=lambda c: (pos.get(c.name, len(pos)), c.rank if c.rank is not None else -1))


def _read_jsonl(path: Path) -> list[CheckResult]:
    out: list[CheckResult] = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(CheckResult.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            if i == len(lines):
                break  # the last line cut short by a kill: the lines before it are still good
            raise InputError(f"{path}: line {i}: not a check result: {exc}") from None
    return out


def read_run_dir(run_dir: Path) -> NodeReport:
    """The run's results: ``report.json`` completed by the ranks' own JSONL files.

    Results are keyed by (check, rank, host); rank 0's report wins where both
    have one. Without a ``report.json`` (rank 0 died first) the report is built
    from the JSONL files alone, with verdict ``interrupted``.
    """
    report_path = run_dir / "report.json"
    report: NodeReport | None = None
    if report_path.exists():
        try:
            report = NodeReport.from_dict(json.loads(report_path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{report_path}: not a gpuaccept report: {exc}") from None
    extra: list[CheckResult] = []
    for path in sorted(run_dir.glob(RANK_JSONL_GLOB)):
        extra.extend(_read_jsonl(path))
    if report is None:
        if not extra:
            raise InputError(f"{run_dir}: neither report.json nor {RANK_JSONL_GLOB} files")
        first = extra[0]
        report = NodeReport(run_id=run_dir.name, host=first.host or "unknown", profile="standard",
                            started="", verdict=Verdict.INTERRUPTED)
    seen = {(c.name, c.rank, c.host) for c in report.checks}
    for c in extra:
        if (c.name, c.rank, c.host) not in seen:
            report.checks.append(c)
            seen.add((c.name, c.rank, c.host))
    return report
