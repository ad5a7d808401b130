"""What to do after a FAIL: the likely causes and the next commands, from one table (pure; no I/O).

:data:`RULES` maps (check, failure kind) to causes and command templates. A failure kind is one of:

- ``metric:<glob>``: a metric of that name missed its bound (its threshold is not met);
- ``reason:<text>``: the check's reason contains the text (case-insensitive);
- ``timeout``: the runner killed the check at its timeout (``details.timeout``);
- ``error``: the check ended in ERROR (it crashed or raised);
- ``any``: the check failed, whatever the kind (the check's fallback, used when no other rule of it matched);
- several kinds joined by ``|``: any of them.

The check ``*`` matches every check. For one failed check, :func:`next_steps` collects every rule that matches,
in table order, and the first ``*`` rule that matches (a ``timeout`` or ``error`` one always, ``any`` only when
no rule of the check itself matched), and fills in the real values:

- ``{host}``: the node; ``{nodes}``: the cluster's hosts (a node report: ``{host},OTHER_NODES``);
- ``{gpu}``: the ``nvidia-smi -i`` index of each GPU whose metric missed (NVML index from the env check's
  inventory, else the CUDA ordinal); ``{ordinal}``: their CUDA ordinals (for ``--gpus``);
- ``{check}``, ``{run_id}``, ``{log}`` (the check's log file: ``details.log``, else, where the run directory
  is known (the console), its ``logs/<check>.log``).

A part in square brackets is dropped when a value in it is unknown (``nvidia-smi -q -d ECC[ -i {gpu}]``); a
command with an unknown value outside brackets is left out.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # read by shape: model's NodeReport.to_dict calls this module, which imports nothing of ours
    from gpuaccept.model import CheckResult, Metric, NodeReport


@dataclass(frozen=True)
class Rule:
    """One row: when ``check`` fails with ``kind``, these ``causes`` are likely and these ``commands`` come next."""

    check: str
    kind: str
    causes: tuple[str, ...]
    commands: tuple[str, ...]


_COLL_CAUSES = ("a slow or erroring NVLink/NVSwitch path or a down NVLink",
                "a NIC, cable or switch port of one node (its rail), or NCCL on a wrong transport (NCCL_* environment)",
                "PCIe ACS or the IOMMU forcing peer traffic through the CPU")
_COLL_COMMANDS = ("gpuaccept isolate --nodes {nodes} --per-rail", "nvidia-smi topo -m",
                  "NCCL_DEBUG=INFO gpuaccept run --checks {check} --verbose")
_WRONG_RESULTS = ("gpuaccept run --checks agreement,memtest,stress --profile full[ --gpus {ordinal}]",
                  "dmesg -T | grep -i -e xid -e nvrm")

_ECC = ("uncorrectable ECC errors in GPU memory[ (GPU {gpu})]: failing HBM, or errors since the last reset",)
_ECC_COMMANDS = ("nvidia-smi -q -d ECC[ -i {gpu}]", "nvidia-smi -q -d ROW_REMAPPER[ -i {gpu}]",
                 "dmesg -T | grep -i -e xid -e nvrm")
_RETIRED = ("retired memory pages pending until the GPU is reset",)
_RETIRED_COMMANDS = ("nvidia-smi -q -d PAGE_RETIREMENT[ -i {gpu}]",
                     "nvidia-smi -r[ -i {gpu}]  # when idle; then run again")
_XID = ("the driver logged Xid errors: a GPU fault, a GPU that fell off the bus (Xid 79), a driver or firmware "
        "problem (the Xid numbers are in the reason; NVIDIA's Xid catalog says what each means)",)
_XID_COMMANDS = ("dmesg -T | grep -i -e xid -e nvrm", "nvidia-bug-report.sh")
_THROTTLE = ("clocks held down by the hardware (HW thermal slowdown, HW power brake): too hot (fans, airflow, a "
             "failed cooling loop) or an external power brake signal from the PSU or the BMC",)
_THROTTLE_COMMANDS = ("nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER[ -i {gpu}]", "ipmitool sdr type Temperature")

_NO_GPU = ("no GPU seen (--require-gpu): no NVIDIA driver loaded (NVML cannot be loaded), the GPUs not given to "
           "this container (the NVIDIA runtime, --gpus), or a machine without GPUs",)
_NO_GPU_COMMANDS = ("nvidia-smi -L", "lsmod | grep nvidia", "ls -l /dev/nvidia*")

RULES: tuple[Rule, ...] = (
    Rule("health", "reason:GPU required (--require-gpu)", _NO_GPU, _NO_GPU_COMMANDS),
    Rule("health", "metric:ecc_*uncorrectable|reason:uncorrectable ECC", _ECC, _ECC_COMMANDS),
    Rule("health", "metric:remapped_rows_*|reason:row remap",
         ("row remapping failed (no spare rows: an RMA candidate) or is pending until the GPU is reset",),
         ("nvidia-smi -q -d ROW_REMAPPER[ -i {gpu}]", "nvidia-smi -r[ -i {gpu}]  # when idle; then run again")),
    Rule("health", "metric:retired_pages_*|reason:page retirement", _RETIRED, _RETIRED_COMMANDS),
    Rule("health", "metric:xid_*|reason:XID ", _XID, _XID_COMMANDS),
    Rule("health", "reason:HW thermal slowdown|reason:HW power brake|reason:HW slowdown", _THROTTLE,
         _THROTTLE_COMMANDS),
    Rule("health", "reason:GPU is lost|reason:GPU requires restart|reason:NVML cannot open",
         ("NVML cannot reach the GPU: it fell off the bus (Xid 79), a driver fault, or it needs a reset or a "
          "power cycle",),
         ("nvidia-smi -L", "lspci -d 10de:", "dmesg -T | grep -i -e xid -e nvrm -e 'fallen off'")),
    Rule("health", "metric:pcie_link_*|reason:PCIe x",
         ("a PCIe link narrower or slower than the GPU and slot allow: riser, slot, retimer or a badly seated card",),
         ("nvidia-smi -q -d PCI[ -i {gpu}]",)),
    Rule("health", "metric:nvlink_*|reason:NVLink",
         ("an NVLink down or erroring: the link, an NVSwitch, or the fabric manager",),
         ("nvidia-smi nvlink --status[ -i {gpu}]", "nvidia-smi nvlink -e[ -i {gpu}]",
          "systemctl status nvidia-fabricmanager")),
    Rule("health", "metric:*temperature_c",
         ("too hot: fans, airflow, a blocked intake or a failed cooling loop",),
         ("nvidia-smi -q -d TEMPERATURE,PERFORMANCE[ -i {gpu}]",)),
    Rule("health", "metric:power_*",
         ("power draw or cap outside the expected range: a power-limited PSU or a lowered power limit",),
         ("nvidia-smi -q -d POWER[ -i {gpu}]",)),
    Rule("health", "any",
         ("a GPU fault in the NVML snapshot (the reason names it): uncorrectable ECC errors, Xid errors, hardware "
          "throttling, retired pages or row remapping pending a reset",),
         ("nvidia-smi -q -d ECC,PERFORMANCE[ -i {gpu}]", "dmesg -T | grep -i xid", "less {log}",
          "gpuaccept run --checks health --verbose")),
    Rule("memtest", "metric:memtest_errors",
         ("GPU memory returned wrong data[ on GPU {gpu}]: failing HBM cells (an RMA candidate when it repeats)",),
         ("nvidia-smi -q -d ECC[ -i {gpu}]", "nvidia-smi -q -d ROW_REMAPPER[ -i {gpu}]",
          "gpuaccept run --checks memtest --profile full[ --gpus {ordinal}]")),
    Rule("compute", "metric:gemm_*",
         ("GPU[ {gpu}] slower than its SKU: clocks held down by power or temperature, a lowered power limit, "
          "or another process on the GPU",),
         ("nvidia-smi -q -d PERFORMANCE,POWER,CLOCK[ -i {gpu}]",
          "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv[ -i {gpu}]")),
    Rule("nbody", "any", ("GPU[ {gpu}] slower than expected: clocks held down by power or temperature, or another "
                          "process on the GPU",),
         ("nvidia-smi -q -d PERFORMANCE,POWER,CLOCK[ -i {gpu}]",)),
    Rule("throughput", "any", ("training throughput below expectation: GPU clocks, a slow PCIe link or host CPU",),
         ("nvidia-smi -q -d PERFORMANCE,POWER,CLOCK[ -i {gpu}]", "nvidia-smi topo -m")),
    Rule("memory", "metric:*_pinned_gbs",
         ("slow host<->GPU copies: a narrow or slow PCIe link, the process on the wrong NUMA node, or the IOMMU",),
         ("nvidia-smi -q -d PCI[ -i {gpu}]", "nvidia-smi topo -m")),
    Rule("memory", "metric:d2d_copy_gbs",
         ("slow GPU memory: memory clocks held down by temperature or power",),
         ("nvidia-smi -q -d CLOCK,TEMPERATURE[ -i {gpu}]",)),
    Rule("memory", "metric:stream_*", ("slow host memory: a missing DIMM, memory speed, or a busy host",),
         ("dmidecode -t memory | grep -i -e speed -e size", "numactl --hardware")),
    Rule("stress", "metric:stress_mismatches",
         ("wrong results under sustained load[ on GPU {gpu}]: failing silicon or memory, marginal power or "
          "cooling",), _WRONG_RESULTS),
    Rule("agreement", "metric:agreement_match",
         ("a GPU[ ({gpu})] computes a different result from the others: silent data corruption",), _WRONG_RESULTS),
    Rule("ddp_train", "metric:ddp_param_mismatch_ranks",
         ("ranks ended with different parameters: a GPU computing wrong results, or a collective corrupting data",),
         ("gpuaccept run --checks agreement,collectives", *_WRONG_RESULTS[1:])),
    Rule("reference_train", "metric:reftrain_*match",
         ("a GPU[ ({gpu})] trains to different bits from the other GPUs of its model (or the fleet's curve): "
          "silent data corruption",), ("gpuaccept run --checks agreement,memtest", *_WRONG_RESULTS[1:])),
    Rule("train", "any", ("training did not converge as expected: a GPU computing wrong results",), _WRONG_RESULTS),
    Rule("collectives", "any", _COLL_CAUSES, _COLL_COMMANDS),
    Rule("nccl_tests", "any", _COLL_CAUSES,
         ("gpuaccept isolate --nodes {nodes} --pair-test nccl-tests --per-rail", "nvidia-smi topo -m")),
    Rule("fabric", "metric:rdma_port*",
         ("an RDMA port down or below its rate: cable, transceiver, switch port or subnet manager",),
         ("ibstat", "ibv_devinfo -v")),
    Rule("fabric", "metric:rdma_link_downed_delta", ("the link went down during the check: cable or transceiver",),
         ("ibstat", "dmesg -T | grep -i mlx")),
    Rule("fabric", "reason:peermem", ("nvidia_peermem is not loaded: no GPUDirect RDMA",),
         ("modprobe nvidia_peermem", "lsmod | grep peermem")),
    Rule("rdma", "metric:rdma_*_bw_gbps",
         ("a NIC below its port's data rate in loopback: its PCIe link (width or speed), firmware, or the GPU's path "
          "(GPUDirect, a GPU not local to the NIC)",), ("ibstat", "nvidia-smi topo -m", "ibv_devinfo -v")),
    Rule("rdma", "reason:Unable to|reason:Couldn't|reason:Failed to|reason:Did not detect",
         ("perftest could not open or reach a NIC: the RDMA driver or device missing, or its localhost port taken",),
         ("ibv_devinfo", "ibstat")),
    Rule("env", "any", ("a GPU missing, disabled or hidden (CUDA_VISIBLE_DEVICES), or a driver and library "
                        "mismatch",),
         ("nvidia-smi -L", "lspci -d 10de:", "dmesg -T | grep -i -e xid -e nvrm")),
    Rule("disk", "any", ("a slow or full scratch file system",), ("df -h", "gpuaccept run --checks disk --verbose")),
    Rule("disk_space", "any", ("a file system nearly full",), ("df -h",)),
    Rule("*", "reason:GPU required (--require-gpu)", _NO_GPU, _NO_GPU_COMMANDS),
    Rule("*", "timeout",
         ("the check ran past its timeout: a hung GPU or driver (Xid), a slower node than planned, or a timeout "
          "too short for it",),
         ("dmesg -T | grep -i -e xid -e nvrm", "less {log}",
          "gpuaccept run --checks {check} --timeout-scale 2")),
    Rule("*", "error", ("the check process crashed or raised (its log has the traceback)",),
         ("less {log}", "gpuaccept run --checks {check} --verbose")),
    Rule("*", "any", ("see the reason above",), ("less {log}", "gpuaccept run --checks {check} --verbose")),
)
"""The table: checks' own rules first, then the fallbacks of every check."""

