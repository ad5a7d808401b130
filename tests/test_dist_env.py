"""Rank detection and hostlists: pure functions on recorded launcher environments (tests/data/dist/env)."""

from __future__ import annotations

import re

import pytest

from gpuaccept.distributed.control import Pulse
from gpuaccept.distributed.env import DEFAULT_MASTER_PORT, detect_rank, processes_on_node
from gpuaccept.distributed.hostlist import expand_hostlist, expand_tasks_per_node, first_host
from gpuaccept.errors import InputError, UsageError
from gpuaccept.node.distributed_run import local_position, node_position
from tests.dist_support import load_envs

# ---------------------------------------------------------------- hostlist


@pytest.mark.parametrize(("text", "hosts"), [
    ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
    ("gpu5", ["gpu5"]),
    ("node[1-2]", ["node1", "node2"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a[1,3]b,c", ["a1b", "a3b", "c"]),
    ("dgx-h100-[001-002].cluster", ["dgx-h100-001.cluster", "dgx-h100-002.cluster"]),
    ("x[5]", ["x5"]),
    ("node1,node1", ["node1", "node1"]),
])
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "empty"),
    ("node[1-3", "never closed"),
    ("node1-3]", "without '['"),
    ("node[[1-2]]", "nested"),
    ("node[3-1]", "goes down"),
    ("node[a-b]", "not a number"),
    ("node[1-]", "not a number"),
    ("a,,b", "empty entry"),
    ("node 1", "white space"),
    ("n[1-9999999]", "implausibly large"),
])
def test_bad_hostlists_are_input_errors(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=re.escape(fragment)):
        expand_hostlist(text)


def test_tasks_per_node() -> None:
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]
    assert expand_tasks_per_node("4,2(x2)") == [4, 2, 2]
    for bad in ("2(x)", "x", "2(x3", ""):
        with pytest.raises(InputError):
            expand_tasks_per_node(bad)


# ---------------------------------------------------------------- recorded launchers


def test_torchrun_standalone() -> None:
    envs = load_envs("torchrun_standalone_2.json")
    infos = [detect_rank(e) for e in envs]
    assert [(i.rank, i.local_rank, i.world_size, i.local_world_size) for i in infos] == [(0, 0, 2, 2), (1, 1, 2, 2)]
    assert all(i.launcher == "torchrun" and i.agent_store and i.node_rank == 0 for i in infos)
    assert infos[0].master_port == int(envs[0]["MASTER_PORT"]) == infos[1].master_port
    assert infos[0].key_prefix == infos[1].key_prefix


def test_torchrun_two_nodes() -> None:
    envs = load_envs("torchrun_2nodes_loopback.json")
    infos = [detect_rank(e) for e in envs]
    assert [(i.rank, i.node_rank, i.num_nodes, i.local_rank) for i in infos] == [(0, 0, 2, 0), (1, 1, 2, 0)]
    assert {i.job_id for i in infos} == {"rec"}  # --rdzv-id
    assert all(i.master_addr == "127.0.0.1" for i in infos)


def test_openmpi() -> None:
    envs = load_envs("mpirun_np2.json")
    infos = [detect_rank(e) for e in envs]
    assert [(i.rank, i.local_rank, i.world_size, i.local_world_size) for i in infos] == [(0, 0, 2, 2), (1, 1, 2, 2)]
    assert envs[1]["OMPI_COMM_WORLD_NODE_RANK"] == "1"  # not a node index: both ranks are on one node
    assert all(i.node_rank == 0 and i.num_nodes == 1 for i in infos)
    assert all(i.launcher == "openmpi" and i.master_addr == "127.0.0.1" for i in infos)
    job = int(envs[0]["OMPI_MCA_ess_base_jobid"])
    assert infos[0].master_port == 20000 + job % 20000 == infos[1].master_port
    assert infos[0].job_id == envs[0]["OMPI_MCA_ess_base_jobid"]


