"""Pure parsers for what Slurm's commands print: sbatch, squeue, sacct, scontrol, host lists.

Every function takes the command's text and returns data; none runs a
command. They are tested on outputs recorded from a real Slurm 22.05
cluster under ``tests/data/slurm/`` (see the README there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuaccept.distributed.hostlist import expand_hostlist
from gpuaccept.errors import InputError

__all__ = ["QueueView", "SlurmJob", "expand_hostlist", "parse_sacct", "parse_sbatch", "parse_scontrol_job",
           "parse_squeue"]

#: States after which the job will not run again (``squeue --help`` / ``sacct -e``).
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})
#: States of a job that is queued or running; COMPLETING still has processes on nodes.
ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "RESIZING", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT", "STOPPED",
})

#: ``squeue`` output format read by :func:`parse_squeue`: job id, state, node list, reason.
SQUEUE_FORMAT = "%i|%T|%N|%r"
#: ``sacct --format`` read by :func:`parse_sacct` (with ``--parsable2 --noheader --allocations``).
SACCT_FIELDS = "JobID,State,ExitCode,NodeList"

_JOB_ID = re.compile(r"^\d+(_\d+)?$")


@dataclass(frozen=True)
class SlurmJob:
    """What the scheduler says about one job.

    ``state`` is the base state name (``CANCELLED by 0`` becomes ``CANCELLED``);
    ``exit_code`` is ``code:signal`` as Slurm prints it (empty when unknown);
    ``nodes`` is the compressed node list (``node[1-2]``), empty before allocation.
    """

    job_id: str
    state: str
    exit_code: str = ""
    nodes: str = ""
    reason: str = ""
    source: str = ""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code in ("", "0:0")

    @property
    def hosts(self) -> list[str]:
        return expand_hostlist(self.nodes) if self.nodes and self.nodes not in ("(null)", "None assigned") else []


def parse_sbatch(text: str) -> str:
    """The job id from ``sbatch --parsable`` (``123`` or ``123;cluster``) or plain ``sbatch`` output."""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        m = re.match(r"^Submitted batch job (\d+)", line)
        if m:
            return m.group(1)
        head = line.split(";", 1)[0]
        if _JOB_ID.match(head):
            return head
    raise InputError(f"sbatch printed no job id: {text.strip()[:200]!r}")


def _base_state(raw: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``RUNNING+`` (sacct) -> ``RUNNING``."""
    word = raw.strip().split(" ", 1)[0].rstrip("+")
    return word.upper()


def parse_squeue(text: str, job_id: str) -> SlurmJob | None:
    """The job's line in ``squeue -h -j ID -o '%i|%T|%N|%r'`` output; None when it is no longer queued."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        if parts[0] != job_id:
            continue
        return SlurmJob(job_id=job_id, state=_base_state(parts[1]), nodes=parts[2].strip(),
                        reason=parts[3].strip() if parts[3].strip() != "None" else "", source="squeue")
    return None


def squeue_says_unknown_job(stderr: str) -> bool:
    """True when squeue's error means the job id is no longer known (purged or never existed)."""
    return "Invalid job id" in stderr


def sacct_unavailable(stderr: str) -> bool:
    """True when sacct cannot answer at all on this cluster (no accounting storage or slurmdbd down)."""
    s = stderr.lower()
    return ("accounting storage is disabled" in s or "slurmdbd" in s
            or "connection refused" in s or "not running a supported accounting_storage plugin" in s)


def parse_sacct(text: str, job_id: str) -> SlurmJob | None:
    """The allocation line of ``sacct -j ID -X -n -P -o JobID,State,ExitCode,NodeList``; None if not listed yet.

    Steps (``ID.batch``, ``ID.0``) are ignored if ``-X`` was forgotten; a
    heterogeneous or array job's first component stands for the job.
    """
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4:
            continue
        jid = parts[0].strip()
        if jid != job_id and not jid.startswith(f"{job_id}_") and not jid.startswith(f"{job_id}+"):
            continue
        if "." in jid:
            continue
        return SlurmJob(job_id=job_id, state=_base_state(parts[1]), exit_code=parts[2].strip(),
                        nodes=parts[3].strip(), source="sacct")
    return None


_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:]*)=(\S*)")


def parse_scontrol_job(text: str, job_id: str) -> SlurmJob | None:
    """``scontrol show job [-o] ID`` output (one-line or multi-line); None when it does not describe ``job_id``."""
    fields: dict[str, str] = {}
    for key, value in _KV.findall(text):
        fields.setdefault(key, value)
    if fields.get("JobId") != job_id or "JobState" not in fields:
        return None
    nodes = fields.get("NodeList", "")
    return SlurmJob(job_id=job_id, state=_base_state(fields["JobState"]), exit_code=fields.get("ExitCode", ""),
                    nodes="" if nodes == "(null)" else nodes,
                    reason="" if fields.get("Reason", "None") == "None" else fields.get("Reason", ""),
                    source="scontrol")


@dataclass
class QueueView:
    """What one poll learnt: the job (or None when no source lists it) and where the answer came from."""

    job: SlurmJob | None
    sacct_available: bool = True
    notes: list[str] = field(default_factory=list)
