"""``gpuaccept isolate --pair-test nccl-tests``: the plan of each pair test (golden), its result read from
recorded all_reduce_perf output with the real parser and judge, and isolation end to end through mpirun and
through a real Slurm.

No nccl-tests binary can run here: all_reduce_perf needs CUDA GPUs and this machine has none. The end-to-end
tests therefore put a stand-in ``all_reduce_perf`` on PATH, at that boundary only (:func:`_stand_in`): a
shell script that, as rank 0 of an MPI job (the only rank nccl-tests prints from), prints the recorded output
of a 2-host, 16-rank H100 run (tests/data/nccl-tests/current_2hosts_h100.txt) with the job's hosts in its
``# Rank`` lines, or, when its job includes the faulty host, the same output with 1024 wrong elements and
``Out of bounds values : 1 FAILED`` (exit 7); a task started without MPI prints its own node's table.

Under mpi, everything else is real: the isolate planner, ``gpuaccept launch mpi`` over the loopback sshd,
mpirun, the log, the parser and the judge. Under slurm, likewise on a private four-node Slurm
(tests/slurm_cluster.py) whose nodes have 8 GPUs each to schedule (``gpus_per_node=8``; each GPU's device
file is /dev/null): each pair test is one sbatch job that Slurm gave 8 GPUs per node (``--gpus-per-node``,
``TresPerNode=gres:gpu:8``), whose srun started the stand-in once per node as the two tasks of one MPI job
(``--mpi=pmi2``: Slurm's own PMI-2, ``PMI_RANK``; Debian's mpi/pmix plugin opens ``libpmix.so``, which
libpmix2 alone does not install). The same plan on a srun that starts no MPI fails every test with the reason.
What these cannot show: that a real all_reduce_perf spans the nodes under this plan (NCCL bootstrapping
over PMI, on GPUs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import UsageError
from gpuaccept.isolate.nccl import command, job_output, launch_flags, run_from_output
from gpuaccept.isolate.pairs import PairTest, launch_argv
from gpuaccept.nccltests.parse import parse_text, runs_in
from tests.helpers import ROOT
from tests.launch_support import check_golden, gpuaccept, launch_env, one_error_line, require
from tests.slurm_cluster import DAEMONS, LocalSlurm
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
        "launch", "mpi", "--nodes", "2", "--hosts", "a,b", "--report-dir", "/res", "--run-id", "r", "--name", "iso",
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
    assert not twice.ok and twice.reason.startswith("2 nccl-tests runs in one log, not 1: the tasks did not run "
                                                    "as one MPI job (under slurm: srun --mpi=pmix")
    assert runs_in(GOOD) == 1 and runs_in((DATA / "srun_label.txt").read_text() * 2) == 2
    # two single-node tables whose lines interleaved into one header (one config line lost): ranks 0-7 twice
    mixed = re.sub(r"Rank +(\d+)", lambda m: f"Rank {int(m[1]) % 8:2d}", GOOD)
    assert run_from_output(GOOD, 2, 8).ok and mixed != GOOD
    dup = run_from_output(mixed, 2, 8)
    assert not dup.ok and dup.reason.startswith("the table's ranks are not 0..15 once each: the tasks did not")
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


def _logged_hosts(data: dict[str, Any], log: str) -> list[list[str]]:
    """The hosts of the table in each test's log (``log`` in its launch directory, a glob), sorted."""
    texts = [next(Path(where).glob(log)).read_text() for where in data["cluster_reports"].values()]
    assert all("# Avg bus bandwidth" in t for t in texts)  # the table each test was judged on
    return sorted(sorted(parse_text(t).hosts) for t in texts)


