"""The ``nccl_tests`` check: run NVIDIA's nccl-tests binaries on this node and judge their output.

For each test of ``tests`` it runs ``<test>_perf <args> -g <GPUs>`` (the binary from ``$PATH``,
``$NCCL_TESTS_DIR`` or /workspace/nccl-tests/build), parses the table
(:mod:`gpuaccept.nccltests.parse`) and judges it (:mod:`gpuaccept.nccltests.judge`): ``#wrong``
must be 0, the footer must say OK, exit code 7 is a data or bandwidth failure, and the lowest busbw
(GB/s) at the judged sizes (>= ``judge_min_bytes``, default the largest) must reach the bound of
:func:`gpuaccept.nccltests.busbw.busbw_reference`, the collectives check's path: a baseline, else
``min_busbw_gbs``, else the expectation derived from this node's NVLink or PCIe links (NVML) x 0.8.
Equivalent command: ``all_reduce_perf -b 8M -e 1G -f 2 -g 8``.

It is in the standard and full profiles (and runs by name with ``--checks nccl_tests``); where no
binary is found it is a SKIP that names the places looked, so the plan never depends on the file system.
RDMA error counters that rise while the binaries run are reported per port (``fabric_root``;
:mod:`gpuaccept.checks.fabric_watch`); on GPUs, a NVLink link whose CRC, replay or recovery errors rise
while they run fails the check (:mod:`gpuaccept.checks.nvlink_watch`). Across nodes, run nccl-tests under
mpirun or srun and parse its log with ``gpuaccept nccl-tests parse`` (see docs/howto/nccl-tests.md).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, RequiredMetric
from gpuaccept.checks.fabric_watch import DELTA_METRICS, DELTA_RULES, FABRIC_ROOT, FabricWatch
from gpuaccept.checks.nvlink_watch import DELTA_METRICS as NVLINK_DELTAS
from gpuaccept.checks.nvlink_watch import NvlinkWatch, node_reader
from gpuaccept.errors import InputError
from gpuaccept.model import Metric, Status, worst
from gpuaccept.nccltests.busbw import FabricFacts, live_facts, result_fabric
from gpuaccept.nccltests.judge import (
    OP_NAMES,
    TESTS,
    find_binary,
    judge,
    places_looked,
    result_details,
    run_binary,
)
from gpuaccept.nccltests.parse import parse_text


def gpu_args(args: list[str], gpus: list[int] | None, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``args`` plus ``-g N`` (unless given) and the environment restricting nccl-tests to ``gpus``.

    ``gpus`` are CUDA ordinals as seen here; an existing ``CUDA_VISIBLE_DEVICES`` is narrowed. Without
    ``gpus``, N is every GPU the binary will see: the driver's count narrowed by ``CUDA_VISIBLE_DEVICES``
    (and its MIG entries), as :func:`gpuaccept.distributed.local.default_nproc` counts ranks; 4 on a
    job given 4 of 8 GPUs, where ``-g 8`` makes nccl-tests exit with "Invalid number of GPUs".
    """
    env = dict(env)
    if gpus is not None:
        visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        chosen = [visible[g] if g < len(visible) else str(g) for g in gpus] if visible else [str(g) for g in gpus]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    if "-g" in args or any(a.startswith("--ngpus") for a in args):
        return list(args), env
    if gpus is not None:
        n = len(gpus)
    else:
        from gpuaccept.hw.devices import visible_gpu_count

        n = visible_gpu_count(env)
    return [*args, "-g", str(max(n, 1))], env


