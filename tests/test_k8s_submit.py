"""Submitting, watching, cancelling and gathering through the real ``kubernetes`` client.

The API server is the recorded fake of ``tests/k8s_fake_api.py`` on 127.0.0.1
(no cluster is reachable from here); it checks what the client sent. The pod
logs it serves are real: the planned Job pod command, run on this machine
with the real suite.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuaccept.errors import ConfigError, UsageError
from gpuaccept.launch.k8s.backend import K8sBackend
from gpuaccept.launch.k8s.manifests import build_manifests, selector
from gpuaccept.launch.k8s.options import K8sOptions
from gpuaccept.launch.k8s.status import job_state, pod_summary
from gpuaccept.launch.pod_script import REPORT_END
from gpuaccept.launch.spec import JobSpec
from gpuaccept.model import NodeReport, Verdict
from tests.helpers import ROOT, cli_env, gpuaccept
from tests.k8s_fake_api import TOKEN, FakeKubeAPI, pod
from tests.k8s_support import need_module
from tests.launch_support import one_error_line
from tests.test_k8s_scripts import container_env, run_container

need_module("kubernetes")

STATUS = Path(__file__).resolve().parent / "data" / "k8s-status"
SUITE = ["--device", "cpu", "--profile", "quick", "--checks", "env"]
RUNNING = {"active": 2}
COMPLETE = {"succeeded": 2, "conditions": [{"type": "Complete", "status": "True"}]}


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    server = FakeKubeAPI().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def node_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real container logs of two Job pods: gpu-node-1 passes, gpu-node-2 fails (it expects a GPU)."""
    def one(host: str, extra: list[str]) -> str:
        results = tmp_path_factory.mktemp(host)
        spec = JobSpec(name="accept", nodes=2, run_id="r1", results_dir="/unused", image="img", gpus_per_node=0,
                       suite_args=[*SUITE, *extra], distributed=False, python=sys.executable,
                       options=K8sOptions.from_dict({"pod_results_dir": str(results)}).to_dict())
        c = build_manifests(spec, K8sOptions.from_dict(spec.options))[1]["spec"]["template"]["spec"]["containers"][0]
        proc = run_container(c["command"], container_env(c, GPUACCEPT_HOSTNAME=host))
        return proc.stdout

    with ThreadPoolExecutor(2) as pool:
        ok = pool.submit(one, "gpu-node-1", [])
        bad = pool.submit(one, "gpu-node-2", ["--expect-gpus", "1"])
        return {"gpu-node-1": ok.result(), "gpu-node-2": bad.result()}


def k8s_spec(kind: str, kubeconfig: Path, results: Path, **options: Any) -> JobSpec:
    opts = K8sOptions.from_dict({"kind": kind, "kubeconfig": str(kubeconfig), **options}).to_dict()
    return JobSpec(name="accept", nodes=2, run_id="r1", results_dir=str(results), gpus_per_node=8,
                   suite_args=["--profile", "quick"], image="nvcr.io/nvidia/pytorch:25.01-py3", distributed=False,
                   options=opts)


def node_pods(spec: JobSpec, kind: str = "job") -> list[dict[str, Any]]:
    docs = build_manifests(spec, K8sOptions.from_dict(spec.options))
    labels = next(t["metadata"]["labels"] for t in _templates(docs[-1]))
    ns = spec.options["namespace"]
    return [pod(f"accept-{i}-x{i}", labels, f"gpu-node-{i + 1}", namespace=ns) for i in range(spec.nodes)]


def _templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    if isinstance(doc, dict):
        if "metadata" in doc and "spec" in doc and "containers" in doc["spec"]:
            found.append(doc)
        for v in doc.values():
            found.extend(_templates(v))
    elif isinstance(doc, list):
        for v in doc:
            found.extend(_templates(v))
    return found


def planned(plan: Any) -> list[dict[str, Any]]:
    return [d for text in plan.files.values() for d in yaml.safe_load_all(text) if d]


# ---- the Job kind, end to end through the backend --------------------------------------------------------------

