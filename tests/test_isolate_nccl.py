"""``gpuaccept isolate --pair-test nccl-tests``: the plan of each pair test (golden), its result read from
recorded all_reduce_perf output with the real parser and judge, and isolation end to end through mpirun.

No nccl-tests binary can run here: all_reduce_perf needs CUDA GPUs and this machine has none. The end-to-end
test therefore puts a stand-in ``all_reduce_perf`` on PATH, at that boundary only: a shell script that, as
rank 0 of the real ``mpirun`` job (the only rank nccl-tests prints from), prints the recorded output of a
2-host, 16-rank H100 run (tests/data/nccl-tests/current_2hosts_h100.txt), or, when its job includes the
faulty host, the same output with 1024 wrong elements and ``Out of bounds values : 1 FAILED``. Everything
else is real: the isolate planner, ``gpuaccept launch mpi`` over the loopback sshd, mpirun, the log, the
parser and the judge. What it cannot show: that a real all_reduce_perf spans the nodes under this plan.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.errors import UsageError
from gpuaccept.launch.isolate_nccl import command, job_output, launch_flags, run_from_output
from gpuaccept.launch.isolate_run import PairTest, launch_argv
from tests.helpers import ROOT
from tests.launch_support import check_golden, gpuaccept, launch_env, one_error_line, require
from tests.sshd import Sshd, start_sshd

DATA = ROOT / "tests" / "data" / "nccl-tests"
GOOD = (DATA / "current_2hosts_h100.txt").read_text()
LAST = ("  8589934592    2147483648     float     sum      -1    47535  180.71  338.82      0    47743  179.92  "
        "337.35      0")
OOB = "# Out of bounds values : 0 OK"
assert LAST in GOOD and OOB in GOOD
BAD = GOOD.replace(LAST, LAST[:-1] + "1024").replace(OOB, "# Out of bounds values : 1 FAILED")
HOSTS = ("node-a", "node-b", "node-c", "node-d")


def _dry(backend: str, nodes: str, *more: str) -> str:
    r = gpuaccept("isolate", "--backend", backend, "--nodes", nodes, "--pair-test", "nccl-tests", "--results-dir",
                  "/shared/iso", "--nccl-tests-bin", "/opt/nccl-tests/build/all_reduce_perf", "--dry-run", *more)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(("backend", "nodes", "more"), [
    ("slurm", "gpu[01-04]", ["--launch-arg=--partition=gpu"]),
    ("mpi", "gpu01,gpu02,gpu03,gpu04,gpu05", ["--gpus-per-node", "4", "--nccl-arg=-b", "--nccl-arg=1G",
                                              "--nccl-arg=-e", "--nccl-arg=8G", "--launch-arg=--transport=ucx"]),
])
def test_the_dry_run_prints_each_pair_test_as_a_launch_command(backend: str, nodes: str, more: list[str]) -> None:
    text = _dry(backend, nodes, *more)
    check_golden(f"isolate/nccl-tests-{backend}.txt", text)
    assert _dry(backend, nodes, *more) == text  # the plan is a function of the input


def test_the_slurm_pair_job_requests_the_gpus_and_runs_all_reduce_perf_once_per_node(tmp_path: Path) -> None:
    """The first pair test's own sbatch script, from ``gpuaccept launch ... --dry-run`` of the printed command."""
    line = _dry("slurm", "gpu[01-04]").splitlines()[1]
    argv = shlex.split(line)[1:]
    r = gpuaccept(*argv[:argv.index("--")], "--dry-run", *argv[argv.index("--"):])
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n" in r.stdout
    assert "#SBATCH --nodelist=gpu" in r.stdout
    assert "/opt/nccl-tests/build/all_reduce_perf -b 8M -e 1G -f 2 -g 8" in r.stdout


def test_pure_plan_pieces_and_what_cannot_run() -> None:
    assert command("mpi", 8, ["-b", "8M"]) == ["all_reduce_perf", "-b", "8M", "-g", "1"]
    assert launch_flags("slurm", 4, [], "/x/all_reduce_perf") == [
        "--gpus-per-node", "4", "--no-torchrun", "--", "/x/all_reduce_perf", "-g", "4"]
    assert launch_argv("mpi", ["a", "b"], "r", "/res", "iso", PairTest("nccl-tests", 2, ("-e", "1G"))) == [
        "launch", "mpi", "--nodes", "2", "--hosts", "a,b", "--results-dir", "/res", "--run-id", "r", "--name", "iso",
        "--gpus-per-node", "2", "--procs-per-node", "2", "--", "all_reduce_perf", "-e", "1G", "-g", "1"]
    for backend, gpus, args, words in (("ssh", 8, [], "needs MPI"), ("local", 8, [], "needs MPI"),
                                       ("mpi", 0, [], "at least 1"), ("slurm", 8, ["-g", "2"], "-g is set")):
        with pytest.raises(UsageError, match=words):
            command(backend, gpus, args)
    with pytest.raises(UsageError, match="collectives or nccl-tests"):
        launch_argv("mpi", ["a", "b"], "r", "/res", "iso", PairTest("ib_write_bw"))


