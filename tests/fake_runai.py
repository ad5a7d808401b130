"""A recorded fake of the Run:ai v2 CLI (``runai training pytorch|mpi submit|describe|logs|delete``).

No Run:ai cluster is reachable from here. Installed on PATH as ``runai`` by
:func:`install`, it appends every argv to ``$FAKE_RUNAI_DIR/calls.jsonl`` and
answers like the real CLI for what the backend uses. It checks what was sent:
``submit`` rejects any flag that is not in the CLI reference for that
workload kind (``runai training <kind> submit --help``, as documented for
the v2 CLI) with cobra's ``Error: unknown flag: --x`` and exit 1, and needs
a name and ``--image``. The workload's phases (one per ``describe``), pods
and per-pod logs come from files the test writes in ``$FAKE_RUNAI_DIR``:
``phases.json``, ``pods.json``, ``logs/<pod>.log`` (``logs/default.log``
without ``--pod``) and optionally ``fail_submit.txt``/``fail_describe.txt``
(the error line to fail with).

For ``mpi submit`` it also checks ``--master-command`` as Kubernetes would
run it: every word must be plain (no quotes, backslashes or spaces to
interpret, so the CLI's way of splitting cannot matter), every ``$(NAME)``
in it must name a ``--master-environment`` variable, and the launcher's
command after Kubernetes' ``$(VAR)`` expansion (``$$`` is a literal ``$``)
is recorded in ``workloads.json`` as ``master_command``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

_COMMON = {
    "--allow-privilege-escalation", "--annotation", "--attach", "--auto-deletion-time-after-completion",
    "--backoff-limit", "--capability", "--command", "-c", "--configmap-map-volume", "--cpu-core-limit",
    "--cpu-core-request", "--cpu-memory-limit", "--cpu-memory-request", "--create-home-dir", "--environment", "-e",
    "--existing-pvc", "--extended-resource", "--external-url", "--git-sync", "--gpu-devices-request", "-g",
    "--gpu-memory-limit", "--gpu-memory-request", "--gpu-portion-limit", "--gpu-portion-request",
    "--gpu-request-type", "--host-ipc", "--host-network", "--host-path", "--image", "-i", "--image-pull-policy",
    "--label", "--large-shm", "--master-args", "--master-environment", "--master-extended-resource",
    "--master-no-pvcs", "--name-prefix", "--new-pvc", "--nfs", "--node-pools", "--node-type",
    "--pod-running-timeout", "--port", "--preferred-pod-topology-key", "--project", "-p",
    "--required-pod-topology-key", "--run-as-gid", "--run-as-uid", "--run-as-user", "--s3", "--seccomp-profile",
    "--stdin", "--supplemental-groups", "--termination-grace-period", "--toleration", "--tty", "-t",
    "--user-group-source", "--wait-for-submit", "--workers", "--working-dir", "--preemptible",
}
SUBMIT_FLAGS = {
    "pytorch": _COMMON | {"--master-gpu-devices-request", "--master-gpu-portion-limit", "--master-gpu-portion-request",
                          "--max-replicas", "--mig-profile", "--min-replicas", "--no-master"},
    "mpi": _COMMON | {"--clean-pod-policy", "--master-command", "--secret-volume", "--slots-per-worker"},
}
BOOLEAN = {"--allow-privilege-escalation", "--attach", "--command", "-c", "--create-home-dir", "--host-ipc",
           "--host-network", "--large-shm", "--master-no-pvcs", "--no-master", "--run-as-user", "--stdin", "--tty",
           "-t", "--preemptible"}


_REF = re.compile(r"\$\(([^)]*)\)")


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a command word or env value: ``$$`` is ``$``, ``$(NAME)`` the value of a
    defined NAME (else left as written), any other ``$`` itself."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        m = _REF.match(text, i)
        if m:
            out.append(env.get(m.group(1), m.group(0)))
            i = m.end()
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _master_command(flags: dict[str, list[str]]) -> list[str] | None:
    """The launcher container's command after expansion; fails like a broken workload would be refused."""
    if "--master-command" not in flags:
        return None
    text = flags["--master-command"][-1]
    words = text.split()
    if shlex.split(text) != words or any(c in text for c in "'\"\\"):
        _fail(f"--master-command {text!r}: words that need quoting depend on how the CLI splits them")
    raw = dict(v.partition("=")[::2] for v in flags.get("--master-environment", []))
    env: dict[str, str] = {}
    for name, value in raw.items():  # in order: later values may use earlier ones
        env[name] = k8s_expand(value, env)
    for name in _REF.findall(text):
        if name not in env:
            _fail(f"--master-command refers to $({name}), which no --master-environment defines")
    return [k8s_expand(w, env) for w in words]


