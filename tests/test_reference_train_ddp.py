"""reference_train_ddp with 2 real gloo ranks on this CPU: the DDP curve equals one device's within the stated
tolerance, and an injected slow rank is named as the straggler."""

from __future__ import annotations

import math
from pathlib import Path

from gpuaccept.checks.reference_train_ddp import SLOW_ENV, slow_rank, stragglers
from tests.helpers import gpuaccept, only_run_dir, validate_report

SMALL = ("checks:\n  reference_train_ddp:\n    params: {cpu_steps: 12, ref_steps: 6, cpu_d_model: 32, cpu_seq: 16, "
         "cpu_batch: 4, heads: 4, progress: 1.0, max_spread: %s}\n")


def run(tmp_path: Path, max_spread: float, shard: bool = False, **env: str) -> tuple[int, str, dict]:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text((SMALL % max_spread).replace("}", ", shard: true}" if shard else "}"))
    r = gpuaccept("run", "--device", "cpu", "--profile", "full", "--checks", "reference_train_ddp", "--config",
                  str(cfg), "--report-dir", str(tmp_path / "r"), timeout=240, **env)
    report = validate_report(only_run_dir(tmp_path / "r") / "report.json")
    (check,) = [c for c in report["checks"] if c["name"] == "reference_train_ddp"]
    return r.returncode, r.stdout + r.stderr, check


def metric(check: dict, name: str) -> list[dict]:
    return [m for m in check["metrics"] if m["name"] == name]


def test_two_ranks_agree_with_the_single_device_curve(tmp_path: Path) -> None:
    rc, out, check = run(tmp_path, 100.0)
    assert rc == 0 and check["status"] == "pass", out
    (err,) = metric(check, "reftrain_ddp_curve_error")
    assert err["value"] <= 1e-5 and err["threshold"]["value"] == 0.02
    assert {m["tags"]["rank"] for m in metric(check, "reftrain_ddp_tokens_per_s")} == {0, 1}
    rank0 = check["details"]["ranks"]["0"]
    assert len(rank0["single_curve"]) == 6 and len(rank0["loss_curve"]) == 12
    assert rank0["parallel"] == "ddp" and rank0["params_on_rank"] >= rank0["params"]  # DDP replicates


def test_fsdp2_sharded_run_agrees_with_the_single_device_curve(tmp_path: Path) -> None:
    """shard: true (FSDP2 fully_shard, gloo, 2 ranks): each rank holds about half the parameters, same curve."""
    rc, out, check = run(tmp_path, 100.0, shard=True)
    assert rc == 0 and check["status"] == "pass", out
    assert "2 ranks: FSDP2 loss within" in check["reason"]
    (err,) = metric(check, "reftrain_ddp_curve_error")
    assert err["value"] <= 1e-5 and err["tags"]["parallel"] == "fsdp2"
    ranks = check["details"]["ranks"]
    for r in ("0", "1"):
        assert ranks[r]["parallel"] == "fsdp2"
        assert ranks[r]["params_on_rank"] <= ranks[r]["params"] * 0.55  # sharded, not replicated
    assert sum(ranks[r]["params_on_rank"] for r in ("0", "1")) >= ranks["0"]["params"]
    assert len(ranks["0"]["loss_curve"]) == 12


def test_a_slow_rank_is_named_as_the_straggler(tmp_path: Path) -> None:
    rc, out, check = run(tmp_path, 1.5, **{SLOW_ENV: "1:0.3"})
    assert rc == 1 and check["status"] == "fail", out
    assert "straggler: rank 1" in check["reason"]
    assert metric(check, "reftrain_ddp_forward_spread")[0]["value"] > 1.5


def test_straggler_math_and_the_fault_variable() -> None:
    assert stragglers([0.01, 0.011, 0.05, 0.0105], 1.5) == (0.05 / 0.01075, [2])
    spread, none = stragglers([0.0, 0.0], 1.5)
    assert math.isnan(spread) and none == []
    assert slow_rank({SLOW_ENV: "1:0.25"}) == (1, 0.25) and slow_rank({SLOW_ENV: "x"}) is None


def test_two_local_nodes_through_launch_local(tmp_path: Path) -> None:
    """One rank per "node" (launch local: two agents, torchrun-style rendezvous): rank 0's node judges the curve."""
    import json

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(SMALL % 100.0)
    r = gpuaccept("launch", "local", "--results-dir", str(tmp_path), "--run-id", "run", "--poll-interval", "0.2",
                  "--nodes", "2", "--device", "cpu", "--profile", "full", "--checks", "reference_train_ddp",
                  "--config", str(cfg), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((tmp_path / "run" / "cluster-report.json").read_text())
    checks = {n["host"]: c for n in report["nodes"] for c in n["report"]["checks"]}
    assert set(checks) == {"local-0", "local-1"} and all(c["status"] == "pass" for c in checks.values())
    err = [m for c in checks.values() for m in c["metrics"] if m["name"] == "reftrain_ddp_curve_error"]
    assert len(err) == 1 and err[0]["value"] <= 1e-5
    assert "[FABRIC] cross-node: SUCCESS - reference_train_ddp pass over 2 rank(s) on 2 node(s)" in r.stdout