@pytest.mark.parametrize(("args", "words"), [
    (["--backend", "ssh", "--nodes", "a,b", "--pair-test", "nccl-tests"], "needs MPI"),
    (["--backend", "mpi", "--nodes", "a,b", "--nccl-arg=-b"], "--nccl-arg is for --pair-test nccl-tests"),
    (["--backend", "mpi", "--nodes", "a,b", "--pair-test", "nccl-tests", "--nccl-arg=-g", "--nccl-arg=1"],
     "-g is set by the plan"),
])
def test_bad_nccl_tests_input_is_one_line(args: list[str], words: str) -> None:
    assert words in one_error_line(gpuaccept("isolate", *args, "--dry-run"))


def test_a_pair_run_is_read_from_recorded_output_with_the_real_parser_and_judge() -> None:
    ok = run_from_output(GOOD, 2, 8)
    assert ok.ok and ok.busbw == 337.35 and not ok.reason  # the largest size, the lower placement
    label = run_from_output((DATA / "srun_label.txt").read_text(), 2, 8)  # srun --label prefixes
    assert label.ok and label.busbw == 337.35
    bad = run_from_output(BAD, 2, 8)
    assert not bad.ok and "#wrong > 0" in bad.reason and "Out of bounds values: 1 FAILED" in bad.reason
    slow = run_from_output(GOOD, 2, 8, min_busbw=400.0)
    assert not slow.ok and "below 400 GB/s" in slow.reason
    cut = run_from_output((DATA / "truncated.txt").read_text(), 2, 8)
    assert not cut.ok and "before the footer" in cut.reason
    assert "covers 16 rank(s) on 2 host(s), not 8 on 2" in run_from_output(GOOD, 2, 4).reason
    twice = run_from_output(GOOD + GOOD, 2, 8)  # one table per node task: srun started them without MPI
    assert not twice.ok and twice.reason.startswith("no nccl-tests result: ")
    none = run_from_output("", 2, 8, job_ok=False, job_state="FAILED")
    assert not none.ok and none.reason.endswith("; the job ended FAILED")
    failed = run_from_output(GOOD, 2, 8, job_ok=False, job_state="FAILED")
    assert not failed.ok and "the job ended FAILED after a passing table" in failed.reason


def test_the_job_output_is_the_launchers_log(tmp_path: Path) -> None:
    (tmp_path / "mpirun.log").write_text("m")
    (tmp_path / "slurm-42.out").write_text("s")
    assert job_output("mpi", tmp_path, "pid1") == "m" and job_output("slurm", tmp_path, "42") == "s"
    assert job_output("slurm", tmp_path, "43") == ""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"), aliases=HOSTS)


def _stand_in(bin_dir: Path, data: Path, calls: Path) -> None:
    bin_dir.mkdir()
    (data / "good.txt").write_text(GOOD)
    (data / "bad.txt").write_text(BAD)
    script = bin_dir / "all_reduce_perf"
    script.write_text(f"""#!/bin/sh
# Stand-in for nccl-tests' all_reduce_perf (no GPU here): rank 0 prints a recorded run, as nccl-tests does.
[ "${{OMPI_COMM_WORLD_RANK:-x}}" = 0 ] || exit 0
echo "$GPUACCEPT_MPI_HOSTS $OMPI_COMM_WORLD_SIZE $*" >> {calls}
case ",$GPUACCEPT_MPI_HOSTS," in
  *,"$ISOLATE_TEST_FAULTY",*) cat {data}/bad.txt; exit 7 ;;
esac
cat {data}/good.txt
""")
    script.chmod(0o755)


def test_isolation_with_nccl_tests_under_mpirun_finds_the_faulty_host(sshd: Sshd, tmp_path: Path) -> None:
    require("mpirun")
    _stand_in(tmp_path / "bin", tmp_path, tmp_path / "calls")
    env = launch_env(ISOLATE_TEST_FAULTY="node-c")
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), env["PATH"]])
    r = gpuaccept("isolate", "--backend", "mpi", "--nodes", ",".join(HOSTS), "--pair-test", "nccl-tests",
                  "--results-dir", str(tmp_path / "runs"), "--json", str(tmp_path / "v.json"), "--test-timeout", "120",
                  f"--launch-arg=--mca=plm_rsh_agent=ssh -F {sshd.ssh_config}", "--launch-arg=--oversubscribe",
                  "--launch-arg=--forward-env=ISOLATE_TEST_FAULTY", env=env, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["bad"] == ["node-c"] and sorted(data["good"]) == ["node-a", "node-b", "node-d"], r.stdout
    bad = next(n for n in data["nodes"] if n["node"] == "node-c")
    assert all(not e["passed"] and "#wrong > 0" in e["reason"] for e in bad["evidence"]) and len(bad["strikes"]) >= 2
    good = next(n for n in data["nodes"] if n["node"] == "node-a")
    assert any(e["passed"] and e["busbw"] == 337.35 for e in good["evidence"])
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == len(data["tests_run"])  # one mpirun job per test, 16 ranks, the planned arguments
    assert all(c.split(" ", 2)[1:] == ["16", "-b 8M -e 1G -f 2 -g 1"] for c in calls), calls
    assert sorted(sorted(c.split()[0].split(",")) for c in calls) == sorted(sorted(t["nodes"])
                                                                            for t in data["tests_run"])
    for where in data["cluster_reports"].values():  # each test's mpirun log holds the table it was judged on
        assert "# Avg bus bandwidth" in (Path(where) / "mpirun.log").read_text()
