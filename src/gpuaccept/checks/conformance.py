"""The ``conformance`` check: this node's configuration as data, judged against a manifest when one is given.

It collects (:func:`gpuaccept.hw.conformance.collect`) from NVML (``nvidia-smi -q``), sysfs below ``root``
(``ibstat``, ``lsmod``, DMI, cpufreq, clocksource, huge pages) and the ``NCCL_*`` environment, puts every
item in ``details.conformance`` and, with ``manifest`` set (``gpuaccept run --conformance FILE``), fails
naming each item that differs (:func:`gpuaccept.checks.conformance_manifest.judge`). No GPU load, no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.checks.base import PROFILES, Check, CheckContext, Outcome, Param
from gpuaccept.checks.conformance_manifest import Manifest, judge, load_manifest
from gpuaccept.errors import GpuacceptError
from gpuaccept.hw.conformance import Extras, NodeConfig, collect, read_sysfs_items
from gpuaccept.hw.nvml import NvmlSnapshot
from gpuaccept.hw.rdma import read_inventory
from gpuaccept.model import Metric, Status, worst


def evaluate_conformance(cfg: NodeConfig, manifest: Manifest | None, *, nvml_error: str | None = None,
                         manifest_path: str = "") -> Outcome:
    """The outcome for a collected configuration (pure). Without a manifest: PASS, "configuration recorded"."""
    details: dict[str, Any] = {"conformance": cfg.to_dict(), "manifest": manifest_path or None}
    if nvml_error:
        details["nvml_error"] = nvml_error
    gpus = cfg.items.get("gpu_count")
    scope = f"{len(cfg.items)} items" + ("" if gpus else f"; CPU only: no GPU items ({nvml_error or 'no GPU'})")
    if manifest is None:
        return Outcome(Status.PASS, f"no manifest: configuration recorded ({scope})", [], details)
    findings = judge(cfg.items, manifest, cfg.absent)
    details["findings"] = [{"status": f.status.value, "item": f.item, "message": f.message} for f in findings]
    metrics = [Metric("conformance_findings", float(len(findings)), "count", expected=0.0)]
    if not findings:
        return Outcome(Status.PASS, f"conforms to {manifest_path or 'the manifest'} ({len(manifest.rules)} rules, "
                                    f"{scope})", metrics, details)
    ordered = sorted(findings, key=lambda f: -f.status.severity)
    return Outcome(worst(*(f.status for f in findings)), "; ".join(f.message for f in ordered), metrics, details)


def read_config(root: str, env: Mapping[str, str]) -> tuple[NodeConfig, str | None]:
    """Collect this node's configuration (NVML if it loads; sysfs, libraries and dpkg below ``root``; runtimes'
    ``--version`` on ``PATH``, each bounded to a few seconds); the NVML error, if any."""
    from gpuaccept.checks.env import host_info
    from gpuaccept.hw.nccl_stack import find_plugin, nccl_version
    from gpuaccept.hw.nvml import NvmlUnavailable, read_snapshot
    from gpuaccept.hw.nvml_state import read_state
    from gpuaccept.hw.rdma_keys import read_port_keys
    from gpuaccept.hw.runtimes import read_runtimes

    snap: NvmlSnapshot | None = None
    extras = Extras(port_keys=read_port_keys(root), nccl_version=nccl_version(env, root),
                    nccl_plugin=find_plugin(env, root), runtimes=read_runtimes(env, root))
    error = None
    try:
        snap = read_snapshot()
        extras.state = read_state()
    except (NvmlUnavailable, GpuacceptError) as exc:
        error = str(exc)
    return collect(snap, read_inventory(root), env, host_info(), read_sysfs_items(root), extras), error


class ConformanceCheck(Check):
    """Records the node's driver, GPU, PCIe, NVLink, NIC, NCCL and OS configuration; judges it against a manifest."""

    name = "conformance"
    tag = "CONF"
    measures = False  # it takes stock
    summary = ("the node's configuration as named items (driver, GPUs, VBIOS, clocks, MIG, PCIe, NVLink and fabric, "
               "NIC firmware, rate and partition, NUMA, NCCL and its plugin, runtimes, kernel, BIOS); with a "
               "manifest, each difference named")
    params: ClassVar[tuple[Param, ...]] = (
        Param("root", "str", "/", "filesystem root under which sys/ and proc/ are read (a recorded tree in tests)"),
        Param("manifest", "str", "", "conformance manifest (YAML) to judge against ('': record only); "
                                     "gpuaccept run --conformance FILE sets it"),
    )
    profiles: ClassVar[tuple[str, ...]] = PROFILES
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {p: {} for p in PROFILES}
    timeout_s: ClassVar[dict[str, float]] = {p: 60.0 for p in PROFILES}
    key_metric = "conformance_findings"
    metrics = ("conformance_findings",)
    imports_beside = True  # reads NVML and sysfs, nothing timed

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return 1.0 + 0.1 * gpus  # NVML start and one pass over sysfs

    def run(self, ctx: CheckContext) -> Outcome:
        root = str(ctx.params.get("root", "/"))
        if not Path(root).is_dir():
            return Outcome.failed(f"conformance root {root!r} is not a directory")
        path = str(ctx.params.get("manifest", "") or "")
        try:
            manifest = load_manifest(path) if path else None
        except GpuacceptError as exc:
            return Outcome.failed(f"manifest: {exc}")
        cfg, error = read_config(root, os.environ)
        return evaluate_conformance(cfg, manifest, nvml_error=error, manifest_path=path)


CHECKS = (ConformanceCheck,)
