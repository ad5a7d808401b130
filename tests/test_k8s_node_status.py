"""``gpuaccept node-status`` without an API server: the pure node change, the verdict from reports, the health
DaemonSet (strict schema validation, golden file, its loop script run for real), and the node-problem-detector
files (the documented config fields, the plugin's exit mapping run for real, shellcheck)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import ConfigError, InputError
from gpuaccept.health.daemonset import LOOP_SCRIPT, HealthDaemonOptions, health_manifests, own_toleration
from gpuaccept.health.nodepatch import (
    HEALTH_LABEL,
    TAINT,
    NodeVerdict,
    NoVerdict,
    desired_change,
    json_patch,
    kubectl_equivalent,
    merge_patch,
    new_taints,
    node_report_for,
    verdict_from_report,
)
from gpuaccept.health.npd import PLUGIN_SCRIPT, go_duration_s, npd_config
from gpuaccept.launch.k8s.manifests import to_yaml
from gpuaccept.model import CheckResult, NodeReport, Status, Verdict
from tests.helpers import gpuaccept
from tests.k8s_fake_api import apply_json_patch, node, node_problems
from tests.k8s_strict import errors
from tests.k8s_support import check_golden, need_binary, need_module
from tests.store_reports import cluster_report, node_report
from tests.vap_cel import denial, node_update

need_module("kubernetes_validate")
need_module("celpy")

NOW = "2026-05-01T12:00:00Z"
OURS = dict(TAINT)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OUR_KEY_OTHER_EFFECT = {"key": HEALTH_LABEL, "value": "fail", "effect": "NoExecute"}


def verdict(health: str, name: str = "gpu-1") -> NodeVerdict:
    return NodeVerdict(name, health, "memtest: fail: 3 errors" if health == "fail" else "5 of 5 checks passed",
                       "r1", NOW)


def patched(n: dict[str, Any], health: str, taint: bool) -> dict[str, Any]:
    """``n`` after our patch, applied the RFC 6902 way; the result must pass the API server's node validation."""
    out = apply_json_patch(n, json_patch(n, desired_change(verdict(health, n["metadata"]["name"]), taint=taint)))
    assert node_problems(out) == []
    return out


# ---- the node change (pure) ------------------------------------------------------------------------------------

def test_desired_change_by_verdict_and_taint() -> None:
    assert desired_change(verdict("pass"), taint=False).taint == "remove"
    assert desired_change(verdict("pass"), taint=True).taint == "remove"
    assert desired_change(verdict("fail"), taint=True).taint == "add"
    assert desired_change(verdict("fail"), taint=False).taint == "keep"
    change = desired_change(verdict("fail"), taint=True)
    assert change.labels == {"gpuaccept.io/health": "fail"}
    assert change.annotations == {"gpuaccept.io/health-checked": NOW, "gpuaccept.io/health-reason":
                                  "memtest: fail: 3 errors", "gpuaccept.io/health-run-id": "r1"}


def test_failure_with_taint_adds_ours_and_keeps_the_rest() -> None:
    n = node("gpu-1", labels={"team": "ml", HEALTH_LABEL: "pass"}, taints=[GPU_TAINT],
             annotations={"other.io/note": "keep me"})
    ops = json_patch(n, desired_change(verdict("fail"), taint=True))
    assert ops[0] == {"op": "add", "path": "/metadata/labels/gpuaccept.io~1health", "value": "fail"}
    assert {"op": "test", "path": "/spec/taints", "value": [GPU_TAINT]} in ops  # what was read, checked
    out = patched(n, "fail", taint=True)
    assert out["spec"]["taints"] == [GPU_TAINT, OURS]
    assert out["metadata"]["labels"] == {"kubernetes.io/hostname": "gpu-1", "team": "ml", HEALTH_LABEL: "fail"}
    assert out["metadata"]["annotations"]["other.io/note"] == "keep me"
    assert out["metadata"]["annotations"]["gpuaccept.io/health-reason"] == "memtest: fail: 3 errors"
    assert out["status"] == n["status"] and out["spec"]["podCIDR"] == n["spec"]["podCIDR"]


