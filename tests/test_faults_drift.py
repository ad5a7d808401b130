"""The fault catalogue's drift guard: every code the source names is catalogued, every catalogued code is on the
generated docs page, every check has its own code, and the failure paths the existing tests make (recorded NVML
fixtures, the runner's timeout/crash/not-run, the judge's threshold FAILs) get a specific code, not the fallback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuaccept import faults
from gpuaccept.checks import registry
from gpuaccept.checks.base import Outcome, ThresholdRule
from gpuaccept.checks.health import HealthCheck, evaluate_health
from gpuaccept.docsgen import faults_md
from gpuaccept.hw.nvml import snapshot_from_dict
from gpuaccept.model import CheckResult, Metric, Status
from gpuaccept.node.judge import judge
from tests.test_health import raw

ROOT = Path(__file__).resolve().parent.parent
CODE = re.compile(r"\bGA-[A-Z]{2,5}-\d{3}\b")
YAML = "src/gpuaccept/data/faults.yaml"


def test_every_code_named_in_the_source_is_catalogued() -> None:
    known = set(faults.by_code())
    for path in sorted((ROOT / "src" / "gpuaccept").rglob("*.py")):
        for code in CODE.findall(path.read_text(encoding="utf-8")):
            assert code in known, f"{path.relative_to(ROOT)} names {code}, which {YAML} does not list: add it there"


def test_every_catalogued_code_is_on_the_generated_docs_page() -> None:
    page = (ROOT / "docs" / "reference" / "fault-codes.md").read_text(encoding="utf-8")
    assert page == faults_md.page(), "docs/reference/fault-codes.md is stale: run make docs-gen"
    for f in faults.load():
        assert f"`{f.code}`" in page


def test_every_check_has_its_own_code() -> None:
    """A check added without a code would get GA-RUN-000 for every FAIL; this says what to add."""
    owned = {r.check for f in faults.load() for r in f.rules if r.catch_all}
    missing = sorted(set(registry()) - owned)
    assert not missing, "\n".join(
        f"check {name!r} can FAIL with no fault code of its own: add to {YAML}, before GA-RUN-000, an entry\n"
        f"  - {{code: GA-<AREA>-<NNN>, title: ..., severity: major, part: gpu, origin: node,\n"
        f"     ladder: [rerun, drain_for_service], evidence: ..., match: [{{check: {name}}}]}}\n"
        f"(more specific entries, e.g. match: [{{check: {name}, reason: REGEX}}], above it), then run make docs-gen"
        for name in missing)


# (recorded NVML fixture of tests/data/nvml, the code its FAIL gets)
HEALTH = [
    ("ecc_volatile_uncorrectable", "GA-MEM-001"),
    ("row_remap_pending_failure", "GA-MEM-002"),
    ("pcie_downgraded", "GA-PCI-001"),
    ("throttle_hw", "GA-GPU-002"),
    ("nvlink_down", "GA-GPU-003"),
    ("gpu_lost", "GA-GPU-001"),
    ("handle_errors", "GA-GPU-001"),
    ("xid_nvlink_memtemp", None),  # asserted below: a specific code, whichever problem comes first
]


@pytest.mark.parametrize(("fixture", "code"), HEALTH)
def test_health_failures_of_recorded_nvml_snapshots_have_their_code(fixture: str, code: str | None) -> None:
    out = evaluate_health(snapshot_from_dict(raw(fixture)), HealthCheck.defaults("standard"))
    result = faults.with_fault(CheckResult("health", out.status, out.reason, metrics=out.metrics, details=out.details))
    assert result.status is Status.FAIL
    assert result.code != faults.FALLBACK and result.code != "GA-GPU-000", (fixture, result.reason, result.code)
    if code is not None:
        assert result.code == code, (fixture, result.reason)


def test_the_runners_errors_and_the_judges_fails_have_codes() -> None:
    timeout = CheckResult("memory", Status.FAIL, "timed out after 31.0 s (limit 30 s)", details={"timeout": True})
    crash = CheckResult("memory", Status.ERROR, "check process died (SIGSEGV) without a result")
    not_run = CheckResult("memory", Status.FAIL, "not run: the budget was spent (0.1 s left)", details={"budget": True})
    malformed = CheckResult("memory", Status.ERROR, "malformed check result: bad json")
    missing = CheckResult("collectives", Status.ERROR, "rank 3 (n4) did not report: lost",
                          details={"missing_rank": True})
    got = [faults.with_fault(r).code for r in (timeout, crash, not_run, malformed, missing)]
    assert got == ["GA-RUN-001", "GA-RUN-002", "GA-RUN-003", "GA-RUN-005", "GA-RUN-004"]
    j = judge(Outcome(Status.PASS, "ok", [Metric("gemm_fp32_tflops", 1.0, "TFLOP/s", expected=100.0)]),
              [ThresholdRule("gemm_*_tflops", min_fraction=0.5)], device="cuda", check="compute")
    judged = faults.with_fault(CheckResult("compute", j.status, j.reason, metrics=j.metrics))
    assert judged.status is Status.FAIL and judged.code == "GA-PERF-010"


def test_a_real_run_writes_the_fault_of_a_real_check_failure(tmp_path: Path) -> None:
    """``gpuaccept run`` end to end: disk_space below an impossible floor fails, and report.json (the runner's
    record) carries its code; a passing check carries none."""
    import json

    from tests.helpers import gpuaccept

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"checks:\n  disk_space:\n    params: {{paths: [{tmp_path}], min_free_gib: 1048576}}\n")
    r = gpuaccept("run", "--checks", "disk_space", "--device", "cpu", "--config", str(cfg),
                  "--report-dir", str(tmp_path / "reports"), "--no-history", "--json", "-")
    assert r.returncode == 1, r.stderr
    check = json.loads(r.stdout)["checks"][0]
    assert check["status"] == "fail" and check["fault"]["code"] == "GA-DSK-001", check
    assert check["fault"]["action"] == "drain_for_service" and check["fault"]["origin"] == "job"
