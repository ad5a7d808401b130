"""The nbody check: physics against analytic and fp64 references, chunking, the check on CPU and GPU."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from gpuaccept.checks import nbody
from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.nbody import (
    NBODY_TOLERANCE,
    NBodyCheck,
    NBodyResult,
    NBodySystem,
    accelerations,
    chunk_rows,
    measure_nbody,
    nbody_flops,
    reference_accelerations,
    reference_run,
    relative_error,
    verify_small,
)
from gpuaccept.checks.nbody_kernel import compiler_missing
from gpuaccept.model import Status

torch = pytest.importorskip("torch")
CPU = torch.device("cpu")


def _ctx(profile: str = "quick", device: str = "cpu", **params: Any) -> CheckContext:
    values = NBodyCheck.defaults(profile)
    values.update(params)
    return CheckContext(device=device, params=values, profile=profile)


def test_two_bodies_match_newton_with_softening() -> None:
    d, eps2 = 0.3, 0.01
    pos = torch.tensor([[0.0, d], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    mass = torch.tensor([2.0, 5.0], dtype=torch.float64)
    acc = accelerations(pos, mass, eps2, rows=1)
    factor = (d * d + eps2) ** -1.5
    assert acc[0, 0].item() == pytest.approx(5.0 * d * factor)  # pulled towards +x by body 1
    assert acc[0, 1].item() == pytest.approx(-2.0 * d * factor)
    assert acc[1:].abs().max().item() == 0.0


def test_chunked_accelerations_match_reference_and_conserve_momentum() -> None:
    system = NBodySystem(CPU, 100, "fp64", seed=4)
    pos, _, mass = system.state()
    ref = reference_accelerations(pos, mass, system.softening2)
    for rows in (1, 7, 100):
        got = accelerations(system.pos, system.mass, system.softening2, rows).numpy()
        assert relative_error(got, ref) < 1e-12
    net_force = (ref * mass[None, :]).sum(axis=1)  # Newton's third law: internal forces cancel
    assert np.abs(net_force).max() < 1e-12 * np.abs(ref * mass[None, :]).sum()


def test_reference_accelerations_rows_select_bodies() -> None:
    system = NBodySystem(CPU, 50, "fp64", seed=2)
    pos, _, mass = system.state()
    full = reference_accelerations(pos, mass, system.softening2)
    rows = np.array([3, 49, 0])
    assert np.allclose(reference_accelerations(pos, mass, system.softening2, rows=rows), full[:, rows])


def test_chunk_rows_bounds_memory() -> None:
    assert chunk_rows(65536, 4, 1 << 30) == 1024  # 4 tensors x 1024 x 65536 x 4 B = 1 GiB
    assert chunk_rows(100, 4, 1 << 30) == 100  # never more than N
    assert chunk_rows(10**9, 8, 1024) == 1  # at least one row


def test_flops_convention() -> None:
    assert nbody_flops(1000) == 20 * 1000 * 1000
    assert nbody_flops(1000, steps=3) == 3 * 20e6
    r = NBodyResult("cpu", 1000, 5, 0.5, 0.0, 0.0, 0.0, 1e-4)
    assert r.gflops == pytest.approx(20e6 * 5 / 0.5 / 1e9)


def test_relative_error_detects_corruption() -> None:
    system = NBodySystem(CPU, 64, "fp32", seed=0)
    pos, _, mass = system.state()
    ref = reference_accelerations(pos, mass, system.softening2)
    got = system.accelerations().numpy().copy()
    assert relative_error(got, ref) <= NBODY_TOLERANCE["fp32"]
    got[1, 10] += 0.01 * np.sqrt(np.mean(ref * ref))  # one component 1% of the typical size off
    assert relative_error(got, ref) > NBODY_TOLERANCE["fp32"]
    got[1, 10] = np.nan
    assert relative_error(got, ref) == np.inf
    assert relative_error(got[:, :3], ref) == np.inf


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_small_case_matches_fp64_reference(dtype: str) -> None:
    acc_err, pos_err = verify_small(CPU, dtype)
    assert acc_err <= NBODY_TOLERANCE[dtype] and pos_err <= NBODY_TOLERANCE[dtype]


def test_steps_move_bodies_like_the_reference() -> None:
    system = NBodySystem(CPU, 40, "fp64", seed=5)
    pos, vel, mass = system.state()
    for _ in range(20):
        system.step()
    moved = system.state()[0]
    assert np.abs(moved - pos).max() > 1e-4  # something happened
    assert relative_error(moved, reference_run(pos, vel, mass, 20)) < 1e-12


def test_measure_nbody_on_cpu() -> None:
    res = measure_nbody(CPU, 300, steps=2, warmup=1)
    assert res.ok and res.gflops > 0 and res.bodies == 300 and res.steps == 2


def test_check_quick_on_cpu_passes() -> None:
    out = NBodyCheck().run(_ctx("quick"))
    assert out.status is Status.PASS, out.reason
    (m,) = out.metrics
    assert m.name == "nbody_gflops" and m.unit == "GFLOP/s" and m.device == "cpu" and m.value > 0
    assert m.tags == {"dtype": "fp32", "bodies": NBodyCheck.defaults("quick")["cpu_bodies"], "stat": "mean"}
    assert "matches fp64 reference" in out.reason


def test_declared_defaults_are_valid_for_every_profile() -> None:
    for profile in ("quick", "standard", "full"):
        values = NBodyCheck.defaults(profile)
        for param in NBodyCheck.params:
            assert param.coerce(values[param.name], "test", param.name) == values[param.name]


def test_wrong_physics_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = nbody.accelerations

    def unsoftened(pos: Any, mass: Any, softening2: float, rows: int, out: Any = None) -> Any:
        return real(pos, mass, softening2 * 0.5, rows, out)  # a subtly different force law

    monkeypatch.setattr(nbody, "accelerations", unsoftened)
    out = NBodyCheck().run(_ctx("quick", cpu_bodies=256, steps=1))
    assert out.status is Status.FAIL
    assert "wrong n-body result on cpu" in out.reason
    assert out.metrics[0].name == "nbody_gflops"
    json.dumps(out.details, allow_nan=False)


def test_cuda_requested_without_cuda_skips_with_reason() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = NBodyCheck().run(_ctx("quick", device="cuda"))
    assert out.status is Status.SKIP and out.needs_gpu


@pytest.mark.gpu
def test_check_quick_on_gpu() -> None:
    out = NBodyCheck().run(_ctx("quick", device="cuda", bodies=16384))
    assert out.status is Status.PASS, out.reason
    assert {m.device for m in out.metrics} == {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    assert all(m.value > 1.0 for m in out.metrics)  # well above what a CPU core manages


# --------------------------------------------------------------------------- the fused kernel


def test_fused_expression_matches_reference_eagerly() -> None:
    from gpuaccept.checks.nbody_kernel import fused_accelerations

    system = NBodySystem(CPU, 90, "fp64", seed=3)
    pos, _, mass = system.state()
    got = fused_accelerations(system.pos, system.mass, system.softening2).numpy()
    assert relative_error(got, reference_accelerations(pos, mass, system.softening2)) < 1e-12


def test_choose_kernel_falls_back_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuaccept.checks import nbody_kernel

    monkeypatch.setenv("CXX", "/nonexistent/c++")
    auto = nbody_kernel.choose_kernel(CPU, "auto")
    assert auto.path == "eager" and auto.fn is None and "no C++ compiler (/nonexistent/c++)" in auto.note
    with pytest.raises(nbody_kernel.KernelUnavailable, match=r"torch\.compile cannot run on cpu"):
        nbody_kernel.choose_kernel(CPU, "compiled")
    assert nbody_kernel.choose_kernel(CPU, "eager").path == "eager"


def test_failed_compilation_falls_back_to_eager_unless_strict() -> None:
    from gpuaccept.checks.nbody_kernel import Kernel, KernelUnavailable

    def broken(pos: Any, mass: Any, softening2: float) -> Any:
        raise RuntimeError("inductor said no\nmore")

    res = measure_nbody(CPU, 64, steps=1, warmup=0, kernel=Kernel("compiled", "fused", broken))
    assert res.ok and res.kernel == "eager"
    assert "torch.compile failed on cpu: RuntimeError: inductor said no" in res.kernel_note
    with pytest.raises(KernelUnavailable):
        Kernel("compiled", "fused", broken, strict=True).prepare(CPU, torch.float32, (8,), 1e-3)


def test_every_compilation_happens_in_prepare() -> None:
    """dynamo specializes on the softening (a Python float): prepare must compile with the value the runs
    pass, or each size compiles again in the untimed checks, outside compile_s."""
    from torch._dynamo.testing import CompileCounter

    from gpuaccept.checks.nbody_kernel import Kernel, fused_accelerations

    counter = CompileCounter()  # counts the graphs dynamo compiles, runs them eagerly (no C++ compiler needed)
    fn = torch.compile(fused_accelerations, dynamic=False, fullgraph=True, backend=counter)
    kernel = Kernel("compiled", "fused", fn, strict=True)
    seen: list[int] = []
    real_prepare = Kernel.prepare

    def prepare(self: Kernel, *args: Any) -> Kernel:
        out = real_prepare(self, *args)
        seen.append(counter.frame_count)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Kernel, "prepare", prepare)
        res = measure_nbody(CPU, 96, steps=2, warmup=1, kernel=kernel)
    assert res.kernel == "compiled" and res.ok, res
    assert seen == [2]  # the check's small case and the timed size
    assert counter.frame_count == 2, "a size compiled again after prepare"


def test_quick_profile_times_eager_and_says_why() -> None:
    out = NBodyCheck().run(_ctx("quick", cpu_bodies=128, steps=1))
    assert out.status is Status.PASS, out.reason
    assert "eager kernel, memory-bound (the quick profile leaves out torch.compile" in out.reason
    assert out.details["results"][0]["kernel"] == "eager"


def test_check_with_kernel_error_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    out = NBodyCheck().run(_ctx("standard", cpu_bodies=64, steps=1, kernel="compiled"))
    assert out.status is Status.ERROR and "set kernel: auto or eager" in out.reason


@pytest.mark.skipif(compiler_missing(CPU) is not None,
                    reason="no C++ compiler for inductor")
def test_compiled_kernel_on_cpu_matches_fp64_and_beats_eager() -> None:
    """Compiles (seconds to tens of seconds, once per process; inductor's disk cache shortens reruns)."""
    from gpuaccept.checks.nbody_kernel import choose_kernel

    kernel = choose_kernel(CPU, "compiled")
    res = measure_nbody(CPU, 512, steps=2, warmup=1, kernel=kernel)
    assert res.kernel == "compiled" and res.ok, res
    assert res.compile_s > 0 and res.worst_error() <= NBODY_TOLERANCE["fp32"]
    out = NBodyCheck().run(_ctx("standard", cpu_bodies=512, steps=2))  # reuses the process's compiled kernel
    assert out.status is Status.PASS, out.reason
    assert "fused kernel (torch.compile) compiled in" in out.reason and "not timed" in out.reason
    assert out.details["results"][0]["kernel"] == "compiled"


@pytest.mark.gpu
def test_compiled_kernel_on_gpu_is_compute_bound() -> None:
    from gpuaccept.checks.nbody_kernel import choose_kernel

    dev = torch.device("cuda:0")
    fused = measure_nbody(dev, 65536, steps=5, warmup=2, kernel=choose_kernel(dev, "compiled"))
    eager = measure_nbody(dev, 65536, steps=2, warmup=1)
    assert fused.ok and fused.kernel == "compiled", fused
    assert fused.gflops > 3 * eager.gflops  # compute-bound vs memory-bound
