"""Expectations of performance figures derived from the SKU table (``gpuaccept/data/skus.yaml``). Pure.

Each function returns the spec value a figure is compared with (``expected``) and the ``>=`` bound it must
meet (``expected x`` the SKU's pass fraction for the family, severity FAIL, source ``sku:<id>``), or None
where no honest expectation exists. The derivations are those documented in ``skus.yaml``:

- ``stress_tflops`` (TFLOP/s): the dense GEMM peak of the dtype stress multiplies in, family
  ``stress_<dtype>`` (``stress`` 0.5 by default: sustained load on every GPU at once, at the power cap).
- ``nbody_gflops`` (GFLOP/s, 20 flops per interaction): the FP32 peak for fp32 bodies, the FP64 figure of
  the CUDA cores (``fp64_vector_tflops``) for fp64 ones, x 1000; family ``nbody_<dtype>`` (``nbody`` 0.2).
  Only the fused (compiled) kernel: the eager one is memory-bound and its rate says little of the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuaccept.model import Metric, Status, Threshold

if TYPE_CHECKING:
    from gpuaccept.hw.sku import Sku


@dataclass(frozen=True)
class Expectation:
    """A figure's spec value and the bound derived from it."""

    expected: float
    threshold: Threshold

    def apply(self, metric: Metric) -> Metric:
        """Set ``metric``'s ``expected`` and ``threshold`` (in place); returns it."""
        metric.expected = self.expected
        metric.threshold = self.threshold
        return metric


def from_spec(sku: Sku | None, expected: float | None, family: str,
              severity: Status = Status.FAIL) -> Expectation | None:
    """``expected`` with the bound ``expected x sku.pass_fraction(family)`` sourced ``sku:<id>``; None
    without a SKU, a spec value or a pass fraction for ``family``."""
    if sku is None or not expected:
        return None
    try:
        fraction = sku.pass_fraction(family)
    except KeyError:
        return None
    return Expectation(expected, Threshold(">=", round(expected * fraction, 3), severity, f"sku:{sku.id}"))


def stress_expectation(sku: Sku | None, dtype: str) -> Expectation | None:
    """``stress_tflops`` in TFLOP/s: the dense GEMM peak of ``dtype`` (``fp64``: the tensor-core figure DGEMM
    reaches), bound by family ``stress_<dtype>``."""
    return from_spec(sku, sku.peak_tflops(dtype) if sku else None, f"stress_{dtype}")


NBODY_PEAKS = {"fp32": "the FP32 peak", "fp64": "the FP64 vector (CUDA-core) peak"}


def nbody_peak_tflops(sku: Sku, dtype: str) -> float | None:
    """The peak an n-body kernel in ``dtype`` can reach on ``sku``, TFLOP/s: FP32 (CUDA cores, which is what
    ``peak_tflops['fp32']`` is) or the FP64 vector figure; None where the table has none."""
    if dtype == "fp32":
        return sku.peak_tflops("fp32")
    if dtype == "fp64":
        return sku.fp64_vector_tflops
    return None


def nbody_expectation(sku: Sku | None, dtype: str, kernel: str) -> Expectation | None:
    """``nbody_gflops`` in GFLOP/s: :func:`nbody_peak_tflops` x 1000, bound by family ``nbody_<dtype>``;
    None for the ``eager`` kernel (memory-bound) or without a peak."""
    if sku is None or kernel != "compiled":
        return None
    peak = nbody_peak_tflops(sku, dtype)
    return from_spec(sku, peak * 1000.0 if peak else None, f"nbody_{dtype}")
