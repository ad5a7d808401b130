"""Job specs in YAML (``gpuaccept launch <backend> --spec job.yaml``), validated strictly.

A spec file holds the same settings as the flags, under their names
(``gpus_per_node`` or ``gpus-per-node``), plus three sections::

    name: acceptance
    nodes: 64
    gpus_per_node: 8
    time: 30                      # minutes
    image: nvcr.io/nvidia/pytorch:24.05-py3
    env: {NCCL_DEBUG: INFO}
    mounts: [/data:/data:ro]
    suite: {profile: quick, checks: [env, compute]}   # the default job's `gpuaccept run` options
    command: [python, train.py]   # or a user command instead of the suite
    slurm: {partition: gpu, account: ml, exclusive: true}
    k8s: {kind: pytorchjob}       # sections of other backends are allowed and ignored

Flags given on the command line win over the file; list-valued flags
(``--env``, ``--mount``, ``--sbatch-line``...) add to the file's lists.
Unknown keys, wrong types and bad values are errors naming the file and key.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import yaml

from gpuaccept.errors import ConfigError

#: Top-level keys that are job settings (argparse dests of the common launch options).
JOB_KEYS = frozenset({
    "name", "nodes", "gpus_per_node", "procs_per_node", "image", "env", "mount", "time", "workdir", "python",
    "results_dir", "run_id", "distributed", "per_node_only", "no_torchrun", "timeout", "poll_interval",
    "cluster_report",
})
#: Keys of the ``suite:`` section (``gpuaccept run`` options).
SUITE_KEYS = frozenset({
    "profile", "checks", "skip", "device", "gpus", "expect_gpus", "require_gpu", "timeout_scale", "config",
    "disk_path", "budget",
})
_ALIASES = {"mounts": "mount", "time_limit_min": "time", "gpus_per_node": "gpus_per_node"}


def load(path: str) -> dict[str, Any]:
    """Read and parse ``path``; it must be a YAML mapping."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read the spec file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(path, where, f"invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(path, "", f"a job spec is a mapping of settings, got {type(data).__name__}")
    return data


def _norm(key: Any, path: str, where: str) -> str:
    if not isinstance(key, str):
        raise ConfigError(path, where + repr(key), "keys are strings")
    k = key.replace("-", "_")
    return _ALIASES.get(k, k)


def _actions_by_name(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.Action, bool]]:
    """Option name (dest, or long flag with - as _) -> (action, negated). ``no_x`` of a store_false is negated."""
    found: dict[str, tuple[argparse.Action, bool]] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        found.setdefault(action.dest, (action, False))
        for flag in action.option_strings:
            if flag.startswith("--"):
                name = flag[2:].replace("-", "_")
                negated = isinstance(action, argparse._StoreFalseAction) and name != action.dest
                found.setdefault(name, (action, negated))
    return found


def _scalar_text(value: Any, path: str, key: str) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        raise ConfigError(path, key, f"expected a single value, got {value!r}")
    return str(value)


