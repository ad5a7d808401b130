"""``gpuaccept node-status`` end to end: the real CLI and the real ``kubernetes`` client against the recorded
fake API server of ``tests/k8s_fake_api.py`` (no cluster is reachable from here), which checks what was sent
(method, path, content type, token, the JSON patch) and applies it the RFC 6902 way. The verdicts come from
report files and from real suite runs on this machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.health.daemonset import HealthDaemonOptions, health_manifests
from gpuaccept.health.nodepatch import HEALTH_LABEL, TAINT
from gpuaccept.model import NodeReport, Verdict
from tests.helpers import ROOT, cli_env, gpuaccept
from tests.k8s_fake_api import TOKEN, FakeKubeAPI, node
from tests.k8s_support import need_module
from tests.report_data import write_json
from tests.store_reports import cluster_report, node_report
from tests.vap_cel import node_update

need_module("kubernetes")
need_module("celpy")

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OURS = dict(TAINT)
SUITE = ["--profile", "quick", "--device", "cpu", "--checks", "env"]


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    server = FakeKubeAPI().start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api: FakeKubeAPI, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


def report_file(tmp_path: Path, fail: bool = False, host: str = "gpu-1") -> Path:
    return write_json(tmp_path / f"report-{host}-{int(fail)}.json", node_report(host, "r1", fail=fail))


def node_status(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``gpuaccept node-status label ARGS``."""
    return gpuaccept("node-status", "label", *args, timeout=180, **env)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ---- --apply ----------------------------------------------------------------------------------------------------

