"""Which rank am I? Rank, world size, local rank and node rank from a launcher's environment.

:func:`detect_rank` is a pure function of an environment mapping. Sources, in
order of precedence (a process started by torchrun inside an ``srun`` step sees
both, and torchrun's values are the per-process ones):

1. torchrun, or any launcher that exports the torch names: ``RANK``,
   ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (node
   rank), ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
2. Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``,
   ``_LOCAL_SIZE``. ``OMPI_COMM_WORLD_NODE_RANK`` is *not* a node index (Open MPI
   defines it as the process's rank among all jobs' processes on its node), so
   the node rank is worked out after rendezvous from the host names;
3. Slurm's ``srun``: ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
   ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``, ``SLURM_STEP_TASKS_PER_NODE``,
   with ``MASTER_ADDR`` defaulting to the first host of ``SLURM_STEP_NODELIST``
   (or ``SLURM_JOB_NODELIST``);
4. the Kubeflow training operator and Run:ai: ``PET_NNODES``, ``PET_NODE_RANK``,
   ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` (one process
   per pod; several per pod need torchrun, which reads ``PET_*`` itself).

When ``MASTER_PORT`` is not set, Slurm and Open MPI jobs use
``20000 + job id mod 20000`` so that two jobs sharing a node do not collide;
otherwise 29500 (torch's default). A contradictory or incomplete environment
raises :class:`~gpuaccept.errors.UsageError` with one line naming the variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.distributed.hostlist import expand_hostlist, expand_tasks_per_node
from gpuaccept.errors import InputError, UsageError

DEFAULT_MASTER_PORT = 29500
_START = ("start it with `torchrun ... -m gpuaccept run --distributed`, `srun gpuaccept run --distributed` "
          "or `mpirun ... gpuaccept run --distributed`")


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a distributed run.

    ``local_rank``/``local_world_size``/``node_rank``/``num_nodes`` are None
    when the launcher does not say; they are then derived from the host names
    gathered at rendezvous. ``agent_store`` means torchrun's agent already
    serves a c10d store at ``master_addr:master_port`` (every rank is a client).
    """

    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    node_rank: int | None
    num_nodes: int | None
    master_addr: str
    master_port: int
    launcher: str
    job_id: str | None = None
    agent_store: bool = False
    restart: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def key_prefix(self) -> str:
        """Prefix of this run's keys in the store, unique per launcher job and restart."""
        return f"gpuaccept/{self.job_id or 'job'}/{self.restart}/"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    def describe(self) -> str:
        local = "" if self.local_rank is None else f", local rank {self.local_rank}"
        node = "" if self.node_rank is None else f", node {self.node_rank}"
        return (f"rank {self.rank} of {self.world_size}{local}{node} ({self.launcher}, "
                f"rendezvous {self.master_addr}:{self.master_port})")


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or int(text) < minimum:
        what = "a positive integer" if minimum > 0 else "a non-negative integer"
        raise UsageError(f"--distributed: {name}={raw!r} is not {what}")
    return int(text)


def _need(env: Mapping[str, str], name: str, why: str, *, minimum: int = 0) -> int:
    value = _int(env, name, minimum=minimum)
    if value is None:
        raise UsageError(f"--distributed: {why}")
    return value


def _below(a: int | None, a_name: str, b: int | None, b_name: str) -> None:
    if a is not None and b is not None and a >= b:
        raise UsageError(f"--distributed: {a_name}={a} is not below {b_name}={b} (ranks count from 0)")


