"""The ``rdma`` check's NICs across a cluster's nodes, as an HTML section: a NIC x node table.

Rows are the rails (rail index and NIC, ``rail 2 · mlx5_2``), columns the nodes that ran the check; a cell is
the NIC's loopback bandwidth (``rdma_<test>_gbps``, Gb/s), marked when it missed its bound or perftest failed
(the check's ``details.nics``). Drawn by :func:`gpuaccept.report.html_rails.nic_node_table`, the table
``gpuaccept isolate`` draws for its rail tests.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from typing import Any

from gpuaccept.model import CheckResult
from gpuaccept.report.html_rails import nic_node_table
from gpuaccept.report.views import NodeView, threshold_met

_CSS = ("<style>.nic-node{border-collapse:collapse;margin:1em 0}.nic-node th,.nic-node td{border:1px solid #ccc;"
        "padding:.3em .6em;text-align:right}.nic-node td.bad{background:#fdd;color:#900;font-weight:bold}"
        ".nic-node td.na,.nic-node td.unjudged{color:#777}</style>")


def _check_rows(host: str, check: CheckResult) -> list[dict[str, Any]]:
    """One row per NIC of one node's ``rdma`` result (its ``details.nics``), with the bandwidth metric's figure."""
    figures = {str(m.tags.get("nic")): m for m in check.metrics
               if fnmatch.fnmatchcase(m.name, "rdma_*_bw_gbps") and "nic" in m.tags}
    nics = check.details.get("nics") if isinstance(check.details, dict) else None
    rows = []
    for n in nics if isinstance(nics, list) else []:
        if not isinstance(n, dict) or "nic" not in n:
            continue
        nic = str(n["nic"])
        m = figures.get(nic)
        bad = n.get("status") in ("fail", "error") or (m is not None and threshold_met(m) is False)
        said = re.compile(r"\w+ rail \d+ \(" + re.escape(nic) + r"\).*")  # the NIC's own words, not the engine's
        pieces = [m.group(0) for m in map(said.search, check.reason.split("; ")) if m]
        rows.append({"node": host, "rail": n.get("rail", 0), "port": nic, "status": n.get("status"),
                     "gpu": (n.get("gpu") or {}).get("index"),
                     "figure": None if m is None else m.value, "unit": "Gb/s",
                     "bound": None if m is None or m.threshold is None else m.threshold.value,
                     "verdict": "bad" if bad else ("not judged" if m is not None and m.threshold is None
                                                    else "good"),
                     "evidence": pieces or [f"{nic}: {n.get('status')}"]})
    return rows


def rows_of(nodes: Sequence[NodeView]) -> list[dict[str, Any]]:
    """The NIC rows of every node's ``rdma`` result (none where no node ran it)."""
    return [row for v in nodes for c in v.checks if c.name == "rdma" for row in _check_rows(v.host, c)]


def section(nodes: Sequence[NodeView]) -> str:
    """The ``<section id="rdma-nics">`` of a cluster page ("" when no node has NIC rows)."""
    rows = rows_of(nodes)
    if not rows:
        return ""
    bad = sum(r["verdict"] == "bad" for r in rows)
    return (f'<section id="rdma-nics"><h2>RDMA NICs × nodes</h2>{_CSS}<p class="muted">Each NIC\'s loopback '
            f"bandwidth (rdma check, Gb/s); {bad} of {len(rows)} NIC run(s) bad, marked (hover for why).</p>"
            f"{nic_node_table(rows)}</section>")