def install(bin_dir: Path, state_dir: Path) -> Path:
    """Write an executable ``runai`` into ``bin_dir`` that runs this fake with ``state_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "runai"
    program = Path(__file__).resolve()
    exe.write_text(f'#!/bin/sh\nFAKE_RUNAI_DIR="{state_dir}" exec "{sys.executable}" "{program}" "$@"\n')
    exe.chmod(0o755)
    return exe


def calls(state_dir: Path) -> list[list[str]]:
    path = state_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _fail(message: str) -> None:
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(1)


def _options(args: list[str], allowed: set[str] | None) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(positionals, flags, after --) as cobra parses them; unknown flags fail when ``allowed`` is given."""
    positionals: list[str] = []
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return positionals, flags, args[i + 1:]
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if allowed is not None and name not in allowed:
                _fail(f"unknown flag: {name}")
            if name in BOOLEAN:
                flags.setdefault(name, []).append("true")
            elif eq:
                flags.setdefault(name, []).append(value)
            else:
                if i + 1 >= len(args):
                    _fail(f"flag needs an argument: {name}")
                flags.setdefault(name, []).append(args[i + 1])
                i += 1
        else:
            positionals.append(a)
        i += 1
    return positionals, flags, []


def main(argv: list[str]) -> None:
    state = Path(os.environ["FAKE_RUNAI_DIR"])
    with (state / "calls.jsonl").open("a") as f:
        f.write(json.dumps(argv) + "\n")
    if len(argv) < 3 or argv[0] != "training" or argv[1] not in SUBMIT_FLAGS:
        _fail(f"unknown command {' '.join(argv[:3])!r} for \"runai\"")
    kind, verb, rest = argv[1], argv[2], argv[3:]
    workloads = state / "workloads.json"
    known = json.loads(workloads.read_text()) if workloads.exists() else {}
    if verb == "submit":
        pos, flags, after = _options(rest, SUBMIT_FLAGS[kind])
        if len(pos) != 1:
            _fail(f"accepts 1 arg(s), received {len(pos)}")
        if "--image" not in flags and "-i" not in flags:
            _fail("image is required")
        if (state / "fail_submit.txt").exists():
            _fail((state / "fail_submit.txt").read_text().strip())
        name = pos[0]
        if name in known:
            _fail(f"workload {name} already exists in the project")
        master = _master_command(flags) if kind == "mpi" else None
        known[name] = {"kind": kind, "project": (flags.get("--project") or ["default"])[0], "command": after,
                       "master_command": master}
        workloads.write_text(json.dumps(known))
        print(f"Creating {kind} training workload '{name}'...")
        print(f"The workload '{name}' has been submitted successfully")
        return
    pos, flags, _ = _options(rest, None)
    if not pos or pos[0] not in known:
        _fail(f"workload {pos[0] if pos else ''!r} not found")
    name = pos[0]
    if verb == "describe":
        if (state / "fail_describe.txt").exists():
            _fail((state / "fail_describe.txt").read_text().strip())
        phases = json.loads((state / "phases.json").read_text()) if (state / "phases.json").exists() else ["Running"]
        phase = phases.pop(0) if len(phases) > 1 else phases[0]
        (state / "phases.json").write_text(json.dumps(phases))
        pods = json.loads((state / "pods.json").read_text()) if (state / "pods.json").exists() else []
        if (flags.get("--output") or flags.get("-o") or ["table"])[0] != "json":
            print(f"Name: {name}\nStatus: {phase}")
            return
        print(json.dumps({"general": {"name": name, "project": known[name]["project"], "type": f"{kind}",
                                      "status": phase},
                          "pods": [{"name": p, "status": phase, "node": f"node-{i}"} for i, p in enumerate(pods)]},
                         indent=2))
    elif verb == "logs":
        pod = (flags.get("--pod") or ["default"])[0]
        path = state / "logs" / f"{pod}.log"
        if not path.exists():
            _fail(f"pod {pod} not found")
        sys.stdout.write(path.read_text())
    elif verb == "delete":
        del known[name]
        workloads.write_text(json.dumps(known))
        print(f"Successfully deleted {kind} training workload '{name}'")
    else:
        _fail(f"unknown command {verb!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
