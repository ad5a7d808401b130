"""Read and judge a pair test's log: the tagged lines of :mod:`gpuaccept.perftest.node` from both nodes (pure).

:func:`read_log` groups the ``@rdma RAIL SIDE NODE NIC PORT| line`` lines (in any interleaving; other lines are
the launcher's and are skipped) by rail and side; :func:`judge_rails` judges each rail on its client's output
(:func:`gpuaccept.perftest.judge.judge`, against the rate of the client's NIC: given, else as its node's
sysfs said in its end line) and makes it an ERROR, naming both
ends, when either side printed an error, exited non-zero or printed nothing; the error counters that rose on
either end during the run are the rail's evidence, and a rise fails a rail that passed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.errors import InputError
from gpuaccept.model import Status
from gpuaccept.perftest.judge import DEFAULT_FRACTION, Ends, Judgement, judge
from gpuaccept.perftest.parse import parse_text

_LINE = re.compile(r"^@rdma (\d{1,3}) (server|client) (\S+) (\S+) (\d{1,5})([|#]) ?(.*)$")


@dataclass
class SideLog:
    """What one side of one rail printed."""

    rail: int
    side: str
    node: str
    nic: str
    port: int
    lines: list[str] = field(default_factory=list)
    exit: int | None = None
    ended: bool = False
    counters: dict[str, Any] = field(default_factory=dict)
    rate_gbps: float | None = None

    def label(self) -> str:
        return f"{self.node} rail {self.rail} ({self.nic})"


def read_log(text: str) -> dict[tuple[int, str], SideLog]:
    """Every (rail, side) the log has lines of; InputError when it has none."""
    out: dict[tuple[int, str], SideLog] = {}
    for raw in text.splitlines():
        m = _LINE.match(raw.rstrip("\r"))
        if not m:
            continue
        rail, side = int(m.group(1)), m.group(2)
        log = out.setdefault((rail, side), SideLog(rail, side, m.group(3), m.group(4), int(m.group(5))))
        if m.group(6) == "|":
            log.lines.append(m.group(7))
            continue
        try:
            end = json.loads(m.group(7))
        except ValueError as exc:
            raise InputError(f"rdma pair log: rail {rail} {side}: a bad end line ({exc})") from exc
        log.ended, log.exit = True, end.get("exit")
        log.counters = end.get("counters") or {}
        rate = end.get("rate_gbps")
        log.rate_gbps = float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else None
    if not out:
        raise InputError("not an rdma pair log: no '@rdma RAIL SIDE NODE NIC PORT|' lines")
    return out


@dataclass
class RailResult:
    rail: int
    ends: Ends
    judgement: Judgement
    gbps: float | None = None
    counters: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rail": self.rail, "client": self.ends.client, "server": self.ends.server,
                "status": self.judgement.status.value, "reason": self.judgement.reason, "gbps": self.gbps,
                "counters": self.counters, "metrics": [m.to_dict() for m in self.judgement.metrics]}


def _side_problem(log: SideLog | None, what: str) -> str | None:
    if log is None:
        return f"no output from the {what} (its task did not run)"
    if not log.ended:
        return f"the {what}'s output ends early (killed, or the job was cut off)"
    return None


def judge_rails(logs: Mapping[tuple[int, str], SideLog], *, rates: Mapping[str, float] | None = None,
                rate_gbps: float | None = None, fraction: float = DEFAULT_FRACTION,
                min_gbps: float | None = None, min_source: str = "--min-gbps") -> list[RailResult]:
    """Each rail's result (see the module docstring); ``rates``: Gb/s by client NIC, else ``rate_gbps``."""
    out = []
    for rail in sorted({r for r, _s in logs}):
        server, client = logs.get((rail, "server")), logs.get((rail, "client"))
        ends = Ends(client.label() if client else f"the client of rail {rail}",
                    server.label() if server else f"the server of rail {rail}")
        seen = {s.side: s.counters for s in (server, client) if s is not None and s.counters}
        problem = _side_problem(client, "client") or _side_problem(server, "server")
        if problem:
            out.append(RailResult(rail, ends, Judgement(Status.ERROR, f"rail {rail} {ends.text()}: {problem}"),
                                  counters=seen))
            continue
        assert client is not None and server is not None
        try:
            result = parse_text("\n".join(client.lines))
        except InputError as exc:
            out.append(RailResult(rail, ends, Judgement(Status.ERROR, f"rail {rail} {ends.text()}: {exc}"),
                                  counters=seen))
            continue
        server_errors = _errors_of(server)
        result.errors += [f"server: {e}" for e in server_errors]
        rate, source = (rates or {}).get(client.nic, rate_gbps), f"{client.nic} rate"
        if rate is None and client.rate_gbps is not None:
            rate, source = client.rate_gbps, f"{client.nic}:1 rate on {client.node}"
        elif rates is None or client.nic not in rates:
            source = "port rate"
        code = client.exit if client.exit != 0 else server.exit
        j = judge(result, rate_gbps=rate, rate_source=source, fraction=fraction, min_gbps=min_gbps,
                  min_source=min_source, ends=ends, returncode=code)
        rose: dict[str, dict[str, int]] = {side: dict(c["rose"]) for side, c in seen.items() if c.get("rose")}
        gone = [side for side, c in seen.items() if c.get("vanished")]
        if j.status is Status.PASS and (rose or gone):
            what = "; ".join([f"{side} port error counters rose: "
                              + ", ".join(f"{k} +{n}" for k, n in sorted(c.items())) for side, c in rose.items()]
                             + [f"the {side}'s port vanished" for side in gone])
            j = Judgement(Status.FAIL, f"{j.reason}; {what}", j.metrics)
        gbps = j.metrics[0].value if j.metrics and j.metrics[0].unit == "Gb/s" else None
        out.append(RailResult(rail, ends, j, gbps, seen))
    return out


def _errors_of(log: SideLog) -> list[str]:
    """The error lines of one side's output ([] when it has none, or is no perftest output at all)."""
    try:
        return parse_text("\n".join(log.lines)).errors
    except InputError:
        return []


def rail_line(r: RailResult, node: str | None = None) -> str:
    """``node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380``: the rail of ``node`` (default the client end)."""
    end = r.ends.client if node is None or r.ends.client.startswith(f"{node} ") else r.ends.server
    metric = r.judgement.metrics[0] if r.judgement.metrics else None
    if r.judgement.status is Status.ERROR or metric is None:
        return f"{end}: {r.judgement.status.value.upper()}: {r.judgement.reason}"
    bound = f", expected >= {metric.threshold.value:g}" if metric.threshold is not None else " (not judged)"
    tail = "" if r.judgement.status is Status.PASS else f": {r.judgement.status.value.upper()}"
    return f"{end}: {metric.value:.0f} Gb/s{bound}{tail}"
