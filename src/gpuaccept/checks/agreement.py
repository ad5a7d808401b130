"""Cross-GPU agreement: the same seeded, deterministic GEMM chain on every GPU, results compared bitwise.

Silent data corruption shows as a wrong value far more often than as a NaN.
Every device computes ``X <- (X @ W) / sqrt(N)`` ``chain`` times from the same
seeded ``X``, ``W`` (made on the CPU, so identical everywhere) with
``torch.use_deterministic_algorithms(True)``, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
and TF32 off, per dtype in ``dtypes``; the SHA-256 of the result's bytes is
that device's hash. GPUs of one model must agree bit for bit: the hash held by
more than half of them is the majority, and a GPU whose hash differs is named.
GPUs of different models are voted on separately (their libraries may pick
other kernels). The first product of the chain is also checked against an fp64
reference on a ``ref_sample`` corner, so a device that is wrong on its own
(or every device alike) is caught too.

With one device (one GPU, or the CPU) there is nobody to vote with: the device
runs the chain ``runs`` times and the runs must agree (repeatability), plus the
fp64 reference. The reason says what was compared. The equivalent by hand is
running the same script on each GPU and comparing ``sha256sum`` of the saved
results.

Metrics per device and dtype: ``agreement_match`` (1 when the device's hash is
its group's majority, or all its runs agree; default threshold ``min 1``) and
``agreement_ref_error`` (max relative error of the first product against fp64,
threshold: the dtype's GEMM tolerance).

``CUBLAS_WORKSPACE_CONFIG`` is read by cuBLAS once per process, at its first GEMM, so it is set
where the process starts: the runner puts it in the check process's environment
(:meth:`AgreementCheck.process_env`: a deterministic value already there is kept, any other
replaced by ``:4096:8``). On a GPU the check runs only with a deterministic value (``:4096:8`` or
``:16:8``), or none in a process where CUDA has not started yet (it sets it then); anything else,
and torch's refusal of a non-deterministic cuBLAS configuration, is an ERROR that says so.

Tests only: ``GPUACCEPT_TEST_AGREEMENT_FAULT=cuda:1`` (or ``cpu#1``: run 1 of a
single device) flips the lowest bit of one element of that result.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import (
    Check,
    CheckContext,
    Outcome,
    Param,
    RequiredMetric,
    ThresholdRule,
    per_device,
    torch_devices_or_skip,
)
from gpuaccept.checks.compute import GEMM_TOLERANCE, fp32_matmul_mode, gemm_error, torch_dtype
from gpuaccept.checks.timing import synchronize
from gpuaccept.model import Metric, Status, Threshold

FAULT_ENV = "GPUACCEPT_TEST_AGREEMENT_FAULT"
AGREE_DTYPES = ("fp64", "fp32", "fp16", "bf16")
CUBLAS_WORKSPACE = ":4096:8"
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
DETERMINISTIC_WORKSPACES = (":4096:8", ":16:8")
"""The values with which torch's deterministic mode allows cuBLAS GEMMs (torch's
``Context::checkCuBLASConfigDeterministic``)."""
_INT_VIEW = {8: "int64", 4: "int32", 2: "int16"}


@dataclass(frozen=True)
class Vote:
    """The majority hash (None when no hash has more than half), the labels that differ from it, the groups."""

    majority: str | None
    odd: list[str]
    groups: dict[str, list[str]] = field(default_factory=dict)


def vote(hashes: Mapping[str, str]) -> Vote:
    """Majority vote over ``{label: hash}``: the hash more than half hold; the others are odd. Pure.

    Without a majority (two devices that differ, three all different) every label is odd and
    ``majority`` is None: something is wrong, but nobody can say which.
    """
    groups: dict[str, list[str]] = {}
    for label, h in hashes.items():
        groups.setdefault(h, []).append(label)
    if not hashes:
        return Vote(None, [], groups)
    top, count = Counter(hashes.values()).most_common(1)[0]
    if 2 * count <= len(hashes) and len(hashes) > 1:
        return Vote(None, list(hashes), groups)
    return Vote(top, [label for label, h in hashes.items() if h != top], groups)


def result_hash(t: Any) -> str:
    """SHA-256 (first 16 hex digits) of a tensor's bytes, in row-major order on the CPU."""
    import torch

    data = t.detach().contiguous().to("cpu")
    if data.dtype in (torch.bfloat16, torch.float16):
        data = data.view(torch.int16)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]


