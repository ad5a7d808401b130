"""The k8s backend's plan: golden manifests, strict schema validation of every kind, hostile inputs."""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuaccept.errors import ConfigError
from gpuaccept.launch.k8s.backend import K8sBackend
from gpuaccept.launch.k8s.manifests import build_manifests, object_name, to_yaml
from gpuaccept.launch.k8s.options import KINDS, K8sOptions, parse_toleration
from gpuaccept.launch.pod_script import NODE_SCRIPT, mpi_launcher_script
from gpuaccept.launch.spec import Mount, sanitize_name
from tests.helpers import gpuaccept
from tests.k8s_strict import CRD_FILES, SCHEMAS, crd_validator, errors, strict_schema
from tests.k8s_support import check_golden, command_spec, need_binary, need_module, suite_spec

need_module("kubernetes_validate")

FULL = {
    "namespace": "gpu-team", "tolerations": ["nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute"],
    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "image_pull_secrets": ["ngc-secret"],
    "service_account": "gpuaccept", "queue": "gpu-queue", "shm_size": "64Gi", "cpu": "96", "memory": "1Ti",
    "resources": {"rdma/ib": "1"}, "results_pvc": "acceptance-results", "labels": {"team": "infra"},
}


def opts(kind: str, **extra: Any) -> dict[str, Any]:
    return K8sOptions.from_dict({"kind": kind, **extra}).to_dict()


def manifests(spec: Any) -> list[dict[str, Any]]:
    return build_manifests(spec, K8sOptions.from_dict(spec.options))