class NcclTestsCheck(Check):
    name = "nccl_tests"
    tag = "nccl-tests"
    summary = "run nccl-tests (all_reduce_perf ...) on this node: #wrong = 0, busbw at the large sizes vs the fabric"
    params = (
        Param("tests", "list", ["all_reduce"], "nccl-tests to run, each as <test>_perf", choices=TESTS),
        Param("args", "list", ["-b", "8M", "-e", "1G", "-f", "2"],
              "arguments for every binary (-g is added: one per GPU unless given)"),
        Param("min_busbw_gbs", "float", 0.0, "fail when busbw (GB/s) at the judged sizes is lower (0: not judged)",
              minimum=0, maximum=10000.0),
        Param("judge_min_bytes", "int", 0, "judge busbw at sizes >= this (bytes; 0: only the largest size)",
              minimum=0, maximum=1 << 40),
        FABRIC_ROOT,
    )
    thresholds = DELTA_RULES
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"args": ["-b", "64M", "-e", "256M", "-f", "2", "-n", "5"]},
        "full": {"args": ["-b", "8", "-e", "8G", "-f", "2"]},
    }
    timeout_s: ClassVar[dict[str, float]] = {"quick": 120.0, "standard": 600.0, "full": 1800.0}
    profiles: ClassVar[tuple[str, ...]] = ("standard", "full")
    key_metric = "allreduce_busbw_large_gbs"
    metrics = (*(f"{OP_NAMES.get(t, t)}_{m}" for t in TESTS for m in ("busbw_large_gbs", "wrong", "out_of_bounds",
                                                                     "avg_busbw_gbs")), *DELTA_METRICS,
               *NVLINK_DELTAS)

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """The judged busbw of every test run (``<op>_busbw_large_gbs``); the footer figures (wrong,
        average busbw, out of bounds) depend on the nccl-tests build and are not required."""
        return [RequiredMetric(f"{OP_NAMES.get(t, t)}_busbw_large_gbs") for t in params.get("tests", [])]

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float | None:
        return estimates.nccl_tests(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        env = dict(os.environ)
        p = ctx.params
        found = {t: find_binary(t, env) for t in p["tests"]}
        missing = [f"{t}_perf" for t, path in found.items() if path is None]
        if missing:
            # a missing tool is not a missing GPU: a SKIP with the places looked, even under --require-gpu (an H200
            # run read "GPU required but none usable ... replace_part" when only nccl-tests was not installed)
            return Outcome.skip(f"nccl-tests not found: no {', '.join(missing)} in {places_looked(env)} (build "
                                "NVIDIA/nccl-tests and set NCCL_TESTS_DIR to its build directory)",
                                looked=places_looked(env))
        args, env = gpu_args(list(p["args"]), ctx.gpus, env)
        statuses: list[Status] = []
        reasons: list[str] = []
        metrics: list[Metric] = []
        details: dict[str, Any] = {}
        per_test = ctx.timeout_s * 0.95 / len(found)
        watch = FabricWatch.start(str(p.get("fabric_root", "/")))
        links = NvlinkWatch.start(node_reader) if ctx.device == "cuda" else None
        facts: FabricFacts | None = None  # NVML read once, after the first binary ran
        for test, path in found.items():
            assert path is not None
            ctx.log(f"running {path} {' '.join(args)}")
            out = run_binary(path, args, per_test, env)
            try:
                result = parse_text(out.stdout)
            except InputError as exc:
                code = "killed at the timeout" if out.returncode is None else f"exit {out.returncode}"
                tail = out.stderr.strip().splitlines()[-1:] or ["no stderr"]
                statuses.append(Status.ERROR)
                reasons.append(f"{test}_perf ({code}): {exc}; stderr: {tail[0]}")
                details[test] = {"argv": out.argv, "returncode": out.returncode, "stderr_tail": out.stderr[-2000:]}
                continue
            if facts is None:
                facts = live_facts(env.get("CUDA_VISIBLE_DEVICES"), None)
            fabric, why = result_fabric(result, OP_NAMES.get(test, test), facts)
            j = judge(result, test, min_busbw_gbs=p["min_busbw_gbs"] or None,
                      judge_min_bytes=p["judge_min_bytes"], returncode=out.returncode, fabric=fabric)
            statuses.append(j.status)
            reasons.append(j.reason)
            metrics += j.metrics
            details[test] = {**result_details(result, out), "busbw_expectation": why}
        outcome = Outcome(worst(*statuses), "; ".join(reasons), metrics, details)
        if links is not None:
            links.finish(outcome)
        return watch.finish(outcome) if watch is not None else outcome


CHECKS = (NcclTestsCheck,)