def _port(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    if not raw.strip().isdigit() or not 0 < int(raw) < 65536:
        raise UsageError(f"--distributed: {name}={raw!r} is not a TCP port (1-65535)")
    return int(raw)


def _job_port(job: str | None) -> int:
    """A rendezvous port derived from a numeric job id, so jobs sharing a node differ."""
    digits = "".join(ch for ch in (job or "") if ch.isdigit())
    return 20000 + int(digits[-9:]) % 20000 if digits else DEFAULT_MASTER_PORT


def _no_addr(world: int, hint: str) -> UsageError:
    return UsageError(f"--distributed: MASTER_ADDR is not set; {world} ranks need the address of rank 0 ({hint})")


def _from_torch(env: Mapping[str, str]) -> RankInfo:
    torchrun = "TORCHELASTIC_RUN_ID" in env
    if "RANK" not in env:
        present = "WORLD_SIZE" if "WORLD_SIZE" in env else "LOCAL_RANK"
        raise UsageError(f"--distributed: {present} is set but RANK is not; {_START}")
    rank = _need(env, "RANK", "")
    world = _need(env, "WORLD_SIZE", "RANK is set but WORLD_SIZE is not", minimum=1)
    _below(rank, "RANK", world, "WORLD_SIZE")
    local_rank = _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1)
    _below(local_rank, "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE")
    if local_world is not None and local_world > world:
        raise UsageError(f"--distributed: LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}")
    node_rank = _int(env, "GROUP_RANK")
    num_nodes = _int(env, "GROUP_WORLD_SIZE", minimum=1)
    _below(node_rank, "GROUP_RANK", num_nodes, "GROUP_WORLD_SIZE")
    notes: list[str] = []
    if not torchrun:
        _cross_check(env, rank, world)
    if local_rank is None:
        if _pet_nproc(env) > 1:
            raise UsageError(f"--distributed: RANK/WORLD_SIZE are set per pod but PET_NPROC_PER_NODE="
                             f"{env['PET_NPROC_PER_NODE']!r} asks for several processes per pod; start it with "
                             "`torchrun -m gpuaccept run --distributed` (torchrun reads PET_*)")
        pet_nodes = _int(env, "PET_NNODES", minimum=1) if env.get("PET_NNODES", "").isdigit() else None
        if pet_nodes is not None and pet_nodes != world:
            raise UsageError(f"--distributed: WORLD_SIZE={world} contradicts PET_NNODES={pet_nodes} "
                             "with one process per pod")
        notes.append("LOCAL_RANK not set: local ranks derived from host names at rendezvous")
    addr = env.get("MASTER_ADDR", "").strip()
    port = _port(env, "MASTER_PORT")
    if world > 1 and not addr:
        raise _no_addr(world, "torchrun sets it; a hand-made environment must export MASTER_ADDR and MASTER_PORT")
    if world > 1 and port is None:
        raise UsageError(f"--distributed: MASTER_PORT is not set; {world} ranks need rank 0's rendezvous port")
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip() if torchrun else ""
    return RankInfo(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        node_rank=node_rank, num_nodes=num_nodes, master_addr=addr or "127.0.0.1",
        master_port=port or DEFAULT_MASTER_PORT, launcher="torchrun" if torchrun else "env",
        job_id=run_id if run_id and run_id != "none" else None,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        restart=_int(env, "TORCHELASTIC_RESTART_COUNT") or 0, notes=tuple(notes))


def _cross_check(env: Mapping[str, str], rank: int, world: int) -> None:
    """RANK/WORLD_SIZE set by hand must agree with a per-process launcher that is also present."""
    ompi_world = _int(env, "OMPI_COMM_WORLD_SIZE", minimum=1)
    ompi_rank = _int(env, "OMPI_COMM_WORLD_RANK")
    if ompi_world is not None and ompi_world != world:
        raise UsageError(f"--distributed: WORLD_SIZE={world} contradicts OMPI_COMM_WORLD_SIZE={ompi_world}")
    if ompi_rank is not None and ompi_world == world and ompi_rank != rank:
        raise UsageError(f"--distributed: RANK={rank} contradicts OMPI_COMM_WORLD_RANK={ompi_rank} "
                         "(was RANK exported to every process?)")
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    slurm_world = _int(env, "SLURM_STEP_NUM_TASKS", minimum=1) or _int(env, "SLURM_NTASKS", minimum=1)
    slurm_rank = _int(env, "SLURM_PROCID")
    if in_step and slurm_world == world and slurm_rank is not None and slurm_rank != rank:
        raise UsageError(f"--distributed: RANK={rank} contradicts SLURM_PROCID={slurm_rank} in an srun step of "
                         f"{world} tasks (was RANK exported to every task? gpuaccept reads SLURM_* itself)")