def test_node_without_taints_or_annotations() -> None:
    n = node("gpu-1")
    ops = json_patch(n, desired_change(verdict("fail"), taint=True))
    assert {"op": "add", "path": "/spec/taints", "value": [OURS]} in ops
    assert {"op": "add", "path": "/metadata/annotations", "value": {
        "gpuaccept.io/health-checked": NOW, "gpuaccept.io/health-reason": "memtest: fail: 3 errors",
        "gpuaccept.io/health-run-id": "r1"}} in ops
    assert patched(n, "fail", taint=True)["spec"]["taints"] == [OURS]
    # a pass on such a node touches no taint
    assert not any(op["path"].startswith("/spec") for op in json_patch(n, desired_change(verdict("pass"), taint=True)))


def test_pass_removes_only_our_taint() -> None:
    foreign_value = {**OURS, "value": "someone-else"}
    n = node("gpu-1", taints=[GPU_TAINT, OURS, OUR_KEY_OTHER_EFFECT])
    assert patched(n, "pass", taint=False)["spec"]["taints"] == [GPU_TAINT, OUR_KEY_OTHER_EFFECT]
    n2 = node("gpu-1", taints=[foreign_value])
    assert patched(n2, "pass", taint=True)["spec"]["taints"] == [foreign_value]  # not exactly ours: left


def test_failure_without_taint_leaves_the_taints() -> None:
    n = node("gpu-1", taints=[GPU_TAINT, OURS])
    ops = json_patch(n, desired_change(verdict("fail"), taint=False))
    assert not any(op["path"].startswith("/spec") for op in ops)
    assert patched(n, "fail", taint=False)["spec"]["taints"] == [GPU_TAINT, OURS]


def test_taint_already_there_is_not_added_twice() -> None:
    n = node("gpu-1", taints=[OURS])
    assert not any(op["path"].startswith("/spec") for op in json_patch(n, desired_change(verdict("fail"), taint=True)))
    # a taint with our key and effect but another value: the API allows one per key and effect, so none is added
    other = {**OURS, "value": "manual"}
    assert new_taints([other], "add") == [other]


def test_the_test_op_catches_a_taint_added_meanwhile() -> None:
    n = node("gpu-1", taints=[GPU_TAINT])
    ops = json_patch(n, desired_change(verdict("fail"), taint=True))
    n["spec"]["taints"].append({"key": "maintenance", "effect": "NoSchedule"})  # another controller, between
    with pytest.raises(ValueError, match="testing value /spec/taints failed"):
        apply_json_patch(n, ops)


def test_reason_is_one_line_and_bounded() -> None:
    rep = node_report("gpu-1", "r1", fail=True)
    rep.checks[-1].reason = "line one\nline two " + "x" * 5000
    v = verdict_from_report(rep, "gpu-1", NOW)
    assert v.health == "fail" and "\n" not in v.reason and len(v.reason) <= 1024
    assert v.reason.startswith("memtest: fail: line one line two")
    out = patched(node("gpu-1"), "fail", taint=False)  # the annotation must fit the API server's limits
    assert out["metadata"]["labels"][HEALTH_LABEL] == "fail"


def test_verdicts_from_reports() -> None:
    ok = verdict_from_report(node_report("gpu-1", "r1"), "gpu-1", NOW)
    assert (ok.health, ok.reason, ok.run_id) == ("pass", "5 of 5 checks passed (standard profile)", "r1")
    bad = verdict_from_report(node_report("gpu-1", "r2", fail=True), "gpu-1", NOW)
    assert (bad.health, bad.reason) == ("fail", "memtest: fail: 3 errors")
    for v in (Verdict.RUNNING, Verdict.INTERRUPTED, Verdict.NOTHING_MEASURED):
        rep = NodeReport(run_id="r3", host="gpu-1", profile="quick", started=NOW, verdict=v,
                         checks=[CheckResult("compute", Status.SKIP, "no GPU")])
        with pytest.raises(NoVerdict) as exc:
            verdict_from_report(rep, "gpu-1", NOW)
        assert exc.value.verdict is v and "left as it is" in str(exc.value)


