"""What a distributed check's process knows, and its process group with bounded waits.

The runner starts one process per rank for a distributed check and passes a
:class:`RankContext` as JSON in the ``GPUACCEPT_DIST`` environment variable.
:func:`process_group` connects to the run's c10d store under a prefix of its
own (one per check), and creates the group with ``timeout=`` so that
``init_process_group`` and every collective give up after that many seconds
(gloo raises; NCCL's watchdog aborts the communicator).
"""

from __future__ import annotations

import abc
import inspect
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.checks.base import Check, CheckContext, Outcome, RequiredMetric, require
from gpuaccept.distributed.devices import DeviceSelectionError, rank_device
from gpuaccept.model import Status

ENV_VAR = "GPUACCEPT_DIST"
PARTIAL_ENV = "GPUACCEPT_PARTIAL"


@dataclass(frozen=True)
class RankContext:
    """One rank of a distributed check. ``timeout_s`` bounds init and each collective (seconds);
    ``device_index`` is the CUDA ordinal this rank uses (None on CPU). With ``store_file`` set (a
    spawn on one node), rank 0 serves the store on a free loopback port and writes the port there,
    and the others read it; otherwise the store is at ``store_host:store_port``."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    hosts: tuple[str, ...]
    store_host: str
    store_port: int
    prefix: str
    timeout_s: float
    device_index: int | None = None
    launcher: str = "local"
    store_file: str | None = None

    def host_of(self, rank: int) -> str:
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else "unknown host"

    @property
    def device_label(self) -> str:
        return "cpu" if self.device_index is None else f"cuda:{self.device_index}"

    def to_json(self) -> str:
        d = asdict(self)
        d["hosts"] = list(self.hosts)
        return json.dumps(d)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RankContext | None:
        """The context in ``env``, or None when this process was not started as a rank."""
        raw = env.get(ENV_VAR)
        if not raw:
            return None
        d: dict[str, Any] = json.loads(raw)
        d["hosts"] = tuple(d["hosts"])
        return cls(**d)


@dataclass
class Group:
    """An initialised default process group: its backend and this rank's torch device."""

    rc: RankContext
    backend: str
    device: Any


def _connect_store(rc: RankContext, timeout: timedelta) -> Any:
    import torch.distributed as dist

    if rc.store_file is None:
        return dist.TCPStore(rc.store_host, rc.store_port, None, False, timeout)
    path = Path(rc.store_file)
    if rc.rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(store.port))
        os.replace(tmp, path)
        return store
    deadline = time.monotonic() + rc.timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not start the store within {rc.timeout_s:g} s")
        time.sleep(0.02)
    return dist.TCPStore("127.0.0.1", int(path.read_text()), None, False, timeout)


@contextmanager
def process_group(rc: RankContext, device: str) -> Iterator[Group]:
    """Initialise the default process group for ``rc`` (NCCL on ``cuda``, gloo on ``cpu``).

    Destroys it on a clean exit. After an exception the group is left alone: a
    wedged communicator can hang in teardown, and the check process exits right
    after writing its outcome anyway.
    """
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=rc.timeout_s)
    if device == "cuda":
        if rc.device_index is None:
            raise RuntimeError("a CUDA rank needs a device index")
        torch.cuda.set_device(rc.device_index)
        dev = torch.device("cuda", rc.device_index)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    store = dist.PrefixStore(rc.prefix, _connect_store(rc, timeout))
    kwargs: dict[str, Any] = {"backend": backend, "store": store, "rank": rc.rank, "world_size": rc.world_size,
                              "timeout": timeout}
    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kwargs["device_id"] = dev  # eager NCCL init (torch >= 2.3): a missing peer fails here, within the timeout
    dist.init_process_group(**kwargs)
    clean = False
    try:
        yield Group(rc, backend, dev)
        clean = True
    finally:
        if clean:
            dist.destroy_process_group()


