"""Ranks per node when the launch did not say: one per GPU the node has, counted on the node at run time.

A plan is made before any node is known, so when neither ``--gpus-per-node``
nor ``--procs-per-node`` was given (and the job is not a CPU job) torchrun's
argv carries :data:`PLACEHOLDER` (``--nproc-per-node=gpu``, torchrun's own
"one rank per CUDA GPU") and the node replaces it with the count it finds:
``SLURM_GPUS_ON_NODE`` (what Slurm gave the job on that node), else the
entries of ``CUDA_VISIBLE_DEVICES``, else the ``GPU`` lines of
``nvidia-smi -L``, else the ``/dev/nvidiaN`` device nodes. A node where
that count is 0 prints one line saying so and exits :data:`NO_GPU_EXIT`,
rather than run one rank as if it were a CPU job.

The shell text is POSIX ``sh`` (and clean under bash's ``set -euo pipefail``).
"""

from __future__ import annotations

PLACEHOLDER = "--nproc-per-node=gpu"
"""torchrun's option when the ranks per node are counted on the node (torchrun itself reads ``gpu`` as "one per
CUDA device", so the job stays right even where the substitution did not run)."""
NO_GPU_EXIT = 96
"""Exit status of a node that found no GPU to start ranks on."""
HINT = ("give --gpus-per-node N (the GPUs to request and test per node), or --device cpu (or --gpus-per-node 0) "
        "for a CPU-only job")

COUNT_FUNCTION = """\
# The GPUs this node gives the job: Slurm's allocation, else CUDA_VISIBLE_DEVICES, else nvidia-smi -L, else /dev.
gpuaccept_gpus() {
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then echo "$SLURM_GPUS_ON_NODE"; return 0; fi
  case "${CUDA_VISIBLE_DEVICES-unset}" in
    unset) ;;
    ''|-1|none|void|NoDevFiles) echo 0; return 0 ;;
    *) printf '%s\\n' "$CUDA_VISIBLE_DEVICES" | tr ',' '\\n' | grep -c . || true; return 0 ;;
  esac
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
    return 0
  fi
  n=0
  for d in /dev/nvidia[0-9]*; do
    case "$d" in /dev/nvidia*[!0-9]*) ;; *) [ -e "$d" ] && n=$((n + 1)) ;; esac
  done
  echo "$n"
}"""


def count_lines(var: str, host: str) -> list[str]:
    """Shell lines that set ``var`` to this node's GPU count, or print why there is none and exit.

    ``host`` is a shell expression naming the node in the message (``$(hostname)``).
    """
    return [
        *COUNT_FUNCTION.splitlines(),
        f"{var}=$(gpuaccept_gpus)",
        f'case "${var}" in',
        "  ''|*[!0-9]*|0)",
        f'    echo "[LAUNCH] {host}: no GPU found on this node (SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES, '
        f'nvidia-smi -L); {HINT}" >&2',
        f"    exit {NO_GPU_EXIT} ;;",
        "esac",
        f'echo "[LAUNCH] {host}: ${var} GPU(s), one rank each" >&2',
    ]


NODE_WRAPPER = "\n".join([
    "# gpuaccept: start one rank per GPU of this node (counted here), then run the job (the arguments).",
    *count_lines("nproc", "${GPUACCEPT_HOSTNAME:-$(cat /proc/sys/kernel/hostname)}"),
    "first=1",
    "for a do",
    '  if [ "$first" = 1 ]; then set --; first=0; fi',
    f'  if [ "$a" = {PLACEHOLDER} ]; then a="--nproc-per-node=$nproc"; fi',
    '  set -- "$@" "$a"',
    "done",
    'exec "$@"',
]) + "\n"
"""``sh -c NODE_WRAPPER NAME ARGV...``: count the node's GPUs, put the count in place of :data:`PLACEHOLDER`."""


def wrapped(argv: list[str]) -> list[str]:
    """``argv`` run under :data:`NODE_WRAPPER` (``sh -c``), which replaces :data:`PLACEHOLDER` with the count."""
    return ["sh", "-c", NODE_WRAPPER, "gpuaccept-gpus", *argv]


def looks_like_count(gpus: str) -> bool:
    """``--gpus 8`` on a launcher: one number, which a person most likely meant as GPUs per node, not GPU 8."""
    return gpus.strip().isdigit() and int(gpus) > 0


def requested(gpus_per_node: int | None, procs_per_node: int | None, gpus: str | list[int] | None,
              device: str | None) -> tuple[int | None, int | None]:
    """``(gpus_per_node, procs_per_node)`` of a launch from its flags (and its suite's ``--gpus``/``--device``,
    flag or config). A CPU suite requests 0 GPUs; a ``--gpus`` list sets the ranks per node to its length;
    ``--gpus N`` alone, a count by the look of it, is a UsageError pointing at ``--gpus-per-node``."""
    from gpuaccept.errors import UsageError

    if isinstance(gpus, str) and gpus_per_node is None and procs_per_node is None and looks_like_count(gpus):
        raise UsageError(f"--gpus {gpus.strip()} names GPU index {gpus.strip()} on each node, not a count: to test "
                         f"{gpus.strip()} GPUs per node give --gpus-per-node {gpus.strip()} (by default every GPU of "
                         "each node is tested)")
    if gpus_per_node is None and device == "cpu":
        gpus_per_node = 0
    if procs_per_node is None and gpus:
        procs_per_node = len(gpus.split(",")) if isinstance(gpus, str) else len(gpus)
    return gpus_per_node, procs_per_node
