"""Writes the node reports of ``tests/data/history/reports/``: two H100 hosts over eight days of runs.

Run from the repository root: ``.venv/bin/python tests/data/history/make_reports.py``. Deterministic
(fixed seed); the reports are committed and this script documents how they were made. See README.md.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold  # noqa: E402

OUT = Path(__file__).resolve().parent / "reports"
T0 = 1_790_000_000  # 2026-09-21T14:13:20Z
DAY = 86400
GPU_NAME = "NVIDIA H100 80GB HBM3"

UA0 = "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c50"
UA1 = "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c51"
UB0 = "GPU-8e2d4c6a-1b3f-4e5d-a7c9-2b4d6f8a0c70"
UB1 = "GPU-8e2d4c6a-1b3f-4e5d-a7c9-2b4d6f8a0c71"
UN = "GPU-d41f0a9b-7c2e-4b8d-9e3f-6a5b4c3d2e10"
SERIAL = {UA0: "1654922000150", UA1: "1654922000151", UB0: "1654922000170", UB1: "1654922000171",
          UN: "1654923001210"}
BOARD = {"gpu-a": "OM234S600412", "gpu-b": "OM234S600977", "gpu-b-new": "OM241S700938"}
PRODUCT = {"gpu-a": "S938432X3A17254", "gpu-b": "S938432X3A17301"}
PORT_GUID = {"gpu-a": "0xb8599f03000ca7f6", "gpu-b": "0xb8599f03001ca7f6"}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def layout(host: str, day: int) -> tuple[list[str], str]:
    """(UUID of cuda:0, cuda:1) and the board serial of ``host`` on ``day``: the maintenance on day 4
    moved UA1 from gpu-a to gpu-b (in place of UB1, sent back), fitted a new GPU UN in gpu-a, and
    replaced gpu-b's mainboard."""
    if host == "gpu-a":
        return [UA0, UA1 if day < 4 else UN], BOARD["gpu-a"]
    return [UB0, UB1 if day < 4 else UA1], BOARD["gpu-b"] if day < 4 else BOARD["gpu-b-new"]


def tflops(uuid: str, host: str, day: int) -> float:
    """Each GPU's own speed: UB1 was a slow part, UN is a normal one slower than UA1, and UA1 slows down
    (by 8 %) two days after it moved."""
    if uuid == UA1 and host == "gpu-b" and day >= 5:
        return 680.0
    return {UA0: 745.0, UA1: 740.0, UB0: 735.0, UB1: 650.0, UN: 690.0}[uuid]


def triad(host: str, day: int) -> float:
    """STREAM triad of the node: gpu-b's new board has fewer memory channels populated."""
    return 250.0 if host == "gpu-a" or day < 4 else 225.0


def env_check(host: str, uuids: list[str], board: str, *, old: bool) -> CheckResult:
    """The env check as gpuaccept writes it; ``old``: as the version before hardware identities wrote it
    (no ``device``/``serial`` per GPU, no ``identity``)."""
    gpus: list[dict[str, Any]] = []
    for i, u in enumerate(uuids):
        g: dict[str, Any] = {"index": i, "name": GPU_NAME, "uuid": u,
                             "pci_bus_id": f"00000000:{0x18 + 0x12 * i:02X}:00.0",
                             "memory_total_bytes": 85520809984, "sku": "h100_sxm"}
        if not old:
            g = {"index": i, "device": f"cuda:{i}", "name": GPU_NAME, "uuid": u, "serial": SERIAL[u],
                 **{k: v for k, v in g.items() if k not in ("index", "name", "uuid")}}
        gpus.append(g)
    details: dict[str, Any] = {
        "host": host, "os": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic", "machine": "x86_64",
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "cpu_count": 224, "cpu_affinity": 224,
        "memory_total_bytes": 2163680747520, "python": "3.11.9", "python_executable": "/usr/bin/python3",
        "torch": {"installed": True, "version": "2.4.0+cu124", "cuda": "12.4", "cudnn": "9.1.0", "nccl": "2.20.5",
                  "cuda_available": True, "device_count": 2, "kernel_ok": True, "kernel_error": None},
        "nvml": {"available": True, "driver_version": "550.54.15", "nvml_version": "12.550.54.15",
                 "cuda_driver_version": "12.4", "gpu_count": 2, "gpus": gpus},
        "cuda_visible_devices": None, "cuda_compat": "driver CUDA 12.4 >= torch CUDA 12.4",
    }
    if not old:
        details["identity"] = {
            "node": {"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR", "product_serial": PRODUCT[host],
                     "board_vendor": "Supermicro", "board_name": "X13DEG-OAD", "board_serial": board},
            "nics": [{"port": "mlx5_0:1", "guid": PORT_GUID[host], "node_guid": PORT_GUID[host]}]}
    return CheckResult("env", Status.PASS, f"2x {GPU_NAME}, driver 550.54.15 (CUDA 12.4), torch 2.4.0+cu124 "
                       "(CUDA 12.4)", 0.6, [Metric("gpu_count", 2.0, "count"), Metric("cpu_count", 224.0, "count")],
                       details)


def report(host: str, day: int, rng: random.Random, *, env: bool = True, old: bool = False) -> NodeReport:
    uuids, board = layout(host, day)
    started = T0 + DAY * day + (0 if host == "gpu-a" else 600)
    run_id = f"{datetime.fromtimestamp(started, timezone.utc):%Y%m%dT%H%M%SZ}-{host}-d{day}"
    compute = CheckResult("compute", Status.PASS, "bf16 GEMM within spec", 31.2, [
        Metric("gemm_bf16_tflops", round(tflops(u, host, day) * (1 + rng.gauss(0, 0.002)), 2), "TFLOP/s",
               device=f"cuda:{i}", expected=989.0, threshold=Threshold(">=", 593.4, Status.FAIL, "sku:h100_sxm"),
               tags={"dtype": "bf16", "size": 8192, "mode": "single", "stat": "median"})
        for i, u in enumerate(uuids)])
    memory = CheckResult("memory", Status.PASS, "STREAM within range", 4.1, [
        Metric("stream_triad_gbs", round(triad(host, day) * (1 + rng.gauss(0, 0.003)), 2), "GB/s", device="cpu",
               tags={"size_bytes": 1 << 30, "threads": 224})])
    checks = ([env_check(host, uuids, board, old=old)] if env else []) + [compute, memory]
    names = ",".join(c.name for c in checks)
    rep = NodeReport(run_id=run_id, host=host, profile="standard", started=iso(started), finished=iso(started + 50),
                     checks=checks, device="cuda", argv=["run", "--checks", names],
                     version="0.9.0" if old else "0.10.0")
    rep.verdict = rep.decide(frozenset({"env"}))
    return rep


def main() -> None:
    rng = random.Random(18)
    OUT.mkdir(parents=True, exist_ok=True)
    for f in OUT.glob("*.json"):
        f.unlink()
    for day in range(8):
        for host in ("gpu-a", "gpu-b"):
            # days 0-1 written by the previous version; gpu-a's day-6 run had no env check
            rep = report(host, day, rng, env=not (host == "gpu-a" and day == 6), old=day < 2)
            (OUT / f"{rep.run_id}.json").write_text(json.dumps(rep.to_dict(), indent=2) + "\n")


if __name__ == "__main__":
    main()
