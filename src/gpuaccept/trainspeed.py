"""Training speed against the GEMM rate: ``reference_train``'s model TFLOP/s per device over the ``compute``
check's measured GEMM TFLOP/s on the same device, from a node report (pure; no I/O).

A check cannot see another check's result, so this is read where the node report is complete: report.json
(``checks[i].train_vs_gemm``, derived, written by :meth:`gpuaccept.model.NodeReport.to_dict`), the console
summary, the Markdown and the HTML report. The ratio is **measured, not judged**: no threshold decides on it.
It makes "the GEMM is fast but training is slow" (host, data loading, optimizer, attention, thermal) visible.

Pairing, per device of a ``reference_train`` result: the ``compute`` result of the same report, host and rank
(its first pass, not a ``--budget`` re-run); its GEMM of the training's dtype (``details.dtype``: ``bf16`` on a
GPU, ``fp32`` on the CPU); measured the way the training ran: all GPUs at once
(``gemm_<dtype>_tflops_concurrent``) when several devices trained together, else one GPU alone
(``gemm_<dtype>_tflops``); the other mode when that one is missing. ``ratio = model TFLOP/s / GEMM TFLOP/s``.
The equivalent by hand: a training job's logged model TFLOP/s (the MFU numerator, 6 x N x tokens/s plus
attention) divided by a GEMM benchmark's rate on the same GPU (``gpuaccept run --checks compute``, or cuBLAS's
``cublasLt`` samples).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # read by shape: model's NodeReport.to_dict calls this module, which imports nothing of ours
    from gpuaccept.model import CheckResult, NodeReport

TRAIN_CHECK = "reference_train"
TRAIN_METRIC = "reftrain_tflops"
GEMM_CHECK = "compute"


@dataclass(frozen=True)
class TrainVsGemm:
    """One device's training rate against its GEMM rate (both TFLOP/s)."""

    device: str
    model_tflops: float
    gemm_tflops: float
    gemm_metric: str
    """The compute metric compared with (``gemm_bf16_tflops`` or ``gemm_bf16_tflops_concurrent``)."""

    @property
    def ratio(self) -> float:
        """Model TFLOP/s over GEMM TFLOP/s (a fraction; 1.0: training runs at the GEMM's rate)."""
        return self.model_tflops / self.gemm_tflops

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "model_tflops": _round(self.model_tflops),
                "gemm_tflops": _round(self.gemm_tflops), "gemm_metric": self.gemm_metric,
                "ratio": round(self.ratio, 4)}

    def text(self) -> str:
        """``cuda:0: 412 model TFLOP/s = 0.61 of its GEMM rate (672 TFLOP/s, gemm_bf16_tflops)``."""
        return (f"{self.device}: {flops_text(self.model_tflops, 'model ')} = {self.ratio:.2f} of its GEMM rate "
                f"({flops_text(self.gemm_tflops)}, {self.gemm_metric})")


def _round(x: float) -> float:
    """Six significant digits (a CPU's rates are thousandths of a TFLOP/s)."""
    return float(f"{x:.6g}")


def flops_text(tflops: float, what: str = "") -> str:
    """``412 TFLOP/s``, or ``1.52 GFLOP/s`` under 1 TFLOP/s (a CPU's rates), three significant digits."""
    if tflops >= 1:
        return f"{tflops:.3g} {what}TFLOP/s"
    return f"{tflops * 1e3:.3g} {what}GFLOP/s"


def _rate(metrics: Iterable[Any], name: str, device: str) -> float | None:
    """The value of metric ``name`` on ``device``: finite and positive, else None."""
    for m in metrics:
        if m.name == name and m.device == device and math.isfinite(m.value) and m.value > 0:
            return float(m.value)
    return None


def train_vs_gemm(train: CheckResult, checks: Iterable[CheckResult]) -> list[TrainVsGemm]:
    """Each device of ``train`` (a ``reference_train`` result) with a model rate and a GEMM rate of its dtype in
    the ``compute`` result among ``checks`` (same host and rank), in the training's device order; [] when
    either is missing (a run without ``compute``, a skipped check, a report from before these figures)."""
    if train.name != TRAIN_CHECK:
        return []
    compute = next((c for c in checks if c.name == GEMM_CHECK and not c.is_rerun and c.host == train.host
                    and c.rank == train.rank), None)
    if compute is None:
        return []
    rates = [m for m in train.metrics if m.name == TRAIN_METRIC and m.device and math.isfinite(m.value)
             and m.value > 0]
    if not rates:
        return []
    dtype = train.details.get("dtype") if isinstance(train.details, dict) else None
    together = len({m.device for m in rates}) > 1
    out = []
    for m in rates:
        device = str(m.device)
        dt = dtype if isinstance(dtype, str) and dtype else str(m.tags.get("dtype", ""))
        names = [f"gemm_{dt}_tflops_concurrent", f"gemm_{dt}_tflops"]
        for name in names if together else names[::-1]:
            gemm = _rate(compute.metrics, name, device)
            if gemm is not None:
                out.append(TrainVsGemm(device, float(m.value), gemm, name))
                break
    return out


def report_train_vs_gemm(report: NodeReport) -> dict[int, list[dict[str, Any]]]:
    """``{position in report.checks: [TrainVsGemm.to_dict(), ...]}`` for each ``reference_train`` result with
    any device compared (report.json's derived ``train_vs_gemm``)."""
    out = {}
    for i, c in enumerate(report.checks):
        rows = train_vs_gemm(c, report.checks)
        if rows:
            out[i] = [r.to_dict() for r in rows]
    return out


def summary_lines(report: NodeReport) -> dict[int, list[str]]:
    """``{position: [line, ...]}``: each compared device's :meth:`TrainVsGemm.text`, marked not judged."""
    out = {}
    for i, c in enumerate(report.checks):
        rows = train_vs_gemm(c, report.checks)
        if rows:
            out[i] = [f"{r.text()}; not judged" for r in rows]
    return out
