"""Disk throughput and IOPS of a scratch directory: fio (JSON output) when installed, else a Python fallback.

Four phases on one test file of ``size_mib`` MiB, each at most ``runtime_s``:
sequential write and read in 1 MiB blocks, then random 4 KiB writes and reads.
With fio that is (:func:`fio_command`)::

    fio --output-format=json --directory=DIR --filename=gpuaccept-fio.dat --size=256M --runtime=5
        --time_based --direct=1 --name=seq_write --rw=write --bs=1M --ioengine=psync
        --name=seq_read --stonewall --rw=read --bs=1M --ioengine=psync
        --name=rand_write --stonewall --rw=randwrite --bs=4k --ioengine=libaio --iodepth=32
        --name=rand_read --stonewall --rw=randread --bs=4k --ioengine=libaio --iodepth=32

and :func:`parse_fio_json` reads its report (pure; tested on recorded output
under ``tests/data/fio``). Without fio, :func:`python_fallback` does the same
phases with ``os.pwrite``/``os.preadv`` at queue depth 1, through ``O_DIRECT``
where the filesystem allows it (page-aligned buffers), else buffered with an
``fsync`` inside the timed write phases and ``POSIX_FADV_DONTNEED`` before the
reads (which may still be served from the page cache: the figures say
``direct: false``). Throughput is MB/s (1e6 bytes/s), IOPS operations/s.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.errors import InputError

MB = 1_000_000
MIB = 1 << 20
BLOCK = 4096
SEQ_BLOCK = MIB
FIO_FILE = "gpuaccept-fio.dat"
PHASES = ("seq_write", "seq_read", "rand_write", "rand_read")


@dataclass(frozen=True)
class FioJob:
    """One job of a fio JSON report: bandwidth in bytes/s and IOPS of each direction, runtime, error code."""

    name: str
    read_bw_bytes: float
    read_iops: float
    write_bw_bytes: float
    write_iops: float
    runtime_ms: float
    error: int


@dataclass
class DiskFigures:
    """What the four phases measured (None: phase not run), how, and notes for the reason."""

    engine: str
    direct: bool
    seq_write_mbs: float | None = None
    seq_read_mbs: float | None = None
    rand_write_iops: float | None = None
    rand_read_iops: float | None = None
    iodepth: int = 1
    notes: list[str] = field(default_factory=list)


def _num(d: Any, key: str, where: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise InputError(f"fio JSON: {where}.{key} is not a non-negative number: {v!r}")
    return float(v)


def parse_fio_json(text: str) -> list[FioJob]:
    """The jobs of ``fio --output-format=json`` output (InputError when it is not such a report).

    fio may print warnings before the JSON (``fio: ...`` lines); everything
    before the first ``{`` at the start of a line is skipped.
    """
    start = text.find("{")
    while start > 0 and text[start - 1] != "\n":
        start = text.find("{", start + 1)
    if start < 0:
        raise InputError("fio printed no JSON report" + (f": {text.strip().splitlines()[-1][:200]}"
                                                        if text.strip() else ""))
    try:
        data = json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise InputError(f"fio JSON report is malformed: {exc}") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list) or not jobs:
        raise InputError("fio JSON report has no 'jobs' list")
    out: list[FioJob] = []
    for i, job in enumerate(jobs):
        where = f"jobs[{i}]"
        if not isinstance(job, dict) or not isinstance(job.get("jobname"), str):
            raise InputError(f"fio JSON: {where} has no jobname")
        read, write = job.get("read"), job.get("write")
        err = job.get("error", 0)
        out.append(FioJob(job["jobname"], _num(read, "bw_bytes", f"{where}.read"), _num(read, "iops", f"{where}.read"),
                          _num(write, "bw_bytes", f"{where}.write"), _num(write, "iops", f"{where}.write"),
                          _num(job, "job_runtime", where) if "job_runtime" in job else 0.0,
                          int(err) if isinstance(err, int) else -1))
    return out


def figures_from_fio(jobs: list[FioJob], direct: bool, iodepth: int) -> DiskFigures:
    """The four phases' figures from parsed fio jobs named as :func:`fio_command` names them (pure).
    InputError when a job reports an error or a phase is missing."""
    by_name = {j.name: j for j in jobs}
    bad = [f"{j.name} (error {j.error})" for j in jobs if j.error]
    if bad:
        raise InputError(f"fio job(s) failed: {', '.join(bad)}")
    missing = [p for p in PHASES if p not in by_name]
    if missing:
        raise InputError(f"fio report lacks job(s) {', '.join(missing)}")
    return DiskFigures("fio", direct, seq_write_mbs=by_name["seq_write"].write_bw_bytes / MB,
                       seq_read_mbs=by_name["seq_read"].read_bw_bytes / MB,
                       rand_write_iops=by_name["rand_write"].write_iops,
                       rand_read_iops=by_name["rand_read"].read_iops, iodepth=iodepth)


def fio_command(fio: str, directory: str, size_mib: int, runtime_s: float, direct: bool, iodepth: int) -> list[str]:
    """The fio argv of the four phases (see the module doc); each phase waits for the one before."""
    rand_engine = ["--ioengine=libaio", f"--iodepth={iodepth}"] if direct else ["--ioengine=psync"]
    argv = [fio, "--output-format=json", f"--directory={directory}", f"--filename={FIO_FILE}",
            f"--size={size_mib}M", f"--runtime={max(1, round(runtime_s))}", "--time_based",
            f"--direct={1 if direct else 0}"]
    argv += ["--name=seq_write", "--rw=write", "--bs=1M", "--ioengine=psync"]
    if not direct:
        argv += ["--end_fsync=1"]
    argv += ["--name=seq_read", "--stonewall", "--rw=read", "--bs=1M", "--ioengine=psync"]
    argv += ["--name=rand_write", "--stonewall", "--rw=randwrite", "--bs=4k", *rand_engine]
    if not direct:
        argv += ["--end_fsync=1"]
    argv += ["--name=rand_read", "--stonewall", "--rw=randread", "--bs=4k", *rand_engine]
    return argv


def direct_supported(directory: str) -> bool:
    """Whether a file in ``directory`` can be opened with O_DIRECT (tmpfs before Linux 6.6, some FUSE and
    network filesystems refuse it)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    path = os.path.join(directory, ".gpuaccept-direct-probe")
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | flag, 0o600)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, BLOCK)
        try:
            os.write(fd, buf)
        except OSError:
            return False
        finally:
            buf.close()
        return True
    finally:
        os.close(fd)
        os.unlink(path)