def test_openmpi_across_nodes_needs_master_addr() -> None:
    env = {**load_envs("mpirun_np2.json")[0], "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_MCA_orte_num_nodes": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    with pytest.raises(UsageError, match="-x MASTER_ADDR"):
        detect_rank(env)
    info = detect_rank({**env, "MASTER_ADDR": "node7", "MASTER_PORT": "4000"})
    assert (info.master_addr, info.master_port, info.node_rank) == ("node7", 4000, None)


def test_srun() -> None:
    envs = load_envs("srun_N2_n4.json")
    infos = [detect_rank(e) for e in envs]
    assert [(i.rank, i.local_rank, i.node_rank, i.local_world_size) for i in infos] == [
        (0, 0, 0, 2), (1, 1, 0, 2), (2, 0, 1, 2), (3, 1, 1, 2)]
    assert all(i.world_size == 4 and i.num_nodes == 2 and i.launcher == "slurm" for i in infos)
    assert all(i.master_addr == "node1" for i in infos)  # first host of node[1-2]
    job = int(envs[0]["SLURM_JOB_ID"])
    assert {i.master_port for i in infos} == {20000 + job % 20000}
    assert infos[0].job_id == f"{job}.0"
    assert any("SLURM_STEP_NODELIST" in n for n in infos[0].notes)


def test_srun_with_explicit_master_and_odd_nodelist() -> None:
    env = {**load_envs("srun_N2_n4.json")[2], "SLURM_STEP_NODELIST": "gpu[07-08]"}
    assert detect_rank(env).master_addr == "gpu07"
    assert detect_rank({**env, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29999"}).master_port == 29999
    with pytest.raises(UsageError, match="SLURM_STEP_NODELIST"):
        detect_rank({**env, "SLURM_STEP_NODELIST": "gpu[07-"})
    with pytest.raises(UsageError, match="lists 1 host"):
        detect_rank({**env, "SLURM_STEP_NODELIST": "gpu07"})


def test_sbatch_script_without_srun_is_refused() -> None:
    env = load_envs("sbatch_script_n2.json")[0]
    with pytest.raises(UsageError, match=r"not an srun step.*srun gpuaccept run --distributed"):
        detect_rank(env)


def test_kubeflow_pytorchjob() -> None:
    infos = [detect_rank(e) for e in load_envs("kubeflow_pytorchjob_2pods.json")]
    assert [(i.rank, i.world_size, i.local_rank) for i in infos] == [(0, 2, None), (1, 2, None)]
    assert infos[1].master_addr == "gpuaccept-job-master-0" and infos[1].master_port == 23456
    for env in load_envs("kubeflow_pytorchjob_nproc4.json"):
        with pytest.raises(UsageError, match=r"PET_NPROC_PER_NODE='4'.*torchrun"):
            detect_rank(env)


def test_pet_only() -> None:
    infos = [detect_rank(e) for e in load_envs("pet_only_3pods.json")]
    assert [(i.rank, i.world_size, i.node_rank, i.local_rank) for i in infos] == [(0, 3, 0, 0), (1, 3, 1, 0),
                                                                                 (2, 3, 2, 0)]
    assert all(i.launcher == "pet" and i.master_addr == "trainer-0.trainer" and i.master_port == 29400
               for i in infos)
    with pytest.raises(UsageError, match="elastic range"):
        detect_rank({**load_envs("pet_only_3pods.json")[0], "PET_NNODES": "1:4"})
    with pytest.raises(UsageError, match="PET_NODE_RANK=3 is not below PET_NNODES=3"):
        detect_rank({**load_envs("pet_only_3pods.json")[0], "PET_NODE_RANK": "3"})


def test_torchrun_inside_srun_prefers_torchrun() -> None:
    env = {**load_envs("srun_N2_n4.json")[3], **load_envs("torchrun_2nodes_loopback.json")[1]}
    info = detect_rank(env)
    assert info.launcher == "torchrun" and info.rank == 1 and info.world_size == 2


# ---------------------------------------------------------------- bad environments


@pytest.mark.parametrize(("env", "fragment"), [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK is set but RANK is not"),
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a non-negative integer"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a positive integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, "MASTER_PORT is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, "not a TCP port"),
    ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a",
      "MASTER_PORT": "1"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "a",
      "MASTER_PORT": "1"}, "LOCAL_WORLD_SIZE=4 exceeds WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
      "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "WORLD_SIZE=4 contradicts OMPI_COMM_WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "4", "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0",
      "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "RANK=0 contradicts SLURM_PROCID=2"),
    ({"RANK": "0", "WORLD_SIZE": "3", "PET_NNODES": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
     "WORLD_SIZE=3 contradicts PET_NNODES=2"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK is not"),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK=3 is not below"),
    ({"SLURM_PROCID": "0"}, "neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}, "SLURM_PROCID=4 is not below SLURM_NTASKS=4"),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}, "neither MASTER_ADDR nor SLURM_STEP"),
    ({"PET_NODE_RANK": "0"}, "PET_NNODES is not"),
    ({"HOME": "/root"}, "no launcher environment found"),
])
def test_bad_environments_are_usage_errors(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(UsageError, match=re.escape(fragment)) as err:
        detect_rank(env)
    assert "\n" not in str(err.value)


def test_hand_made_environment_and_single_rank() -> None:
    info = detect_rank({"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert (info.rank, info.local_rank, info.launcher, info.master_addr) == (3, None, "env", "head")
    one = detect_rank({"RANK": "0", "WORLD_SIZE": "1"})
    assert (one.master_addr, one.master_port) == ("127.0.0.1", DEFAULT_MASTER_PORT)


def test_processes_on_node() -> None:
    assert processes_on_node({}) is None
    assert processes_on_node(load_envs("torchrun_standalone_2.json")[0]) == (2, "LOCAL_WORLD_SIZE")
    assert processes_on_node(load_envs("mpirun_np2.json")[1]) == (2, "OMPI_COMM_WORLD_LOCAL_SIZE")
    assert processes_on_node(load_envs("srun_N2_n4.json")[2]) == (2, "SLURM_STEP_TASKS_PER_NODE")
    assert processes_on_node(load_envs("sbatch_script_n2.json")[0]) is None  # a job script is one process


# ---------------------------------------------------------------- positions and liveness


def test_positions_from_hosts() -> None:
    hosts: list[str | None] = ["a", "a", "b", "b", "a"]
    assert [local_position(r, hosts) for r in range(5)] == [(0, 3), (1, 3), (0, 2), (1, 2), (2, 3)]
    assert [node_position(r, hosts) for r in range(5)] == [(0, 2), (0, 2), (1, 2), (1, 2), (0, 2)]


def test_pulse_declares_a_silent_rank_stale_only_after_the_timeout() -> None:
    p = Pulse(stale_s=5.0)
    assert not p.seen(1, 0, now=100.0)
    assert not p.seen(1, 0, now=104.9)
    assert not p.seen(1, 3, now=104.95)  # it moved: the clock restarts
    assert not p.seen(1, 3, now=109.9)
    assert p.seen(1, 3, now=110.0)
    assert p.silent_for(1, 110.0) == pytest.approx(5.05)
    assert not p.seen(2, 7, now=110.0)  # another rank has its own clock
