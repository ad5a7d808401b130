"""What gpuaccept's profiles and checks stand in for, as data: DCGM diagnostic levels and plugins, nccl-tests
binaries, gpu-burn, and each profile's expected duration on a GPU node. Imports nothing; the docs render it.

:data:`PROFILES` gives each profile its DCGM level and its expected seconds on an 8-GPU node
(``EXPECTED_GPUS``): the sum of its checks' built-in estimates (:mod:`gpuaccept.checks.estimates`, rates set
deliberately low) for 8 GPUs, each check's process start and the run's own overhead included
(:mod:`gpuaccept.node.budget`). A test recomputes them, so the figures cannot drift from the estimates.
These are conservative (an H100 node finishes well before); on a real node ``gpuaccept run --plan`` shows the
figure for its own GPU count, and ``--budget`` plans calibrate it from the node's past runs. The DCGM level is
the one whose content the profile covers, not a promise of the same duration.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPECTED_GPUS = 8
"""The GPU count the profiles' expected durations are computed for."""


@dataclass(frozen=True)
class ProfileInfo:
    """A profile: the DCGM diagnostic level it corresponds to (``dcgmi diag -r N``) and its expected seconds."""

    dcgm_level: str
    dcgm_note: str
    expected_s: int


PROFILES: dict[str, ProfileInfo] = {
    "quick": ProfileInfo("r1", "dcgmi diag -r 1 (seconds): deployment and software checks", 178),
    "standard": ProfileInfo("r2", "dcgmi diag -r 2 (about 2 min): adds PCIe and memory", 913),
    "full": ProfileInfo("r3", "dcgmi diag -r 3 (about 15 min): adds targeted stress and power, memory "
                              "bandwidth, diagnostic GEMM", 5178),
    "burnin": ProfileInfo("r4", "dcgmi diag -r 4 (an hour or more): extended stress and memtest", 2261),
}


@dataclass(frozen=True)
class Equivalent:
    """What a check replaces: the DCGM diag plugin (``""``: none), the other tool or behaviour, and a note."""

    dcgm: str
    tool: str
    note: str = ""


CHECKS: dict[str, Equivalent] = {
    "env": Equivalent("software (deployment)", "nvidia-smi -L; nvidia-smi --query-gpu=index,name,uuid,driver_version",
                      "driver, libraries, GPU inventory and count"),
    "health": Equivalent("software (page retirement, inforom); dcgmi health -c",
                         "nvidia-smi -q -d ECC,ROW_REMAPPER,PCI,TEMPERATURE,POWER,PERFORMANCE; dmesg Xid",
                         "one NVML snapshot, no load"),
    "conformance": Equivalent("", "nvidia-smi -q; nvidia-smi nvlink -s; ibv_devinfo -v; uname -r; nvidia-ctk "
                                  "--version; a site's golden-configuration script",
                              "driver, VBIOS, clocks, PCIe, NVLink and fabric, NIC, partition, NCCL, runtime and OS "
                              "items against a manifest or the fleet"),
    "disk_space": Equivalent("", "df -h", "free space of scratch and temporary file systems"),
    "fabric": Equivalent("", "ibstat; ibv_devinfo; lsmod | grep nvidia_peermem",
                         "RDMA ports, counters, GPU/NIC NUMA; DCGM does not look at the NICs"),
    "compute": Equivalent("diagnostic (GEMM)", "gpu-burn's GEMM rate; cuBLAS GEMM benchmarks",
                          "TFLOP/s per dtype against the SKU, results verified"),
    "memory": Equivalent("pcie (host<->device bandwidth); memory_bandwidth", "nvbandwidth; STREAM on the CPU",
                         "device copy and pinned PCIe copies, data verified"),
    "p2p": Equivalent("pcie (peer-to-peer bandwidth and latency)",
                      "nvbandwidth -t device_to_device_memcpy_read_ce (and _write_ce, host_to_device_memcpy_ce); "
                      "p2pBandwidthLatencyTest; nvidia-smi nvlink -e before and after",
                      "every GPU pair one way and both ways, latency, host<->device per GPU, NVLink errors under load"),
    "memtest": Equivalent("memory; memtest (r4)", "cuda_memtest; gpu-burn's memory fill",
                          "walking-bit, random and address patterns over free memory"),
    "train": Equivalent("", "a PyTorch training smoke test", "loss must fall on a seeded model"),
    "nbody": Equivalent("", "CUDA samples' nbody -benchmark", "all-pairs n-body GFLOP/s, verified in fp64"),
    "stress": Equivalent("targeted_stress; targeted_power", "gpu-burn -d DURATION",
                         "sustained GEMM; results compared with the first and with fp64, throughput drop"),
    "agreement": Equivalent("", "gpu-burn's error count (result comparison)",
                            "the same seeded GEMM chain on every GPU, hashes compared bitwise"),
    "reference_train": Equivalent("", "a short MaxText, Megatron-LM or TorchTitan run per GPU, loss curves "
                                  "compared", "a seeded GPT-style decoder: loss under the task's bound, per-step "
                                  "bits identical across GPUs, model TFLOP/s against the bf16 peak"),
    "throughput": Equivalent("", "small MLPerf-style training benchmarks", "samples/s of a CNN and a transformer"),
    "disk": Equivalent("", "fio (sequential and 4k random)", "MB/s and IOPS of a scratch path"),
    "collectives": Equivalent("pcie (peer-to-peer and NVLink bandwidth)",
                              "nccl-tests all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, "
                              "broadcast_perf, sendrecv_perf", "busbw per size and #wrong, through torch.distributed"),
    "ddp_train": Equivalent("", "a PyTorch DDP smoke test", "loss falls, parameters bit-identical on all ranks"),
    "reference_train_ddp": Equivalent("", "a short torchrun MaxText/Megatron-LM/TorchTitan data-parallel run "
                                      "compared with a one-GPU run", "the DDP loss curve within tolerance of one "
                                      "device's, tokens/s per rank, the straggler named"),
    "nccl_tests": Equivalent("", "nccl-tests all_reduce_perf etc. (runs them)", "#wrong = 0, busbw vs the fabric"),
    "rdma": Equivalent("", "ib_write_bw -d mlx5_0 --use_cuda=0 --report_gbits per NIC, loopback",
                       "each NIC's bandwidth against its port's data rate (Azure's node health checks); DCGM does not "
                       "measure the NICs"),
}
"""Each built-in check's counterpart (a test holds that every registered built-in check has one)."""


def profile_help(profile: str) -> str:
    """``quick: about 1 min on an 8-GPU node (like dcgmi diag -r 1)``."""
    info = PROFILES[profile]
    return f"{profile}: about {_minutes(info.expected_s)} on an {EXPECTED_GPUS}-GPU node (like DCGM {info.dcgm_level})"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
