"""Parse nccl-tests output: the text table of any version and the JSON file written by ``-J``.

Text (``all_reduce_perf -b 8 -e 1G -f 2 -g 8 | tee log``): the ``# Rank`` device lines, the
column header (``# size count type redop root time algbw busbw #wrong time ...``), one row per
size and type with the out-of-place and in-place ``time`` (µs; ``cputime`` under ``-C 1``),
``algbw`` and ``busbw`` (GB/s, 10^9 B/s) and ``#wrong`` (elements outside the tolerance; ``N/A``
under ``-c 0``), and the footer (``# Out of bounds values : N OK|FAILED``, ``# Avg bus bandwidth
: X [OK|FAILED]``). The columns are read from the header, so older layouts parse too: the
``error`` column (the largest error, a float) instead of ``#wrong``, no ``root``, no ``redop``,
and ``-S 1``'s trailing ``timestamp``; a row one field short of a header with ``redop root`` is
an old build's test without a reduction (alltoall, alltoallv, all_gather of nccl-tests before 2.13
print the op name ``""``: an empty ``redop`` then the root), read with ``redop`` ``""``. Lines
prefixed by ``mpirun --tag-output`` (``[1,0]<stdout>:``) or ``srun --label`` (``0: ``) are
unprefixed first; other lines between the rows (NCCL INFO logging) are ignored.

Anything that is not nccl-tests output, or a row that does not fit its header, is an
:class:`~gpuaccept.errors.InputError`, never a partial result. Every number is finite and >= 0.
:func:`parse_text` reads one run; :func:`parse_runs` reads a log of several runs one after
another (a script looping over tests into one file), each on its own (:func:`split_runs`).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.errors import InputError

_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<(stdout|stderr)>:")
_SLURM_PREFIX = re.compile(r"^\s*\d+: ")
_DEVICE = re.compile(r"^#\s+Rank\s+(\d+)(?:\s+Group\s+(\d+))?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
                     r"\s+\[([^\]]*)\]\s+(.*?)\s*$")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)\s*$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?\s*$")
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\b")
_CONFIG = re.compile(r"^#?\s*nThread\s+\d+\s+nGpus\s+\d+\s+minBytes")
_ERROR = re.compile(r"^#\s*error:\s*(.+?)\s*$")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}$|^\d{2}:\d{2}:\d{2}$")
PREFIX_COLUMNS = ("size", "count", "type", "redop", "root")
TIME_COLUMNS = ("time", "cputime")
CHECK_COLUMNS = ("#wrong", "error")


@dataclass(frozen=True)
class Device:
    """One ``# Rank`` line: rank, group (None before groups existed), pid, host, CUDA device, PCI id, name."""

    rank: int
    group: int | None
    pid: int
    host: str
    device: int
    pci: str
    name: str


@dataclass(frozen=True)
class Measure:
    """One placement of a row: time (µs), algbw and busbw (GB/s) and the check column.

    ``wrong`` is ``#wrong`` (elements) or, in old versions, ``error`` (the largest error);
    None when the check was off (``N/A``).
    """

    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: float | None


@dataclass(frozen=True)
class Row:
    """One size: bytes, elements, type, reduction (None: no column), root (None: no column), placements."""

    size_bytes: int
    count: int
    type: str
    redop: str | None
    root: int | None
    out_of_place: Measure | None
    in_place: Measure | None
    timestamp: str | None = None


@dataclass(frozen=True)
class Footer:
    """``# Out of bounds values`` and ``# Avg bus bandwidth`` (GB/s); ``*_ok`` None where not checked."""

    out_of_bounds: int
    out_of_bounds_ok: bool
    avg_busbw_gbs: float | None
    avg_busbw_ok: bool | None


@dataclass
class NcclTestsResult:
    """A parsed run. ``check_column`` is ``#wrong`` or ``error``; ``time_column`` ``time`` or ``cputime``.

    ``footer`` is None when the output ends before it (a crash or a cut-off log).
    """

    program: str | None
    devices: list[Device]
    rows: list[Row]
    footer: Footer | None
    check_column: str = "#wrong"
    time_column: str = "time"
    errors: list[str] = field(default_factory=list)
    source: str = "text"

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(d.host for d in self.devices))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hosts"] = self.hosts
        return d


def _unprefix(line: str) -> str:
    m = _MPI_PREFIX.match(line)
    if m:
        return line[m.end():]
    m = _SLURM_PREFIX.match(line)
    return line[m.end():] if m else line