def test_report_of_another_host_is_refused() -> None:
    rep = node_report("gpu-1", "r1")
    assert node_report_for(rep, "gpu-1.cluster.local") is rep  # the runner records the short name
    with pytest.raises(InputError, match="is from host gpu-1, not node gpu-2: pass --node"):
        node_report_for(rep, "gpu-2")
    assert node_report_for(rep, "gpu-2", any_host=True) is rep
    cluster = cluster_report("c1", ["gpu-1", "gpu-2", "gpu-3"], missing=("gpu-3",), failing=("gpu-2",))
    assert node_report_for(cluster, "gpu-2").verdict is Verdict.FAILURE
    with pytest.raises(InputError, match="node gpu-3 did not report in cluster run c1"):
        node_report_for(cluster, "gpu-3")
    with pytest.raises(InputError, match="node gpu-9 is not part of cluster run c1"):
        node_report_for(cluster, "gpu-9")


def test_dry_run_forms() -> None:
    change = desired_change(verdict("fail"), taint=True)
    assert merge_patch(change) == {"metadata": {"labels": change.labels, "annotations": change.annotations}}
    cmds = kubectl_equivalent(change)
    assert cmds[0] == ["kubectl", "label", "node", "gpu-1", "--overwrite", "gpuaccept.io/health=fail"]
    assert cmds[-1] == ["kubectl", "taint", "node", "gpu-1", "--overwrite", "gpuaccept.io/health=fail:NoSchedule"]
    assert kubectl_equivalent(desired_change(verdict("pass"), taint=False))[-1][-1] == \
        "gpuaccept.io/health=fail:NoSchedule-"


# ---- the health DaemonSet ----------------------------------------------------------------------------------------

ARGS = ["--profile", "quick", "--taint"]


def daemon(**over: Any) -> list[dict[str, Any]]:
    values: dict[str, Any] = {"image": "registry.example.com/gpuaccept:1", "node_status_args": ARGS, **over}
    return health_manifests(HealthDaemonOptions(**values))


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(docs[-1]["spec"]["template"]["spec"])


@pytest.mark.parametrize("over", [{}, {"gpus": 8, "cpu": "4", "memory": "16Gi", "runtime_class": "nvidia",
                                       "run_as_user": 1000, "priority_class": "system-node-critical",
                                       "node_selector": {"nvidia.com/gpu.present": "true"},
                                       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                       "image_pull_secrets": ["ngc"], "image_pull_policy": "Always"}],
                         ids=["default", "everything"])
def test_daemonset_manifests_are_valid(over: dict[str, Any]) -> None:
    docs = daemon(**over)
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DaemonSet"]
    for doc in docs:
        assert errors(doc) == [], doc["kind"]


def test_the_admission_policy_can_be_left_out_for_older_clusters() -> None:
    docs = daemon(admission_policy=False)
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"]


def test_a_misspelt_policy_field_would_be_refused() -> None:
    """The strict validation the policy passes above does look at its fields."""
    policy = copy.deepcopy(daemon()[3])
    policy["spec"]["validations"][0]["mesage"] = policy["spec"]["validations"][0].pop("message")
    assert any("'mesage' was unexpected" in e for e in errors(policy))
    binding = copy.deepcopy(daemon()[4])
    binding["spec"]["validationActions"] = "Deny"
    assert errors(binding) != []


SA_USER = "system:serviceaccount:gpuaccept-health:gpuaccept-health"


