"""Slurm hostlist expressions, expanded without calling ``scontrol``.

``expand_hostlist("node[01-03,7],gpu5")`` gives ``["node01", "node02", "node03",
"node7", "gpu5"]``, the same as ``scontrol show hostnames 'node[01-03,7],gpu5'``.
Zero padding of a range's lower bound is kept (``[08-10]`` gives ``08 09 10``),
several bracket groups in one name expand as a product in order
(``r[1-2]n[1-2]`` gives ``r1n1 r1n2 r2n1 r2n2``), and duplicates are kept
(Slurm keeps them too). Pure functions; bad input raises
:class:`~gpuaccept.errors.InputError`.
"""

from __future__ import annotations

from gpuaccept.errors import InputError

MAX_HOSTS = 1_000_000


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise InputError(f"Slurm host list {text!r}: nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise InputError(f"Slurm host list {text!r}: ']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise InputError(f"Slurm host list {text!r}: '[' is never closed")
    parts.append(text[start:])
    return parts


def _range_items(body: str, whole: str) -> list[str]:
    """``01-03,7`` -> ``["01", "02", "03", "7"]``."""
    items: list[str] = []
    for piece in body.split(","):
        lo, sep, hi = piece.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise InputError(f"Slurm host list {whole!r}: {piece!r} is not a number or a range like 1-4")
        if not sep:
            items.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise InputError(f"Slurm host list {whole!r}: range {piece!r} goes down")
        if b - a + 1 > MAX_HOSTS:
            raise InputError(f"Slurm host list {whole!r}: range {piece!r} is implausibly large")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        items.extend(str(n).zfill(width) for n in range(a, b + 1))
    return items


def _expand_one(name: str, whole: str) -> list[str]:
    """Expand one comma-free entry such as ``rack[1-2]-n[01-04]``."""
    out = [""]
    i = 0
    while i < len(name):
        j = name.find("[", i)
        if j < 0:
            out = [o + name[i:] for o in out]
            break
        k = name.index("]", j)
        items = _range_items(name[j + 1:k], whole)
        out = [o + name[i:j] + item for o in out for item in items]
        if len(out) > MAX_HOSTS:
            raise InputError(f"Slurm host list {whole!r} expands to more than {MAX_HOSTS} hosts")
        i = k + 1
    return out


def expand_hostlist(text: str) -> list[str]:
    """Every host name of a Slurm hostlist expression, in order (``scontrol show hostnames``)."""
    text = text.strip()
    if not text:
        raise InputError("Slurm host list is empty")
    if any(ch.isspace() for ch in text):
        raise InputError(f"Slurm host list {text!r} contains white space")
    hosts: list[str] = []
    for part in _split_top(text):
        if not part:
            raise InputError(f"Slurm host list {text!r} has an empty entry")
        hosts.extend(_expand_one(part, text))
    return hosts


def first_host(text: str) -> str:
    """The first host of a hostlist (where Slurm runs task 0 with the default block distribution)."""
    return expand_hostlist(text)[0]


def expand_tasks_per_node(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) to ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        num, sep, rest = part.partition("(x")
        if not num.isdigit() or (sep and not (rest.endswith(")") and rest[:-1].isdigit())):
            raise InputError(f"tasks per node {text!r}: {part!r} is not N or N(xM)")
        counts.extend([int(num)] * (int(rest[:-1]) if sep else 1))
    return counts
