"""The cluster's metrics as a columnar table beside ``cluster-report.json`` (issue #27: fleet scale).

``gpuaccept gather`` (and ``launch``) write ``<run-dir>/cluster-report.metrics.npz`` next to the cluster
report: the :class:`~gpuaccept.results.samples.Samples` the outlier analysis collected (one row per judged,
finite metric of every node: value float64, key/SKU/node/device int32 ids), the id tables, each node's
hardware identities and configuration items, as a numpy ``.npz`` (no pickle: the tables are one JSON text
stored as a uint8 array). ``analyze`` and ``baseline create --from`` read it instead of parsing and
validating every node's report again, when it belongs to the cluster report named: the table records the
report file's size and SHA-256, checked before use. A table that does not match (the report was rewritten,
or edited) is not used: the report itself is read, as before. A table that matches but is malformed is
exit 2 (:class:`~gpuaccept.errors.InputError`) with one line.

Why numpy and not Arrow/Parquet: numpy is already a dependency and the analysis works on numpy columns;
pyarrow is not in the environment's package lists, and would add a large dependency to every reader.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from gpuaccept.errors import InputError
from gpuaccept.results.hwid import HardwareMap, HwId
from gpuaccept.results.samples import SampleKey, Samples

FORMAT = 1
"""The table's layout version (``meta.format``)."""
SUFFIX = ".metrics.npz"
MAX_TABLE_BYTES = 4 * 1024 * 1024 * 1024
"""The most bytes of a table file read (4,096 nodes x 8 GPUs of the standard profile: about 40 MB)."""
_COLUMNS = {"value": np.float64, "key": np.int32, "sku": np.int32, "node": np.int32, "device": np.int32}


def table_path(report: Path) -> Path:
    """``run/cluster-report.json`` -> ``run/cluster-report.metrics.npz``."""
    return report.with_suffix(SUFFIX)