def _number(text: str, what: str, lineno: int, *, integral: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"line {lineno}: {what} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"line {lineno}: {what} {text!r} is not a finite number >= 0")
    if integral and value != int(value):
        raise InputError(f"line {lineno}: {what} {text!r} is not a whole number")
    return value


def _measure(tokens: list[str], lineno: int, check: str) -> Measure:
    time_s, alg, bus, wrong = tokens
    return Measure(
        time_us=_number(time_s, "time", lineno), algbw_gbs=_number(alg, "algbw", lineno),
        busbw_gbs=_number(bus, "busbw", lineno),
        wrong=None if wrong == "N/A" else _number(wrong, check, lineno, integral=check == "#wrong"))


@dataclass
class _Layout:
    prefix: list[str]
    time_column: str
    check_column: str
    timestamp: bool

    @classmethod
    def from_header(cls, tokens: list[str], lineno: int) -> _Layout:
        """The layout named by a header such as ``size count type redop root time algbw busbw #wrong ...``."""
        i = next((k for k, t in enumerate(tokens) if t in TIME_COLUMNS), None)
        if i is None or tokens[:3] != ["size", "count", "type"] or not set(tokens[3:i]) <= set(PREFIX_COLUMNS):
            raise InputError(f"line {lineno}: unknown nccl-tests column header: {' '.join(tokens)}")
        rest = tokens[i:]
        timestamp = rest[-1:] == ["timestamp"]
        if timestamp:
            rest = rest[:-1]
        if len(rest) != 8 or rest[4] != rest[0] or rest[1:3] != ["algbw", "busbw"] or rest[5:7] != rest[1:3] \
                or rest[3] not in CHECK_COLUMNS or rest[7] != rest[3]:
            raise InputError(f"line {lineno}: unknown nccl-tests column header: {' '.join(tokens)}")
        return cls(tokens[:i], rest[0], rest[3], timestamp)

    def row(self, tokens: list[str], lineno: int) -> Row:
        want = len(self.prefix) + 8 + (2 if self.timestamp else 0)
        if len(tokens) == want - 1 and self.prefix[3:] == ["redop", "root"] and re.fullmatch(r"-?\d+", tokens[3]):
            tokens = [*tokens[:3], "", *tokens[3:]]  # an old build's empty op name (alltoall, all_gather < 2.13)
        if len(tokens) != want:
            raise InputError(f"line {lineno}: a result row with {len(tokens)} fields where the header has {want}: "
                             f"{' '.join(tokens)}")
        named = dict(zip(self.prefix, tokens, strict=False))
        n = len(self.prefix)
        stamp = None
        if self.timestamp:
            if not all(_TIMESTAMP.match(t) for t in tokens[-2:]):
                raise InputError(f"line {lineno}: {' '.join(tokens[-2:])!r} is not a timestamp")
            stamp = " ".join(tokens[-2:])
        root = None
        if "root" in named:
            try:
                root = int(named["root"])
            except ValueError:
                raise InputError(f"line {lineno}: root {named['root']!r} is not an integer") from None
        return Row(size_bytes=int(_number(named["size"], "size", lineno, integral=True)),
                   count=int(_number(named["count"], "count", lineno, integral=True)),
                   type=named["type"], redop=named.get("redop"), root=root,
                   out_of_place=_measure(tokens[n:n + 4], lineno, self.check_column),
                   in_place=_measure(tokens[n + 4:n + 8], lineno, self.check_column), timestamp=stamp)


def runs_in(text: str) -> int:
    """How many nccl-tests runs a log holds: its ``# nThread .. nGpus .. minBytes`` lines, prefixes removed (pure).

    One MPI job prints one (rank 0's); tasks started without MPI print one each."""
    return sum(1 for raw in text.splitlines() if _CONFIG.match(_unprefix(raw).strip()))


def _is_header(line: str) -> bool:
    return line.startswith("#") and line[1:].split()[:3] == ["size", "count", "type"]


def split_runs(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each run in a log of nccl-tests runs one after another (pure).

    A run starts at its ``# nccl-tests version``, ``# Collective test starting`` or ``# nThread`` line,
    whichever comes first once the run before has its column header, or at a column header after the
    run before has its footer. One run: the whole text."""
    runs: list[tuple[int, list[str]]] = [(1, [])]
    table = footer = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _unprefix(raw).strip()
        starts = bool(_CONFIG.match(line) or _START.match(line) or _VERSION.match(line))
        if (starts and table) or (_is_header(line) and footer):
            runs.append((lineno, []))
            table = footer = False
        table = table or _is_header(line)
        footer = footer or bool(_OOB.match(line))
        runs[-1][1].append(raw)
    return [(first, "\n".join(lines) + "\n") for first, lines in runs]


def parse_runs(text: str) -> list[NcclTestsResult]:
    """Every run of a log (:func:`split_runs`), each parsed alone; a ``-J`` JSON document is one run. Raises
    InputError naming the run and its line when one of them is not nccl-tests output."""
    if text.lstrip().startswith("{"):
        return [parse_any(text)]
    runs = split_runs(text)
    out = []
    for k, (first, chunk) in enumerate(runs, 1):
        try:
            out.append(parse_text(chunk, first_line=first))
        except InputError as exc:
            if len(runs) == 1:
                raise
            raise InputError(f"run {k} of {len(runs)} (from line {first}): {exc}") from None
    return out


def parse_text(text: str, *, first_line: int = 1) -> NcclTestsResult:
    """Parse the stdout of one nccl-tests binary (see the module docstring); line numbers in errors count
    from ``first_line``. Raises InputError."""
    devices: list[Device] = []
    rows: list[Row] = []
    errors: list[str] = []
    layout: _Layout | None = None
    footer_oob: tuple[int, bool] | None = None
    avg: tuple[float, bool | None] | None = None
    program = None
    configs = 0
    for lineno, raw in enumerate(text.splitlines(), first_line):
        line = _unprefix(raw).rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if _CONFIG.match(stripped):
            configs += 1
            if configs > 1 and (rows or footer_oob is not None):
                raise InputError(f"line {lineno}: a second nccl-tests run starts here; parse one run at a time")
            continue
        if stripped.startswith("#"):
            body = stripped[1:].split()
            if m := _DEVICE.match(stripped):
                devices.append(Device(int(m[1]), int(m[2]) if m[2] is not None else None, int(m[3]), m[4],
                                      int(m[5]), m[6], m[7]))
            elif body[:3] == ["size", "count", "type"]:
                new = _Layout.from_header(body, lineno)
                if layout is not None and (new != layout or footer_oob is not None):
                    raise InputError(f"line {lineno}: a second result table starts here; parse one run at a time")
                layout = new
            elif m := _OOB.match(stripped):
                footer_oob = (int(m[1]), m[2] == "OK")
            elif m := _AVG.match(stripped):
                value = _number(m[1], "Avg bus bandwidth", lineno)
                avg = (value, None if m[2] is None else m[2] == "OK")
            elif m := _START.match(stripped):
                program = m[1]
            elif m := _ERROR.match(stripped):
                errors.append(m[1])
            continue
        if layout is not None and footer_oob is None and stripped[0].isdigit() and re.match(r"^\d+\s+\d+\s", stripped):
            rows.append(layout.row(stripped.split(), lineno))
    if layout is None:
        raise InputError("not nccl-tests output: no '# size count type ...' column header")
    if not rows:
        raise InputError("nccl-tests output without a single result row")
    if footer_oob is None and avg is not None:
        raise InputError("nccl-tests footer has 'Avg bus bandwidth' but no 'Out of bounds values' line")
    footer = None
    if footer_oob is not None:
        footer = Footer(footer_oob[0], footer_oob[1], avg[0] if avg else None, avg[1] if avg else None)
    return NcclTestsResult(program, devices, rows, footer, layout.check_column, layout.time_column, errors)


def strip_env(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of a ``-J`` document without its ``env`` list (the whole environment: it can hold secrets)."""
    return {k: v for k, v in doc.items() if k != "env"}


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"nccl-tests JSON: {where} has no {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise InputError(f"nccl-tests JSON: {where}.{key} is {value!r}, not {getattr(kind, '__name__', kind)}")
    return value


def _json_number(obj: Any, key: str, where: str) -> float:
    value = float(_field(obj, key, (int, float), where))
    if not math.isfinite(value) or value < 0:
        raise InputError(f"nccl-tests JSON: {where}.{key} = {value!r} is not a finite number >= 0")
    return value


def _json_measure(obj: Any, where: str) -> tuple[Measure | None, str]:
    if obj is None:
        return None, "time"
    time_key = "cpu_time" if isinstance(obj, dict) and "cpu_time" in obj else "time"
    wrong = obj.get("nwrong") if isinstance(obj, dict) else None
    m = Measure(_json_number(obj, time_key, where), _json_number(obj, "alg_bw", where),
                _json_number(obj, "bus_bw", where), None if wrong is None else _json_number(obj, "nwrong", where))
    if m.wrong is not None and m.wrong != int(m.wrong):
        raise InputError(f"nccl-tests JSON: {where}.nwrong = {m.wrong!r} is not a whole number")
    return m, "cputime" if time_key == "cpu_time" else "time"


def _json_bool(value: Any, where: str) -> bool | None:
    """nccl-tests writes booleans as the strings "true"/"false" ("unchecked" for no threshold)."""
    if value in (True, "true"):
        return True
    if value in (False, "false"):
        return False
    if value == "unchecked":
        return None
    raise InputError(f"nccl-tests JSON: {where} = {value!r} is not true, false or unchecked")


def parse_json_doc(doc: Any) -> NcclTestsResult:
    """Parse a ``-J`` document (nccl-tests' ``src/util.cu``, JSON file version 1). Raises InputError."""
    if not isinstance(doc, dict) or "results" not in doc:
        raise InputError("not an nccl-tests JSON file: no 'results' list")
    if doc.get("version") != 1:
        raise InputError(f"nccl-tests JSON version {doc.get('version')!r} is not supported (only 1)")
    raw_config = doc.get("config")
    config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
    raw_devices = config.get("devices", doc.get("devices", []))
    if not isinstance(raw_devices, list):
        raise InputError("nccl-tests JSON: config.devices is not a list")
    devices = []
    for i, d in enumerate(raw_devices):
        w = f"devices[{i}]"
        devices.append(Device(_field(d, "rank", int, w), d.get("group") if isinstance(d.get("group"), int) else None,
                              _field(d, "pid", int, w), _field(d, "hostname", str, w), _field(d, "device", int, w),
                              _field(d, "device_hex", str, w), _field(d, "device_info", str, w)))
    results = doc["results"]
    if not isinstance(results, list) or not results:
        raise InputError("nccl-tests JSON: 'results' is empty or not a list")
    rows, time_column = [], "time"
    for i, r in enumerate(results):
        w = f"results[{i}]"
        root_text = str(_field(r, "root", (str, int), w)).strip()
        try:
            root = int(root_text)
        except ValueError:
            raise InputError(f"nccl-tests JSON: {w}.root {root_text!r} is not an integer") from None
        out, kind_out = _json_measure(r.get("out_of_place"), f"{w}.out_of_place")
        inp, kind_in = _json_measure(r.get("in_place"), f"{w}.in_place")
        time_column = kind_out if out is not None else kind_in
        size = _field(r, "size", int, w)
        count = _field(r, "count", int, w)
        if size < 0 or count < 0:
            raise InputError(f"nccl-tests JSON: {w} has a negative size or count")
        rows.append(Row(size, count, _field(r, "type", str, w), _field(r, "redop", str, w), root, out, inp))
    footer = None
    if "out_of_bounds" in doc:
        oob = doc["out_of_bounds"]
        count = _field(oob, "count", int, "out_of_bounds")
        avg = doc.get("average_bus_bandwidth")
        oob_ok = _json_bool(_field(oob, "okay", (str, bool), "out_of_bounds"), "out_of_bounds.okay")
        footer = Footer(count, bool(oob_ok),
                        _json_number(avg, "bandwidth", "average_bus_bandwidth") if avg is not None else None,
                        _json_bool(avg.get("okay"), "average_bus_bandwidth.okay") if isinstance(avg, dict) else None)
    errs = doc.get("errors", [])
    errors = [e for e in errs if isinstance(e, str) and e] if isinstance(errs, list) else []
    args = doc.get("args")
    program = args[0].rsplit("/", 1)[-1] if isinstance(args, list) and args and isinstance(args[0], str) else None
    return NcclTestsResult(program, devices, rows, footer, "#wrong", time_column, errors, source="json")


def parse_any(text: str) -> NcclTestsResult:
    """A ``-J`` JSON document when ``text`` starts with ``{``, else the text output."""
    if text.lstrip().startswith("{"):
        from gpuaccept.inputs import loads_json

        try:
            doc = loads_json(text, "nccl-tests JSON")
        except InputError as exc:
            raise InputError(f"{exc} (a cut-off file?)") from None
        return parse_json_doc(doc)
    return parse_text(text)