@pytest.mark.parametrize(("request_", "target", "message"), [
    (node_update(SA_USER, "gpu-1"), "gpu-1", None),
    (node_update(SA_USER, "gpu-1"), "gpu-2",
     "gpuaccept-health/gpuaccept-health may patch only its own node gpu-1, not gpu-2"),
    (node_update(SA_USER), "gpu-1", "the token of gpuaccept-health/gpuaccept-health names no node"),
    (node_update(SA_USER, extra={"authentication.kubernetes.io/pod-name": ["p"]}), "gpu-1",
     "the token of gpuaccept-health/gpuaccept-health names no node"),
    (node_update(SA_USER, extra={"authentication.kubernetes.io/node-name": []}), "gpu-1",
     "the token of gpuaccept-health/gpuaccept-health names no node"),
    (node_update("system:serviceaccount:other:gpuaccept-health", "gpu-1"), "gpu-2", None),  # not ours: not matched
    (node_update("kubernetes-admin"), "gpu-2", None),
    ({**node_update(SA_USER, "gpu-1"), "operation": "CREATE"}, "gpu-2", None),  # RBAC grants no create
], ids=["own-node", "other-node", "no-extra", "no-node-claim", "empty-claim", "other-namespace", "admin", "create"])
def test_the_policy_lets_the_service_account_patch_only_its_own_node(request_: dict[str, Any], target: str,
                                                                      message: str | None) -> None:
    """The policy's CEL evaluated on admission requests (cel-python; the API server's own type and cost checks
    are not run here)."""
    policy = daemon()[3]
    found = denial(policy, request_, node(target), node(target))
    if message is None:
        assert found is None
    else:
        assert found is not None and found.startswith(message), found


def test_the_policy_names_the_service_account_of_its_options() -> None:
    policy, binding = daemon(name="health2", namespace="ops")[3:5]
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == binding["metadata"]["name"] == "health2"
    assert denial(policy, node_update("system:serviceaccount:ops:health2", "gpu-1"), node("gpu-2")) == \
        "ops/health2 may patch only its own node gpu-1, not gpu-2"
    assert denial(policy, node_update(SA_USER, "gpu-1"), node("gpu-2")) is None


def test_daemonset_matches_golden() -> None:
    check_golden("k8s/health-daemonset.yaml", to_yaml(daemon(node_selector={"nvidia.com/gpu.present": "true"},
                                                              tolerations=[{"key": "nvidia.com/gpu",
                                                                            "operator": "Exists"}])))


def test_rbac_is_get_and_patch_nodes_only() -> None:
    _sa, role, binding, _policy, _policy_binding, ds = daemon()
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "gpuaccept-health"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuaccept-health",
                                    "namespace": "gpuaccept-health"}]
    assert pod_spec([ds])["serviceAccountName"] == "gpuaccept-health"


