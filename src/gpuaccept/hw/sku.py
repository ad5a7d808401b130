"""Per-SKU reference data: spec peaks, bandwidths and pass fractions by GPU model.

The data lives in ``gpuaccept/data/skus.yaml``; this module loads it strictly
(unknown keys and wrong types raise :class:`~gpuaccept.errors.ConfigError`)
and maps the name NVML or torch reports (``nvidia-smi --query-gpu=name``,
``torch.cuda.get_device_name()``) to a :class:`Sku`. Imports nothing heavy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpuaccept.errors import ConfigError

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
MIG_WORD = "MIG"
"""The word in the name of a MIG instance (``... MIG 1g.10gb``), which no SKU describes."""

# PCIe transfer rate per lane in GT/s and line-code efficiency, by generation.
_PCIE_GTS = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
             5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}

_TOP_KEYS = {"version", "defaults", "skus"}
_DEFAULTS_KEYS = {"pass_fractions"}
_SKU_REQUIRED = {"id", "name", "source", "match", "compute_capability", "memory_gib", "peak_tflops",
                 "memory_bandwidth_gbs", "pcie", "nvlink_gbs", "max_power_w"}
_SKU_OPTIONAL = {"exclude", "pass_fractions", "nvlink_all_pairs", "fp64_vector_tflops", "p2p_gbs", "h2d_gbs"}
_PCIE_KEYS = {"gen", "width"}
_ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_CC_RE = re.compile(r"^\d+\.\d+$")


def pcie_gbs(gen: int, width: int) -> float:
    """Theoretical PCIe bandwidth per direction in GB/s of a gen ``gen`` x``width`` link (gen5 x16: 63.0):
    GT/s per lane x line-code efficiency x lanes / 8. KeyError for a generation outside 1..6."""
    rate, efficiency = _PCIE_GTS[gen]
    return rate * efficiency * width / 8


def _words(text: str) -> frozenset[str]:
    """Upper-case words of a GPU name; '-' and '_' separate words like spaces."""
    return frozenset(re.sub(r"[-_\s]+", " ", text).upper().split())


@dataclass(frozen=True)
class Sku:
    """One GPU model's reference data (units as in ``skus.yaml``)."""

    id: str
    name: str
    source: str
    match: tuple[frozenset[str], ...]
    exclude: frozenset[str]
    compute_capability: tuple[int, int]
    memory_gib: float
    peak: Mapping[str, float] = field(hash=False)
    memory_bandwidth_gbs: float
    pcie_gen: int
    pcie_width: int
    nvlink_gbs: float | None
    max_power_w: float
    pass_fractions: Mapping[str, float] = field(hash=False)
    nvlink_all_pairs: bool = False
    """NVLink joins every pair of GPUs on every board this part ships on (NVSwitch, or a full mesh)."""
    fp64_vector_tflops: float | None = None
    """FP64 peak of the CUDA cores (no tensor cores) in TFLOP/s, what a hand-written fp64 kernel can reach
    (``peak_tflops['fp64']`` is the tensor-core figure DGEMM reaches); None where the datasheet omits it."""
    p2p_gbs: float | None = None
    """Copy bandwidth from one GPU to a peer, one direction, in GB/s, that a healthy board of this part reaches
    (``nvbandwidth -t device_to_device_memcpy_read_ce``); None: derived from the NVLink or PCIe links instead."""
    h2d_gbs: float | None = None
    """Pinned host-to-device (and device-to-host) copy bandwidth per direction in GB/s that a healthy node of this
    part reaches (``nvbandwidth -t host_to_device_memcpy_ce``); None: derived from the PCIe link instead."""

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense spec peak in TFLOP/s for ``dtype`` (``fp64`` ... ``fp8``), None if not specified."""
        return self.peak.get(dtype)

    def pass_fraction(self, family: str) -> float:
        """Fraction of the spec value a measurement of ``family`` must reach.

        Looks up ``family`` then its prefixes (``gemm_bf16`` -> ``gemm``);
        raises KeyError when none is defined.
        """
        parts = family.split("_")
        for i in range(len(parts), 0, -1):
            key = "_".join(parts[:i])
            if key in self.pass_fractions:
                return self.pass_fractions[key]
        raise KeyError(f"no pass fraction for {family!r} in SKU {self.id!r}")

    def pcie_bandwidth_gbs(self) -> float:
        """Theoretical PCIe bandwidth per direction in GB/s (gen5 x16: 63.0)."""
        return pcie_gbs(self.pcie_gen, self.pcie_width)

    def match_rank(self, gpu_name: str) -> int:
        """Number of words of the most specific matching pattern, 0 for no match."""
        words = _words(gpu_name)
        if words & self.exclude:
            return 0
        return max((len(p) for p in self.match if p <= words), default=0)


def _fail(source: str, key: str, reason: str) -> ConfigError:
    return ConfigError(source, key, reason)


def _number(raw: Any, source: str, key: str, *, positive: bool = True) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise _fail(source, key, f"expected a number, got {type(raw).__name__} {raw!r}")
    if positive and not raw > 0:
        raise _fail(source, key, f"must be > 0, got {raw!r}")
    return float(raw)


def _string(raw: Any, source: str, key: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _fail(source, key, f"expected a non-empty string, got {raw!r}")
    return raw


def _string_list(raw: Any, source: str, key: str) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise _fail(source, key, f"expected a non-empty list of strings, got {raw!r}")
    return [_string(v, source, f"{key}[{i}]") for i, v in enumerate(raw)]


def _mapping(raw: Any, source: str, key: str, allowed: set[str] | None) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _fail(source, key, f"expected a mapping, got {type(raw).__name__}")
    for k in raw:
        where = f"{key}.{k}" if key else str(k)
        if not isinstance(k, str):
            raise _fail(source, where, "keys must be strings")
        if allowed is not None and k not in allowed:
            raise _fail(source, where, f"unknown key; allowed: {', '.join(sorted(allowed))}")
    return raw


def _fractions(raw: Any, source: str, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam, val in _mapping(raw, source, key, None).items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", fam):
            raise _fail(source, f"{key}.{fam}", "a family is a snake_case word such as gemm_bf16")
        frac = _number(val, source, f"{key}.{fam}")
        if frac > 1:
            raise _fail(source, f"{key}.{fam}", f"a fraction must be in (0, 1], got {val!r}")
        out[fam] = frac
    return out


def _parse_sku(raw: Any, source: str, key: str, default_fractions: dict[str, float]) -> Sku:
    d = _mapping(raw, source, key, _SKU_REQUIRED | _SKU_OPTIONAL)
    missing = sorted(_SKU_REQUIRED - set(d))
    if missing:
        raise _fail(source, f"{key}.{missing[0]}", "required key is missing")
    sku_id = _string(d["id"], source, f"{key}.id")
    if not _ID_RE.match(sku_id):
        raise _fail(source, f"{key}.id", f"must be snake_case, got {sku_id!r}")
    cc = _string(d["compute_capability"], source, f"{key}.compute_capability")
    if not _CC_RE.match(cc):
        raise _fail(source, f"{key}.compute_capability", f"expected 'major.minor', got {cc!r}")
    major, minor = (int(x) for x in cc.split("."))
    peaks = _mapping(d["peak_tflops"], source, f"{key}.peak_tflops", set(DTYPES))
    pcie = _mapping(d["pcie"], source, f"{key}.pcie", _PCIE_KEYS)
    missing_pcie = sorted(_PCIE_KEYS - set(pcie))
    if missing_pcie:
        raise _fail(source, f"{key}.pcie.{missing_pcie[0]}", "required key is missing")
    gen, width = pcie["gen"], pcie["width"]
    if isinstance(gen, bool) or gen not in _PCIE_GTS:
        raise _fail(source, f"{key}.pcie.gen", f"expected one of {sorted(_PCIE_GTS)}, got {gen!r}")
    if isinstance(width, bool) or width not in (1, 2, 4, 8, 16):
        raise _fail(source, f"{key}.pcie.width", f"expected 1, 2, 4, 8 or 16 lanes, got {width!r}")
    nvlink = d["nvlink_gbs"]
    all_pairs = d.get("nvlink_all_pairs", False)
    if not isinstance(all_pairs, bool):
        raise _fail(source, f"{key}.nvlink_all_pairs", f"expected true or false, got {all_pairs!r}")
    if all_pairs and nvlink is None:
        raise _fail(source, f"{key}.nvlink_all_pairs", "needs nvlink_gbs (the SKU has no NVLink)")
    fractions = dict(default_fractions)
    fractions.update(_fractions(d.get("pass_fractions", {}), source, f"{key}.pass_fractions"))
    return Sku(
        id=sku_id,
        name=_string(d["name"], source, f"{key}.name"),
        source=_string(d["source"], source, f"{key}.source"),
        match=tuple(_words(p) for p in _string_list(d["match"], source, f"{key}.match")),
        exclude=frozenset(w.upper() for w in _string_list(d["exclude"], source, f"{key}.exclude"))
        if "exclude" in d else frozenset(),
        compute_capability=(major, minor),
        memory_gib=_number(d["memory_gib"], source, f"{key}.memory_gib"),
        peak=MappingProxyType({dt: _number(v, source, f"{key}.peak_tflops.{dt}") for dt, v in peaks.items()}),
        memory_bandwidth_gbs=_number(d["memory_bandwidth_gbs"], source, f"{key}.memory_bandwidth_gbs"),
        pcie_gen=int(gen),
        pcie_width=int(width),
        nvlink_gbs=None if nvlink is None else _number(nvlink, source, f"{key}.nvlink_gbs"),
        max_power_w=_number(d["max_power_w"], source, f"{key}.max_power_w"),
        pass_fractions=MappingProxyType(fractions),
        nvlink_all_pairs=all_pairs,
        fp64_vector_tflops=None if d.get("fp64_vector_tflops") is None
        else _number(d["fp64_vector_tflops"], source, f"{key}.fp64_vector_tflops"),
        p2p_gbs=None if d.get("p2p_gbs") is None else _number(d["p2p_gbs"], source, f"{key}.p2p_gbs"),
        h2d_gbs=None if d.get("h2d_gbs") is None else _number(d["h2d_gbs"], source, f"{key}.h2d_gbs"),
    )


def parse_skus(data: Any, source: str) -> dict[str, Sku]:
    """Validate the parsed YAML document ``data`` and build the SKUs by id."""
    top = _mapping(data, source, "", _TOP_KEYS)
    if top.get("version", 1) != 1:
        raise _fail(source, "version", f"unsupported version {top.get('version')!r}; this gpuaccept reads 1")
    defaults = _mapping(top.get("defaults", {}), source, "defaults", _DEFAULTS_KEYS)
    default_fractions = _fractions(defaults.get("pass_fractions", {}), source, "defaults.pass_fractions")
    raw_skus = top.get("skus")
    if not isinstance(raw_skus, list) or not raw_skus:
        raise _fail(source, "skus", "expected a non-empty list of SKUs")
    skus: dict[str, Sku] = {}
    patterns: dict[frozenset[str], str] = {}
    for i, raw in enumerate(raw_skus):
        sku = _parse_sku(raw, source, f"skus[{i}]", default_fractions)
        if sku.id in skus:
            raise _fail(source, f"skus[{i}].id", f"duplicate SKU id {sku.id!r}")
        for p in sku.match:
            if p in patterns:
                raise _fail(source, f"skus[{i}].match", f"pattern {' '.join(sorted(p))!r} is also "
                                                         f"used by {patterns[p]!r}")
            patterns[p] = sku.id
        skus[sku.id] = sku
    return skus


def _read(path: str | Path | None) -> tuple[str, str]:
    if path is None:
        ref = resources.files("gpuaccept").joinpath("data", "skus.yaml")
        return ref.read_text(encoding="utf-8"), "gpuaccept/data/skus.yaml"
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read: {exc.strerror or exc}") from exc


def load_skus(path: str | Path | None = None) -> dict[str, Sku]:
    """All SKUs by id, from ``path`` or the packaged ``skus.yaml`` (cached)."""
    if path is None:
        return dict(_load_packaged())
    return _load(path)


@lru_cache(maxsize=1)
def _load_packaged() -> dict[str, Sku]:
    return _load(None)


def _load(path: str | Path | None) -> dict[str, Sku]:
    text, source = _read(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, "", f"not valid YAML: {exc}") from exc
    return parse_skus(data, source)


def match_sku(gpu_name: str, skus: Mapping[str, Sku] | None = None) -> Sku | None:
    """The SKU whose most specific pattern matches ``gpu_name`` (None if none or a tie).

    ``"NVIDIA H100 80GB HBM3"`` -> ``h100_sxm``; ``"NVIDIA H100 NVL"`` -> ``h100_nvl``. A MIG
    instance (``"NVIDIA H100 80GB HBM3 MIG 3g.40gb"``, as CUDA names it) matches nothing: it has
    a share of the GPU's SMs and memory bandwidth, so the whole GPU's peaks do not apply to it.
    """
    if MIG_WORD in _words(gpu_name):
        return None
    table = _load_packaged() if skus is None else skus
    ranked = sorted(((s.match_rank(gpu_name), s) for s in table.values()), key=lambda t: -t[0])
    if not ranked or ranked[0][0] == 0:
        return None
    if len(ranked) > 1 and ranked[1][0] == ranked[0][0]:
        return None
    return ranked[0][1]
