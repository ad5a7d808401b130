"""The ``disk`` check: sequential and random throughput and IOPS of a scratch directory, and its free space.

Training jobs stage data and write checkpoints to node-local scratch; a slow
or nearly full scratch disk fails them long after acceptance. The measurement
(:mod:`gpuaccept.checks.disk_io`) runs fio with JSON output when ``fio`` is
installed (``engine: auto``), else a Python fallback at queue depth 1 that
says whether it could use O_DIRECT. It works in a fresh directory under
``path`` (default: the system temp directory), removed afterwards.

Metrics (node-wide, no device): ``disk_seq_write_mbs`` and ``disk_seq_read_mbs``
(MB/s, 1e6 bytes/s, 1 MiB blocks), ``disk_rand_write_iops`` and
``disk_rand_read_iops`` (4 KiB operations/s), ``disk_free_gib`` (GiB free
to this user at ``path``, ``df -B1 PATH``; threshold ``>= min_free_gib``). The
throughput figures have no built-in bound: a fleet baseline (``--baseline``)
judges them. A ``path`` that does not exist or is not writable is refused
before anything runs (exit 2).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, RequiredMetric
from gpuaccept.checks.disk_io import (
    MIB,
    DiskFigures,
    direct_supported,
    figures_from_fio,
    fio_command,
    parse_fio_json,
    python_fallback,
    scratch_problem,
)
from gpuaccept.errors import ConfigError, InputError
from gpuaccept.model import Metric, Status, Threshold

GIB = 1 << 30


def scratch_dir(path: str) -> str:
    """The directory the check tests: ``path``, or the system temp directory when ``path`` is empty."""
    return path or tempfile.gettempdir()


def free_gib(path: str) -> float:
    """GiB free to an unprivileged user at ``path`` (``statvfs`` f_bavail)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / GIB