def test_submit_watch_gather_job(api: FakeKubeAPI, node_logs: dict[str, str], tmp_path: Path) -> None:
    spec = k8s_spec("job", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results",
                    namespace="gpu-team")
    backend = K8sBackend()
    plan = backend.plan(spec)
    backend.check_ready(plan, spec)
    sub = backend.submit(plan, spec, tmp_path)
    assert sub.job_id == "gpu-team/accept"

    posts = api.calls("POST")
    assert [r["path"] for r in posts] == ["/api/v1/namespaces/gpu-team/services",
                                          "/apis/batch/v1/namespaces/gpu-team/jobs"]
    assert [r["body"] for r in posts] == planned(plan)
    assert all(r["query"].get("fieldValidation") == "Strict" for r in posts)
    assert all(r["auth"] == f"Bearer {TOKEN}" and r["content_type"] == "application/json" for r in posts), posts

    api.statuses[("jobs", "accept")] = [RUNNING, COMPLETE]
    api.pods = node_pods(spec)
    for i, host in enumerate(("gpu-node-1", "gpu-node-2")):
        api.logs[(f"accept-{i}-x{i}", "node")] = node_logs[host]
    state = backend.poll(sub)
    assert (state.state, state.done) == ("running", False) and "2 Succeeded" in state.detail
    state = backend.poll(sub)
    assert (state.state, state.done, state.ok) == ("succeeded", True, True)
    assert api.calls("GET", "/apis/batch/v1/namespaces/gpu-team/jobs/accept/status")

    reports = backend.gather(sub, spec)
    assert {r.host: r.verdict for r in reports} == {"gpu-node-1": Verdict.SUCCESS, "gpu-node-2": Verdict.FAILURE}
    assert {r.host: r.pod for r in reports} == {"gpu-node-1": "accept-0-x0", "gpu-node-2": "accept-1-x1"}
    schema = json.loads((ROOT / "src" / "gpuaccept" / "data" / "report.schema.json").read_text())
    for r in reports:  # the pod field is part of the published schema and survives a round trip
        jsonschema.validate(r.to_dict(), schema)
        assert NodeReport.from_dict(json.loads(json.dumps(r.to_dict()))).pod == r.pod
    assert sub.hosts == ["gpu-node-1", "gpu-node-2"]
    listing = api.calls("GET", "/api/v1/namespaces/gpu-team/pods")[0]
    assert listing["query"]["labelSelector"] == selector("job", "accept")
    assert {r["query"]["container"] for r in api.calls("GET", "/log")} == {"node"}
    run_dir = Path(spec.run_results_dir)
    assert (run_dir / "logs" / "accept-0-x0.log").read_text() == node_logs["gpu-node-1"]
    assert json.loads((run_dir / "k8s" / "accept-1-x1" / "report.json").read_text())["host"] == "gpu-node-2"
    assert sub.handle.problems == []