def deterministic_workspace(env: Mapping[str, str]) -> dict[str, str]:
    """A check process's deterministic ``CUBLAS_WORKSPACE_CONFIG`` from its start: the one in ``env`` when it is
    deterministic, else ``:4096:8`` (``Check.process_env`` of every check that needs bit-exact GEMMs)."""
    value = env.get(CUBLAS_ENV, "").strip()
    return {CUBLAS_ENV: value if value in DETERMINISTIC_WORKSPACES else CUBLAS_WORKSPACE}


def workspace_problem(value: str | None, cuda_started: bool) -> str | None:
    """Why cuBLAS in this process may not be deterministic with ``CUBLAS_WORKSPACE_CONFIG=value``; None when it
    is (a deterministic value, or none before CUDA started: the check sets it). Pure."""
    if value is not None and value.strip() in DETERMINISTIC_WORKSPACES:
        return None
    if value is None and not cuda_started:
        return None
    shown = "unset" if value is None else f"{value!r}"
    return (f"{CUBLAS_ENV} is {shown}{' and CUDA already started in this process' if value is None else ''}; "
            f"deterministic GEMMs need {' or '.join(DETERMINISTIC_WORKSPACES)} set before the process starts "
            "(gpuaccept run sets it)")


def cublas_refusal(exc: BaseException) -> str | None:
    """The ERROR reason for torch's RuntimeError when deterministic mode meets a non-deterministic cuBLAS
    configuration; None for any other error. Pure."""
    text = str(exc)
    if CUBLAS_ENV not in text:
        return None
    return (f"torch refused a cuBLAS GEMM in deterministic mode: {CUBLAS_ENV} in this process is "
            f"{os.environ.get(CUBLAS_ENV, 'unset')!r}, not {' or '.join(DETERMINISTIC_WORKSPACES)} "
            f"({text.splitlines()[0][:160]})")


def parse_faults(env: Mapping[str, str]) -> set[str]:
    """``GPUACCEPT_TEST_AGREEMENT_FAULT=cuda:1,cpu#2`` -> ``{"cuda:1", "cpu#2"}``."""
    return {x.strip() for x in env.get(FAULT_ENV, "").split(",") if x.strip()}


@dataclass
class ChainResult:
    hash: str
    ref_error: float


