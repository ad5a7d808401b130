"""The preflight: before anything starts, every host is reachable and can run the job."""

from __future__ import annotations

import shlex
import subprocess

from gpuaccept.errors import InputError
from gpuaccept.launch.spec import JobSpec
from gpuaccept.launch.ssh.fanout import parallel
from gpuaccept.launch.ssh.options import SshOptions
from gpuaccept.launch.ssh.plan import NodeSlot, ssh_argv, uses_torchrun


def preflight_command(spec: JobSpec, python: str) -> str:
    """Remote check before launch: exit 4 no working directory, 5 no Python, 6 a module the job needs is missing."""
    modules = ["gpuaccept"] if spec.command is None else ["torch"] if uses_torchrun(spec) else []
    lines = []
    if spec.workdir:
        lines.append(f"cd -- {shlex.quote(spec.workdir)} || exit 4")
    lines.append(f"command -v {shlex.quote(python)} >/dev/null 2>&1 || exit 5")
    if modules:
        code = ("import importlib.util as u, sys; "
                "sys.exit(0 if all(u.find_spec(m) for m in sys.argv[1:]) else 6)")
        lines.append(shlex.join([python, "-c", code, *modules]))
    else:
        lines.append("exit 0")
    return "exec /bin/sh -c " + shlex.quote("; ".join(lines))



_PREFLIGHT_WHY = {4: "the working directory does not exist", 5: "the remote Python was not found",
                  6: "the remote Python cannot import a module the job needs"}


def preflight(spec: JobSpec, opts: SshOptions, slots: list[NodeSlot]) -> None:
    """Connect to every host and check it can run the job; InputError listing every host that cannot."""
    python = opts.remote_python or spec.python
    command = preflight_command(spec, python)
    needs = "gpuaccept" if spec.command is None else "torch" if uses_torchrun(spec) else ""

    def check(slot: NodeSlot) -> str | None:
        argv = ssh_argv(opts, slot.host, command)
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=opts.connect_timeout_s + 30)
        except subprocess.TimeoutExpired:
            return f"{slot.label}: no answer within {opts.connect_timeout_s + 30} s"
        except OSError as exc:
            return f"cannot run ssh: {exc.strerror}"
        if res.returncode == 0:
            return None
        err = " ".join(res.stderr.strip().splitlines()[-1:])
        if res.returncode in _PREFLIGHT_WHY:
            why = _PREFLIGHT_WHY[res.returncode]
            if res.returncode == 5:
                why += f" ({python!r}; set --remote-python)"
            elif res.returncode == 6:
                why += f" ({needs})"
            elif spec.workdir:
                why += f" ({spec.workdir!r})"
            return f"{slot.label}: {why}"
        return f"{slot.label}: {err or f'ssh exited with {res.returncode}'}"

    problems = [p for p in parallel(check, slots, opts.max_connections) if p]
    if problems:
        raise InputError(f"ssh preflight failed on {len(problems)} of {len(slots)} host(s), nothing was started: "
                         + "; ".join(problems))