def test_resume_after_detach_finds_the_job(api: FakeKubeAPI, node_logs: dict[str, str], tmp_path: Path) -> None:
    spec = k8s_spec("job", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    first = K8sBackend().submit(K8sBackend().plan(spec), spec, tmp_path)
    later = K8sBackend().resume(spec)  # a new process, from the spec saved at launch
    assert later.job_id == first.job_id and later.handle.objects == first.handle.objects
    api.statuses[("jobs", "accept")] = [COMPLETE]
    api.pods = node_pods(spec)
    api.logs[("accept-0-x0", "node")] = node_logs["gpu-node-1"]
    assert K8sBackend().poll(later).ok
    assert [r.host for r in K8sBackend().gather(later, spec)] == ["gpu-node-1"]
    K8sBackend().cancel(later)
    assert api.objects == {}


def test_cancel_deletes_what_was_created(api: FakeKubeAPI, tmp_path: Path) -> None:
    spec = k8s_spec("job", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    backend = K8sBackend()
    sub = backend.submit(backend.plan(spec), spec, tmp_path)
    assert len(api.objects) == 2
    backend.cancel(sub)
    deletes = api.calls("DELETE")
    assert [r["path"] for r in deletes] == ["/apis/batch/v1/namespaces/default/jobs/accept",
                                            "/api/v1/namespaces/default/services/accept"]
    assert all(r["query"].get("propagationPolicy") == "Background" for r in deletes)
    assert api.objects == {}
    backend.cancel(sub)  # idempotent: the 404s are expected
    assert sub.handle.problems == []
    state = backend.poll(sub)
    assert (state.state, state.done, state.ok) == ("deleted", True, False)


@pytest.mark.parametrize("kind, group, version, plural, status_file, expect", [
    ("jobset", "jobset.x-k8s.io", "v1alpha2", "jobsets", "jobset-completed.json", ("succeeded", True, True)),
    ("pytorchjob", "kubeflow.org", "v1", "pytorchjobs", "pytorchjob-failed.json", ("failed", True, False)),
    ("mpijob", "kubeflow.org", "v2beta1", "mpijobs", "mpijob-succeeded.json", ("succeeded", True, True)),
    ("trainjob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", "trainjob-complete.json",
     ("succeeded", True, True)),
])
def test_custom_resources_are_created_and_watched(api: FakeKubeAPI, tmp_path: Path, kind: str, group: str,
                                                  version: str, plural: str, status_file: str,
                                                  expect: tuple[str, bool, bool]) -> None:
    spec = k8s_spec(kind, api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    backend = K8sBackend()
    plan = backend.plan(spec)
    sub = backend.submit(plan, spec, tmp_path)
    (post,) = api.calls("POST")
    assert post["path"] == f"/apis/{group}/{version}/namespaces/default/{plural}"
    assert post["body"] == planned(plan)[0] and post["query"]["fieldValidation"] == "Strict"
    api.statuses[(plural, "accept")] = [json.loads((STATUS / status_file).read_text())["status"]]
    state = backend.poll(sub)
    assert (state.state, state.done, state.ok) == expect
    backend.cancel(sub)
    assert api.calls("DELETE")[0]["path"] == f"/apis/{group}/{version}/namespaces/default/{plural}/accept"


def test_mpijob_reports_come_from_the_launcher_log(api: FakeKubeAPI, node_logs: dict[str, str],
                                                   tmp_path: Path) -> None:
    spec = k8s_spec("mpijob", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    backend = K8sBackend()
    sub = backend.submit(backend.plan(spec), spec, tmp_path)
    base = {"app.kubernetes.io/name": "gpuaccept", "app.kubernetes.io/instance": "accept"}
    api.pods = [pod("accept-launcher-abc", {**base, "gpuaccept/role": "launcher"}, "cpu-node-1"),
                pod("accept-worker-0", {**base, "gpuaccept/role": "worker"}, "gpu-node-1", phase="Running"),
                pod("accept-worker-1", {**base, "gpuaccept/role": "worker"}, "gpu-node-2", phase="Running")]
    # Ranks started through sshd do not see the pod's GPUACCEPT_HOSTNAME: their reports name the worker pods
    # (the MPI operator sets each worker's hostname to its pod name).
    log = (node_logs["gpu-node-1"].replace('"host": "gpu-node-1"', '"host": "accept-worker-0"')
           + node_logs["gpu-node-2"].replace('"host": "gpu-node-2"', '"host": "accept-worker-1"'))
    assert log.count('"host": "accept-worker-') == 4  # the reports' and their checks'
    api.logs[("accept-launcher-abc", "launcher")] = log
    reports = backend.gather(sub, spec)
    assert sorted((r.host, r.pod) for r in reports) == [("gpu-node-1", "accept-worker-0"),
                                                       ("gpu-node-2", "accept-worker-1")]
    assert [r["path"] for r in api.calls("GET", "/log")] == ["/api/v1/namespaces/default/pods/accept-launcher-abc/log"]
    selectors = [r["query"]["labelSelector"] for r in api.calls("GET", "/pods") if not r["path"].endswith("/log")]
    assert selectors[-2:] == [f"{selector('mpijob', 'accept')}", f"{selector('mpijob', 'accept', 'worker')}"]
    assert selectors[-1].endswith("gpuaccept/role=worker")
    assert {c.host for r in reports for c in r.checks} == {"gpu-node-1", "gpu-node-2"}
    assert sub.hosts == ["gpu-node-1", "gpu-node-2"]  # the workers' nodes; the launcher's is not under test
    saved = json.loads((Path(spec.run_results_dir) / "k8s" / "accept-launcher-abc-0" / "report.json").read_text())
    assert (saved["host"], saved["pod"]) == ("gpu-node-1", "accept-worker-0")


# ---- errors ----------------------------------------------------------------------------------------------------

def test_a_failing_status_read_does_not_end_the_watch(api: FakeKubeAPI, tmp_path: Path) -> None:
    spec = k8s_spec("job", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    backend = K8sBackend()
    sub = backend.submit(backend.plan(spec), spec, tmp_path)
    api.reject[("GET", "jobs")] = (500, "InternalError", "etcdserver: request timed out")
    state = backend.poll(sub)
    assert (state.state, state.done) == ("unknown", False) and "etcdserver: request timed out" in state.detail
    del api.reject[("GET", "jobs")]
    api.statuses[("jobs", "accept")] = [COMPLETE]
    assert backend.poll(sub).state == "succeeded"
    api.reject[("GET", "jobs")] = (403, "Forbidden", 'jobs.batch "accept" is forbidden')
    assert [backend.poll(sub).state for _ in range(4)] == ["unknown"] * 4
    with pytest.raises(UsageError, match=r"HTTP 403: jobs.batch \"accept\" is forbidden \(5 reads in a row failed\)"):
        backend.poll(sub)


def test_a_crd_that_is_not_installed_is_a_clear_error(api: FakeKubeAPI, tmp_path: Path) -> None:
    api.served.discard(("jobset.x-k8s.io", "v1alpha2", "jobsets"))
    spec = k8s_spec("jobset", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    backend = K8sBackend()
    with pytest.raises(UsageError, match=r"does not serve jobset.x-k8s.io/v1alpha2 jobsets: install its controller"):
        backend.submit(backend.plan(spec), spec, tmp_path)
    assert api.objects == {}


def test_a_rejected_job_rolls_back_the_service(api: FakeKubeAPI, tmp_path: Path) -> None:
    api.reject[("POST", "jobs")] = (422, "Invalid", 'Job.batch "accept" is invalid: spec.completions: Invalid value')
    spec = k8s_spec("job", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    backend = K8sBackend()
    with pytest.raises(UsageError, match=r"HTTP 422: Job.batch \"accept\" is invalid.*nothing was left submitted"):
        backend.submit(backend.plan(spec), spec, tmp_path)
    assert [r["path"] for r in api.calls("DELETE")] == ["/api/v1/namespaces/default/services/accept"]
    assert api.objects == {}


def test_a_name_in_use_is_a_clear_error(api: FakeKubeAPI, tmp_path: Path) -> None:
    spec = k8s_spec("pytorchjob", api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "results")
    K8sBackend().submit(K8sBackend().plan(spec), spec, tmp_path)
    with pytest.raises(UsageError, match="already exists: choose another --name"):
        K8sBackend().submit(K8sBackend().plan(spec), spec, tmp_path)
    assert len(api.objects) == 1


def test_an_unreachable_api_server_is_a_clear_error(tmp_path: Path) -> None:
    server = FakeKubeAPI()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    server.server.server_close()  # the port is closed: connection refused
    spec = k8s_spec("job", kubeconfig, tmp_path / "results")
    backend = K8sBackend()
    with pytest.raises(UsageError, match="cannot reach the Kubernetes API"):
        backend.submit(backend.plan(spec), spec, tmp_path)


def test_bad_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    for content in (None, "{{{ not yaml", "apiVersion: v1\nkind: Config\nclusters: []\n"):
        path = tmp_path / "kubeconfig"
        if content is None:
            path = tmp_path / "missing"
        else:
            path.write_text(content)
        spec = k8s_spec("job", path, tmp_path / "results")
        backend = K8sBackend()
        with pytest.raises(ConfigError, match="cannot load a Kubernetes configuration"):
            backend.check_ready(backend.plan(spec), spec)


# ---- status parsing on the samples of tests/data/k8s-status ----------------------------------------------------

@pytest.mark.parametrize("name, expect, detail", [
    ("job-running.json", ("running", False, False), ""),
    ("job-complete.json", ("succeeded", True, True), ""),
    ("job-failed-indexes.json", ("failed", True, False), "FailedIndexes: Job has failed indexes"),
    ("jobset-completed.json", ("succeeded", True, True), ""),
    ("jobset-failed.json", ("failed", True, False), "FailedJobs"),
    ("pytorchjob-failed.json", ("failed", True, False), "1 Worker replica(s) failed"),
    ("mpijob-running.json", ("running", False, False), ""),
    ("mpijob-succeeded.json", ("succeeded", True, True), ""),
    ("trainjob-complete.json", ("succeeded", True, True), ""),
    ("trainjob-suspended.json", ("suspended", False, False), ""),
])
def test_job_state_from_recorded_status(name: str, expect: tuple[str, bool, bool], detail: str) -> None:
    state = job_state(json.loads((STATUS / name).read_text()))
    assert (state.state, state.done, state.ok) == expect
    assert detail in state.detail


def test_stuck_pods_are_named_in_the_detail() -> None:
    pods = json.loads((STATUS / "pods-stuck.json").read_text())["items"]
    text = pod_summary(pods)
    assert text.startswith("2 Pending")
    assert "accept-0-abcde: ImagePullBackOff" in text and "accept-1-fghij: Unschedulable: 0/8 nodes" in text
    state = job_state({"kind": "Job", "status": {}}, pods)
    assert state.state == "pending" and "ImagePullBackOff" in state.detail


# ---- through the CLI -------------------------------------------------------------------------------------------

def test_cli_launch_k8s_against_the_fake_api(api: FakeKubeAPI, node_logs: dict[str, str], tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    spec = k8s_spec("job", kubeconfig, tmp_path / "results")
    api.statuses[("jobs", "accept")] = [RUNNING, RUNNING, {"failed": 1, "succeeded": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "FailedIndexes", "message": "Job has failed indexes"}]}]
    api.pods = node_pods(spec)
    for pod_ in api.pods:
        pod_["metadata"]["labels"]["gpuaccept/run-id"] = "r-e2e"
    for i, host in enumerate(("gpu-node-1", "gpu-node-2")):
        api.logs[(f"accept-{i}-x{i}", "node")] = node_logs[host]
    proc = gpuaccept("launch", "k8s", "--image", "nvcr.io/nvidia/pytorch:25.01-py3", "--nodes", "2",
                     "--gpus-per-node", "8", "--name", "accept", "--run-id", "r-e2e", "--kubeconfig", str(kubeconfig),
                     "--results-dir", str(tmp_path / "results"), "--poll-interval", "0.2", "--profile", "quick",
                     timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = tmp_path / "results" / "r-e2e"
    written = [d for d in yaml.safe_load_all((run_dir / "launch" / "accept.yaml").read_text()) if d]
    assert [r["body"] for r in api.calls("POST")] == written
    cluster = json.loads((run_dir / "cluster-report.json").read_text())
    assert {n["host"]: n["verdict"] for n in cluster["nodes"]} == {"gpu-node-1": "success", "gpu-node-2": "failure"}
    assert cluster["job_id"] == "default/accept"
    assert "[NODE] gpu-node-2: FAILURE" in proc.stdout


def test_cli_without_the_kubernetes_package(tmp_path: Path) -> None:
    blocker = tmp_path / "block" / "kubernetes"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    env = {"PYTHONPATH": f"{blocker.parent}:{ROOT}"}
    argv = ["launch", "k8s", "--image", "img", "--gpus-per-node", "8", "--kubeconfig", str(tmp_path / "none"),
            "--results-dir", str(tmp_path / "r")]
    proc = gpuaccept(*argv, **env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpuaccept: error: the k8s backend submits through the kubernetes Python client, which is not installed: "
        "pip install 'gpuaccept[k8s]' (or use --dry-run / --output and kubectl)"]
    assert gpuaccept(*argv, "--dry-run", **env).returncode == 0
    assert not list((tmp_path / "r").glob("**/job.json"))  # nothing was submitted


def test_launch_help_does_not_import_the_client() -> None:
    code = ("import sys; from gpuaccept.cli import main; import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: main(['launch', 'k8s', '--help'])\n"
            "    except SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'torch')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# ---- launch --detach, then gpuaccept gather (a new process finds the job again from launch/job.json) ----------

def _serve_node_pods(api: FakeKubeAPI, tmp_path: Path, node_logs: dict[str, str], run_id: str,
                     logs: dict[str, str] | None = None) -> None:
    """Two finished Job pods of run ``run_id`` on gpu-node-1/2, with the given logs (default: the real ones)."""
    spec = k8s_spec("job", tmp_path / "unused-kubeconfig", tmp_path / "results")
    api.statuses[("jobs", "accept")] = [COMPLETE]
    api.pods = node_pods(spec)
    for i, pod_ in enumerate(api.pods):
        pod_["metadata"]["labels"]["gpuaccept/run-id"] = run_id
        host = f"gpu-node-{i + 1}"
        text = (logs or node_logs).get(host)
        if text is not None:
            api.logs[(f"accept-{i}-x{i}", "node")] = text


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuaccept", *args], capture_output=True, text=True, timeout=180,
                          env=cli_env(), cwd=cwd)


def test_detach_then_gather_brings_the_reports_back(api: FakeKubeAPI, node_logs: dict[str, str],
                                                    tmp_path: Path) -> None:
    api.write_kubeconfig(tmp_path / "kubeconfig")
    _serve_node_pods(api, tmp_path, node_logs, "r-det")
    results = tmp_path / "results"
    # a relative --kubeconfig: job.json keeps it absolute, so gather works from any directory
    launch = _cli("launch", "k8s", "--image", "nvcr.io/nvidia/pytorch:25.01-py3", "--nodes", "2",
                  "--gpus-per-node", "8", "--name", "accept",
                  "--run-id", "r-det", "--kubeconfig", "kubeconfig", "--results-dir", str(results),
                  "--profile", "quick", "--detach", cwd=tmp_path)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    run_dir = results / "r-det"
    assert f"gpuaccept gather {run_dir}" in launch.stdout
    assert not (run_dir / "cluster-report.json").exists() and not api.calls("GET")
    job = json.loads((run_dir / "launch" / "job.json").read_text())
    assert job["spec"]["options"]["kubeconfig"] == str(tmp_path / "kubeconfig")

    gather = gpuaccept("gather", str(run_dir))  # cwd is the repository, not tmp_path
    assert gather.returncode == 1, gather.stdout + gather.stderr
    cluster = json.loads((run_dir / "cluster-report.json").read_text())
    assert {n["host"]: (n["state"], n["verdict"]) for n in cluster["nodes"]} == {
        "gpu-node-1": ("reported", "success"), "gpu-node-2": ("reported", "failure")}
    assert (cluster["backend"], cluster["job_id"], cluster["verdict"]) == ("k8s", "default/accept", "failure")
    assert api.calls("GET", "/api/v1/namespaces/default/pods")[0]["query"]["labelSelector"] == selector("job", "accept")
    assert len(api.calls("GET", "/log")) == 2
    assert json.loads((run_dir / "k8s" / "accept-0-x0" / "report.json").read_text())["host"] == "gpu-node-1"
    assert "[NODE] gpu-node-2: FAILURE" in gather.stdout and "warning" not in gather.stderr

    # the API is out of reach (a --kubeconfig override to a closed port): the copies gathered above are used
    dead = FakeKubeAPI()
    dead_config = dead.write_kubeconfig(tmp_path / "dead-kubeconfig")
    dead.server.server_close()
    asked = len(api.requests)
    again = gpuaccept("gather", str(run_dir), "--kubeconfig", str(dead_config))
    assert again.returncode == 1, again.stdout + again.stderr
    assert len(api.requests) == asked  # the override was used, not the kubeconfig saved in job.json
    warnings = [x for x in again.stderr.splitlines() if x.startswith("[LAUNCH] warning: ")]
    assert len(warnings) == 1, again.stderr
    assert "cannot fetch the reports from the k8s job" in warnings[0]
    assert "cannot reach the Kubernetes API" in warnings[0]
    assert f"using the 2 report(s) already under {run_dir}" in warnings[0]
    cluster = json.loads((run_dir / "cluster-report.json").read_text())
    assert {n["host"]: n["verdict"] for n in cluster["nodes"]} == {"gpu-node-1": "success", "gpu-node-2": "failure"}

    # --namespace overrides job.json; no pods there (deleted, say): the copies gathered above are used, with a warning
    other = gpuaccept("gather", str(run_dir), "--namespace", "elsewhere")
    assert other.returncode == 1, other.stdout + other.stderr
    assert api.calls("GET", "/api/v1/namespaces/elsewhere/pods")
    assert other.stderr.splitlines()[0] == (
        f"[LAUNCH] warning: the k8s job returned no report; using the 2 already under {run_dir}")
    assert "[NODE] gpu-node-1: SUCCESS" in other.stdout


def test_gather_lists_a_node_that_never_reported(api: FakeKubeAPI, node_logs: dict[str, str],
                                                 tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    _serve_node_pods(api, tmp_path, node_logs, "r-miss", logs={"gpu-node-1": node_logs["gpu-node-1"]})
    launch = gpuaccept("launch", "k8s", "--image", "img", "--nodes", "2", "--gpus-per-node", "8", "--name", "accept",
                       "--run-id", "r-miss",
                       "--kubeconfig", str(kubeconfig), "--results-dir", str(tmp_path / "results"), "--profile",
                       "quick", "--detach")
    assert launch.returncode == 0, launch.stderr
    gather = gpuaccept("gather", str(tmp_path / "results" / "r-miss"))
    assert gather.returncode == 1
    cluster = json.loads((tmp_path / "results" / "r-miss" / "cluster-report.json").read_text())
    # the hosts are the nodes the pods ran on: gpu-node-2's pod has no log, so it is missing by name
    assert [(n["host"], n["state"]) for n in cluster["nodes"]] == [("gpu-node-1", "reported"),
                                                                   ("gpu-node-2", "missing")]
    assert "[RESULT] FAILURE: gpu-node-2" in gather.stdout
    assert '[LAUNCH] warning: accept-1-x1: no log (HTTP 400: container "node" in pod "accept-1-x1" is waiting ' \
           "to start)" in gather.stderr.splitlines()


def test_gather_rejects_bad_job_files_and_flags_of_another_backend(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    (run_dir / "launch").mkdir(parents=True)
    spec = dataclasses.asdict(k8s_spec("job", tmp_path / "kubeconfig", tmp_path))
    job = {"backend": "k8s", "run_id": "r1", "job_id": "default/accept", "nodes": 2, "expected_hosts": [],
           "spec": {**spec, "name": "Not A Label"}}
    (run_dir / "launch" / "job.json").write_text(json.dumps(job))
    line = one_error_line(gpuaccept("gather", str(run_dir)))
    assert f"{run_dir / 'launch' / 'job.json'}: cannot rebuild the job spec" in line and "--local" in line
    assert "--project is for runai runs; " in one_error_line(gpuaccept("gather", str(run_dir), "--project", "team"))
    assert "--local does not ask the backend" in one_error_line(
        gpuaccept("gather", str(run_dir), "--local", "--namespace", "x"))
    bare = tmp_path / "bare"
    bare.mkdir()
    assert "not a launched run" in one_error_line(gpuaccept("gather", str(bare), "--kubeconfig", "k"))
    # --local reads what is there (nothing): both nodes missing, no traceback, no backend
    local = gpuaccept("gather", str(run_dir), "--local")
    assert local.returncode == 1 and "Traceback" not in local.stderr
    assert "[RESULT] FAILURE: missing-0, missing-1" in local.stdout


def test_launch_warns_about_each_report_it_could_not_read(api: FakeKubeAPI, node_logs: dict[str, str],
                                                          tmp_path: Path) -> None:
    """Reports the backend could not read (a log cut short) are warnings on stderr, not silently dropped."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    cut = node_logs["gpu-node-2"].split(REPORT_END)[0]  # the container was killed while printing its report
    _serve_node_pods(api, tmp_path, node_logs, "r-cut", logs={"gpu-node-1": node_logs["gpu-node-1"],
                                                              "gpu-node-2": cut})
    proc = gpuaccept("launch", "k8s", "--image", "img", "--nodes", "2", "--gpus-per-node", "8", "--name", "accept",
                     "--run-id", "r-cut",
                     "--kubeconfig", str(kubeconfig), "--results-dir", str(tmp_path / "results"), "--profile",
                     "quick", "--poll-interval", "0.2", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("[LAUNCH] warning: ")]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("[LAUNCH] warning: accept-1-x1: report ")
    assert warnings[0].endswith("report.json is cut short (no end marker)")
    cluster = json.loads((tmp_path / "results" / "r-cut" / "cluster-report.json").read_text())
    assert [(n["host"], n["state"]) for n in cluster["nodes"]] == [("gpu-node-1", "reported"),
                                                                   ("gpu-node-2", "missing")]
