"""GPUs as the PCI bus holds them, independent of any driver, and whether this job can use them.

Read below a ``root`` (``/`` on a node, a recorded tree in tests), as :mod:`gpuaccept.hw.rdma` reads
the fabric: ``<root>/sys/bus/pci/devices/<bdf>/{vendor,device,class}`` and the name of the
``driver`` link (read with ``readlink``, never followed). A GPU is an NVIDIA (``0x10de``) or AMD
(``0x1002``) function of base class ``0x03`` (display controller: ``0x0300`` VGA, ``0x0302`` 3D,
``0x0380`` other); NVSwitches (``0x0680``), audio functions (``0x0403``) and emulated display
adapters of other vendors do not count. Equivalent command: ``lspci -Dnn -d 10de::0302``.

:func:`judge_bus` compares the bus with what NVML and torch see and with what the job was allowed
to see (``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``,
``HIP_VISIBLE_DEVICES``): fewer GPUs usable than allowed is a FAIL naming the cause; a job
given fewer GPUs than the node holds is not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuaccept.hw.devices import visible_count
from gpuaccept.model import Status

PCI_DEVICES = "sys/bus/pci/devices"
VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD"}
DRIVERS = {"NVIDIA": ("nvidia",), "AMD": ("amdgpu",)}
"""The kernel drivers that make a GPU usable, per vendor (``nouveau``, ``vfio-pci`` and the like do not)."""
DISPLAY_CLASS = "0x03"
_HIDDEN_CONTAINER = ("", "void", "none")
"""``NVIDIA_VISIBLE_DEVICES`` values under which the container runtime gives the job no GPU."""


@dataclass(frozen=True)
class BusGpu:
    """One GPU function on the PCI bus (``lspci -Dnnk``): address, vendor, ids and bound driver (None: none)."""

    address: str
    vendor: str
    device_id: str | None
    class_code: str
    driver: str | None

    @property
    def usable_driver(self) -> bool:
        return self.driver in DRIVERS.get(self.vendor, ())

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "vendor": self.vendor, "device_id": self.device_id,
                "class": self.class_code, "driver": self.driver}


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip().lower()
    except OSError:
        return None


def _driver(path: Path) -> str | None:
    """The name of the driver a PCI function is bound to: the last part of its ``driver`` link."""
    try:
        return os.path.basename(os.readlink(path)) or None
    except OSError:
        return None


def read_bus_gpus(root: str | Path = "/") -> list[BusGpu] | None:
    """The GPUs under ``<root>/sys/bus/pci/devices`` in bus order; None when that directory cannot be read."""
    base = Path(root) / PCI_DEVICES
    try:
        names = sorted(p.name for p in base.iterdir())
    except OSError:
        return None
    out = []
    for bdf in names:
        d = base / bdf
        vendor, cls = VENDORS.get(_text(d / "vendor") or ""), _text(d / "class")
        if vendor is None or cls is None or not cls.startswith(DISPLAY_CLASS):
            continue
        out.append(BusGpu(bdf, vendor, _text(d / "device"), cls, _driver(d / "driver")))
    return out


def _entries(value: str) -> list[str]:
    return [e.strip() for e in value.split(",") if e.strip()]


def allowed_gpus(bus_count: int, env: Mapping[str, str], vendor: str = "NVIDIA") -> tuple[int, str | None]:
    """How many CUDA (or HIP) devices this job was given of the ``bus_count`` on the bus, and the variable
    that narrowed them (None: not narrowed). ``NVIDIA_VISIBLE_DEVICES`` (the container runtime's, ``all``
    meaning every GPU) narrows the node to the container; ``CUDA_VISIBLE_DEVICES`` then narrows that."""
    count, why = bus_count, None
    outer = ("NVIDIA_VISIBLE_DEVICES",) if vendor == "NVIDIA" else ("ROCR_VISIBLE_DEVICES",)
    inner = ("CUDA_VISIBLE_DEVICES",) if vendor == "NVIDIA" else ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    for name in outer:
        value = env.get(name)
        if value is None or value.strip().lower() == "all":
            continue
        count = 0 if value.strip().lower() in _HIDDEN_CONTAINER else visible_count(count, value)
        why = f"{name}={value}"
    for name in inner:
        value = env.get(name)
        if value is None:
            continue
        count = visible_count(count, value)
        why = f"{name}={value}"
        break
    return count, why


@dataclass
class BusVerdict:
    """What the bus says about this run: problems (status, message) and, where no GPU can be used by this
    job, why the run is CPU only (None when GPUs are there for it)."""

    problems: list[tuple[Status, str]]
    cpu_only: str | None
    allowed: int
    narrowed_by: str | None


def _n(count: int, vendor: str) -> str:
    return f"{count} {vendor} GPU{'s' if count != 1 else ''}"


def _nvml_problems(gpus: list[BusGpu], allowed: int, nvml: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """NVML absent, or seeing fewer GPUs than this job was given of those on the bus."""
    if not nvml.get("available"):
        return [f"{_n(len(gpus), 'NVIDIA')} on the PCI bus but NVML is not available ({nvml.get('error')}): the "
                f"driver is not loaded, or a container runs without the NVIDIA runtime"]
    seen = int(nvml.get("gpu_count", 0))
    # NVML counts physical GPUs: a job given MIG instances sees their parents, at least one
    narrowing = f"{env.get('NVIDIA_VISIBLE_DEVICES', '')},{env.get('CUDA_VISIBLE_DEVICES', '')}".lower()
    expect = 1 if "mig" in narrowing or ":" in narrowing else allowed
    if seen >= min(expect, len(gpus)):
        return []
    found = {_bus_key(str(g.get("pci_bus_id", ""))) for g in nvml.get("gpus", [])}
    missing = [g.address for g in gpus if _bus_key(g.address) not in found]
    if allowed < len(gpus):
        return [f"NVML sees {seen} GPU{'s' if seen != 1 else ''}, fewer than the {allowed} this job was given of the "
                f"{_n(len(gpus), 'NVIDIA')} on the PCI bus"]
    where = f" (not seen: {', '.join(missing[:8])})" if missing and found else ""
    return [f"NVML sees {seen} of the {_n(len(gpus), 'NVIDIA')} on the PCI bus{where}"]


def _bus_key(bus_id: str) -> str:
    """A PCI address with its domain as a number (NVML writes ``00000000:18:00.0``, sysfs ``0000:18:00.0``)."""
    domain, sep, rest = bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16)}:{rest}" if sep else bus_id.lower()
    except ValueError:
        return bus_id.lower()


def _torch_problems(vendor: str, allowed: int, why: str | None, tch: dict[str, Any], mig: bool) -> list[str]:
    """torch unable to use the GPUs this job was given, or seeing fewer of them (with MIG on and no
    ``MIG-`` entry chosen, CUDA enumerates a single MIG instance: one is enough)."""
    runtime = "ROCm" if vendor == "AMD" else "CUDA"
    given = f"the {allowed} GPU{'s' if allowed != 1 else ''} this job was given" + (f" ({why})" if why else "")
    if not tch.get("installed"):
        return [f"torch does not import ({tch.get('error')}): it cannot use {given}"]
    built = tch.get("hip") if vendor == "AMD" else tch.get("cuda")
    if not built:
        return [f"torch {tch.get('version')} is not built for {runtime}: it cannot use {given}"]
    if not tch.get("cuda_available"):
        cause = tch.get("cuda_error") or "torch.cuda.is_available() is False"
        return [f"torch {tch.get('version')} ({runtime} {built}) cannot use {given}: {cause}"]
    seen = int(tch.get("device_count", 0))
    if seen < (1 if mig else allowed):
        return [f"{runtime} sees {seen} of {given}"]
    return []


def cpu_only_reason(gpus: list[BusGpu] | None, env: Mapping[str, str], requested: str) -> str:
    """Why a run on ``device`` cpu uses no GPU, from the bus alone (no NVML, no torch): no GPU on the
    bus, none given to this job, ``--device cpu`` (``requested``), or GPUs that cannot be used."""
    if gpus is None:
        return "no GPU found (the PCI bus cannot be read here)"
    if not gpus:
        return "this node has no GPU"
    vendor = "NVIDIA" if any(g.vendor == "NVIDIA" for g in gpus) else "AMD"
    mine = [g for g in gpus if g.vendor == vendor]
    allowed, why = allowed_gpus(len(mine), env, vendor)
    if allowed == 0:
        return f"this job was given none of the node's {_n(len(mine), vendor)} ({why})"
    if requested == "cpu":
        return f"--device cpu: the node's {_n(len(mine), vendor)} were not tested"
    return f"the node's {_n(len(mine), vendor)} cannot be used (see env)"


def judge_bus(gpus: list[BusGpu] | None, nvml: dict[str, Any], tch: dict[str, Any], env: Mapping[str, str],
              device: str, expect: int | None = None) -> BusVerdict:
    """GPUs on the bus that this job cannot use are a FAIL naming the cause, whatever ``device`` says;
    none on the bus, or none given to the job, makes the run CPU only (as does ``device`` cpu).
    ``expect`` (``--expect-gpus``) caps what the job was given, for a container runtime that narrows the
    GPUs without saying so in the environment (CDI).

    ``nvml`` and ``tch`` are :func:`gpuaccept.checks.env.nvml_info` and ``torch_info``. Pure.
    """
    nvml_count = int(nvml.get("gpu_count", 0)) if nvml.get("available") else 0
    torch_count = int(tch.get("device_count", 0) or 0) if tch.get("installed") else 0
    if gpus is None:  # the bus cannot be read (a sandbox without /sys): judge by what the drivers see
        if nvml_count or torch_count:
            return BusVerdict([], None if device == "cuda" else "--device cpu: the GPUs were not tested",
                              visible_count(max(nvml_count, torch_count), env.get("CUDA_VISIBLE_DEVICES")), None)
        return BusVerdict([], "no GPU found (the PCI bus cannot be read here, and NVML and torch see none)", 0, None)
    if not gpus:
        if nvml_count or torch_count:  # a GPU no bus entry shows (an unusual sysfs): trust the drivers
            return BusVerdict([], None if device == "cuda" else "--device cpu: the GPUs were not tested",
                              visible_count(max(nvml_count, torch_count), env.get("CUDA_VISIBLE_DEVICES")), None)
        return BusVerdict([], "this node has no GPU", 0, None)
    problems: list[tuple[Status, str]] = []
    unbound = [g for g in gpus if not g.usable_driver]
    if unbound:
        shown = ", ".join(f"{g.address} ({g.driver or 'no driver'})" for g in unbound[:8])
        have = "has" if len(unbound) == 1 else "have"
        problems.append((Status.FAIL, f"{len(unbound)} of the {len(gpus)} GPUs on the PCI bus {have} no GPU driver "
                                      f"bound: {shown}"))
    vendor = "NVIDIA" if any(g.vendor == "NVIDIA" for g in gpus) else "AMD"
    mine = [g for g in gpus if g.vendor == vendor]
    allowed, why = allowed_gpus(len(mine), env, vendor)
    if expect is not None and expect < allowed:
        allowed, why = expect, f"--expect-gpus {expect}"
    if allowed == 0:
        return BusVerdict(problems, f"this job was given none of the node's {_n(len(mine), vendor)} ({why})", 0, why)
    messages = _nvml_problems(mine, allowed, nvml, env) if vendor == "NVIDIA" else []
    messages += _torch_problems(vendor, allowed, why, tch, bool(nvml.get("mig_gpus")))
    problems += [(Status.FAIL, m) for m in messages]
    if device != "cuda":  # usable GPUs on a cpu run: --device cpu asked for it
        return BusVerdict(problems, cpu_only_reason(gpus, env, "auto" if problems else "cpu"), allowed, why)
    return BusVerdict(problems, None, allowed, why)
