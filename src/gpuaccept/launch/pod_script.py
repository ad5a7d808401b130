"""Shell scripts that run inside a container of a Kubernetes or Run:ai job, and what their MPI launcher forwards.

Both are POSIX ``sh`` (no bash needed in the image) and take the job argv as
positional parameters (``sh -c SCRIPT NAME ARGV...``), so the argv is never
re-quoted into the script text. After the job, every ``report.json`` under
``$GPUACCEPT_RESULTS_DIR`` is printed to stdout between marker lines; the
launcher reads them back from the container log (``kubectl logs``) with
:func:`gpuaccept.launch.log_reports.reports_from_log`.
"""

from __future__ import annotations

import shlex

from gpuaccept.errors import ConfigError
from gpuaccept.launch.spec import JobSpec

REPORT_BEGIN = "@@gpuaccept-report-begin@@"
REPORT_END = "@@gpuaccept-report-end@@"
RESULTS_ENV = "GPUACCEPT_RESULTS_DIR"
MPI_HOSTFILE = "/etc/mpi/hostfile"
MPI_MASTER_PORT = 29500
"""Rendezvous port of an MPIJob's ranks when the job's env sets no MASTER_PORT (each pod has its own network)."""
MPI_ALWAYS_FORWARD = ("MASTER_ADDR", "MASTER_PORT", "PATH", "LD_LIBRARY_PATH")
"""Forwarded to every rank by the MPIJob launcher, besides the job's environment."""
EXIT_PLACEMENT = 97
"""Exit status of the MPI launcher when ranks are not placed one group per worker."""

# Prints each report between markers; a leading newline keeps the marker at
# the start of a line even when the job's last output had none.
_EMIT_REPORTS = f"""\
dir="${{{RESULTS_ENV}:-}}"
if [ -n "$dir" ] && [ -d "$dir" ]; then
  find "$dir" -type f -name report.json | sort | while IFS= read -r f; do
    printf "\\n%s %s\\n" "{REPORT_BEGIN}" "$f"
    cat "$f"
    printf "\\n%s\\n" "{REPORT_END}"
  done
fi"""

NODE_SCRIPT = f"""\
# gpuaccept: run the job (the arguments), then print its reports to the log.
rc=0
"$@" || rc=$?
{_EMIT_REPORTS}
exit "$rc"
"""
"""Entrypoint of every node container (``sh -c NODE_SCRIPT gpuaccept ARGV...``); exits with the job's status."""


def mpi_launcher_script(workers: int, ranks_per_worker: int, forward_env: list[str],
                        mpirun_args: list[str]) -> str:
    """Entrypoint of an MPIJob launcher: check rank placement, run the job argv under mpirun, collect reports.

    ``mpirun`` always gets ``--hostfile /etc/mpi/hostfile``: with OpenMPI 5 the
    operator's ORTE variables are ignored, and without the flag every rank
    silently runs on the launcher. Before the job, a placement probe starts
    ``workers * ranks_per_worker`` ranks that print their hostname, and the
    script exits with status 97 unless there are exactly that many ranks, on
    ``workers`` distinct hosts, none of them the launcher. After the job, each
    worker's reports are printed by a one-rank ``mpirun`` per host, one host at
    a time, so that their lines cannot interleave.

    ``forward_env`` names are exported to the ranks with ``-x`` (they must be
    valid identifiers), and so are ``PATH``, ``LD_LIBRARY_PATH``, and
    ``MASTER_ADDR``/``MASTER_PORT`` (default: the first host of the hostfile,
    port 29500), which ``gpuaccept run --distributed`` and torch programs
    need to meet; ``mpirun_args`` are extra options placed before the job.
    """
    np = workers * ranks_per_worker
    names = [*forward_env, RESULTS_ENV, *MPI_ALWAYS_FORWARD]
    forward = " ".join(f"-x {name}" for name in dict.fromkeys(names))
    extra = " ".join(shlex.quote(a) for a in mpirun_args)
    mapping = f'--hostfile "$hostfile" -np {np} --map-by ppr:{ranks_per_worker}:node'
    emit = _EMIT_REPORTS
    assert "'" not in emit
    return f"""\
# gpuaccept MPIJob launcher: check rank placement, run the job (the arguments), print the reports.
hostfile={MPI_HOSTFILE}
workers={workers}
np={np}
fail() {{
  printf 'gpuaccept: %s\\n' "$*" >&2
  exit {EXIT_PLACEMENT}
}}
[ -r "$hostfile" ] || fail "$hostfile is missing: the MPI operator did not mount the hostfile"
listed=$(grep -c '[^[:space:]]' "$hostfile")
[ "$listed" -eq "$workers" ] || fail "$hostfile lists $listed hosts, expected $workers"
launcher=$(cat /proc/sys/kernel/hostname)
placement=$(mpirun {mapping} cat /proc/sys/kernel/hostname) ||
  fail "mpirun could not start $np ranks on the $workers workers"
ranks=$(printf '%s\\n' "$placement" | grep -c .)
hosts=$(printf '%s\\n' "$placement" | sort -u | grep -c .)
[ "$ranks" -eq "$np" ] || fail "mpirun started $ranks ranks, expected $np"
if printf '%s\\n' "$placement" | grep -qxF "$launcher"; then
  fail "ranks ran on the launcher $launcher, not on the workers (is --hostfile ignored?)"
fi
[ "$hosts" -eq "$workers" ] || fail "ranks ran on $hosts hosts, expected $workers"
# Rank 0 runs on the first host of the hostfile: the ranks meet there.
MASTER_ADDR=${{MASTER_ADDR:-$(awk 'NF {{print $1; exit}}' "$hostfile")}}
MASTER_PORT=${{MASTER_PORT:-{MPI_MASTER_PORT}}}
LD_LIBRARY_PATH=${{LD_LIBRARY_PATH:-}}
export MASTER_ADDR MASTER_PORT LD_LIBRARY_PATH
rc=0
mpirun {mapping} {forward}{" " + extra if extra else ""} "$@" || rc=$?
# shellcheck disable=SC2016 # expanded on each worker, not here
emit='{emit}'
awk 'NF {{print $1}}' "$hostfile" | while IFS= read -r host; do
  mpirun --host "$host" -np 1 -x {RESULTS_ENV} sh -c "$emit" </dev/null || true
done
exit "$rc"
"""


MPI_LAUNCHER_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TERM": "dumb"}
"""Set on the MPI launcher: mpirun may run as root (NGC images), and ranks write to mpirun's ptys, not a terminal."""


def mpi_forward_env(spec: JobSpec) -> list[str]:
    """Variables the launcher's mpirun exports to the ranks (``-x``): the job's env, and TERM."""
    return [*spec.env, *(["TERM"] if "TERM" not in spec.env else [])]


def mpi_ranks_per_worker(spec: JobSpec) -> int:
    """One rank per GPU for a distributed job or a user command; one per node for the plain suite. The backends
    that start an MPI launcher (k8s, runai, bcp) know the GPUs per node before this is asked."""
    if not (spec.distributed or spec.command is not None):
        return 1
    if spec.nproc is None:
        raise ConfigError("--gpus-per-node", "", "an MPI launcher starts a fixed number of ranks per worker: give "
                                                 "--gpus-per-node N")
    return spec.nproc