def walk(node: Any, key: str) -> list[Any]:
    """Every value stored under ``key`` anywhere in ``node``."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                found.append(v)
            found.extend(walk(v, key))
    elif isinstance(node, list):
        for v in node:
            found.extend(walk(v, key))
    return found


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for cs in walk(doc, "containers") for c in cs]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# ---- golden files and schema validation ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_suite_plan_matches_golden(kind: str) -> None:
    full = dict(FULL, priority_class=None if kind == "trainjob" else "gpu-high")
    plan = K8sBackend().plan(suite_spec(opts(kind, **full)))
    assert list(plan.files) == ["accept-h100.yaml"]
    check_golden(f"k8s/{kind}.yaml", plan.files["accept-h100.yaml"])
    assert plan.commands == [["kubectl", "create", "--validate=strict", "-f", "accept-h100.yaml"]]


@pytest.mark.parametrize("kind", KINDS)
def test_command_plan_matches_golden(kind: str) -> None:
    plan = K8sBackend().plan(command_spec(opts(kind)))
    check_golden(f"k8s/{kind}-command.yaml", plan.files["train.yaml"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["suite-full", "suite-minimal", "command", "distributed-suite", "one-node"])
def test_every_manifest_passes_strict_validation(kind: str, variant: str) -> None:
    full = dict(FULL, priority_class=None if kind == "trainjob" else "gpu-high", privileged=True)
    spec = {
        "suite-full": lambda: suite_spec(opts(kind, **full)),
        "suite-minimal": lambda: suite_spec(opts(kind), mounts=[], env={}, gpus_per_node=0, time_limit_min=None),
        "command": lambda: command_spec(opts(kind, host_network=kind != "trainjob")),
        "distributed-suite": lambda: suite_spec(opts(kind), distributed=True, suite_args=["--distributed"]),
        "one-node": lambda: command_spec(opts(kind), nodes=1, gpus_per_node=1),
    }[variant]()
    docs = yaml.safe_load_all(K8sBackend().plan(spec).files[f"{spec.name}.yaml"])
    for doc in docs:
        assert errors(doc) == [], (doc["kind"], errors(doc))


@pytest.mark.parametrize("kind", KINDS)
def test_undeclared_field_is_rejected_like_the_api_server(kind: str) -> None:
    doc = manifests(suite_spec(opts(kind)))[-1]
    for mutate, where in [
        (lambda d: d["spec"].__setitem__("paralellism", 4), "paralellism"),
        (lambda d: d["metadata"].__setitem__("lables", {"a": "b"}), "lables"),
        (lambda d: containers(d)[0].__setitem__("imagePullPolisy", "Always"), "imagePullPolisy"),
        (lambda d: walk(d, "volumes")[0][0]["emptyDir"].__setitem__("medum", "Memory"), "medum"),
    ]:
        bad = copy.deepcopy(doc)
        mutate(bad)
        found = errors(bad)
        assert found and where in " ".join(found), (kind, where, found)
    if (doc["apiVersion"], doc["kind"]) in CRD_FILES:
        # Plain jsonschema on the CRD's own schema lets the same typo through: the strict transform matters.
        raw = json.loads((SCHEMAS / CRD_FILES[(doc["apiVersion"], doc["kind"])]).read_text())
        bad = copy.deepcopy(doc)
        containers(bad)[0]["imagePullPolisy"] = "Always"
        assert list(jsonschema.Draft7Validator(raw).iter_errors(bad)) == []


def test_wrong_types_and_enums_are_rejected() -> None:
    doc = manifests(suite_spec(opts("mpijob")))[-1]
    bad = copy.deepcopy(doc)
    bad["spec"]["mpiImplementation"] = "OpenMPI5"
    bad["spec"]["slotsPerWorker"] = "eight"
    text = " ".join(errors(bad))
    assert "OpenMPI5" in text and "eight" in text
    job = manifests(suite_spec(opts("job")))[-1]
    bad = copy.deepcopy(job)
    containers(bad)[0]["resources"]["limits"]["nvidia.com/gpu"] = ["8"]
    assert errors(bad)


def test_strict_schema_transform() -> None:
    schema = strict_schema({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "q": {"x-kubernetes-int-or-string": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "empty": {"type": "object"},
            "n": {"type": "string", "nullable": True},
        }}}})
    v = jsonschema.Draft7Validator(schema)
    ok = {"metadata": {"name": "x"}, "spec": {"q": 1, "free": {"anything": [1]}, "map": {"k": "v"}, "empty": {},
                                              "n": None}}
    assert list(v.iter_errors(ok)) == []
    assert list(v.iter_errors({**ok, "spec": {**ok["spec"], "q": "10Gi"}})) == []
    for bad in ({"q": [1]}, {"empty": {"x": 1}}, {"map": {"k": 1}}, {"typo": 1}):
        assert list(v.iter_errors({**ok, "spec": {**ok["spec"], **bad}})), bad
    assert list(v.iter_errors({**ok, "metadata": {"name": "Bad_Name"}}))
    assert list(v.iter_errors({**ok, "metadata": {"name": "x", "labels": {"k": "bad value"}}}))


def test_crd_schemas_are_the_served_versions() -> None:
    for (api, kind), _file in CRD_FILES.items():
        validator = crd_validator(api, kind)
        assert validator.schema["properties"]["kind"] == {"const": kind}


# ---- what the manifests say ------------------------------------------------------------------------------------

def test_plan_is_deterministic() -> None:
    a = K8sBackend().plan(suite_spec(opts("job", **FULL)))
    b = K8sBackend().plan(suite_spec(opts("job", **FULL)))
    assert a.render() == b.render()


def test_job_rendezvous_and_service() -> None:
    spec = command_spec(opts("job"), nodes=3)
    service, job = manifests(spec)
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    pod = job["spec"]["template"]
    assert pod["spec"]["subdomain"] == service["metadata"]["name"] == "train"
    assert all(pod["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items())
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 3
    assert job["spec"]["parallelism"] == 3 and job["spec"]["backoffLimit"] == 0
    env = env_of(pod["spec"]["containers"][0])
    assert env["PET_MASTER_ADDR"] == "train-0.train"
    assert env["PET_NODE_RANK"] == {"fieldRef": {"fieldPath":
                                                 "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert env["PET_NNODES"] == "3" and env["PET_NPROC_PER_NODE"] == "8" and env["PET_MASTER_PORT"] == "29500"
    argv = pod["spec"]["containers"][0]["command"]
    assert argv[:4] == ["sh", "-c", NODE_SCRIPT, "gpuaccept"]
    assert argv[4:8] == ["python3", "-m", "torch.distributed.run", "--nnodes=3"]
    assert argv[-4:] == ["python", "train.py", "--lr", "3e-4"]


def test_suite_runs_once_per_node_without_torchrun() -> None:
    _svc, job = manifests(suite_spec(opts("job")))
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][4:] == ["python3", "-m", "gpuaccept", "run", "--profile", "quick", "--no-history",
                                "--report-dir", "/tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12"]
    env = env_of(c)
    assert "PET_NODE_RANK" not in env
    assert env["GPUACCEPT_RESULTS_DIR"] == "/tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12"
    assert env["GPUACCEPT_HOSTNAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert job["spec"]["backoffLimitPerIndex"] == 0 and "backoffLimit" not in job["spec"]


@pytest.mark.parametrize("kind", KINDS)
def test_gpus_shm_and_scheduling(kind: str) -> None:
    full = dict(FULL, priority_class=None if kind == "trainjob" else "gpu-high")
    doc = manifests(suite_spec(opts(kind, **full)))[-1]
    limits = walk(doc, "limits")
    assert limits and all(lim["nvidia.com/gpu"] == "8" and lim["rdma/ib"] == "1" for lim in limits)
    shm = [v for vs in walk(doc, "volumes") for v in vs if v["name"] == "shm"]
    assert shm and all(v["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"} for v in shm)
    assert {"name": "shm", "mountPath": "/dev/shm"} in [m for ms in walk(doc, "volumeMounts") for m in ms]
    assert walk(doc, "tolerations")[0] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                           {"key": "dedicated", "operator": "Equal", "value": "ml",
                                            "effect": "NoExecute"}]
    assert walk(doc, "imagePullSecrets")[0] == [{"name": "ngc-secret"}]
    assert walk(doc, "nodeSelector")[0] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert walk(doc, "serviceAccountName")[0] == "gpuaccept"
    assert doc["metadata"]["namespace"] == "gpu-team"
    assert doc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    pvc = [v for vs in walk(doc, "volumes") for v in vs if v["name"] == "results"]
    assert pvc[0]["persistentVolumeClaim"] == {"claimName": "acceptance-results"}


@pytest.mark.parametrize("kind", KINDS)
def test_never_privileged_unless_asked(kind: str) -> None:
    for spec in (suite_spec(opts(kind, **FULL if kind != "trainjob" else {})), command_spec(opts(kind))):
        text = to_yaml(manifests(spec))
        doc = manifests(spec)[-1]
        assert "privileged:" not in text
        # every container, the MPIJob launcher included, cannot gain privileges
        assert len(walk(doc, "securityContext")) == len(containers(doc)) >= 1
        assert all(sc == {"allowPrivilegeEscalation": False} for sc in walk(doc, "securityContext"))
        # no pod talks to the API: no token mounted (a TrainJob's pod template has no such field)
        pods = walk(doc, "containers")
        tokens = walk(doc, "automountServiceAccountToken")
        token_off = kind != "trainjob" and not spec.options.get("service_account")
        assert tokens == ([False] * len(pods) if token_off else [])
    doc = manifests(command_spec(opts(kind, privileged=True)))[-1]
    assert walk(doc, "securityContext") and all(sc == {"privileged": True} for sc in walk(doc, "securityContext"))
    with_sa = manifests(command_spec(opts(kind, service_account="runner")))[-1]
    assert walk(with_sa, "automountServiceAccountToken") == []  # the named account's own setting


def test_pytorchjob_replicas() -> None:
    job = manifests(command_spec(opts("pytorchjob"), nodes=4))[0]
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 3
    assert job["spec"]["nprocPerNode"] == "8"
    for rs in specs.values():
        c = rs["template"]["spec"]["containers"][0]
        assert c["name"] == "pytorch" and rs["restartPolicy"] == "Never"
        assert "PET_NODE_RANK" not in env_of(c)  # the operator injects it
    one = manifests(command_spec(opts("pytorchjob"), nodes=1))[0]
    assert list(one["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_mpijob_launcher_uses_the_hostfile_and_checks_ranks() -> None:
    job = manifests(command_spec(opts("mpijob", mpirun_args=["--mca", "btl_tcp_if_include", "eth0"]), nodes=3))[0]
    assert job["spec"]["slotsPerWorker"] == 8
    rs = job["spec"]["mpiReplicaSpecs"]
    assert rs["Launcher"]["replicas"] == 1 and rs["Worker"]["replicas"] == 3
    launcher = rs["Launcher"]["template"]["spec"]["containers"][0]
    worker = rs["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["/usr/sbin/sshd", "-De"]
    assert "resources" not in launcher and worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    script = launcher["command"][2]
    mpiruns = [line for line in script.splitlines() if re.search(r"(^\s*|\$\()mpirun --", line)]
    assert len(mpiruns) == 3
    assert all('--hostfile "$hostfile"' in line for line in mpiruns[:2])
    assert "hostfile=/etc/mpi/hostfile" in script and "np=24" in script and "--map-by ppr:8:node" in script
    assert ("-x NCCL_IB_HCA -x TERM -x GPUACCEPT_RESULTS_DIR -x MASTER_ADDR -x MASTER_PORT -x PATH -x LD_LIBRARY_PATH "
            "--mca btl_tcp_if_include eth0") in script
    assert "MASTER_ADDR=${MASTER_ADDR:-$(awk 'NF {print $1; exit}' \"$hostfile\")}" in script
    assert launcher["command"][3:] == ["gpuaccept-launcher", "python", "train.py", "--lr", "3e-4"]
    env = env_of(launcher)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["NCCL_IB_HCA"] == "mlx5"
    # The plain suite: one rank per node.
    suite = manifests(suite_spec(opts("mpijob")))[0]
    script = suite["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2]
    assert "np=4" in script and "--map-by ppr:1:node" in script


def test_trainjob_shape_and_cel_rules() -> None:
    job = manifests(command_spec(opts("trainjob"), nodes=4))[0]
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] >= 1
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert not any(e["name"].startswith("PET_") for e in trainer["env"])  # the trainer forbids setting them
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                         "name": "torch-distributed"}
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "node"
    # CEL rules jsonschema does not run: RFC 1035 name of at most 63 characters.
    for name in ("train", "2024-run", "x" * 48):
        tj = manifests(command_spec(opts("trainjob"), name=sanitize_name(name)))[0]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", tj["metadata"]["name"]) and len(tj["metadata"]["name"]) <= 63
    with pytest.raises(ConfigError, match="priority class"):
        K8sOptions.from_dict({"kind": "trainjob", "priority_class": "high"})
    with pytest.raises(ConfigError, match="TrainJob cannot set"):
        manifests(command_spec(opts("trainjob", host_network=True)))


def test_jobset_addresses_rank_zero_by_its_hostname() -> None:
    js = manifests(command_spec(opts("jobset")))[0]
    assert js["spec"]["network"]["subdomain"] == "train" and js["spec"]["network"]["enableDNSHostnames"] is True
    rj = js["spec"]["replicatedJobs"][0]
    assert rj["name"] == "node" and rj["replicas"] == 1 and rj["template"]["spec"]["completions"] == 2
    assert env_of(containers(js)[0])["PET_MASTER_ADDR"] == "train-node-0-0.train"


# ---- hostile inputs --------------------------------------------------------------------------------------------

def test_names_are_made_valid() -> None:
    assert sanitize_name("My_Job v2!") == "my-job-v2"
    spec = command_spec(opts("job"), name=sanitize_name("2026_Acceptance"))
    assert object_name(spec, "job") == "gpuaccept-2026-acceptance"
    for kind in KINDS:
        doc = manifests(command_spec(opts(kind), name=sanitize_name("2026_Acceptance")))[-1]
        assert doc["metadata"]["name"] == "gpuaccept-2026-acceptance"
        assert errors(doc) == []


def test_too_long_a_name_for_the_pod_hostnames_is_an_error() -> None:
    spec = command_spec(opts("jobset"), name="j" * 51, nodes=100_000)  # 51 + "-node-0-" + "99999" = 64
    with pytest.raises(ConfigError, match="at most 63"):
        manifests(spec)


def test_env_values_with_quotes_and_newlines_survive_yaml() -> None:
    env = {"QUOTES": "it's \"quoted\"", "NEWLINES": "line1\nline2\n", "YAMLISH": "yes", "NUM": "08",
           "COLON": "a: b # not a comment", "LEADING": "  spaces", "NULLISH": "null", "UNICODE": "héllo ✓",
           "DOLLAR": "$(HOME) ${PATH}"}
    for kind in KINDS:
        spec = command_spec(opts(kind), env=env)
        docs = manifests(spec)
        back = list(yaml.safe_load_all(to_yaml(docs)))
        assert back == docs
        env_lists = [e for e in walk(back[-1], "env") if any(x["name"] == "QUOTES" for x in e)]
        assert env_lists, kind
        for found in env_lists:
            got = {x["name"]: x.get("value") for x in found}
            assert all(got[k] == v for k, v in env.items()), kind


def test_paths_with_spaces() -> None:
    spec = command_spec(opts("job"), mounts=[Mount("/mnt/my data", "/data dir", True)],
                        command=["python", "/opt/my code/train.py"], workdir="/work dir")
    _svc, job = manifests(spec)
    back = list(yaml.safe_load_all(to_yaml(manifests(spec))))[1]
    assert back == job
    pod = job["spec"]["template"]["spec"]
    assert {"name": "mount-0", "hostPath": {"path": "/mnt/my data"}} in pod["volumes"]
    assert {"name": "mount-0", "mountPath": "/data dir", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert pod["containers"][0]["workingDir"] == "/work dir"
    assert pod["containers"][0]["command"][-1] == "/opt/my code/train.py"
    assert errors(job) == []


@pytest.mark.parametrize("options, message", [
    ({"tolerations": ["gpu:NoScheduled"]}, "effect must be one of"),
    ({"node_selector": ["bad key=x"]}, "label key"),
    ({"node_selector": {"ok": "bad value"}}, "label value"),
    ({"shm_size": "64 GiB"}, "not a Kubernetes quantity"),
    ({"memory": "lots"}, "not a Kubernetes quantity"),
    ({"namespace": "My_Team"}, "DNS label"),
    ({"results_pvc": "my_pvc"}, "DNS subdomain"),
    ({"image_pull_secrets": ["Secret!"]}, "DNS subdomain"),
    ({"kind": "deployment"}, "must be one of"),
    ({"pod_results_dir": "relative/dir"}, "absolute path"),
    ({"master_port": 70000}, "TCP port"),
    ({"mpirun_args": ["-v"]}, "only applies to --kind mpijob"),
    ({"no_such_option": 1}, "unknown k8s option"),
    ({"image_pull_secrets": 5}, "image_pull_secrets.*expected a list, got int"),
])
def test_bad_options_are_clear_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        K8sOptions.from_dict({"kind": "job", **options})


def test_bad_mounts_and_missing_image() -> None:
    with pytest.raises(ConfigError, match="needs a container image"):
        manifests(command_spec(opts("job"), image=None))
    with pytest.raises(ConfigError, match="DNS subdomain"):
        manifests(command_spec(opts("job"), mounts=[Mount("My_Claim", "/data")]))
    with pytest.raises(ConfigError, match="two volumes are mounted"):
        manifests(command_spec(opts("job"), mounts=[Mount("/dev/shm", "/dev/shm")]))


def test_toleration_syntax() -> None:
    assert parse_toleration("*") == {"operator": "Exists"}
    assert parse_toleration("gpu") == {"key": "gpu", "operator": "Exists"}
    assert parse_toleration("a.io/gpu=true:NoSchedule") == {"key": "a.io/gpu", "operator": "Equal", "value": "true",
                                                             "effect": "NoSchedule"}


def test_flags_to_options() -> None:
    parser = argparse.ArgumentParser()
    K8sBackend.add_arguments(parser)
    args = parser.parse_args(["--kind", "mpijob", "--toleration", "gpu:NoSchedule", "--node-selector", "a=b",
                              "--label", "team=ml", "--resource", "rdma/ib=2", "--shm-size", "32Gi",
                              "--mpirun-arg=--mca", "--mpirun-arg=pml", "--mpirun-arg=ucx", "--privileged"])
    o = K8sBackend.options_from_args(args)
    assert o["kind"] == "mpijob" and o["tolerations"] == [{"key": "gpu", "operator": "Exists",
                                                          "effect": "NoSchedule"}]
    assert o["node_selector"] == {"a": "b"} and o["resources"] == {"rdma/ib": "2"} and o["privileged"] is True
    assert o["mpirun_args"] == ["--mca", "pml", "ucx"]
    assert K8sOptions.from_dict(o).to_dict() == o  # what plan() reads back
    with pytest.raises(ConfigError):
        K8sBackend.options_from_args(parser.parse_args(["--toleration", "x:Sometimes"]))


# ---- generated shell -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", [
    NODE_SCRIPT,
    mpi_launcher_script(2, 8, ["NCCL_DEBUG", "A_B"], ["--mca", "btl_tcp_if_include", "eth0 lo"]),
    mpi_launcher_script(1, 1, [], []),
])
def test_generated_scripts_pass_shellcheck(script: str, tmp_path: Path) -> None:
    shellcheck = need_binary("shellcheck")
    path = tmp_path / "script.sh"
    path.write_text("#!/bin/sh\n" + script)
    proc = subprocess.run([shellcheck, "-s", "sh", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- through the CLI -------------------------------------------------------------------------------------------

def test_cli_dry_run_prints_valid_yaml(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    proc = gpuaccept("launch", "k8s", "--kind", "jobset", "--image", "nvcr.io/nvidia/pytorch:25.01-py3",
                     "--nodes", "2", "--gpus-per-node", "8", "--name", "My_Acceptance", "--toleration",
                     "nvidia.com/gpu:NoSchedule", "--env", "MSG=it's a \"test\"\nsecond line", "--show-env",
                     "--run-id", "r1",
                     "--dry-run", "--output", str(out), "--profile", "quick")
    assert proc.returncode == 0, proc.stderr
    yaml_part = proc.stdout.split("# ---- commands ----")[0]
    docs = [d for d in yaml.safe_load_all(yaml_part) if d]
    assert [d["kind"] for d in docs] == ["JobSet"] and docs[0]["metadata"]["name"] == "my-acceptance"
    assert all(errors(d) == [] for d in docs)
    assert "kubectl create --validate=strict -f my-acceptance.yaml" in proc.stdout
    assert env_of(containers(docs[0])[0])["MSG"] == "it's a \"test\"\nsecond line"
    written = out / "my-acceptance.yaml"
    assert list(yaml.safe_load_all(written.read_text())) == docs


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "2"], "needs a container image"),
    (["--image", "x", "--kind", "deployment"], "invalid choice"),
    (["--image", "x", "--toleration", "gpu:Sometimes"], "effect must be one of"),
    (["--image", "x", "--namespace", "Bad_NS"], "DNS label"),
    (["--image", "x", "--kind", "trainjob", "--priority-class", "high"], "priority class"),
    (["--image", "x", "--kind", "trainjob", "--trainer-version", "2.0"], "--trainer-version"),
])
def test_cli_bad_input_exits_2_with_one_line(argv: list[str], message: str) -> None:
    proc = gpuaccept("launch", "k8s", "--dry-run", *argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


# ---- one pod per host, Trainer releases ------------------------------------------------------------------------

def _pod_templates(doc: dict[str, Any]) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """(labels, pod spec) of every pod template in ``doc`` that has containers."""
    out = []
    for tmpl in walk(doc, "template") + walk(doc, "podTemplateOverrides"):
        for t in tmpl if isinstance(tmpl, list) else [tmpl]:
            if isinstance(t, dict) and isinstance(t.get("spec"), dict) and "containers" in t["spec"]:
                out.append((t.get("metadata", {}).get("labels", {}), t["spec"]))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_node_pods_repel_each_other_on_a_host(kind: str) -> None:
    """With --gpus-per-node 4 on 8-GPU hosts two node pods could share a host: a required anti-affinity forbids it."""
    doc = manifests(suite_spec(opts(kind), gpus_per_node=4))[-1]
    templates = _pod_templates(doc)
    node_pods = [(labels, pod) for labels, pod in templates if labels.get("gpuaccept/role") != "launcher"]
    assert node_pods
    for labels, pod in node_pods:
        (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        match = term["labelSelector"]["matchLabels"]
        if kind == "trainjob":  # JobSet labels the pods it creates with its name, the TrainJob's
            assert match == {"jobset.sigs.k8s.io/jobset-name": "accept-h100"}
        else:  # the selector matches the pod itself, so every node pod of the run (all roles) repels the others
            assert match.items() <= labels.items(), (match, labels)
            assert "gpuaccept/run-id" not in match
    if kind == "pytorchjob":  # master and workers repel each other too: the selector has no role
        assert all("gpuaccept/role" not in p["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"] for _, p in node_pods)
    launchers = [pod for labels, pod in templates if labels.get("gpuaccept/role") == "launcher"]
    assert all("affinity" not in pod for pod in launchers)  # the CPU-only launcher may share a worker's host
    if kind == "mpijob":
        assert launchers and node_pods[0][1]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"][
            "gpuaccept/role"] == "worker"


def test_trainjob_follows_the_trainer_release() -> None:
    new = manifests(command_spec(opts("trainjob")))[0]
    assert "runtimePatches" in new["spec"] and "podTemplateOverrides" not in new["spec"]
    for version in ("2.1", "v2.1.0"):
        old = manifests(command_spec(opts("trainjob", trainer_version=version)))[0]
        assert "runtimePatches" not in old["spec"]
        (override,) = old["spec"]["podTemplateOverrides"]
        assert override["targetJobs"] == [{"name": "node"}]
        patched = new["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        # the same pod patch, in the older shape (which cannot carry a container securityContext)
        newer_pod = copy.deepcopy(patched["template"]["spec"]["template"]["spec"])
        assert [c.pop("securityContext") for c in newer_pod["containers"]] == [{"allowPrivilegeEscalation": False}]
        assert override["spec"] == newer_pod
        assert override["metadata"] == patched["template"]["spec"]["template"]["metadata"]
    for version in ("2.3", "v2.2.1", "3.0"):
        assert "runtimePatches" in manifests(command_spec(opts("trainjob", trainer_version=version)))[0]["spec"]
    for bad in ("2.0", "two", "2", ""):
        with pytest.raises(ConfigError, match="--trainer-version"):
            K8sOptions.from_dict({"kind": "trainjob", "trainer_version": bad})
    with pytest.raises(ConfigError, match="security context"):
        manifests(command_spec(opts("trainjob", trainer_version="2.1", privileged=True)))


def test_trainer_version_flag() -> None:
    parser = argparse.ArgumentParser()
    K8sBackend.add_arguments(parser)
    args = parser.parse_args(["--kind", "trainjob", "--trainer-version", "2.1"])
    assert K8sBackend.options_from_args(args)["trainer_version"] == "2.1"
    assert K8sBackend.options_from_args(parser.parse_args([]))["trainer_version"] == "2.2"


def test_options_that_weaken_isolation_print_a_warning_naming_the_risk(tmp_path: Path) -> None:
    base = ["launch", "k8s", "--image", "img", "--nodes", "2", "--gpus-per-node", "8", "--results-dir", str(tmp_path),
            "--dry-run"]
    quiet = gpuaccept(*base)
    assert quiet.returncode == 0, quiet.stderr
    assert "warning" not in quiet.stderr
    loud = gpuaccept(*base, "--privileged", "--host-network", "--mount", "/var/log:/host-logs")
    assert loud.returncode == 0, loud.stderr
    warnings = [line for line in loud.stderr.splitlines() if line.startswith("[LAUNCH] warning:")]
    assert len(warnings) == 3, loud.stderr
    assert "take over the node" in warnings[0] and "network namespace" in warnings[1]
    assert "/var/log" in warnings[2] and "read-write" in warnings[2]