def _from_ompi(env: Mapping[str, str]) -> RankInfo:
    rank = _need(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not")
    world = _need(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not",
                  minimum=1)
    _below(rank, "OMPI_COMM_WORLD_RANK", world, "OMPI_COMM_WORLD_SIZE")
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1)
    _below(local_rank, "OMPI_COMM_WORLD_LOCAL_RANK", local_world, "OMPI_COMM_WORLD_LOCAL_SIZE")
    if local_world is not None and local_world > world:
        raise UsageError(f"--distributed: OMPI_COMM_WORLD_LOCAL_SIZE={local_world} exceeds "
                         f"OMPI_COMM_WORLD_SIZE={world}")
    num_nodes = _int(env, "OMPI_MCA_orte_num_nodes", minimum=1)
    single_node = num_nodes == 1 or (local_world is not None and local_world == world)
    job = (env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE") or "").strip() or None
    notes = ["node rank derived from host names at rendezvous (OMPI_COMM_WORLD_NODE_RANK is not a node index)"]
    addr = env.get("MASTER_ADDR", "").strip()
    if not addr:
        if world > 1 and not single_node:
            raise _no_addr(world, "mpirun does not say where rank 0 runs: pass -x MASTER_ADDR=<host of rank 0>")
        addr = "127.0.0.1"
        notes.append("MASTER_ADDR defaulted to 127.0.0.1: every rank is on this node")
    port = _port(env, "MASTER_PORT")
    if port is None:
        port = _job_port(job)
        notes.append(f"MASTER_PORT defaulted to {port} from the Open MPI job id")
    return RankInfo(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                    node_rank=0 if single_node else None, num_nodes=1 if single_node else num_nodes,
                    master_addr=addr, master_port=port, launcher="openmpi", job_id=job, notes=tuple(notes))


def _from_slurm(env: Mapping[str, str]) -> RankInfo:
    rank = _need(env, "SLURM_PROCID", "")
    world = (_int(env, "SLURM_STEP_NUM_TASKS", minimum=1) or _int(env, "SLURM_NTASKS", minimum=1)
             or _int(env, "SLURM_NPROCS", minimum=1))
    if world is None:
        raise UsageError("--distributed: SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is")
    _below(rank, "SLURM_PROCID", world, "SLURM_NTASKS")
    if world > 1 and "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
        raise UsageError(f"--distributed: this is a Slurm job script, not an srun step ({world} tasks "
                         "allocated, no SLURM_STEP_ID); start every task with `srun gpuaccept run --distributed`")
    local_rank = _int(env, "SLURM_LOCALID")
    node_rank = _int(env, "SLURM_NODEID")
    num_nodes = (_int(env, "SLURM_STEP_NUM_NODES", minimum=1) or _int(env, "SLURM_NNODES", minimum=1)
                 or _int(env, "SLURM_JOB_NUM_NODES", minimum=1))
    _below(node_rank, "SLURM_NODEID", num_nodes, "SLURM_NNODES")
    local_world = _int(env, "SLURM_NTASKS_PER_NODE", minimum=1)
    per_node_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node_text:
        try:
            per_node = expand_tasks_per_node(per_node_text)
        except InputError as exc:
            raise UsageError(f"--distributed: SLURM_STEP_TASKS_PER_NODE: {exc}") from None
        if node_rank is not None and node_rank < len(per_node):
            local_world = per_node[node_rank]
    _below(local_rank, "SLURM_LOCALID", local_world, "tasks on this node")
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    job_id = f"{job}.{step}" if job and step else job
    notes: list[str] = []
    addr = env.get("MASTER_ADDR", "").strip()
    if not addr:
        nodelist_var = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                             if env.get(v)), None)
        if nodelist_var is None:
            if world > 1:
                raise _no_addr(world, "neither MASTER_ADDR nor SLURM_STEP_NODELIST/SLURM_JOB_NODELIST is set")
            addr = "127.0.0.1"
        else:
            try:
                hosts = expand_hostlist(env[nodelist_var])
            except InputError as exc:
                raise UsageError(f"--distributed: {nodelist_var}: {exc}") from None
            if num_nodes is not None and len(hosts) < num_nodes:
                raise UsageError(f"--distributed: {nodelist_var} lists {len(hosts)} host(s) but the step has "
                                 f"{num_nodes} nodes")
            addr = hosts[0]
            notes.append(f"MASTER_ADDR from the first host of {nodelist_var}")
    port = _port(env, "MASTER_PORT")
    if port is None:
        port = _job_port(job)
        notes.append(f"MASTER_PORT defaulted to {port} from SLURM_JOB_ID")
    return RankInfo(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                    node_rank=node_rank, num_nodes=num_nodes, master_addr=addr, master_port=port,
                    launcher="slurm", job_id=job_id, notes=tuple(notes))