def gemm_chain(device: Any, dtype: str, n: int, chain: int, seed: int, ref_sample: int,
               corrupt: bool = False) -> ChainResult:
    """Run the chain on ``device`` (deterministic algorithms on) and hash the result (see the module doc)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n, generator=gen).to(device, torch_dtype(dtype))
    w = torch.randn(n, n, generator=gen).to(device, torch_dtype(dtype))
    scale = 1.0 / math.sqrt(n)
    first = None
    for _ in range(chain):
        x = torch.matmul(x, w) * scale
        if first is None:
            first = x
    synchronize(device)
    assert first is not None
    k = min(ref_sample, n)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(n, n, generator=gen).to(torch_dtype(dtype)).to(torch.float64)
    w0 = torch.randn(n, n, generator=gen).to(torch_dtype(dtype)).to(torch.float64)
    ref = (x0[:k] @ w0[:, :k]) * scale
    error = gemm_error(first[:k, :k], ref)
    if corrupt:
        x = x.clone()
        flat = x.view(-1).view(getattr(torch, _INT_VIEW[x.element_size()]))
        flat[0] ^= 1  # one ulp: a wrong value, not a NaN
    return ChainResult(result_hash(x), error)


class AgreementCheck(Check):
    """The same deterministic GEMM chain on every device; a device whose result hash differs is named."""

    name = "agreement"
    tag = "AGREE"
    summary = ("Same seeded deterministic GEMM chain on every GPU, result hashes compared bitwise, the odd GPU "
               "named (one device: repeated runs); first product checked against fp64")
    key_metric = "agreement_match"
    metrics = ("agreement_match", "agreement_ref_error")
    profiles: ClassVar[tuple[str, ...]] = ("full", "burnin")
    params = (
        Param("dtypes", "list", ["fp32", "bf16"], "GEMM dtypes (fp32 with TF32 off)", item="str",
              choices=AGREE_DTYPES),
        Param("size", "int", 4096, "matrix dimension N on GPU", minimum=16, maximum=32768),
        Param("cpu_size", "int", 128, "matrix dimension N on CPU", minimum=16, maximum=4096),
        Param("chain", "int", 8, "GEMMs chained, each on the previous result", minimum=1, maximum=1000),
        Param("runs", "int", 2, "runs on a single device (one GPU, or the CPU), compared with each other",
              minimum=2, maximum=100),
        Param("ref_sample", "int", 64, "rows and columns of the first product checked against fp64", minimum=1,
              maximum=1024),
        Param("seed", "int", 1234, "seed of X and W", minimum=0, maximum=(1 << 32) - 1),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {},
        "burnin": {"chain": 32, "runs": 3},
    }
    thresholds = (ThresholdRule("agreement_match", min=1),)
    timeout_s: ClassVar[dict[str, float]] = {"full": 600.0, "burnin": 900.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """A match verdict and the fp64 error on every device."""
        return per_device(devices, "agreement_match", "agreement_ref_error")

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.agreement(params, device, gpus)

    @classmethod
    def process_env(cls, env: Mapping[str, str]) -> dict[str, str]:
        """A deterministic ``CUBLAS_WORKSPACE_CONFIG`` from the process's start: the one in ``env``, else
        ``:4096:8``."""
        return deterministic_workspace(env)

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        import torch

        p = ctx.params
        on_gpu = devices[0].type == "cuda"
        if on_gpu:
            problem = workspace_problem(os.environ.get(CUBLAS_ENV), torch.cuda.is_initialized())
            if problem is not None:
                return Outcome(Status.ERROR, problem, details={"cublas_workspace_config": os.environ.get(CUBLAS_ENV)})
            os.environ.setdefault(CUBLAS_ENV, CUBLAS_WORKSPACE)  # CUDA has not started: cuBLAS reads it later
        n = int(p["size"] if on_gpu else p["cpu_size"])
        dtypes = [d for d in dict.fromkeys(p["dtypes"]) if on_gpu or d not in ("fp16",)]
        if not dtypes:
            return Outcome.skip("no dtype to compare here (fp16 GEMM is not a meaningful test on CPU)")
        faults = parse_faults(os.environ)
        models = ({str(d): torch.cuda.get_device_name(d) for d in devices} if on_gpu
                  else {"cpu": "cpu"})
        single = len(devices) == 1
        runs = int(p["runs"]) if single else 1
        old_det = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        hashes: dict[str, dict[str, str]] = {}  # dtype -> label (device, or device#run) -> hash
        errors: dict[str, dict[str, float]] = {}
        try:
            with fp32_matmul_mode(False):
                for dtype in dtypes:
                    hashes[dtype], errors[dtype] = {}, {}
                    for dev in devices:
                        for r in range(runs):
                            label = f"{dev}#{r}" if single else str(dev)
                            res = gemm_chain(dev, dtype, n, int(p["chain"]), int(p["seed"]), int(p["ref_sample"]),
                                             corrupt=label in faults or (r == 0 and str(dev) in faults))
                            hashes[dtype][label] = res.hash
                            errors[dtype][str(dev)] = max(errors[dtype].get(str(dev), 0.0), res.ref_error)
                            ctx.log(f"{label} {dtype} N={n} chain {p['chain']}: {res.hash}, "
                                    f"fp64 error {res.ref_error:.2g}")
        except torch.cuda.OutOfMemoryError as exc:
            return Outcome(Status.ERROR, f"out of memory at size {n}; lower 'size' ({str(exc).splitlines()[0]})")
        except RuntimeError as exc:
            refused = cublas_refusal(exc)
            if refused is None:
                raise
            return Outcome(Status.ERROR, refused, details={"cublas_workspace_config": os.environ.get(CUBLAS_ENV)})
        finally:
            torch.use_deterministic_algorithms(old_det)
        return self._judge(hashes, errors, models, single, runs, n, p)

    @staticmethod
    def _judge(hashes: dict[str, dict[str, str]], errors: dict[str, dict[str, float]], models: dict[str, str],
               single: bool, runs: int, n: int, p: Mapping[str, Any]) -> Outcome:
        metrics: list[Metric] = []
        problems: list[str] = []
        details: dict[str, Any] = {"size": n, "chain": p["chain"], "hashes": hashes,
                                   "cublas_workspace_config": os.environ.get(CUBLAS_ENV)}
        for dtype, by_label in hashes.items():
            tol = GEMM_TOLERANCE[dtype]
            if single:
                dev = next(iter(models))
                v = vote(by_label)
                ok = len(set(by_label.values())) == 1
                if not ok:
                    problems.append(f"{dev} {dtype}: {runs} runs of the same deterministic GEMM chain gave "
                                    f"{len(set(by_label.values()))} different results"
                                    + (f" (run(s) {', '.join(x.split('#')[1] for x in v.odd)} differ from the "
                                       "rest)" if v.majority else ""))
                verdicts = {dev: ok}
            else:
                verdicts = {}
                for model in dict.fromkeys(models.values()):
                    group = {d: h for d, h in by_label.items() if models[d] == model}
                    v = vote(group)
                    for d in group:
                        verdicts[d] = d not in v.odd
                    if v.odd and v.majority:
                        problems.append(f"{dtype}: {', '.join(v.odd)} differ(s) from the other {model} GPUs "
                                        f"({len(group) - len(v.odd)} of {len(group)} agree on {v.majority})")
                    elif v.odd:
                        problems.append(f"{dtype}: the {len(group)} {model} GPUs disagree with no majority "
                                        f"({', '.join(f'{d} {h}' for d, h in group.items())})")
            tags: dict[str, str | int | float] = {"dtype": dtype, "size": n}
            for dev, ok in verdicts.items():
                err = errors[dtype][dev]
                metrics.append(Metric("agreement_match", 1.0 if ok else 0.0, "bool", dev, tags=dict(tags)))
                metrics.append(Metric("agreement_ref_error", err, "fraction", dev, tags=dict(tags),
                                      threshold=Threshold("<=", tol, Status.FAIL, f"tolerance:{dtype}")))
                if not err <= tol:
                    problems.append(f"{dev} {dtype}: first product differs from the fp64 reference "
                                    f"(error {err:.3g} > {tol:g})")
        if problems:
            return Outcome.failed("; ".join(problems[:4]) + (f"; and {len(problems) - 4} more"
                                                              if len(problems) > 4 else ""), metrics, **details)
        if single:
            dev = next(iter(models))
            what = (f"one device ({dev}): compared {runs} runs of the chain with each other (repeatability; no "
                    "other GPU to vote with)")
        else:
            what = f"{len(models)} GPUs agree bit for bit" + (
                f" within each model ({', '.join(dict.fromkeys(models.values()))})"
                if len(set(models.values())) > 1 else "")
        return Outcome.passed(f"{what}; {', '.join(hashes)} N={n}, chain of {p['chain']}; first product within "
                              "tolerance of fp64", metrics, **details)


CHECKS = (AgreementCheck,)