def test_failure_labels_and_taints_the_node(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", labels={"team": "ml"}, taints=[GPU_TAINT], annotations={"x.io/a": "b"})
    proc = node_status("--apply", "--taint", "--report", str(report_file(tmp_path, fail=True)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    get, patch = api.requests
    assert (get["method"], get["path"]) == ("GET", "/api/v1/nodes/gpu-1")
    assert (patch["method"], patch["path"], patch["content_type"]) == ("PATCH", "/api/v1/nodes/gpu-1",
                                                                      "application/json-patch+json")
    assert all(r["auth"] == f"Bearer {TOKEN}" for r in api.requests)
    assert "dryRun" not in patch["query"]
    doc = json.loads(proc.stdout)
    assert patch["body"] == doc["patch"] and doc["applied"] is True
    assert doc["verdict"]["health"] == "fail" and doc["verdict"]["reason"] == "memtest: fail: 3 errors"
    stored = api.nodes["gpu-1"]
    assert stored["metadata"]["labels"] == {"kubernetes.io/hostname": "gpu-1", "team": "ml", HEALTH_LABEL: "fail"}
    assert stored["spec"]["taints"] == [GPU_TAINT, OURS]
    notes = stored["metadata"]["annotations"]
    assert notes["x.io/a"] == "b" and notes["gpuaccept.io/health-reason"] == "memtest: fail: 3 errors"
    assert notes["gpuaccept.io/health-run-id"] == "r1" and notes["gpuaccept.io/health-checked"].endswith("Z")
    assert "[HEALTH] node gpu-1: fail: memtest: fail: 3 errors (applied)" in proc.stderr


def test_pass_clears_our_taint_only(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", labels={HEALTH_LABEL: "fail"}, taints=[OURS, GPU_TAINT])
    proc = node_status("--apply", "--report", str(report_file(tmp_path)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert api.nodes["gpu-1"]["spec"]["taints"] == [GPU_TAINT]
    assert api.nodes["gpu-1"]["metadata"]["labels"][HEALTH_LABEL] == "pass"


def test_node_name_from_the_environment(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1")
    proc = node_status("--apply", "--report", str(report_file(tmp_path)), "--kubeconfig", str(kubeconfig),
                       NODE_NAME="gpu-1")
    assert proc.returncode == 0, proc.stderr
    assert api.calls("PATCH")[0]["path"] == "/api/v1/nodes/gpu-1"


def test_cluster_report_entry_of_the_node(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-2"] = node("gpu-2")
    cluster = write_json(tmp_path / "cluster-report.json", cluster_report("c1", ["gpu-1", "gpu-2"],
                                                                          failing=("gpu-2",)))
    proc = node_status("--apply", "--taint", "--report", str(cluster), "--node", "gpu-2", "--kubeconfig",
                       str(kubeconfig))
    assert proc.returncode == 1, proc.stderr
    assert api.nodes["gpu-2"]["spec"]["taints"] == [OURS]


def test_taints_changed_between_read_and_patch_are_kept(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    """Another controller adds a taint after our read: the server refuses our patch (422 on the test), node-status
    reads again and patches again, and both taints stay."""
    api.nodes["gpu-1"] = node("gpu-1", taints=[GPU_TAINT])
    maintenance = {"key": "maintenance", "effect": "NoSchedule"}
    once = [True]

    def meanwhile(n: dict[str, Any]) -> None:
        if once.pop() if once else False:
            n["spec"]["taints"].append(maintenance)

    api.before_patch.append(meanwhile)
    proc = node_status("--apply", "--taint", "--report", str(report_file(tmp_path, fail=True)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [r["method"] for r in api.requests] == ["GET", "PATCH", "GET", "PATCH"]
    assert api.nodes["gpu-1"]["spec"]["taints"] == [GPU_TAINT, maintenance, OURS]


def test_server_dry_run_stores_nothing(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    before = node("gpu-1")
    api.nodes["gpu-1"] = json.loads(json.dumps(before))
    proc = node_status("--apply", "--server-dry-run", "--taint", "--report", str(report_file(tmp_path, fail=True)),
                       "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stderr
    assert api.calls("PATCH")[0]["query"]["dryRun"] == "All"
    assert api.nodes["gpu-1"] == before
    doc = json.loads(proc.stdout)
    assert doc["applied"] is False and doc["server_dry_run"] is True and doc["patch"]


def test_dry_run_sends_nothing(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1")
    proc = node_status("--taint", "--report", str(report_file(tmp_path, fail=True)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stderr
    assert api.requests == []
    doc = json.loads(proc.stdout)
    assert doc["applied"] is False
    assert doc["merge_patch"]["metadata"]["labels"] == {HEALTH_LABEL: "fail"}
    assert doc["change"]["taint"]["action"] == "add"
    assert doc["kubectl"][-1] == "kubectl taint node gpu-1 --overwrite gpuaccept.io/health=fail:NoSchedule"


# ---- when the API says no ------------------------------------------------------------------------------------------

def test_no_such_node(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    proc = node_status("--apply", "--report", str(report_file(tmp_path, fail=True)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2
    assert one_line(proc) == "gpuaccept: error: no node gpu-1 in the cluster (see --node)"
    doc = json.loads(proc.stdout)  # the verdict is not lost
    assert doc["verdict"]["health"] == "fail" and doc["applied"] is False and "no node gpu-1" in doc["error"]


def test_forbidden_patch_names_the_rbac(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1")
    api.reject[("PATCH", "nodes")] = (403, "Forbidden", 'nodes "gpu-1" is forbidden: User "system:serviceaccount:'
                                                        'x:y" cannot patch resource "nodes"')
    proc = node_status("--apply", "--report", str(report_file(tmp_path)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith("gpuaccept: error: patching node gpu-1: HTTP 403: nodes \"gpu-1\" is forbidden")
    assert line.endswith("(the service account needs get and patch on nodes: see node-status daemonset)")
    assert json.loads(proc.stdout)["verdict"]["health"] == "pass"
    assert api.nodes["gpu-1"] == node("gpu-1")


SA_USER = "system:serviceaccount:gpuaccept-health:gpuaccept-health"


def _enforce_policy(api: FakeKubeAPI, token_node: str | None) -> None:
    """The health DaemonSet's admission policy in force; the token is its service account's, bound to a pod on
    ``token_node`` (None: a token that names no node)."""
    docs = health_manifests(HealthDaemonOptions(image="img"))
    api.admission.append((docs[3], docs[4]))
    api.user_info = node_update(SA_USER, token_node)["userInfo"]


def test_the_policy_lets_the_pod_patch_its_own_node(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1")
    _enforce_policy(api, "gpu-1")
    proc = node_status("--apply", "--taint", "--report", str(report_file(tmp_path, fail=True)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert api.nodes["gpu-1"]["spec"]["taints"] == [OURS]


@pytest.mark.parametrize(("token_node", "words"), [
    ("gpu-1", "gpuaccept-health/gpuaccept-health may patch only its own node gpu-1, not gpu-2"),
    (None, "the token of gpuaccept-health/gpuaccept-health names no node"),
])
def test_the_policy_refuses_another_node(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path, token_node: str | None,
                                         words: str) -> None:
    """A pod (or a stolen token) that patches a node other than its own: the API server's admission refuses it."""
    api.nodes["gpu-2"] = node("gpu-2")
    _enforce_policy(api, token_node)
    proc = node_status("--apply", "--taint", "--report", str(report_file(tmp_path, fail=True, host="gpu-2")),
                       "--node", "gpu-2", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith("gpuaccept: error: patching node gpu-2: HTTP 403: nodes \"gpu-2\" is forbidden: "
                           f"ValidatingAdmissionPolicy 'gpuaccept-health' with binding 'gpuaccept-health' denied "
                           f"request: {words}"), line
    assert line.endswith("(the health DaemonSet's policy lets its service account patch only the node its pod "
                         "runs on)")
    assert api.nodes["gpu-2"] == node("gpu-2")  # unchanged
    assert json.loads(proc.stdout)["applied"] is False


def test_api_unreachable_keeps_the_verdict(tmp_path: Path) -> None:
    server = FakeKubeAPI()  # never started: its port refuses connections
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    server.server.server_close()
    proc = node_status("--apply", "--report", str(report_file(tmp_path, fail=True)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig), "--summary")
    assert proc.returncode == 2
    assert one_line(proc).startswith("gpuaccept: error: reading node gpu-1: cannot reach the Kubernetes API")
    assert proc.stdout.startswith("node gpu-1: fail: memtest: fail: 3 errors (not applied: reading node gpu-1: "
                                  "cannot reach the Kubernetes API")


def test_bad_kubeconfig(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("{not yaml: [")
    proc = node_status("--apply", "--report", str(report_file(tmp_path)), "--node", "gpu-1", "--kubeconfig", str(bad))
    assert proc.returncode == 2
    assert one_line(proc).startswith(f"gpuaccept: error: --kubeconfig: {bad}: cannot load a Kubernetes configuration")


def test_without_the_kubernetes_package(tmp_path: Path) -> None:
    blocker = tmp_path / "block" / "kubernetes"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    env = {"PYTHONPATH": f"{blocker.parent}:{ROOT}"}
    report = str(report_file(tmp_path))
    proc = node_status("--apply", "--report", report, "--node", "gpu-1", **env)
    assert proc.returncode == 2
    assert one_line(proc) == ("gpuaccept: error: node-status label --apply patches the node through the kubernetes "
                              "Python client, which is not installed: pip install 'gpuaccept[k8s]'")
    assert node_status("--report", report, "--node", "gpu-1", **env).returncode == 0  # a dry run needs no client


# ---- bad input -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    ([], "give --report PATH (a report to judge) or --profile quick|standard|full (run the suite)"),
    (["--report", "R", "--profile", "quick"], "--profile is a suite option; --report judges a report and runs nothing"),
    (["--report", "R", "--server-dry-run"], "--server-dry-run goes with --apply"),
    (["--report", "/no/such/report.json"], "--report /no/such/report.json: no such file or directory"),
    (["--report", "R", "--node", "bad name"], "--node 'bad name': not a Kubernetes node name"),
    (["--report", "R", "--plan"], "--plan shows the plan of the suite run with --profile; it goes without --report"),
])
def test_bad_usage_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    report = str(report_file(tmp_path))
    proc = node_status(*[report if a == "R" else a for a in args])
    assert proc.returncode == 2
    assert one_line(proc) == f"gpuaccept: error: {message}"


@pytest.mark.parametrize(("args", "message"), [
    ([], "gpuaccept node-status needs an action: label, daemonset, npd (see 'gpuaccept node-status --help')"),
    (["daemonset", "--profile", "quick"], "the following arguments are required: --image (see 'gpuaccept "
                                          "node-status daemonset --help')"),
    (["daemonset", "--image", "i"], "give --profile quick|standard|full: the suite the pods run"),
    (["daemonset", "--image", "i", "--profile", "quick", "--report", "R"], "--report does not apply to daemonset: "
                                                                           "its pods run the suite (give --profile)"),
    (["npd", "D", "--report", "R", "--profile", "quick"], "--profile is a suite option; --report judges a report "
                                                          "and runs nothing"),
    (["npd", "D"], "give --report PATH (a report to judge) or --profile quick|standard|full (run the suite)"),
])
def test_bad_usage_of_the_other_actions_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    report = str(report_file(tmp_path))
    given = {"R": report, "D": str(tmp_path / "d")}
    proc = gpuaccept("node-status", *[given.get(a, a) for a in args])
    assert proc.returncode == 2
    assert one_line(proc) == f"gpuaccept: error: {message}"


@pytest.mark.parametrize(("args", "stray"), [
    (["daemonset", "--image", "i", "--profile", "quick", "--apply"], "--apply"),
    (["npd", "D", "--report", "R", "--taint"], "--taint"),
    (["label", "--report", "R", "--image", "i"], "--image"),
    (["label", "--profile", "quick", "--interval", "60"], "--interval"),
    (["label", "--report", "R", "--apply", "--node-selector", "a=b"], "--node-selector"),
    (["label", "--report", "R", "--no-admission-policy"], "--no-admission-policy"),
    (["label", "--report", "R", "--invoke-interval", "5m"], "--invoke-interval"),
    (["daemonset", "--image", "i", "--profile", "quick", "--plugin-path", "/p"], "--plugin-path"),
])
def test_an_option_of_another_action_is_refused_not_ignored(tmp_path: Path, args: list[str], stray: str) -> None:
    """Each action has only its own options: one of another action is an error naming it and the right help."""
    report = str(report_file(tmp_path))
    given = {"R": report, "D": str(tmp_path / "d")}
    proc = gpuaccept("node-status", *[given.get(a, a) for a in args])
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith(f"gpuaccept: error: unrecognized arguments: {stray}"), line
    assert line.endswith(f"(see 'gpuaccept node-status {args[0]} --help')"), line
    assert not (tmp_path / "d").exists()  # nothing written


def test_malformed_report(tmp_path: Path) -> None:
    bad = tmp_path / "report.json"
    bad.write_text('{"run_id": "r1", "host": "gpu-1"')
    proc = node_status("--report", str(bad), "--node", "gpu-1")
    assert proc.returncode == 2
    assert one_line(proc).startswith(f"gpuaccept: error: {bad}")


def test_report_of_another_host(tmp_path: Path) -> None:
    proc = node_status("--report", str(report_file(tmp_path, host="gpu-7")), "--node", "gpu-1")
    assert proc.returncode == 2
    assert one_line(proc) == ("gpuaccept: error: the report (run r1) is from host gpu-7, not node gpu-1: pass --node "
                              "for the node it is from, or --any-host to use it for this node")
    assert node_status("--report", str(report_file(tmp_path, host="gpu-7")), "--node", "gpu-1",
                       "--any-host").returncode == 0


@pytest.mark.parametrize(("verdict", "rc"), [(Verdict.NOTHING_MEASURED, 5), (Verdict.INTERRUPTED, 2),
                                             (Verdict.RUNNING, 2)])
def test_report_without_a_verdict_changes_nothing(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path,
                                                  verdict: Verdict, rc: int) -> None:
    api.nodes["gpu-1"] = node("gpu-1")
    rep = node_report("gpu-1", "r1")
    rep = NodeReport.from_dict({**rep.to_dict(), "verdict": verdict.value})
    proc = node_status("--apply", "--report", str(write_json(tmp_path / "r.json", rep)), "--node", "gpu-1",
                       "--kubeconfig", str(kubeconfig), "--summary")
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert proc.stdout.startswith("unknown: node gpu-1: run r1 ") and "the node is left as it is" in proc.stdout
    assert api.requests == []


# ---- the suite run by node-status ----------------------------------------------------------------------------------

def test_profile_runs_the_suite_and_applies(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", taints=[OURS])
    proc = node_status("--apply", *SUITE, "--node", "gpu-1", "--kubeconfig", str(kubeconfig),
                       "--report-dir", str(tmp_path / "reports"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[RESULT] SUCCESS" in proc.stderr  # the run's own output, on stderr: stdout is the JSON
    doc = json.loads(proc.stdout)
    assert doc["verdict"]["health"] == "pass" and doc["applied"] is True
    (run_dir,) = (tmp_path / "reports").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["host"] == "gpu-1" and report["run_id"] == doc["verdict"]["run_id"] == run_dir.name
    assert api.nodes["gpu-1"]["spec"]["taints"] == [] and api.nodes["gpu-1"]["metadata"]["labels"][HEALTH_LABEL] == \
        "pass"


def test_profile_failure_without_apply(tmp_path: Path) -> None:
    proc = node_status(*SUITE, "--expect-gpus", "1", "--node", "gpu-1", "--summary", TMPDIR=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ("node gpu-1: fail: GA-GPU-006 env: fail: expected 1 GPUs, found 0 (dry run: nothing sent; "
                           "--apply sends it)\n")
    assert list(tmp_path.iterdir()) == []  # the temporary report directory is gone


def test_bad_suite_option_is_refused(tmp_path: Path) -> None:
    proc = node_status("--profile", "quick", "--checks", "nosuchcheck", "--node", "gpu-1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("gpuaccept: error: the suite refused its options (exit 2, the "
                                                    "reason is above); nothing was decided")


def test_sigterm_stops_the_run_and_changes_nothing(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    argv = [sys.executable, "-m", "gpuaccept", "node-status", "label", "--apply", "--profile", "quick", "--device",
            "cpu", "--checks", "nap", "--node", "gpu-1", "--kubeconfig", str(kubeconfig), "--summary"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=cli_env(TMPDIR=str(scratch)))
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "nap: running" in line:
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert out.startswith("unknown: the suite run was interrupted (exit 130)")
    assert api.requests == []
    assert list(scratch.iterdir()) == []  # the temporary report directory is gone


def test_daemonset_pod_command_end_to_end(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    """The DaemonSet container's command, run here with the env the kubelet would give it (spec.nodeName for the
    downward API fields) and the real suite: the node gets its label within one loop."""
    api.nodes["gpu-node-3"] = node("gpu-node-3")
    (_sa, _role, _binding, policy, policy_binding, ds) = health_manifests(HealthDaemonOptions(
        image="img", node_status_args=[*SUITE, "--expect-gpus", "1", "--taint", "--kubeconfig", str(kubeconfig)],
        interval_s=600))
    api.admission.append((policy, policy_binding))  # in force, with the pod's token bound to its node
    api.user_info = node_update(SA_USER, "gpu-node-3")["userInfo"]
    c = ds["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] if "value" in e else "gpu-node-3" for e in c["env"]}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path))
    full = cli_env(**env, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.Popen(c["command"], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    looped = "[HEALTH] gpuaccept node-status exited 1; next check in 600 s\n"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and looped not in lines:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 0, out
    stored = api.nodes["gpu-node-3"]
    assert stored["metadata"]["labels"][HEALTH_LABEL] == "fail"
    assert stored["spec"]["taints"] == [OURS]
    assert looped in lines  # one loop: node-status exited 1 (the node failed) and the pod waits for the next
    assert len(api.calls("PATCH")) == 1


# ---- the fault's ladder -----------------------------------------------------------------------------------------

def _faulted(tmp_path: Path, reason: str, check: str = "health") -> Path:
    from gpuaccept.faults import with_fault
    from gpuaccept.model import CheckResult, Status

    rep = node_report("gpu-1", "r1", fail=True)
    rep.checks = [with_fault(CheckResult(check, Status.FAIL, reason))]
    return write_json(tmp_path / "report-faulted.json", rep)


def test_a_fault_that_leaves_service_taints_with_its_code(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", taints=[GPU_TAINT])
    proc = node_status("--apply", "--taint", "--report", str(_faulted(tmp_path, "cuda:2: XID 79 (GPU has fallen "
                       "off the bus)")), "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stored = api.nodes["gpu-1"]
    assert stored["spec"]["taints"] == [GPU_TAINT, OURS]
    notes = stored["metadata"]["annotations"]
    assert notes["gpuaccept.io/health-code"] == "GA-XID-079" and notes["gpuaccept.io/health-origin"] == "node"
    assert notes["gpuaccept.io/health-reason"].startswith("GA-XID-079 health: fail: cuda:2: XID 79")
    assert json.loads(proc.stdout)["verdict"]["leaves_service"] == "true"


def test_a_rerun_first_fault_labels_but_does_not_taint(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", taints=[GPU_TAINT])
    proc = node_status("--apply", "--taint", "--report", str(_faulted(tmp_path, "GPU held by a leftover process",
                                                                      "compute")),
                       "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stored = api.nodes["gpu-1"]
    assert stored["spec"]["taints"] == [GPU_TAINT]  # not tainted
    assert stored["metadata"]["labels"][HEALTH_LABEL] == "fail"
    assert stored["metadata"]["annotations"]["gpuaccept.io/health-origin"] == "job"
    assert "not tainted: GA-GPU-008 says re-run first" in proc.stderr


# ---- the circuit breaker ----------------------------------------------------------------------------------------

def _recently(minutes: int) -> str:
    from datetime import datetime, timedelta, timezone

    when = datetime.now(timezone.utc) - timedelta(minutes=minutes)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _tainted_by_us(name: str, minutes_ago: int, **annotations: str) -> dict[str, Any]:
    return node(name, labels={HEALTH_LABEL: "fail"}, taints=[GPU_TAINT, OURS],
                annotations={"gpuaccept.io/health-checked": _recently(minutes_ago), **annotations})


XID79 = "cuda:2: XID 79 (GPU has fallen off the bus)"


def test_the_breaker_holds_the_second_taint_and_says_what_it_would_have_done(api: FakeKubeAPI, kubeconfig: Path,
                                                                             tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", taints=[GPU_TAINT])
    api.nodes["gpu-2"] = _tainted_by_us("gpu-2", 5)
    api.nodes["gpu-3"] = node("gpu-3")
    proc = node_status("--apply", "--taint", "--breaker-limit", "1", "--report", str(_faulted(tmp_path, XID79)),
                       "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stored = api.nodes["gpu-1"]
    assert stored["spec"]["taints"] == [GPU_TAINT]  # held back
    assert stored["metadata"]["labels"][HEALTH_LABEL] == "fail"  # the verdict is still written
    held = stored["metadata"]["annotations"]["gpuaccept.io/breaker-held"]
    assert held.startswith("circuit breaker open: 1 node(s) tainted by gpuaccept") and "gpu-2" in held
    assert "would have tainted gpu-1 gpuaccept.io/health=fail:NoSchedule" in proc.stderr
    assert api.calls("GET", "/api/v1/nodes") and not api.calls("PATCH", "gpu-2")


def test_old_taints_and_other_taints_do_not_count(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", taints=[GPU_TAINT])
    api.nodes["gpu-2"] = _tainted_by_us("gpu-2", 90)  # outside the 1h window
    api.nodes["gpu-3"] = node("gpu-3", taints=[{"key": "gpuaccept.io/health", "value": "fail",
                                                "effect": "NoExecute"}])  # not ours exactly
    proc = node_status("--apply", "--taint", "--breaker-limit", "1", "--report", str(_faulted(tmp_path, XID79)),
                       "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1 and api.nodes["gpu-1"]["spec"]["taints"] == [GPU_TAINT, OURS], proc.stderr


def test_a_persons_reset_acknowledges_the_counted_taints_and_lets_the_next_one_through(
        api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", taints=[GPU_TAINT])
    api.nodes["gpu-2"] = _tainted_by_us("gpu-2", 5)
    reset = node_status("--breaker", "reset", "--kubeconfig", str(kubeconfig))
    assert reset.returncode == 0, reset.stderr
    assert "circuit breaker reset: 1 node(s) acknowledged (gpu-2)" in reset.stderr
    notes = api.nodes["gpu-2"]["metadata"]["annotations"]
    assert notes["gpuaccept.io/breaker-ack"] == notes["gpuaccept.io/health-checked"]
    assert api.nodes["gpu-2"]["spec"]["taints"] == [GPU_TAINT, OURS]  # still tainted: it has not passed
    proc = node_status("--apply", "--taint", "--breaker-limit", "1", "--report", str(_faulted(tmp_path, XID79)),
                       "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1 and api.nodes["gpu-1"]["spec"]["taints"] == [GPU_TAINT, OURS], proc.stderr


def test_when_the_taints_cannot_be_counted_it_does_not_taint(api: FakeKubeAPI, kubeconfig: Path,
                                                              tmp_path: Path) -> None:
    api.nodes["gpu-1"] = node("gpu-1", taints=[GPU_TAINT])
    api.reject[("LIST", "nodes")] = (403, "Forbidden", 'nodes is forbidden: cannot list resource "nodes"')
    proc = node_status("--apply", "--taint", "--breaker-percent", "10", "--report", str(_faulted(tmp_path, XID79)),
                       "--node", "gpu-1", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1 and api.nodes["gpu-1"]["spec"]["taints"] == [GPU_TAINT], proc.stderr
    assert "cannot count gpuaccept's taints" in proc.stderr and "HTTP 403" in proc.stderr


def test_the_daemonset_pods_carry_the_breaker_and_may_list_nodes() -> None:
    r = gpuaccept("node-status", "daemonset", "--image", "ghcr.io/example/gpuaccept:1.0", "--profile", "quick",
                  "--taint", "--breaker-limit", "3", "--breaker-window", "2h")
    assert r.returncode == 0, r.stderr
    assert "--breaker-limit=3" in r.stdout and "--breaker-window=7200s" in r.stdout
    assert "- list" in r.stdout
