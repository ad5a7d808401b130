"""What the history store returns: a run's summary, a stored run, a metric value with where and when it was
measured, and a sighting of a piece of hardware (plain data; :mod:`gpuaccept.results.store` reads them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.model import ClusterReport, NodeReport


@dataclass(frozen=True)
class RunSummary:
    """One row of ``gpuaccept history``.

    ``kind`` is ``node`` or ``cluster``; ``host`` is empty for a cluster run;
    ``checks`` counts checks by status (for a cluster: over all its nodes);
    ``failed`` names failed or errored checks (node) or nodes that did not
    succeed (cluster); ``parent_run_id`` is the cluster run a node run belongs to.
    """

    run_id: str
    kind: str
    host: str
    started: str
    finished: str | None
    verdict: str
    profile: str | None
    sku: str | None
    backend: str | None
    parent_run_id: str | None
    nodes: int
    expected_nodes: int | None
    checks: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StoredRun:
    """A run read back: its summary and the report (node or cluster, node reports attached)."""

    summary: RunSummary
    report: NodeReport | ClusterReport


@dataclass(frozen=True)
class MetricPoint:
    """One stored metric value with where and when it was measured.

    ``value`` is None where the report had NaN or infinity; ``started`` is the
    run's start (ISO 8601 UTC) and ``started_ts`` the same in epoch seconds.
    ``hw_kind``/``hw_id``/``hw_serial``: the hardware measured (gpu, nic or
    node; GPU UUID, port GUID or board serial), None where unknown. ``rerun``: the value
    is from a ``run --budget`` deeper re-run, not the run's first pass.
    """

    run_id: str
    host: str
    sku: str | None
    started: str
    started_ts: float
    check: str
    name: str
    device: str | None
    value: float | None
    unit: str
    expected: float | None
    threshold_op: str | None
    threshold_value: float | None
    dtype: str | None
    size_bytes: int | None
    tags: dict[str, Any]
    hw_kind: str | None = None
    hw_id: str | None = None
    hw_serial: str | None = None
    rerun: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sighting:
    """Where a piece of hardware was: in ``runs`` node runs on ``host`` as ``device`` (None: the node
    itself) from ``first`` to ``last`` (run starts, ISO 8601 UTC; ``first_ts`` in epoch seconds)."""

    kind: str
    hw_id: str
    serial: str | None
    host: str
    device: str | None
    first: str
    last: str
    first_ts: float
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