def file_digest(path: Path) -> tuple[int, str]:
    """``(size in bytes, SHA-256 hex)`` of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(4 * 1024 * 1024):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def _hw(hw: HwId | None) -> list[Any] | None:
    return None if hw is None else [hw.kind, hw.id, hw.serial]


def _unhw(raw: Any) -> HwId | None:
    if raw is None:
        return None
    kind, ident, serial = raw
    return HwId(str(kind), str(ident), None if serial is None else str(serial))


def _meta(s: Samples, configs: dict[str, dict[str, Any]], source: tuple[int, str]) -> dict[str, Any]:
    return {
        "format": FORMAT, "source": {"size": source[0], "sha256": source[1]},
        "keys": [[k.check, k.metric, k.unit, [list(t) for t in k.tags]] for k in s.keys],
        "skus": s.skus, "nodes": [list(n) for n in s.nodes], "devices": s.devices,
        "hardware": [{"devices": {d: _hw(h) for d, h in m.devices.items()},
                      "per_check": {c: {d: _hw(h) for d, h in own.items()} for c, own in m.per_check.items()},
                      "node": _hw(m.node)} for m in s.hardware],
        "configs": configs,
    }


def write_table(s: Samples, configs: dict[str, dict[str, Any]], report: Path) -> Path:
    """Write the table of ``report`` (a cluster report already written) beside it, replaced atomically
    through a new temporary file in the same directory; returns its path."""
    meta = json.dumps(_meta(s, configs, file_digest(report)), allow_nan=False).encode()
    path = table_path(report)
    fd, tmp = tempfile.mkstemp(prefix=".metrics-", suffix=".npz.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            arrays: dict[str, Any] = {name: np.asarray(getattr(s, name), dtype=dt) for name, dt in _COLUMNS.items()}
            np.savez(fh, meta=np.frombuffer(meta, dtype=np.uint8), **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_table(report: Path) -> None:
    """Remove a table left beside ``report`` by an earlier write (a regular file only)."""
    path = table_path(report)
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


def read_table(report: Path) -> tuple[Samples, dict[str, dict[str, Any]]] | None:
    """The samples and configs of ``report`` from its table, or None when there is no table, it is not a
    regular file, or it was written for another version of the report; :class:`InputError` when it matches
    the report but is malformed."""
    path = table_path(report)
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TABLE_BYTES:
            return None
        try:
            with np.load(fh, allow_pickle=False) as z:
                if sum(i.file_size for i in z.zip.infolist()) > MAX_TABLE_BYTES:
                    raise ValueError(f"more than {MAX_TABLE_BYTES >> 20} MiB once unpacked")
                meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    return None
                source = meta.get("source") or {}
                if os.stat(report).st_size != source.get("size") or file_digest(report)[1] != source.get("sha256"):
                    return None
                cols = {name: z[name] for name in _COLUMNS}
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
            raise InputError(f"{where}: not a gpuaccept metrics table ({type(exc).__name__}: {exc})") from None
    try:
        return _samples(cols, meta, where)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise InputError(f"{where}: not a gpuaccept metrics table ({type(exc).__name__}: {exc})") from None


def _samples(cols: dict[str, np.ndarray], meta: dict[str, Any], where: str) -> tuple[Samples, dict[str, Any]]:
    n = cols["value"].shape
    for name, dt in _COLUMNS.items():
        if cols[name].dtype != dt or cols[name].ndim != 1 or cols[name].shape != n:
            raise ValueError(f"column {name} is not a {np.dtype(dt).name} vector of {n[0]} rows")
    if not np.isfinite(cols["value"]).all():
        raise ValueError("a value is not finite")
    keys = [SampleKey(str(c), str(m), str(u), tuple((str(k), v) for k, v in tags)) for c, m, u, tags in meta["keys"]]
    skus = [str(x) for x in meta["skus"]]
    nodes = [(str(h), str(r)) for h, r in meta["nodes"]]
    devices = [None if d is None else str(d) for d in meta["devices"]]
    for name, table in (("key", keys), ("sku", skus), ("node", nodes), ("device", devices)):
        col = cols[name]
        if col.size and (int(col.min()) < 0 or int(col.max()) >= len(table)):
            raise ValueError(f"column {name} names an entry its table does not have")
    hardware = [HardwareMap(devices={str(d): h for d, raw in m["devices"].items() if (h := _unhw(raw))},
                            per_check={str(c): {str(d): h for d, raw in own.items() if (h := _unhw(raw))}
                                       for c, own in m["per_check"].items()},
                            node=_unhw(m["node"])) for m in meta["hardware"]]
    configs = meta["configs"]
    if not isinstance(configs, dict):
        raise ValueError("configs is not an object")
    s = Samples(value=cols["value"], key=cols["key"].astype(np.intp), sku=cols["sku"].astype(np.intp),
                node=cols["node"].astype(np.intp), device=cols["device"].astype(np.intp), keys=keys, skus=skus,
                nodes=nodes, devices=devices, hardware=hardware)
    return s, configs


def merge(parts: list[Samples]) -> Samples:
    """One :class:`Samples` of several (the id tables joined, the nodes one after another)."""
    if len(parts) == 1:
        return parts[0]
    keys: dict[SampleKey, int] = {}
    skus: dict[str, int] = {}
    devices: dict[str | None, int] = {None: 0}
    nodes: list[tuple[str, str]] = []
    hardware: list[HardwareMap] = []
    cols: dict[str, list[np.ndarray]] = {name: [] for name in _COLUMNS}
    for p in parts:
        kmap = np.array([keys.setdefault(k, len(keys)) for k in p.keys] or [0], dtype=np.intp)
        smap = np.array([skus.setdefault(x, len(skus)) for x in p.skus] or [0], dtype=np.intp)
        dmap = np.array([devices.setdefault(d, len(devices)) for d in p.devices], dtype=np.intp)
        cols["value"].append(p.value)
        cols["key"].append(kmap[p.key])
        cols["sku"].append(smap[p.sku])
        cols["device"].append(dmap[p.device])
        cols["node"].append(p.node + len(nodes))
        nodes.extend(p.nodes)
        hardware.extend(p.hardware)
    return Samples(value=np.concatenate(cols["value"]), key=np.concatenate(cols["key"]),
                   sku=np.concatenate(cols["sku"]), node=np.concatenate(cols["node"]),
                   device=np.concatenate(cols["device"]), keys=list(keys), skus=list(skus), nodes=nodes,
                   devices=list(devices), hardware=hardware)


def tables_of(paths: list[str]) -> tuple[Samples, dict[str, dict[str, Any]]] | None:
    """The merged samples and configs of ``paths`` when every one is a cluster report file with a table that
    matches it, else None (the caller reads the reports)."""
    parts: list[Samples] = []
    configs: dict[str, dict[str, Any]] = {}
    for raw in paths:
        p = Path(raw)
        if not p.is_file():
            return None
        got = read_table(p)
        if got is None:
            return None
        parts.append(got[0])
        configs.update(got[1])
    return (merge(parts), configs) if parts else None
