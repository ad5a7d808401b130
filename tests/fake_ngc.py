"""A recorded fake of the NGC CLI for Base Command (``ngc base-command job run|info|kill``, ``result download``).

No NGC account or Base Command cluster is reachable from here. Installed on
PATH as ``ngc`` by :func:`install`, it appends every argv to
``$FAKE_NGC_DIR/calls.jsonl`` and answers in the shape of the NGC CLI
reference examples. It checks what was sent: ``job run`` rejects any option
that is not one of the documented/published ``job run`` flags (argparse's
``unrecognized arguments`` and exit 2), needs ``--name``, ``--image``,
``--instance``, ``--result`` and ``--commandline``, checks ``--array-type``
(MPI or PYTORCH, only with ``--replicas`` > 1), ``--total-runtime``
(``<n>s|m|h|d|w``), ``--workspace`` (``ID:MOUNT:RW|RO``), ``--datasetid``
and ``--env-var`` (``NAME:VALUE``). The statuses (one per ``job info``) come
from ``statuses.json``; ``result download ID[:REPLICA] --dest D`` copies the
tree ``results/<ID or ID_REPLICA>/`` to ``D/<ID or ID_REPLICA>/``;
``fail_run.txt`` and ``fail_info.txt`` hold an error line to fail with.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

_SCOPE = {"--ace", "--org", "--team", "--format_type", "--debug"}
RUN_FLAGS = _SCOPE | {
    "--name", "--image", "--instance", "--commandline", "--result", "--replicas", "--array-type",
    "--total-runtime", "--workspace", "--datasetid", "--preempt", "--priority", "--order", "--min-timeslice",
    "--label", "--env-var", "--port", "--file", "-f",
}
BOOLEAN = {"--debug"}
REPEATABLE = {"--workspace", "--datasetid", "--label", "--env-var", "--port"}


def install(bin_dir: Path, state_dir: Path) -> Path:
    """Write an executable ``ngc`` into ``bin_dir`` that runs this fake with ``state_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "ngc"
    exe.write_text(f'#!/bin/sh\nFAKE_NGC_DIR="{state_dir}" exec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    exe.chmod(0o755)
    return exe


def calls(state_dir: Path) -> list[list[str]]:
    path = state_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _fail(message: str, code: int = 1) -> None:
    print(f"ngc: error: {message}", file=sys.stderr)
    sys.exit(code)


def _options(args: list[str], allowed: set[str] | None) -> tuple[list[str], dict[str, list[str]]]:
    positionals: list[str] = []
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if allowed is not None and name not in allowed:
                _fail(f"unrecognized arguments: {name}", 2)
            if name in BOOLEAN:
                flags.setdefault(name, []).append("true")
            else:
                if not eq:
                    if i + 1 >= len(args):
                        _fail(f"argument {name}: expected one argument", 2)
                    value = args[i + 1]
                    i += 1
                if name in flags and name not in REPEATABLE:
                    _fail(f"argument {name}: given twice", 2)
                flags.setdefault(name, []).append(value)
        else:
            positionals.append(a)
        i += 1
    return positionals, flags


def _check_run(flags: dict[str, list[str]]) -> None:
    for need in ("--name", "--image", "--instance", "--result", "--commandline"):
        if need not in flags:
            _fail(f"the following arguments are required: {need}", 2)
    replicas = int(flags.get("--replicas", ["1"])[0])
    array = flags.get("--array-type", [None])[0]
    if array is not None and array not in ("MPI", "PYTORCH"):
        _fail(f"argument --array-type: invalid choice: {array!r}", 2)
    if (replicas > 1) != (array is not None):
        _fail("--replicas > 1 and --array-type go together", 2)
    for value in flags.get("--total-runtime", []):
        if not re.fullmatch(r"\d+[smhdwSMHDW]", value):
            _fail(f"argument --total-runtime: invalid value {value!r}", 2)
    for value in flags.get("--workspace", []):
        if not re.fullmatch(r"[A-Za-z0-9._-]+:/[^:]*:(RW|RO)", value):
            _fail(f"argument --workspace: invalid value {value!r}", 2)
    for value in flags.get("--datasetid", []):
        if not re.fullmatch(r"[A-Za-z0-9_-]+:/[^:]*", value):
            _fail(f"argument --datasetid: invalid value {value!r}", 2)
    for value in flags.get("--env-var", []):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*:.*", value, re.DOTALL):
            _fail(f"argument --env-var: invalid value {value!r}", 2)


def main(argv: list[str]) -> None:
    state = Path(os.environ["FAKE_NGC_DIR"])
    with (state / "calls.jsonl").open("a") as f:
        f.write(json.dumps(argv) + "\n")
    if argv[:1] != ["base-command"] or len(argv) < 3:
        _fail(f"invalid choice: {' '.join(argv[:3])!r}", 2)
    group, verb, rest = argv[1], argv[2], argv[3:]
    jobs_path = state / "jobs.json"
    jobs = json.loads(jobs_path.read_text()) if jobs_path.exists() else {}
    if (group, verb) == ("job", "run"):
        _pos, flags = _options(rest, RUN_FLAGS)
        _check_run(flags)
        if (state / "fail_run.txt").exists():
            _fail((state / "fail_run.txt").read_text().strip())
        job_id = str(4242000 + len(jobs))
        jobs[job_id] = {"name": flags["--name"][0], "commandline": flags["--commandline"][0]}
        jobs_path.write_text(json.dumps(jobs))
        print(f"""--------------------------------------------------
  Job Information
    Id: {job_id}
    Name: {flags['--name'][0]}
    Number of Replicas: {flags.get('--replicas', ['1'])[0]}
    Job Type: BATCH
  Job Container Information
    Docker Image URL: {flags['--image'][0]}
  Job Status
    Status: CREATED
    Preempt Class: {flags.get('--preempt', ['RUNONCE'])[0]}
--------------------------------------------------""")
        return
    pos, flags = _options(rest, None)
    target = pos[0] if pos else ""
    if target.split(":")[0] not in jobs:
        _fail(f"Job '{target}' could not be found.")
    if (group, verb) == ("job", "info"):
        if (state / "fail_info.txt").exists():
            _fail((state / "fail_info.txt").read_text().strip())
        statuses = json.loads((state / "statuses.json").read_text()) if (state / "statuses.json").exists() \
            else ["RUNNING"]
        status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
        (state / "statuses.json").write_text(json.dumps(statuses))
        print(f"""--------------------------------------------------
  Job Information
    Id: {target}
    Name: {jobs[target]['name']}
    Job Type: BATCH
  Job Status
    Status: {status}
    Status Type: OK
    Preempt Class: RUNONCE
--------------------------------------------------""")
    elif (group, verb) == ("job", "kill"):
        if jobs[target].get("killed"):
            _fail(f"Job '{target}' is already in a terminal state.")
        jobs[target]["killed"] = True
        jobs_path.write_text(json.dumps(jobs))
        print(f"Submitted kill request for job Id: {target}")
    elif (group, verb) == ("result", "download"):
        name = target.replace(":", "_")
        source = state / "results" / name
        if not source.is_dir():
            _fail(f"Result for '{target}' could not be found.")
        dest = Path(flags.get("--dest", ["."])[0]) / name
        shutil.copytree(source, dest, dirs_exist_ok=True)
        print(f"Downloaded local path: {dest}")
    else:
        _fail(f"invalid choice: {group} {verb}", 2)


if __name__ == "__main__":
    main(sys.argv[1:])