FAILED = ("fail", "error")
"""The statuses (:class:`gpuaccept.model.Status` values) that get next steps."""
_FIELD = re.compile(r"\{(\w+)\}")
_OPTIONAL = re.compile(r"\[([^\]]*)\]")
_REASON_DEVICE = re.compile(r"(?:^|; )(cuda:[0-9]+): ")
"""A GPU a reason names (``cuda:3: PCIe x8 < x16 max; cuda:5: HW slowdown``): the GPUs when no metric missed."""


def missed(result: CheckResult) -> list[Metric]:
    """The metrics of ``result`` whose bound is not met at FAIL severity (a WARN bound does not fail a check)."""
    return [m for m in result.metrics
            if m.threshold is not None and m.threshold.severity == "fail" and not m.threshold.met_by(m.value)]


def matches(rule: Rule, result: CheckResult, missed_names: list[str]) -> bool:
    """Whether ``rule``'s kind describes how ``result`` failed."""
    timeout = isinstance(result.details, dict) and result.details.get("timeout") is True
    if "|" in rule.kind:
        return any(matches(Rule(rule.check, k, (), ()), result, missed_names) for k in rule.kind.split("|"))
    kind, _, arg = rule.kind.partition(":")
    if kind == "metric":
        return any(fnmatch.fnmatchcase(name, arg) for name in missed_names)
    if kind == "reason":
        return arg.lower() in result.reason.lower()
    if kind == "timeout":
        return timeout
    if kind == "error":
        return result.status == "error" and not timeout
    return kind == "any"