def test_pod_is_least_privilege_and_knows_its_node() -> None:
    spec = pod_spec(daemon())
    c = spec["containers"][0]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "hostNetwork" not in spec and "hostPID" not in spec
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["NODE_NAME"] == env["GPUACCEPT_HOSTNAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "resources" not in c  # no GPU allocated by default
    assert c["command"][:4] == ["/bin/sh", "-c", LOOP_SCRIPT, "gpuaccept-health"] and c["command"][4:] == ARGS
    assert spec["tolerations"] == [own_toleration()]  # a tainted node keeps the pod that can clear the taint
    with_gpus = pod_spec(daemon(gpus=8))["containers"][0]
    assert with_gpus["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in with_gpus["env"]}  # the device plugin sets it


@pytest.mark.parametrize(("over", "flag"), [({"name": "Bad_Name"}, "--name"), ({"interval_s": 0}, "--interval"),
                                            ({"memory": "lots"}, "--memory"), ({"gpus": -1}, "--gpus-per-node"),
                                            ({"image": "has space"}, "--image"),
                                            ({"run_as_user": -5}, "--run-as-user")])
def test_daemonset_bad_options(over: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError) as exc:
        daemon(**over)
    assert exc.value.source == flag


def _stub(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    stub = bin_dir / "gpuaccept"
    stub.write_text("#!/bin/sh\n" + body)
    stub.chmod(0o755)


def test_loop_script_is_clean_for_shellcheck(tmp_path: Path) -> None:
    shellcheck = need_binary("shellcheck")
    for name, text in (("loop.sh", "#!/bin/sh\n" + LOOP_SCRIPT), ("plugin.sh", PLUGIN_SCRIPT)):
        path = tmp_path / name
        path.write_text(text)
        proc = subprocess.run([shellcheck, "-s", "sh", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_loop_runs_node_status_every_interval_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    _stub(tmp_path / "bin", f'echo "$*" >> "{log}"\nexit 1\n')
    c = pod_spec(daemon(interval_s=1))["containers"][0]
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "GPUACCEPT_HEALTH_INTERVAL": "1"}
    proc = subprocess.Popen(c["command"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(log.read_text().splitlines() if log.exists() else []) < 2:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=5)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    calls = log.read_text().splitlines()
    assert len(calls) >= 2 and set(calls) == {"node-status label --apply --profile quick --taint"}
    assert "[HEALTH] gpuaccept node-status exited 1; next check in 1 s" in out  # a failure does not stop it


def test_loop_passes_sigterm_to_a_running_check(tmp_path: Path) -> None:
    """SIGTERM right after the check started (before the loop's next command, once a race that lost the child)."""
    marker = tmp_path / "got-term"
    _stub(tmp_path / "bin", f'trap \'echo term > "{marker}"; kill "$!"; exit 130\' TERM\necho started\n'
                            'sleep 60 &\nwait "$!"\n')
    c = pod_spec(daemon(interval_s=600))["containers"][0]
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "GPUACCEPT_HEALTH_INTERVAL": "600"}
    proc = subprocess.Popen(c["command"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0 and marker.read_text().strip() == "term"
    assert time.monotonic() - t0 < 5


def test_daemonset_cli(tmp_path: Path) -> None:
    proc = gpuaccept("node-status", "daemonset", "--image", "reg/gpuaccept:1", "--profile", "quick", "--checks",
                     "env,memory", "--taint", "--interval", "300", "--toleration", "nvidia.com/gpu:NoSchedule",
                     "--node-selector", "nvidia.com/gpu.present=true")
    assert proc.returncode == 0, proc.stderr
    import yaml

    docs = list(yaml.safe_load_all(proc.stdout))
    assert all(errors(d) == [] for d in docs)
    spec = pod_spec(docs)
    # unattended: a pod that sees no GPU must fail, not pass on the CPU
    assert spec["containers"][0]["command"][4:] == ["--profile", "quick", "--checks", "env,memory", "--require-gpu",
                                                    "--taint"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"][1] == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert [d["kind"] for d in docs][3:5] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    cpu = gpuaccept("node-status", "daemonset", "--image", "i", "--profile", "quick", "--device", "cpu",
                    "--no-admission-policy", "--name", "h2", "--namespace", "ops")
    cpu_docs = list(yaml.safe_load_all(cpu.stdout))
    assert "--require-gpu" not in pod_spec(cpu_docs)["containers"][0]["command"]
    assert [d["kind"] for d in cpu_docs] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"]
    assert {(d["metadata"]["name"], d["metadata"].get("namespace")) for d in cpu_docs} == {
        ("h2", "ops"), ("h2", None)}
    bad = gpuaccept("node-status", "daemonset", "--profile", "quick")
    assert (bad.returncode, bad.stderr.strip()) == (2, "gpuaccept: error: the following arguments are required: "
                                                       "--image (see 'gpuaccept node-status daemonset --help')")


# ---- node-problem-detector ---------------------------------------------------------------------------------------

def test_npd_config_has_the_documented_fields() -> None:
    """Field names and meanings from kubernetes/node-problem-detector: pkg/custompluginmonitor/types/config.go
    (CustomPluginConfig, pluginGlobalConfig) and types.go (CustomRule), example config/custom-plugin-monitor.json."""
    cfg = npd_config("/config/plugin/gpuaccept-plugin.sh", ["--profile", "quick"], interval="30m", timeout="10m")
    assert set(cfg) == {"plugin", "pluginConfig", "source", "metricsReporting", "conditions", "rules"}
    assert cfg["plugin"] == "custom"  # NPD refuses any other value
    assert set(cfg["pluginConfig"]) == {"invoke_interval", "timeout", "max_output_length", "concurrency",
                                        "enable_message_change_based_condition_update"}
    assert cfg["pluginConfig"]["concurrency"] == 1
    (cond,) = cfg["conditions"]
    assert set(cond) == {"type", "reason", "message"}
    (rule,) = cfg["rules"]
    assert set(rule) == {"type", "condition", "reason", "path", "args", "timeout"}
    assert rule["type"] == "permanent" and rule["condition"] == cond["type"]
    assert rule["args"] == ["--profile", "quick"] and rule["path"].startswith("/")
    # NPD refuses a rule timeout above the global one
    assert go_duration_s(rule["timeout"], "t") <= go_duration_s(cfg["pluginConfig"]["timeout"], "t")
    json.dumps(cfg)


@pytest.mark.parametrize(("kw", "flag"), [({"interval": "soon"}, "--invoke-interval"),
                                          ({"timeout": "1h"}, "--timeout"),
                                          ({"timeout": "0s"}, "--timeout")])
def test_npd_config_bad_durations(kw: dict[str, str], flag: str) -> None:
    with pytest.raises(ConfigError) as exc:
        npd_config("/p.sh", [], **kw)
    assert exc.value.source == flag
    assert go_duration_s("1h30m", "x") == 5400 and go_duration_s("1.5s", "x") == 1.5


@pytest.mark.parametrize(("node_status_rc", "npd_rc"), [(0, 0), (1, 1), (2, 2), (4, 2), (5, 2), (130, 2), (3, 2)])
def test_npd_plugin_maps_exit_codes(tmp_path: Path, node_status_rc: int, npd_rc: int) -> None:
    _stub(tmp_path / "bin", f'echo "node gpu-1: rc {node_status_rc} ($*)"\necho second line\nexit {node_status_rc}\n')
    script = tmp_path / "plugin.sh"
    script.write_text(PLUGIN_SCRIPT)
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run([str(script), "--profile", "quick"], capture_output=True, text=True, env=env)
    assert proc.returncode == npd_rc
    assert proc.stdout == f"node gpu-1: rc {node_status_rc} (node-status label --summary --profile quick)\n"


def test_npd_plugin_without_output_says_why(tmp_path: Path) -> None:
    _stub(tmp_path / "bin", "echo only-on-stderr >&2\nexit 2\n")
    script = tmp_path / "plugin.sh"
    script.write_text(PLUGIN_SCRIPT)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env)
    assert (proc.returncode, proc.stdout) == (2, "gpuaccept node-status exited 2 with no verdict\n")


def test_npd_plugin_with_the_real_cli(tmp_path: Path) -> None:
    """The files ``node-status npd`` writes, the plugin run as NPD would, on a passing and a failing report."""
    from tests.report_data import write_json

    out = tmp_path / "npd"
    proc = gpuaccept("node-status", "npd", str(out), "--report", "/var/lib/gpuaccept/latest")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads((out / "gpuaccept-monitor.json").read_text())
    assert cfg["rules"][0]["args"] == ["--report", "/var/lib/gpuaccept/latest"]
    suite = gpuaccept("node-status", "npd", str(tmp_path / "npd2"), "--profile", "quick")
    assert suite.returncode == 0, suite.stderr
    assert json.loads((tmp_path / "npd2" / "gpuaccept-monitor.json").read_text())["rules"][0]["args"] == [
        "--profile", "quick", "--require-gpu"]
    script = out / "gpuaccept-plugin.sh"
    assert os.access(script, os.X_OK)
    env = {**os.environ, "GPUACCEPT_BIN": str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "gpuaccept")}
    if not Path(env["GPUACCEPT_BIN"]).exists():
        env["GPUACCEPT_BIN"] = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpuaccept")
    for fail, rc in ((False, 0), (True, 1)):
        report = write_json(tmp_path / f"r{int(fail)}.json", node_report("gpu-1", "r1", fail=fail))
        run = subprocess.run([str(script), "--report", str(report), "--node", "gpu-1"], capture_output=True,
                             text=True, env=env, timeout=60)
        assert run.returncode == rc, run.stdout + run.stderr
        first = run.stdout.splitlines()[0]
        assert first.startswith(f"node gpu-1: {'fail' if fail else 'pass'}: "), run.stdout
    unknown = subprocess.run([str(script), "--report", str(tmp_path / "missing.json"), "--node", "gpu-1"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert unknown.returncode == 2
