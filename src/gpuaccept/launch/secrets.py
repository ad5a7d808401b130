"""Which ``--env`` values are secrets, and how files that hold one are stored.

The rule: the value of every ``--env NAME=VALUE`` is a secret unless NAME is known to carry
configuration only (:func:`is_secret`). A launch then

- saves the job spec (``launch/job.json``) with secret values replaced by :data:`REDACTED`;
- stores a file the backend hands to the job itself (the ssh node script, sent on standard
  input) with secret values replaced;
- writes any plan file that must hold a secret value (the slurm batch script, k8s manifests,
  run:ai and bcp submit scripts, every file written by ``--output``) with mode 0600 (0700 for
  a script), created with that mode so it is never readable by others, not even for a moment;
- prints a ``--dry-run`` plan with secret values replaced, unless ``--show-env``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

REDACTED = "<redacted>"

#: Names whose values are configuration, not secrets: stored in clear.
SAFE_PREFIXES = ("NCCL_", "UCX_", "OMPI_", "PMIX_", "FI_", "CUDA_", "NVIDIA_", "TORCH_", "PYTORCH_",
                 "GPUACCEPT_", "OMP_", "MKL_", "LC_")
SAFE_NAMES = frozenset({"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "HOME", "TERM", "LANG",
                        "TZ", "TMPDIR", "MASTER_ADDR", "MASTER_PORT", "LOGLEVEL"})


def is_secret(name: str) -> bool:
    """True unless ``name`` is in :data:`SAFE_NAMES`, starts with one of :data:`SAFE_PREFIXES` or ends in ``PATH``."""
    return not (name in SAFE_NAMES or name.startswith(SAFE_PREFIXES) or name.endswith("PATH"))


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The non-empty values of the secret names of ``env``."""
    return [v for k, v in env.items() if v and is_secret(k)]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every secret value replaced by :data:`REDACTED` (empty values stay empty)."""
    return {k: (REDACTED if v and is_secret(k) else v) for k, v in env.items()}


def holds_secret(text: str, secrets: Collection[str]) -> bool:
    return any(s in text for s in secrets)


def write_file(path: Path, text: str, *, private: bool, executable: bool = False) -> None:
    """Write ``text`` to ``path``: mode 0600/0700 when ``private``, else 0666/0755 (0666 before the umask).

    A private file is created with its mode (no window where it is readable), and an existing
    file is narrowed to it before anything is written.
    """
    mode = (0o700 if executable else 0o600) if private else (0o755 if executable else 0o666)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        if private:
            os.fchmod(fd, mode)
        fh.write(text)
    if not private and executable:
        path.chmod(0o755)