def fill(template: str, values: dict[str, str]) -> str | None:
    """``template`` with ``values`` filled in; a bracketed part with an unknown value is dropped, and None when
    an unknown value is outside brackets."""
    def optional(m: re.Match[str]) -> str:
        part = m.group(1)
        return part if all(values.get(k) for k in _FIELD.findall(part)) else ""

    text = _OPTIONAL.sub(optional, template)
    if not all(values.get(k) for k in _FIELD.findall(text)):
        return None
    return _FIELD.sub(lambda m: values[m.group(1)], text)


def _nvml_index(report: NodeReport | None) -> dict[str, str]:
    """CUDA device label (``cuda:0``) -> NVML index, from the env check's inventory (empty when absent)."""
    out: dict[str, str] = {}
    env = next((c for c in report.checks if c.name == "env"), None) if report is not None else None
    nvml = env.details.get("nvml") if env is not None and isinstance(env.details, dict) else None
    gpus = nvml.get("gpus") if isinstance(nvml, dict) else None
    for g in gpus if isinstance(gpus, list) else []:
        if isinstance(g, dict) and isinstance(g.get("device"), str) and isinstance(g.get("index"), int):
            out[g["device"]] = str(g["index"])
    return out


def values_for(result: CheckResult, report: NodeReport | None, hosts: list[str] | None = None,
               run_dir: str | None = None) -> dict[str, str]:
    """The real values of one failed check's templates (see the module docstring); ``run_dir``, where known,
    gives the log of a check whose details name none (``<run_dir>/logs/<check>.log``)."""
    host = result.host or (report.host if report is not None else "")
    devices = sorted({m.device for m in missed(result) if m.device and m.device.startswith("cuda:")}
                     or set(_REASON_DEVICE.findall(result.reason)),
                     key=lambda d: int(d[5:]) if d[5:].isdigit() else 0)
    index = _nvml_index(report)
    log = result.details.get("log") if isinstance(result.details, dict) else None
    if not isinstance(log, str) and run_dir:
        log = f"{run_dir}/logs/{result.name}.log"
    others = [h for h in hosts or [] if h != host]
    return {
        "host": host,
        "nodes": ",".join([host, *others]) if others else (f"{host},OTHER_NODES" if host else ""),
        "gpu": ",".join(index.get(d, d[5:]) for d in devices),
        "ordinal": ",".join(d[5:] for d in devices),
        "check": result.name,
        "run_id": report.run_id if report is not None else "",
        "log": log if isinstance(log, str) else "",
    }