class DiskCheck(Check):
    """fio (or a Python fallback) on a scratch directory: MB/s, IOPS, free space."""

    name = "disk"
    tag = "DISK"
    summary = "Sequential MB/s and random 4k IOPS of a scratch path (fio JSON, else Python with O_DIRECT), free space"
    key_metric = "disk_seq_write_mbs"
    metrics = ("disk_free_gib", "disk_seq_write_mbs", "disk_seq_read_mbs", "disk_rand_write_iops",
               "disk_rand_read_iops")
    profiles: ClassVar[tuple[str, ...]] = ("full", "burnin")
    params = (
        Param("path", "str", "", "scratch directory to test ('' = the system temp directory); must exist and be "
              "writable"),
        Param("size_mib", "int", 256, "test file size in MiB", minimum=16, maximum=1 << 20),
        Param("runtime_s", "float", 5.0, "seconds per phase (seq write, seq read, rand write, rand read)",
              minimum=1.0, maximum=3600.0),
        Param("engine", "str", "auto", "fio, python, or auto (fio when installed)", choices=("auto", "fio", "python")),
        Param("direct", "bool", True, "use O_DIRECT where the filesystem allows it"),
        Param("iodepth", "int", 32, "queue depth of fio's random phases (libaio; with O_DIRECT only)", minimum=1,
              maximum=1024),
        Param("min_free_gib", "float", 1.0, "fail when less than this many GiB are free at path", minimum=0.0,
              maximum=1e9),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"size_mib": 256, "runtime_s": 5.0},
        "burnin": {"size_mib": 4096, "runtime_s": 30.0},
    }
    timeout_s: ClassVar[dict[str, float]] = {"full": 300.0, "burnin": 900.0}

    @classmethod
    def timeout_for(cls, profile: str, params: dict[str, Any]) -> float:
        """Four phases of ``runtime_s``, the file laid out at 20 MB/s at worst, and two minutes to spare."""
        need = 4 * float(params["runtime_s"]) + int(params["size_mib"]) * MIB / 20e6 + 120.0
        return max(super().timeout_for(profile, params), need)

    @classmethod
    def preflight(cls, params: dict[str, Any], source: str, key: str) -> None:
        """A ``path`` that does not exist, is not a directory or is not writable; ``engine: fio`` without fio."""
        path = str(params.get("path") or "")
        problem = scratch_problem(scratch_dir(path))
        if problem:
            raise ConfigError(source, f"{key}.path", problem)
        if params.get("engine") == "fio" and shutil.which("fio") is None:
            raise ConfigError(source, f"{key}.engine", "fio is not installed (apt-get install fio), or use auto")

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """The four I/O figures and the free space (node-wide)."""
        return [RequiredMetric(m) for m in ("disk_seq_write_mbs", "disk_seq_read_mbs", "disk_rand_write_iops",
                                            "disk_rand_read_iops", "disk_free_gib")]

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.disk(params, device, gpus)

    @classmethod
    def budget_stretch(cls, params: dict[str, Any]) -> tuple[str, float] | None:
        return "runtime_s", 2.0

    def run(self, ctx: CheckContext) -> Outcome:
        p = ctx.params
        base = scratch_dir(str(p["path"]))
        problem = scratch_problem(base)
        if problem:
            return Outcome(Status.ERROR, problem)
        size_mib, runtime_s = int(p["size_mib"]), float(p["runtime_s"])
        free = free_gib(base)
        min_free = float(p["min_free_gib"])
        tags: dict[str, str | int | float] = {"path": base}
        free_metric = Metric("disk_free_gib", round(free, 3), "GiB", tags=dict(tags),
                             threshold=Threshold(">=", min_free, Status.FAIL, "param:min_free_gib"))
        if free * GIB < size_mib * MIB + min_free * GIB:
            return Outcome.failed(f"{base}: {free:.2f} GiB free, too little for a {size_mib} MiB test file and "
                                  f"min_free_gib {min_free:g}", [free_metric], path=base)
        fio = shutil.which("fio") if p["engine"] != "python" else None
        if p["engine"] == "fio" and fio is None:
            return Outcome(Status.ERROR, "engine: fio, but fio is not installed")
        work = tempfile.mkdtemp(prefix="gpuaccept-disk-", dir=base)
        try:
            direct = bool(p["direct"]) and direct_supported(work)
            ctx.log(f"{base}: {'fio' if fio else 'python'} {size_mib} MiB, {runtime_s:g} s per phase, "
                    f"O_DIRECT {'on' if direct else 'off'}")
            if fio:
                figures = self._fio(fio, work, size_mib, runtime_s, direct, int(p["iodepth"]), ctx)
                if isinstance(figures, Outcome):
                    return figures
            else:
                figures = python_fallback(work, size_mib, runtime_s, direct)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if not figures.direct:
            figures.notes.insert(0, ("O_DIRECT refused here" if p["direct"] else "O_DIRECT off") +
                                 ": buffered I/O with fsync in the write phases; reads may come from the page cache")
        return self._outcome(figures, free_metric, tags, base, size_mib, runtime_s)

    @staticmethod
    def _fio(fio: str, work: str, size_mib: int, runtime_s: float, direct: bool, iodepth: int,
             ctx: CheckContext) -> DiskFigures | Outcome:
        argv = fio_command(fio, work, size_mib, runtime_s, direct, iodepth)
        ctx.log(" ".join(argv))
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=4 * runtime_s + 600, cwd=work)
        except subprocess.TimeoutExpired:
            return Outcome(Status.ERROR, f"fio ran past {4 * runtime_s + 600:g} s")
        if proc.stderr.strip():
            ctx.log(proc.stderr.strip()[-2000:])
        try:
            return figures_from_fio(parse_fio_json(proc.stdout), direct, iodepth if direct else 1)
        except InputError as exc:
            last = proc.stderr.strip().splitlines()[-1][:300] if proc.stderr.strip() else ""
            return Outcome.failed(f"fio on {work} failed (exit {proc.returncode}): {exc}"
                                  + (f"; {last}" if last else ""))

    @staticmethod
    def _outcome(f: DiskFigures, free_metric: Metric, tags: dict[str, str | int | float], base: str,
                 size_mib: int, runtime_s: float) -> Outcome:
        tags = {**tags, "engine": f.engine, "direct": int(f.direct), "iodepth": f.iodepth}
        metrics = [free_metric]
        for name, value, unit in (("disk_seq_write_mbs", f.seq_write_mbs, "MB/s"),
                                  ("disk_seq_read_mbs", f.seq_read_mbs, "MB/s"),
                                  ("disk_rand_write_iops", f.rand_write_iops, "IO/s"),
                                  ("disk_rand_read_iops", f.rand_read_iops, "IO/s")):
            if value is not None:
                metrics.append(Metric(name, round(value, 3), unit, tags=dict(tags), performance=True))
        how = f"{f.engine}, O_DIRECT {'on' if f.direct else 'off'}, random at queue depth {f.iodepth}"
        reason = (f"{base}: seq write {f.seq_write_mbs or 0:.0f} MB/s, read {f.seq_read_mbs or 0:.0f} MB/s; "
                  f"4k random write {f.rand_write_iops or 0:.0f} IOPS, read {f.rand_read_iops or 0:.0f} IOPS "
                  f"({how}); {free_metric.value:.1f} GiB free")
        if f.notes:
            reason += "; " + "; ".join(f.notes)
        return Outcome.passed(reason, metrics, path=base, engine=f.engine, direct=f.direct, size_mib=size_mib,
                              runtime_s=runtime_s, iodepth=f.iodepth, notes=f.notes)


CHECKS = (DiskCheck,)
