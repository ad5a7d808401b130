"""bench/bench_fleet.py at a smoke size: a synthetic launched run goes through every CLI step (issue #27)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_fleet_smoke(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_fleet.py"), "--nodes", "6", "--gpus", "4",
                          "--work", str(tmp_path), "--keep", "--timeout", "300"],
                         capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("BENCH_FLEET ")
    (result,) = json.loads(last.split(" ", 1)[1])
    assert result["nodes"] == 6 and result["node_reports_mb"] > 0
    steps = result["steps"]
    assert list(steps) == ["gather", "analyze", "report-md", "report-html", "history-import", "baseline-create"]
    for step, fig in steps.items():
        assert fig["exit"] == 0, (step, fig, (tmp_path / "n6" / f"{step}.log").read_text()[-1500:])
        assert fig["peak_rss_mib"] > 10 and fig["wall_s"] > 0 and fig["cpu_s"] > 0
    assert steps["gather"]["output_mb"] > 0
    run = next((tmp_path / "n6").glob("*-fleet6"))
    cluster = json.loads((run / "cluster-report.json").read_text())
    assert [e["state"] for e in cluster["nodes"]] == ["reported"] * 6 and cluster["verdict"] == "success"
    assert (run / "cluster-report.metrics.npz").stat().st_size > 0  # the columnar table analyze read
    node = json.loads((run / "gpu00003" / "report.json").read_text())
    coll = next(c for c in node["checks"] if c["name"] == "collectives")
    per_rank = {r: [m["name"] for m in coll["metrics"] if m["tags"]["rank"] == r] for r in range(4)}
    assert any(n.endswith("_time_us") for n in per_rank[0])  # the job's rows, once
    assert all(n.endswith(("_busbw_large_gbs", "_wrong")) for r in (1, 2, 3) for n in per_rank[r])
    assert "| gather" not in out.stdout and " gather " in out.stdout  # the table names every step