def agree_min(value: int, device: Any) -> int:
    """The smallest ``value`` over all ranks (one ``all_reduce`` with MIN on ``device``).

    Every rank must call it at the same point: anything that shapes the sequence
    of collectives (a sweep's sizes, a step count) has to be agreed this way, or
    ranks that derived it from local state run different collectives and hang.
    """
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def all_gather_text(text: str, device: Any, width: int = 96) -> list[str]:
    """Every rank's ``text`` (ASCII, at most ``width`` bytes), in rank order; every rank must call it."""
    import torch
    import torch.distributed as dist

    raw = text.encode("ascii", "replace")[:width].ljust(width, b"\0")
    mine = torch.tensor(list(raw), dtype=torch.uint8, device=device)
    every = torch.empty(dist.get_world_size() * width, dtype=torch.uint8, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(every, mine)
    data = bytes(every.cpu().tolist())
    return [data[k * width:(k + 1) * width].rstrip(b"\0").decode("ascii") for k in range(dist.get_world_size())]


def with_visible_device(rc: RankContext, gpus: Sequence[int] | None, device_count: int) -> RankContext:
    """``rc`` with the CUDA ordinal this process must use (:func:`~gpuaccept.distributed.devices.rank_device`).

    The local launcher starts every rank with the same view of the node, so
    there the ranks always select from a list (``--gpus`` or ``0..n-1``) and
    the one-visible-device rule of per-task binding never applies.
    """
    if gpus is None and rc.launcher == "local":
        gpus = list(range(rc.local_world_size))
    index = rank_device(rc.local_rank, rc.local_world_size, device_count, gpus)
    return replace(rc, device_index=index)


_SOURCE_REF = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|c|h|hpp):\d+\]\s*")
_MAX_MESSAGE = 200


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, without C++ source locations, at most about 200 characters
    (gloo and NCCL errors span many lines and carry advice that does not fit a report's reason)."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = _SOURCE_REF.sub("", text.splitlines()[0]).split(" This is typically caused by")[0]
    if len(line) > _MAX_MESSAGE:
        line = line[:_MAX_MESSAGE - 3] + "..."
    return f"{type(exc).__name__}: {line}"


class Abandon(Exception):
    """Leaves a :func:`process_group` block with a finished outcome, without tearing a broken group down."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        super().__init__(outcome.reason)


def train_in_group(ctx: CheckContext, rc: RankContext,
                   train: Callable[[CheckContext, RankContext, Any, str], Outcome]) -> Outcome:
    """``train(ctx, rc, device, backend)`` inside the rank's :func:`process_group`; an exception ends it as this
    rank's ERROR naming the rank, its host and device (via :class:`Abandon`: a broken group is not torn down)."""
    with process_group(rc, ctx.device) as pg:
        try:
            return train(ctx, rc, pg.device, pg.backend)
        except Exception as exc:
            raise Abandon(Outcome(Status.ERROR, f"rank {rc.rank} ({rc.host_of(rc.rank)}, {rc.device_label}): "
                                                f"{first_line(exc)}")) from None


class DistributedCheck(Check):
    """A check that runs as one process per rank and talks through a process group.

    The runner starts it on every rank (``distributed = True``) and gives it a
    :class:`RankContext`; subclasses implement :meth:`run_rank`.
    """

    distributed: ClassVar[bool] = True
    min_world: ClassVar[int] = 2
    _last_checkpoint: float = 0.0

    def checkpoint(self, outcome: Callable[[], Outcome], *, every_s: float = 1.0) -> None:
        """Save what was measured so far where the runner looks if this process is killed.

        At most once per ``every_s`` seconds; ``outcome`` is only built when saved.
        The runner's ``GPUACCEPT_PARTIAL`` names the file; without it nothing is written.
        """
        path = os.environ.get(PARTIAL_ENV)
        now = time.monotonic()
        if not path or now - self._last_checkpoint < every_s:
            return
        self._last_checkpoint = now
        from gpuaccept.checks.base import outcome_to_dict

        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(outcome_to_dict(outcome()), fh, allow_nan=False, default=str)
        os.replace(tmp, path)

    def run(self, ctx: CheckContext) -> Outcome:
        rc = RankContext.from_env(os.environ)
        if rc is None:
            return Outcome.skip(f"{self.name} runs one process per rank; run it through `gpuaccept run`")
        if rc.world_size < self.min_world:
            return Outcome.skip(f"{self.name} needs at least {self.min_world} ranks; the world size is "
                                f"{rc.world_size}")
        try:
            import torch
        except ImportError as exc:
            return Outcome.skip(f"torch is not installed: {exc}", needs_gpu=ctx.device == "cuda")
        if ctx.device == "cuda" and not torch.cuda.is_available():
            return Outcome.skip(f"CUDA requested but torch {torch.__version__} cannot use it", needs_gpu=True)
        if ctx.device == "cuda":
            try:
                rc = with_visible_device(rc, ctx.gpus, torch.cuda.device_count())
            except DeviceSelectionError as exc:
                return Outcome(Status.ERROR, f"rank {rc.rank} ({rc.host_of(rc.rank)}): {exc}")
        try:
            return require(self.run_rank(ctx, rc), self.rank_required_metrics(ctx.params, rc))
        except Abandon as stop:
            return stop.outcome
        except Exception as exc:  # init timed out, a peer vanished, NCCL aborted...
            ctx.log(f"rank {rc.rank}: {first_line(exc)}")
            return Outcome(Status.ERROR, f"rank {rc.rank} ({rc.host_of(rc.rank)}, {rc.device_label}): "
                           f"{first_line(exc)}")

    @classmethod
    def rank_required_metrics(cls, params: dict[str, Any], rc: RankContext) -> list[RequiredMetric]:
        """What a PASS/WARN outcome of rank ``rc`` must contain (the per-rank counterpart of
        :meth:`Check.required_metrics`, which a distributed check leaves empty: each rank measures only
        its own device). A lacking outcome becomes an ERROR naming what is missing. Default: nothing."""
        return []

    @abc.abstractmethod
    def run_rank(self, ctx: CheckContext, rc: RankContext) -> Outcome:
        """Measure on this rank; every rank calls it at the same time."""
