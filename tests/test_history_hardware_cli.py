"""``history --gpu/--nic`` and ``trend --gpu/--host`` following the hardware, run as a user would.

The reports are ``tests/data/history/reports`` (see its README): on day 4 GPU UA1 moved from gpu-a to
gpu-b (and slowed down there two days later), gpu-a got a new GPU UN, gpu-b got a new mainboard.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import gpuaccept, ok, one_line_error
from tests.pg_server import shared_server

DATA = Path(__file__).resolve().parent / "data"
REPORTS = sorted(str(p) for p in (DATA / "history" / "reports").glob("*.json"))
UA1 = "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c51"
UB1 = "GPU-8e2d4c6a-1b3f-4e5d-a7c9-2b4d6f8a0c71"
UN = "GPU-d41f0a9b-7c2e-4b8d-9e3f-6a5b4c3d2e10"
GEMM = ("--metric", "gemm_bf16_tflops")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('hw') / 'history.db'}"
    assert ok(gpuaccept("history", "--import", *REPORTS, "--db", url)).strip().endswith("16 report(s) stored in "
                                                                                         + url)
    return url


def test_history_of_a_gpu_across_hosts(db: str) -> None:
    text = ok(gpuaccept("history", "--gpu", UA1, "--db", db))
    assert text.splitlines()[:3] == [
        f"GPU {UA1} (serial 1654922000151):",
        "  cuda:1 on gpu-a from 2026-09-21T14:13:20Z to 2026-09-24T14:13:20Z (4 runs)",
        "  cuda:1 on gpu-b from 2026-09-25T14:23:20Z to 2026-09-28T14:23:20Z (4 runs)"]
    data = json.loads(ok(gpuaccept("history", "--gpu", UA1.upper().removeprefix("GPU-"), "--db", db, "--json")))
    assert data["hardware"]["id"] == UA1 and data["hardware"]["kind"] == "gpu"  # any case, GPU- optional
    assert [r["host"] for r in data["runs"]] == ["gpu-b"] * 4 + ["gpu-a"] * 4
    assert [(s["host"], s["device"], s["runs"]) for s in data["hardware"]["seen"]] == [("gpu-a", "cuda:1", 4),
                                                                                     ("gpu-b", "cuda:1", 4)]
    # The new GPU's history starts at the swap; filters combine.
    new = json.loads(ok(gpuaccept("history", "--gpu", UN, "--db", db, "--json", "--since", "2026-09-27")))
    assert [r["run_id"][-2:] for r in new["runs"]] == ["d7"]
    assert json.loads(ok(gpuaccept("history", "--gpu", UA1, "--host", "gpu-a", "--db", db, "--json",
                                    "--limit", "1")))["runs"][0]["run_id"].endswith("gpu-a-d3")
    nic = json.loads(ok(gpuaccept("history", "--nic", "b859:9f03:001c:a7f6", "--db", db, "--json")))
    assert {r["host"] for r in nic["runs"]} == {"gpu-b"} and nic["hardware"]["id"] == "0xb8599f03001ca7f6"
    unknown = "GPU-00000000-0000-4000-8000-000000000000"
    assert ok(gpuaccept("history", "--gpu", unknown, "--db", db)).strip() == f"no run recorded GPU {unknown} in {db}"


def test_trend_of_a_gpu_follows_it_and_flags_its_drop(db: str) -> None:
    text = ok(gpuaccept("trend", "--gpu", UA1, *GEMM, "--db", db), rc=1)
    assert text.splitlines()[0].startswith(f"{UA1} compute gemm_bf16_tflops cuda:1 dtype=bf16")
    assert "gpu-a cuda:1" in text and "gpu-b cuda:1" in text  # the WHERE column
    assert f"REGRESSION: {UA1} compute gemm_bf16_tflops cuda:1" in text and "(on gpu-b)" in text
    data = json.loads(ok(gpuaccept("trend", "--gpu", UA1, *GEMM, "--db", db, "--json"), rc=1))
    (series,) = data["series"]
    assert data["gpu"] == UA1 and series["hosts"] == ["gpu-a", "gpu-b"] and series["hw_serial"] == "1654922000151"
    assert [p["host"] for p in series["points"]] == ["gpu-a"] * 4 + ["gpu-b"] * 4
    # The new GPU: too little history of its own, whatever the slot held before.
    assert "not enough history to judge" in ok(gpuaccept("trend", "--gpu", UN, *GEMM, "--db", db))


def test_trend_of_a_host_judges_the_hardware_it_holds_now(db: str) -> None:
    text = ok(gpuaccept("trend", "--host", "gpu-a", *GEMM, "--db", db))
    assert f"cuda:1 {UA1}" in text and "(moved: now on gpu-b as cuda:1; not judged)" in text
    assert f"cuda:1 {UN}" in text and "REGRESSION:" not in text
    assert "no regression in the newest run (1 series judged)" in text  # UA0; UN is too new to judge
    text = ok(gpuaccept("trend", "--host", "gpu-b", *GEMM, "--db", db), rc=1)
    assert f"(replaced: cuda:1 now holds {UA1}; not judged)" in text
    assert f"REGRESSION: gpu-b compute gemm_bf16_tflops cuda:1 {UA1}" in text
    data = json.loads(ok(gpuaccept("trend", "--host", "gpu-b", *GEMM, "--db", db, "--json", "--device", "cuda:1"),
                          rc=1))
    assert [(s["hw_id"], s["gone"] is None, s["regressed"]) for s in data["series"]] == [(UA1, True, True),
                                                                                       (UB1, False, False)]
    board = ok(gpuaccept("trend", "--host", "gpu-b", "--metric", "stream_triad_gbs", "--db", db))
    assert "(replaced: the node's board is now OM241S700938; not judged)" in board
    assert "not enough history to judge" in board


def test_bad_hardware_ids_are_one_line_errors(db: str) -> None:
    for argv in (["history", "--gpu", "GPU-1234"], ["trend", "--gpu", "cuda:0", *GEMM],
                 ["history", "--gpu", "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c5z"]):
        one_line_error(gpuaccept(*argv, "--db", db), "is not a GPU UUID: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-")
    one_line_error(gpuaccept("trend", "--nic", "mlx5_0:1", *GEMM, "--db", db), "is not a port GUID")
    one_line_error(gpuaccept("history", "--nic", "0x0000000000000000", "--db", db), "all zero")
    one_line_error(gpuaccept("history", "--gpu", UA1, "--nic", "0xb8599f03001ca7f6", "--db", db),
                    "not allowed with argument")
    one_line_error(gpuaccept("trend", "--gpu", UA1, "--host", "gpu-a", *GEMM, "--db", db), "not allowed with")
    one_line_error(gpuaccept("trend", "--gpu", UA1, "--device", "cuda:1", *GEMM, "--db", db),
                    "--device goes with --host")
    one_line_error(gpuaccept("trend", "--gpu", "GPU-00000000-0000-4000-8000-000000000000", *GEMM, "--db", db),
                    "no run recorded GPU GPU-00000000-0000-4000-8000-000000000000 in")
    one_line_error(gpuaccept("trend", "--gpu", UA1, "--metric", "nosuch", "--db", db),
                    f"GPU {UA1} has no metric 'nosuch'")
    one_line_error(gpuaccept("trend", *GEMM, "--db", db), "one of the arguments --host --gpu --nic is required")


def test_a_cpu_run_names_no_hardware_and_nothing_breaks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cpu.db'}"
    ok(gpuaccept("history", "--import", str(DATA / "reports" / "node-cpu.json"), "--db", url))
    assert "not enough history" in ok(gpuaccept("trend", "--host", "vm", "--metric", "gemm_fp32_tflops",
                                                 "--db", url))
    assert json.loads(ok(gpuaccept("history", "--host", "vm", "--db", url, "--json")))[0]["host"] == "vm"
    one_line_error(gpuaccept("trend", "--gpu", UA1, *GEMM, "--db", url), "(0 GPUs recorded")


def test_an_older_history_is_upgraded_by_a_writing_command(tmp_path: Path) -> None:
    """The SQLite file gpuaccept wrote at schema v2 (days 0-3): reading commands refuse it, an import migrates it."""
    path = tmp_path / "history.db"
    shutil.copy(DATA / "history" / "history-v2.db", path)
    url = f"sqlite:///{path}"
    one_line_error(gpuaccept("history", "--gpu", UA1, "--db", url), "a history of an older schema (v2)")
    later = [r for r in REPORTS if r.endswith(("d4.json", "d5.json", "d6.json", "d7.json"))]
    ok(gpuaccept("history", "--import", *later, "--db", url))
    data = json.loads(ok(gpuaccept("history", "--gpu", UA1, "--db", url, "--json")))
    assert [(s["host"], s["runs"]) for s in data["hardware"]["seen"]] == [("gpu-a", 4), ("gpu-b", 4)]
    assert "REGRESSION" in ok(gpuaccept("trend", "--host", "gpu-b", *GEMM, "--db", url), rc=1)


def test_following_hardware_on_postgres() -> None:
    url = shared_server().new_database()
    ok(gpuaccept("history", "--import", *REPORTS, "--db", url))
    data = json.loads(ok(gpuaccept("history", "--gpu", UA1, "--json", GPUACCEPT_DB=url)))
    assert [(s["host"], s["device"], s["runs"]) for s in data["hardware"]["seen"]] == [("gpu-a", "cuda:1", 4),
                                                                                     ("gpu-b", "cuda:1", 4)]
    assert f"REGRESSION: {UA1}" in ok(gpuaccept("trend", "--gpu", UA1, *GEMM, "--db", url), rc=1)
    assert "no regression in the newest run" in ok(gpuaccept("trend", "--host", "gpu-a", *GEMM, "--db", url))