def _pet_nproc(env: Mapping[str, str]) -> int:
    """Processes per pod from PET_NPROC_PER_NODE: a number, else 1 (``auto``/``gpu`` are torchrun's to
    resolve; without torchrun there is one process per pod, and the operator counts WORLD_SIZE so)."""
    raw = env.get("PET_NPROC_PER_NODE", "1").strip()
    return int(raw) if raw.isdigit() else 1


def _from_pet(env: Mapping[str, str]) -> RankInfo:
    nnodes_raw = env.get("PET_NNODES", "").strip()
    if ":" in nnodes_raw:
        raise UsageError(f"--distributed: PET_NNODES={nnodes_raw!r} is an elastic range; start it with "
                         "`torchrun -m gpuaccept run --distributed`")
    nnodes = _need(env, "PET_NNODES", "PET_NODE_RANK is set but PET_NNODES is not", minimum=1)
    node_rank = _need(env, "PET_NODE_RANK", "PET_NNODES is set but PET_NODE_RANK is not")
    _below(node_rank, "PET_NODE_RANK", nnodes, "PET_NNODES")
    if _pet_nproc(env) > 1:
        raise UsageError(f"--distributed: PET_NPROC_PER_NODE={env['PET_NPROC_PER_NODE']!r} asks for several "
                         "processes per pod; start it with `torchrun -m gpuaccept run --distributed` "
                         "(torchrun reads PET_*)")
    addr = (env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR") or "").strip()
    if nnodes > 1 and not addr:
        raise _no_addr(nnodes, "the operator sets PET_MASTER_ADDR; it is missing")
    port = _port(env, "PET_MASTER_PORT") or _port(env, "MASTER_PORT") or DEFAULT_MASTER_PORT
    return RankInfo(rank=node_rank, world_size=nnodes, local_rank=0, local_world_size=1, node_rank=node_rank,
                    num_nodes=nnodes, master_addr=addr or "127.0.0.1", master_port=port, launcher="pet")


def detect_rank(env: Mapping[str, str]) -> RankInfo:
    """This process's :class:`RankInfo` from ``env``; UsageError when it is missing or contradictory."""
    if any(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return _from_torch(env)
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        return _from_ompi(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    if "PET_NNODES" in env or "PET_NODE_RANK" in env:
        return _from_pet(env)
    raise UsageError("--distributed: no launcher environment found (RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK, "
                     f"SLURM_PROCID or PET_NNODES); {_START}")


def processes_on_node(env: Mapping[str, str]) -> tuple[int, str] | None:
    """How many processes a launcher started on this node, and the variable that says so.

    None outside a launcher. A plain ``gpuaccept run`` refuses to run as one of
    several processes per node (each would run the whole node suite).
    """
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        raw = env.get(name, "").strip()
        if raw.isdigit():
            if name == "SLURM_NTASKS_PER_NODE" and "SLURM_STEP_ID" not in env:
                continue
            return int(raw), name
    text = env.get("SLURM_STEP_TASKS_PER_NODE")
    node = env.get("SLURM_NODEID", "0")
    if text and node.isdigit() and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        try:
            counts = expand_tasks_per_node(text)
        except InputError:
            return None
        if int(node) < len(counts):
            return counts[int(node)], "SLURM_STEP_TASKS_PER_NODE"
    return None
