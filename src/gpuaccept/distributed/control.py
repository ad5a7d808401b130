"""The control plane of a distributed run, on a c10d TCPStore: join, heartbeats, barriers, results.

Rank 0's ``gpuaccept`` process serves the store at ``MASTER_ADDR:MASTER_PORT``
(under torchrun its agent already does, and every rank is a client). Every key
lives under the run's prefix (:attr:`RankInfo.key_prefix`); each check's own
process group uses a further prefix, so successive checks never collide.

Liveness: every rank's process bumps ``hb/<rank>`` every ``timeout/10`` seconds
from a thread with its own connection. A rank whose counter has not moved for
``timeout`` seconds is dead. Rank 0 watches everyone and publishes the dead set;
the others watch rank 0 (its counter, or the store itself when rank 0 serves it).
No wait here is unbounded: a barrier ends when every rank has arrived or has
been declared dead, and a rank that loses rank 0 raises :class:`LeaderLost`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from gpuaccept.distributed.env import RankInfo
from gpuaccept.errors import UsageError


class RendezvousError(Exception):
    """This rank could not join the run (rank 0's store unreachable); nothing was measured."""


class LeaderLost(Exception):
    """Rank 0 died or became unreachable; this rank must finish on its own."""


@dataclass
class Pulse:
    """Decides staleness of heartbeat counters from successive readings (pure, clock passed in).

    A rank is stale when its counter has not changed for more than ``stale_s``
    seconds of the observer's monotonic clock; the first reading starts its clock.
    """

    stale_s: float
    last: dict[int, tuple[int, float]] = field(default_factory=dict)

    def seen(self, rank: int, value: int, now: float) -> bool:
        """Record a reading; True when ``rank`` is stale."""
        prev = self.last.get(rank)
        if prev is None or prev[0] != value:
            self.last[rank] = (value, now)
            return False
        return now - prev[1] > self.stale_s

    def silent_for(self, rank: int, now: float) -> float:
        prev = self.last.get(rank)
        return 0.0 if prev is None else now - prev[1]


def _backoff(step: float, cap: float) -> float:
    return min(cap, step * 1.5)


class Control:
    """One rank's view of the run's control plane. Call :meth:`join` first, :meth:`close` last."""

    def __init__(self, info: RankInfo, host: str, timeout_s: float, *,
                 log: Callable[[str], None] | None = None) -> None:
        self.info = info
        self.rank = info.rank
        self.world = info.world_size
        self.host = host
        self.timeout_s = timeout_s
        self.hb_interval = min(2.0, max(0.1, timeout_s / 10))
        self.log = log or (lambda message: None)
        self.hosts: list[str | None] = [None] * self.world
        self.dead: dict[int, str] = {}
        self.run_id = ""
        self.port = info.master_port
        self._server: Any = None
        self._raw: Any = None
        self.store: Any = None
        self._pulse = Pulse(timeout_s)
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._hb_error: str | None = None
        self._posted = 0
        self._read = [0] * self.world
        self._last_watch = 0.0

    # ---- connection -------------------------------------------------------------------------
    def _tcp(self, is_master: bool) -> Any:
        import torch.distributed as dist

        return dist.TCPStore(self.info.master_addr, self.port, None, is_master,
                             timedelta(seconds=self.timeout_s), wait_for_workers=False,
                             multi_tenant=is_master)

    def _connect(self) -> None:
        import torch.distributed as dist

        where = f"{self.info.master_addr}:{self.info.master_port}"
        if self.rank == 0 and not self.info.agent_store:
            if self.world == 1:
                self.port = 0  # alone: any free port will do
            try:
                self._server = self._tcp(True)
                self.port = int(self._server.port)
            except RuntimeError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise UsageError(f"--distributed: rank 0 cannot serve the rendezvous store on port "
                                 f"{self.info.master_port}: {first} (another run on MASTER_PORT?)") from None
            self._raw = self._server
        else:
            try:
                self._raw = self._tcp(False)
            except RuntimeError as exc:
                raise RendezvousError(f"cannot reach rank 0's rendezvous store at {where} within "
                                      f"{self.timeout_s:g} s ({type(exc).__name__}); is rank 0 running, and are "
                                      "MASTER_ADDR/MASTER_PORT right?") from None
        self.store = dist.PrefixStore(self.info.key_prefix, self._raw)

    def _heartbeat(self) -> None:
        import torch.distributed as dist

        try:
            store = dist.PrefixStore(self.info.key_prefix, self._tcp(False))
            while not self._hb_stop.is_set():
                store.add(f"hb/{self.rank}", 1)
                self._hb_stop.wait(self.hb_interval)
        except Exception as exc:  # the store went away: rank 0 is gone
            self._hb_error = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def store_address(self) -> tuple[str, int]:
        """Where a check's process connects for its process group (the same store, another prefix)."""
        return self.info.master_addr, self.port

    # ---- guarded store access for non-zero ranks ----------------------------------------------
    def _op(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            if self.rank == 0 and self._server is not None:
                raise
            raise LeaderLost(f"rank 0 ({self.host_of(0)}) is unreachable: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
                             ) from None

    def _has(self, key: str) -> bool:
        return bool(self._op(lambda: self.store.check([key])))

    def _get_json(self, key: str) -> Any:
        return json.loads(self._op(lambda: self.store.get(key)).decode())

    def _counter(self, key: str) -> int:
        return int(self._op(lambda: self.store.add(key, 0)))

    def host_of(self, rank: int) -> str:
        host = self.hosts[rank] if 0 <= rank < len(self.hosts) else None
        return host or "unknown host"

    def describe(self, ranks: Iterable[int]) -> str:
        """``rank 1 (node2), rank 3 (node4)``."""
        return ", ".join(f"rank {r} ({self.host_of(r)})" for r in sorted(ranks))

    # ---- join ---------------------------------------------------------------------------------
    def join(self, run_id: str | None, new_run_id: Callable[[], str]) -> str:
        """Connect, register this rank's host, agree on the run id and the members. Returns the run id.

        Rank 0 waits at most ``timeout`` for the others; ranks that never come
        are dead from the start. The others wait for rank 0's word for at most
        twice the timeout.
        """
        self._connect()
        self._hb_thread = threading.Thread(target=self._heartbeat, name="gpuaccept-heartbeat", daemon=True)
        self._hb_thread.start()
        me = json.dumps({"host": self.host, "local_rank": self.info.local_rank})
        self._op(lambda: self.store.set(f"host/{self.rank}", me))
        self._op(lambda: self.store.add("joined", 1))
        if self.rank == 0:
            return self._lead_join(run_id or new_run_id())
        return self._follow_join()

    def _lead_join(self, run_id: str) -> str:
        deadline = time.monotonic() + self.timeout_s
        step = 0.01
        while self._counter("joined") < self.world and time.monotonic() < deadline:
            time.sleep(step)
            step = _backoff(step, 0.25)
        for r in range(self.world):
            if self._has(f"host/{r}"):
                self.hosts[r] = json.loads(self.store.get(f"host/{r}").decode())["host"]
            else:
                self.dead[r] = f"never joined within {self.timeout_s:g} s"
        self.run_id = run_id
        self.store.set("members", json.dumps({"run_id": run_id, "hosts": self.hosts, "dead": self.dead}))
        if self.dead:
            self.log(f"{self.describe_dead()} never joined")
        return run_id

    def _follow_join(self) -> str:
        deadline = time.monotonic() + 2 * self.timeout_s
        step = 0.01
        while not self._has("members"):
            if time.monotonic() > deadline:
                raise RendezvousError(f"rank 0 did not publish the members within {2 * self.timeout_s:g} s")
            time.sleep(step)
            step = _backoff(step, 0.25)
        members = self._get_json("members")
        self.hosts = members["hosts"]
        self.dead = {int(k): v for k, v in members["dead"].items()}
        self.run_id = members["run_id"]
        return self.run_id

    # ---- liveness -----------------------------------------------------------------------------
    @property
    def alive(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.dead]

    def describe_dead(self, ranks: Iterable[int] | None = None) -> str:
        chosen = sorted(self.dead if ranks is None else ranks)
        return "; ".join(f"rank {r} ({self.host_of(r)}): {self.dead.get(r, 'gone')}" for r in chosen)

    def _check_pulses(self, ranks: Iterable[int]) -> set[int]:
        """Rank 0: read heartbeats of ``ranks``; declare and return the newly stale ones."""
        now = time.monotonic()
        stale: set[int] = set()
        for r in ranks:
            if r == self.rank or r in self.dead:
                continue
            if self._pulse.seen(r, self._counter(f"hb/{r}"), now):
                stale.add(r)
        if stale:
            for r in stale:
                self.dead[r] = f"no heartbeat for {self._pulse.silent_for(r, now):.1f} s (process died or hung)"
            self.store.set("dead", json.dumps(self.dead))
            self.log(f"lost {self.describe_dead(stale)}")
        return stale

    def _watch_leader(self) -> None:
        """Others: pick up rank 0's dead list; raise LeaderLost when rank 0 is silent or unreachable."""
        if self._has("dead"):
            self.dead.update({int(k): v for k, v in self._get_json("dead").items()})
        now = time.monotonic()
        if self._pulse.seen(0, self._counter("hb/0"), now):
            raise LeaderLost(f"rank 0 ({self.host_of(0)}): no heartbeat for {self._pulse.silent_for(0, now):.1f} s "
                             "(process died or hung)")

    def watch(self) -> dict[int, str]:
        """Non-blocking liveness poll (at most once per heartbeat interval); returns the dead ranks."""
        now = time.monotonic()
        if now - self._last_watch < self.hb_interval:
            return self.dead
        self._last_watch = now
        if self.rank == 0:
            self._check_pulses(self.alive)
        else:
            self._watch_leader()
        return self.dead

    # ---- barrier ------------------------------------------------------------------------------
    def barrier(self, name: str) -> dict[int, str]:
        """Wait until every live rank arrives; ranks silent for ``timeout`` are declared dead.

        Returns the (cumulative) dead ranks as rank 0 decided them, so all
        survivors agree. Raises LeaderLost on a non-zero rank whose rank 0 is gone.
        """
        self._op(lambda: self.store.set(f"bar/{name}/{self.rank}", "1"))
        go = f"bar/{name}/go"
        step = 0.005
        if self.rank == 0:
            pending = set(self.alive) - {0}
            while True:
                pending = {r for r in pending if not self._has(f"bar/{name}/{r}")}
                pending -= self._check_pulses(pending)
                if not pending:
                    break
                time.sleep(step)
                step = _backoff(step, min(0.5, self.hb_interval))
            self.store.set(go, json.dumps(self.dead))
            return self.dead
        waited = time.monotonic()
        noted = False
        while not self._has(go):
            self._watch_leader()
            if not noted and time.monotonic() - waited > 30:
                self.log(f"rank {self.rank} waiting at {name} for rank 0 ({self.host_of(0)})")
                noted = True
            time.sleep(step)
            step = _backoff(step, min(0.5, self.hb_interval))
        self.dead.update({int(k): v for k, v in self._get_json(go).items()})
        return self.dead

    # ---- results ------------------------------------------------------------------------------
    def post(self, result: dict[str, Any]) -> None:
        """Publish one of this rank's CheckResults (as a dict) for rank 0 to gather."""
        i = self._posted
        text = json.dumps(result, allow_nan=False)
        self._op(lambda: self.store.set(f"res/{self.rank}/{i}", text))
        self._op(lambda: self.store.add(f"res/{self.rank}/n", 1))
        self._posted += 1

    def collect(self) -> dict[int, list[dict[str, Any]]]:
        """Rank 0: results posted since the last call, by rank (dead ranks' earlier posts included)."""
        new: dict[int, list[dict[str, Any]]] = {}
        for r in range(self.world):
            if r == self.rank:
                continue
            n = self._counter(f"res/{r}/n")
            if n > self._read[r]:
                new[r] = [json.loads(self.store.get(f"res/{r}/{i}").decode()) for i in range(self._read[r], n)]
                self._read[r] = n
        return new

    # ---- the end ------------------------------------------------------------------------------
    def announce_final(self, payload: dict[str, Any]) -> None:
        """Rank 0: publish the run's outcome and keep the store up until the live ranks have read it."""
        self.store.set("final", json.dumps(payload))
        want = len(self.alive) - 1
        deadline = time.monotonic() + self.timeout_s
        step = 0.005
        while self._counter("final_ack") < want and time.monotonic() < deadline:
            time.sleep(step)
            step = _backoff(step, 0.25)
            self._check_pulses(self.alive)
            want = len(self.alive) - 1

    def await_final(self) -> dict[str, Any]:
        """Others: wait for rank 0's outcome (bounded by rank 0's liveness) and acknowledge it."""
        step = 0.005
        while not self._has("final"):
            self._watch_leader()
            time.sleep(step)
            step = _backoff(step, min(0.5, self.hb_interval))
        payload: dict[str, Any] = self._get_json("final")
        self._op(lambda: self.store.add("final_ack", 1))
        return payload

    def close(self) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=2 * self.hb_interval + 1)
        self.store = None
        self._raw = None
        self._server = None