def next_steps(result: CheckResult, report: NodeReport | None = None, hosts: list[str] | None = None,
               rules: tuple[Rule, ...] = RULES, run_dir: str | None = None) -> dict[str, list[str]] | None:
    """``{"causes": [...], "commands": [...]}`` for a FAIL or ERROR ``result`` (None for any other status);
    ``report`` is its node's report, ``hosts`` the cluster's and ``run_dir`` the run's directory (where known),
    for the values filled in."""
    if result.status not in FAILED:
        return None
    names = [m.name for m in missed(result)]
    own = [r for r in rules if r.check == result.name and r.kind != "any" and matches(r, result, names)]
    own = own or [r for r in rules if r.check == result.name and r.kind == "any"]
    fallback = [r for r in rules if r.check == "*" and matches(r, result, names)][:1]
    chosen = own + [r for r in fallback if not own or r.kind in ("timeout", "error")]
    values = values_for(result, report, hosts, run_dir)
    causes: list[str] = []
    commands: list[str] = []
    for rule in chosen:
        for out, templates in ((causes, rule.causes), (commands, rule.commands)):
            for t in templates:
                text = fill(t, values)
                if text is not None and text not in out:
                    out.append(text)
    return {"causes": causes, "commands": commands}


def report_next_steps(report: NodeReport, hosts: list[str] | None = None) -> dict[int, dict[str, list[str]]]:
    """Each failed check's next steps by its position in ``report.checks``."""
    out = {}
    for i, r in enumerate(report.checks):
        steps = next_steps(r, report, hosts)
        if steps is not None:
            out[i] = steps
    return out


def step_lines(steps: dict[str, Any] | None) -> list[str]:
    """``likely: ...`` and ``next: ...`` lines of one check's next steps (the console's)."""
    if not steps:
        return []
    return [*(f"likely: {c}" for c in steps.get("causes", [])), *(f"next:   {c}" for c in steps.get("commands", []))]