def scratch_problem(path: str) -> str | None:
    """Why ``path`` cannot be the scratch directory (None when it can): missing, not a directory, not writable."""
    if not os.path.exists(path):
        return f"scratch path {path} does not exist"
    if not os.path.isdir(path):
        return f"scratch path {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"scratch path {path} is not writable"
    return None


def _rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def python_fallback(directory: str, size_mib: int, runtime_s: float, direct: bool, seed: int = 0) -> DiskFigures:
    """The four phases in Python at queue depth 1 (see the module doc) on ``directory/gpuaccept-fio.dat``;
    the file is removed at the end. ``direct`` asks for O_DIRECT (the caller checked it works)."""
    path = os.path.join(directory, FIO_FILE)
    flag = getattr(os, "O_DIRECT", 0) if direct else 0
    size = size_mib * MIB
    fig = DiskFigures("python", bool(flag), iodepth=1)
    buf = mmap.mmap(-1, SEQ_BLOCK)  # page-aligned, as O_DIRECT wants
    buf.write(os.urandom(SEQ_BLOCK))
    small = mmap.mmap(-1, BLOCK)
    small.write(os.urandom(BLOCK))
    rng = random.Random(seed)
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC | flag, 0o600)
        try:
            # sequential write: the whole file (or until runtime_s), fsync inside the timing
            t0, written = time.perf_counter(), 0
            while written < size and time.perf_counter() - t0 < runtime_s:
                written += os.pwrite(fd, buf, written)
            os.fsync(fd)
            fig.seq_write_mbs = _rate(written, time.perf_counter() - t0) / MB
            blocks = max(1, written // BLOCK)
            if not flag and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            # sequential read, cycling over the written part until runtime_s
            t0, read, off = time.perf_counter(), 0, 0
            while time.perf_counter() - t0 < runtime_s:
                got = os.preadv(fd, [buf], off)
                if got <= 0:
                    if off == 0:
                        break
                    off = 0
                    continue
                read += got
                off = off + got if off + got < written else 0
            fig.seq_read_mbs = _rate(read, time.perf_counter() - t0) / MB
            # random 4 KiB writes, then reads, within the written part
            t0, ops = time.perf_counter(), 0
            while time.perf_counter() - t0 < runtime_s:
                os.pwrite(fd, small, rng.randrange(blocks) * BLOCK)
                ops += 1
            os.fsync(fd)
            fig.rand_write_iops = _rate(ops, time.perf_counter() - t0)
            if not flag and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0, ops = time.perf_counter(), 0
            while time.perf_counter() - t0 < runtime_s:
                os.preadv(fd, [small], rng.randrange(blocks) * BLOCK)
                ops += 1
            fig.rand_read_iops = _rate(ops, time.perf_counter() - t0)
        finally:
            os.close(fd)
    finally:
        buf.close()
        small.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if written < size:
        fig.notes.append(f"sequential write reached {written // MIB} of {size_mib} MiB in {runtime_s:g} s")
    return fig