def _stand_in(bin_dir: Path, data: Path, calls: Path) -> None:
    """``bin_dir/all_reduce_perf``: nccl-tests as seen from its MPI boundary. In an MPI job (mpirun's
    ``OMPI_COMM_WORLD_RANK``, srun --mpi=pmi2's ``PMI_RANK``, pmix's ``PMIX_RANK``) only rank 0 prints: the
    recorded 16-rank table with its two hosts renamed to the job's, or BAD (exit 7) when the job holds
    ``$ISOLATE_TEST_FAULTY``. A task started without MPI is a job of its own and prints a table of its own
    node's 8 GPUs. Each printing task appends ``HOSTS SIZE STEP_GPUS ARGS`` (``alone`` for SIZE without MPI)
    to ``calls``."""
    bin_dir.mkdir()
    (data / "good.txt").write_text(GOOD)
    (data / "bad.txt").write_text(BAD)
    (data / "one_node.txt").write_text("".join(x for x in GOOD.splitlines(True) if " on ztan-mig-gq73 " not in x))
    script = bin_dir / "all_reduce_perf"
    script.write_text(f"""#!/bin/sh
# Stand-in for nccl-tests' all_reduce_perf (no GPU here): see _stand_in in tests/test_isolate_nccl.py.
rank=${{OMPI_COMM_WORLD_RANK:-${{PMI_RANK:-${{PMIX_RANK:-}}}}}}
size=${{OMPI_COMM_WORLD_SIZE:-${{PMI_SIZE:-${{SLURM_NTASKS:-1}}}}}}
if [ -n "${{SLURM_JOB_NODELIST:-}}" ]; then
  hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
else
  hosts=$GPUACCEPT_MPI_HOSTS
fi
if [ -z "$rank" ]; then
  me=${{SLURMD_NODENAME:-$(hostname)}}
  echo "$hosts alone ${{SLURM_STEP_GPUS:-none}} $*" >> {calls}
  sed "s/ on ztan-mig-235z / on $me /" {data}/one_node.txt
  exit 0
fi
[ "$rank" = 0 ] || exit 0
echo "$hosts $size ${{SLURM_STEP_GPUS:-none}} $*" >> {calls}
first=${{hosts%%,*}}
second=${{hosts#*,}}
second=${{second%%,*}}
out=good
case ",$hosts," in
  *,"$ISOLATE_TEST_FAULTY",*) out=bad ;;
esac
sed -e "s/ on ztan-mig-235z / on $first /" -e "s/ on ztan-mig-gq73 / on $second /" {data}/$out.txt
[ $out = good ] || exit 7
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
    assert all(c.split(" ", 3)[1:] == ["16", "none", "-b 8M -e 1G -f 2 -g 1"] for c in calls), calls
    assert sorted(sorted(c.split()[0].split(",")) for c in calls) == sorted(sorted(t["nodes"])
                                                                            for t in data["tests_run"])
    assert _logged_hosts(data, "mpirun.log") == sorted(sorted(t["nodes"]) for t in data["tests_run"])


# ---------------------------------------------------------------------- over a real Slurm with GPUs to request

SLURM_NODES = ("node1", "node2", "node3", "node4")
ARGS = "-b 8M -e 1G -f 2 -g 8"


@pytest.fixture(scope="module")
def gpu_slurm() -> Iterator[LocalSlurm]:
    """A private four-node Slurm whose nodes have 8 GPUs each to schedule (device files: /dev/null)."""
    require(*DAEMONS, "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
    with LocalSlurm(nodes=len(SLURM_NODES), gpus_per_node=8) as cluster:
        yield cluster


def test_the_gpu_test_cluster_schedules_gpus_by_count(gpu_slurm: LocalSlurm) -> None:
    r = gpu_slurm.run("sinfo", "-h", "-N", "-o", "%N %G")
    assert sorted(r.stdout.splitlines()) == [f"{n} gpu:8" for n in SLURM_NODES], r.stdout
    too_many = gpu_slurm.run("sbatch", "-N1", "--gpus-per-node=9", "--wrap", "true")
    assert too_many.returncode != 0 and "Requested node configuration is not available" in too_many.stderr


def _isolate_on_slurm(cluster: LocalSlurm, tmp_path: Path, *more: str, faulty: str = "",
                      ) -> tuple[str, dict[str, Any], list[str]]:
    """``gpuaccept isolate --backend slurm --pair-test nccl-tests`` over the four nodes with the stand-in on
    PATH; its stdout, its --json and the stand-in's calls."""
    _stand_in(tmp_path / "bin", tmp_path, tmp_path / "calls")
    env = launch_env(SLURM_CONF=str(cluster.conf), ISOLATE_TEST_FAULTY=faulty)
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), env["PATH"]])
    r = gpuaccept("isolate", "--backend", "slurm", "--nodes", "node[1-4]", "--pair-test", "nccl-tests",
                  "--gpus-per-node", "8", "--results-dir", str(tmp_path / "runs"), "--json", str(tmp_path / "v.json"),
                  "--test-timeout", "120", *more, env=env, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr + cluster.log_tail()
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return r.stdout, json.loads((tmp_path / "v.json").read_text()), calls


def _jobs(cluster: LocalSlurm, data: dict[str, Any]) -> list[dict[str, str]]:
    """Each test's job as Slurm shows it (``scontrol show job``: MinJobAge keeps it 300 s), its sbatch script
    beside it; one job per test."""
    jobs = []
    for where in data["cluster_reports"].values():
        [out] = Path(where).glob("slurm-*.out")
        job_id = out.name[len("slurm-"):-len(".out")]
        cluster.wait_job(job_id)
        shown = cluster.run("scontrol", "show", "job", "-o", job_id).stdout
        fields = dict(w.split("=", 1) for w in shown.split() if "=" in w)
        hosts = cluster.run("scontrol", "show", "hostnames", fields["NodeList"]).stdout.split()
        jobs.append({**fields, "hosts": ",".join(sorted(hosts)), "script": (Path(where) / "job.sbatch").read_text()})
    assert len(jobs) == len(data["tests_run"])
    assert sorted(j["hosts"] for j in jobs) == sorted(",".join(sorted(t["nodes"])) for t in data["tests_run"])
    return jobs


def test_isolation_with_nccl_tests_over_slurm_finds_the_faulty_node(gpu_slurm: LocalSlurm, tmp_path: Path) -> None:
    """Each pair test is one sbatch job asking 8 GPUs per node; srun (``--mpi=pmi2``, this Slurm's PMI plugin
    that needs no PMIx library) starts all_reduce_perf ``-g 8`` once per node as the two ranks of one MPI job."""
    out, data, calls = _isolate_on_slurm(gpu_slurm, tmp_path, "--launch-arg=--srun-arg=--mpi=pmi2", "--drain",
                                         faulty="node3")
    assert data["bad"] == ["node3"] and sorted(data["good"]) == ["node1", "node2", "node4"], out
    assert "scontrol update NodeName=node3 State=DRAIN 'Reason=gpuaccept: isolated: failed with" in out
    bad = next(n for n in data["nodes"] if n["node"] == "node3")
    assert all(not e["passed"] and "#wrong > 0" in e["reason"] for e in bad["evidence"]) and len(bad["strikes"]) >= 2
    good = next(n for n in data["nodes"] if n["node"] == "node1")
    assert any(e["passed"] and e["busbw"] == 337.35 for e in good["evidence"])
    # one printing rank per test: 2 MPI tasks, the step holding the node's 8 GPUs, the planned arguments
    assert sorted(c.split(" ", 1)[0] for c in calls) == sorted(",".join(sorted(t["nodes"])) for t in data["tests_run"])
    assert all(c.split(" ", 1)[1] == f"2 0,1,2,3,4,5,6,7 {ARGS}" for c in calls), calls
    for job in _jobs(gpu_slurm, data):
        assert job["TresPerNode"] == "gres:gpu:8" and "#SBATCH --gpus-per-node=8\n" in job["script"]
        words = " ".join(job["script"].replace("\\\n", " ").split())  # the script's lines joined
        assert f"{tmp_path}/bin/all_reduce_perf {ARGS}" in words and " --mpi=pmi2 " in words, words
        failed = "node3" in job["hosts"].split(",")
        assert (job["JobState"], job["ExitCode"]) == (("FAILED", "7:0") if failed else ("COMPLETED", "0:0")), job
    assert _logged_hosts(data, "slurm-*.out") == sorted(sorted(t["nodes"]) for t in data["tests_run"])


def test_nccl_tests_tasks_started_without_mpi_fail_the_pair_test(gpu_slurm: LocalSlurm, tmp_path: Path) -> None:
    """The same plan on a Slurm whose srun starts no MPI (MpiDefault=none, no --mpi): each task is a job of its
    own and prints its own node's table; no test passes, and the reason says why."""
    out, data, calls = _isolate_on_slurm(gpu_slurm, tmp_path, "--max-rounds", "1")
    assert not data["good"] and data["tests_run"], out
    for test in data["tests_run"]:
        assert not test["passed"]
        assert test["runs"][0]["reason"].startswith("2 nccl-tests runs in one log, not 1: the tasks did not run "
                                                    "as one MPI job (under slurm: srun --mpi=pmix"), test
    assert len(calls) == 2 * len(data["tests_run"])  # every task printed, each on its own
    assert all(c.split(" ", 1)[1] == f"alone 0,1,2,3,4,5,6,7 {ARGS}" for c in calls), calls
    assert all(job["TresPerNode"] == "gres:gpu:8" and job["JobState"] == "COMPLETED" for job in _jobs(gpu_slurm, data))