def _convert(action: argparse.Action, text: str, path: str, key: str) -> Any:
    value: Any = text
    if action.type is not None:
        try:
            value = action.type(text)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ConfigError(path, key, str(exc) or f"invalid value {text!r}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(path, key, f"{value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def _apply(action: argparse.Action, negated: bool, raw: Any, path: str, key: str,
           parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    dest = action.dest
    given = getattr(args, dest, None) != parser.get_default(dest)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        if not isinstance(raw, bool):
            raise ConfigError(path, key, f"expected true or false, got {raw!r}")
        if not given:
            value = raw
            if isinstance(action, argparse._StoreFalseAction):
                value = not raw if negated else raw
            setattr(args, dest, value)
        return
    if isinstance(action, argparse._AppendAction):
        items = raw if isinstance(raw, list) else [raw]
        values = [_convert(action, _scalar_text(v, path, f"{key}[{i}]"), path, f"{key}[{i}]")
                  for i, v in enumerate(items)]
        setattr(args, dest, values + list(getattr(args, dest, None) or []))
        return
    if isinstance(raw, list):
        raw = ",".join(_scalar_text(v, path, f"{key}[{i}]") for i, v in enumerate(raw))
    value = _convert(action, _scalar_text(raw, path, key), path, key)
    if not given:
        setattr(args, dest, value)


def _env_items(raw: Any, path: str) -> list[str]:
    if isinstance(raw, dict):
        items = []
        for k, v in raw.items():
            if isinstance(v, (dict, list)) or v is None:
                raise ConfigError(path, f"env.{k}", f"expected a string, number or boolean, got {v!r}")
            text = ("true" if v else "false") if isinstance(v, bool) else str(v)
            items.append(f"{k}={text}")
        return items
    if isinstance(raw, list):
        return [_scalar_text(v, path, f"env[{i}]") for i, v in enumerate(raw)]
    raise ConfigError(path, "env", "expected a mapping NAME: value (or a list of NAME=VALUE)")


def _mount_items(raw: Any, path: str) -> list[str]:
    if not isinstance(raw, list):
        raw = [raw]
    out = []
    for i, m in enumerate(raw):
        if isinstance(m, dict):
            unknown = set(m) - {"source", "target", "readonly"}
            if unknown or "source" not in m or "target" not in m:
                raise ConfigError(path, f"mounts[{i}]", "a mount is SRC:DST[:ro] or {source, target, readonly}")
            out.append(f"{m['source']}:{m['target']}" + (":ro" if m.get("readonly") else ""))
        else:
            out.append(_scalar_text(m, path, f"mounts[{i}]"))
    return out


def apply(data: dict[str, Any], path: str, parser: argparse.ArgumentParser, args: argparse.Namespace,
          backend: str, backends: list[str], backend_dests: set[str]) -> None:
    """Fill ``args`` from a spec file: values not given on the command line come from ``data``."""
    actions = _actions_by_name(parser)
    for raw_key, value in data.items():
        key = _norm(raw_key, path, "")
        if key == "backend":
            if value != backend:
                raise ConfigError(path, "backend", f"the spec is for {value!r}; this is 'launch {backend}'")
        elif key in backends:
            if key != backend:
                continue
            if not isinstance(value, dict):
                raise ConfigError(path, key, f"the {key} section is a mapping of {key} options")
            for sub_raw, sub_value in value.items():
                sub = _norm(sub_raw, path, f"{key}.")
                found = actions.get(sub)
                if found is None or found[0].dest not in backend_dests:
                    known = sorted(backend_dests)
                    raise ConfigError(path, f"{key}.{sub_raw}",
                                      f"unknown {key} option; known: {', '.join(known) or 'none'}")
                _apply(found[0], found[1], sub_value, path, f"{key}.{sub_raw}", parser, args)
        elif key == "suite":
            if not isinstance(value, dict):
                raise ConfigError(path, "suite", "the suite section is a mapping of `gpuaccept run` options")
            for sub_raw, sub_value in value.items():
                sub = _norm(sub_raw, path, "suite.")
                if sub not in SUITE_KEYS:
                    raise ConfigError(path, f"suite.{sub_raw}",
                                      f"unknown suite option; known: {', '.join(sorted(SUITE_KEYS))}")
                _apply(actions[sub][0], False, sub_value, path, f"suite.{sub_raw}", parser, args)
        elif key == "command":
            if isinstance(value, str):
                cmd = shlex.split(value)
            elif isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
                cmd = [str(v) for v in value]
            else:
                raise ConfigError(path, "command", "expected a list of strings (or one shell-quoted string)")
            if not cmd:
                raise ConfigError(path, "command", "is empty")
            if getattr(args, "command_argv", None) is None:
                args.command_argv = cmd
        elif key == "env":
            _apply(actions["env"][0], False, _env_items(value, path), path, "env", parser, args)
        elif key == "mount":
            _apply(actions["mount"][0], False, _mount_items(value, path), path, str(raw_key), parser, args)
        elif key in JOB_KEYS:
            _apply(actions[key][0], actions[key][1], value, path, str(raw_key), parser, args)
        else:
            known = sorted({*JOB_KEYS, "backend", "suite", "command", "mounts", *backends})
            raise ConfigError(path, str(raw_key), f"unknown key; known: {', '.join(known)}")
