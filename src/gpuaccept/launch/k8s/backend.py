"""The Kubernetes backend: manifests planned by :mod:`gpuaccept.launch.k8s.manifests`, submitted and watched
through the official ``kubernetes`` Python client (the optional ``k8s`` extra, imported only to submit).

Results come back through the pod logs: every node container prints its
``report.json`` after the job (for an MPIJob, the launcher prints every
worker's). ``--results-pvc`` also keeps them on a PersistentVolumeClaim.
Objects are created with server-side strict field validation, so a field the
cluster's API does not know fails the submission instead of being dropped.
A --mount whose source is an absolute path mounts that host path; any other
source names a PersistentVolumeClaim (--mount datasets:/data:ro). Submitting
needs the kubernetes Python client (pip install 'gpuaccept[k8s]') and a
kubeconfig; --dry-run and --output need neither.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuaccept.cliargs import hidden_alias
from gpuaccept.errors import GpuacceptError, InputError, UsageError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission
from gpuaccept.launch.k8s.client import MissingClient, kubernetes_module, new_api_client, status_message
from gpuaccept.launch.k8s.manifests import NODE_CONTAINER, PYTORCH_CONTAINER, build_manifests, selector, to_yaml
from gpuaccept.launch.k8s.options import (
    KINDS,
    TRAINER_LATEST,
    K8sOptions,
    parse_key_values,
    parse_resources,
    parse_toleration,
)
from gpuaccept.launch.k8s.status import job_state, on_nodes, pod_rows
from gpuaccept.launch.log_reports import reports_from_log
from gpuaccept.launch.spec import JobSpec
from gpuaccept.model import NodeReport

# kind -> (group, version, plural); "" is the core group.
RESOURCES: dict[str, tuple[str, str, str]] = {
    "Service": ("", "v1", "services"),
    "Job": ("batch", "v1", "jobs"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "MPIJob": ("kubeflow.org", "v2beta1", "mpijobs"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}
_LOG_CONTAINER = {"job": NODE_CONTAINER, "jobset": NODE_CONTAINER, "trainjob": NODE_CONTAINER,
                  "pytorchjob": PYTORCH_CONTAINER, "mpijob": "launcher"}


MAX_POLL_FAILURES = 5
"""Consecutive failed status reads after which watching gives up."""


def _kubernetes() -> Any:
    try:
        return kubernetes_module("the k8s backend submits")
    except MissingClient as exc:
        raise MissingClient(f"{exc} (or use --dry-run / --output and kubectl)") from None


@dataclass
class K8sHandle:
    """What was created: (kind, name) in creation order, and where to find it."""

    kind: str
    namespace: str
    name: str
    objects: list[tuple[str, str]]
    options: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    poll_failures: int = 0


class K8sBackend(Backend):
    """Kubernetes: --kind job (Indexed Job + headless Service), jobset, pytorchjob, mpijob or trainjob.
    --image is required; --dry-run prints the manifests and --output DIR writes them. Submitting needs the
    kubernetes Python client (pip install 'gpuaccept[k8s]') and a kubeconfig; reports come back through
    the pod logs. Containers are never privileged unless --privileged."""

    name = "k8s"
    help = "Kubernetes: an Indexed Job, a JobSet, a PyTorchJob, an MPIJob or a TrainJob"

    def __init__(self) -> None:
        self._api: Any = None

    # ---- options -----------------------------------------------------------------------------------------------

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("k8s")
        g.add_argument("--kind", choices=KINDS, default="job",
                       help="job: Indexed Job + headless Service; jobset: JobSet v1alpha2; pytorchjob: Kubeflow "
                            "PyTorchJob v1; mpijob: Kubeflow MPIJob v2beta1; trainjob: Kubeflow Trainer TrainJob "
                            "v1alpha1 (default: job)")
        g.add_argument("--namespace", default="default", help="namespace of every object (default: default)")
        g.add_argument("--kubeconfig", default=None, metavar="FILE",
                       help="kubeconfig to submit with (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
        g.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
        g.add_argument("--gpu-resource", default="nvidia.com/gpu", metavar="NAME",
                       help="extended resource requested per node for --gpus-per-node (default: nvidia.com/gpu)")
        g.add_argument("--resource", action="append", default=[], metavar="NAME=QTY",
                       help="another resource limit per node, e.g. rdma/ib=1 (repeatable)")
        g.add_argument("--cpus", default=None, metavar="QTY", help="CPU request per node pod, e.g. 64 or 500m")
        g.add_argument("--memory", default=None, metavar="QTY",
                       help="memory request and limit per node pod, e.g. 512Gi")
        g.add_argument("--shm-size", default=None, metavar="QTY",
                       help="size limit of the in-memory /dev/shm volume (default: no limit)")
        g.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]",
                       help="tolerate a taint (kubectl taint syntax; '*' tolerates all); repeatable")
        g.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                       help="schedule only on nodes with this label (repeatable)")
        g.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                       help="secret for pulling the image (repeatable)")
        g.add_argument("--image-pull-policy", choices=("Always", "IfNotPresent", "Never"), default=None)
        g.add_argument("--service-account", default=None, metavar="NAME", help="service account of the pods")
        g.add_argument("--priority-class", default=None, metavar="NAME", help="priority class of the pods")
        g.add_argument("--queue", default=None, metavar="NAME",
                       help="Kueue local queue (label kueue.x-k8s.io/queue-name)")
        g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                       help="extra label on the objects and pods (repeatable)")
        g.add_argument("--privileged", action="store_true", default=False,
                       help="run the containers privileged (never done unless asked)")
        g.add_argument("--host-network", action="store_true", default=False, help="use the node's network namespace")
        g.add_argument("--results-pvc", default=None, metavar="CLAIM",
                       help="also keep the reports on this PersistentVolumeClaim, mounted at --pod-results-dir")
        g.add_argument("--pod-results-dir", default="/tmp/gpuaccept-results", metavar="PATH",
                       help="where reports are written in the containers (default: /tmp/gpuaccept-results)")
        rt = g.add_argument("--training-runtime", dest="runtime", default="torch-distributed", metavar="NAME",
                            help="trainjob: the training runtime to run on (default: torch-distributed)")
        hidden_alias(g, "--runtime", rt)  # slurm's --runtime is the container runtime (docker, podman)
        g.add_argument("--runtime-kind", choices=("ClusterTrainingRuntime", "TrainingRuntime"),
                       default="ClusterTrainingRuntime", help="trainjob: kind of --training-runtime")
        g.add_argument("--trainer-version", default=TRAINER_LATEST, metavar="X.Y",
                       help="trainjob: the Kubeflow Trainer release installed: 2.2 or later takes runtimePatches, "
                            f"2.1 podTemplateOverrides (default: {TRAINER_LATEST})")
        g.add_argument("--master-port", type=int, default=29500, metavar="PORT",
                       help="torch rendezvous port on node 0 (default: 29500)")
        g.add_argument("--mpirun-arg", action="append", default=[], metavar="ARG",
                       help="mpijob: extra mpirun argument, e.g. --mpirun-arg=--mca --mpirun-arg=btl_tcp_if_include "
                            "--mpirun-arg=eth0 (repeatable)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        def get(name: str, default: Any = None) -> Any:
            return getattr(args, name, default)

        kubeconfig = get("kubeconfig")
        raw = {
            "kind": get("kind", "job"),
            "namespace": get("namespace", "default"),
            # absolute: launch/job.json keeps it for 'gpuaccept gather', which may run from another directory
            "kubeconfig": os.path.abspath(os.path.expanduser(kubeconfig)) if kubeconfig else None,
            "context": get("context"),
            "gpu_resource": get("gpu_resource", "nvidia.com/gpu"),
            "resources": parse_resources(get("resource") or []),
            "cpu": get("cpus"),
            "memory": get("memory"),
            "shm_size": get("shm_size"),
            "tolerations": [parse_toleration(t) for t in get("toleration") or []],
            "node_selector": parse_key_values(get("node_selector") or [], "--node-selector"),
            "image_pull_secrets": list(get("image_pull_secret") or []),
            "image_pull_policy": get("image_pull_policy"),
            "service_account": get("service_account"),
            "priority_class": get("priority_class"),
            "queue": get("queue"),
            "labels": parse_key_values(get("label") or [], "--label"),
            "privileged": bool(get("privileged", False)),
            "host_network": bool(get("host_network", False)),
            "results_pvc": get("results_pvc"),
            "pod_results_dir": get("pod_results_dir", "/tmp/gpuaccept-results"),
            "runtime": get("runtime", "torch-distributed"),
            "runtime_kind": get("runtime_kind", "ClusterTrainingRuntime"),
            "trainer_version": str(get("trainer_version", TRAINER_LATEST)),
            "master_port": get("master_port", 29500),
            "mpirun_args": list(get("mpirun_arg") or []),
        }
        return K8sOptions.from_dict(raw, "k8s").to_dict()

    # ---- plan --------------------------------------------------------------------------------------------------

    def plan(self, spec: JobSpec) -> Plan:
        opts = K8sOptions.from_dict(spec.options, "k8s options")
        docs = build_manifests(spec, opts)
        name = docs[-1]["metadata"]["name"]
        filename = f"{name}.yaml"
        kinds = " + ".join(d["kind"] for d in docs)
        notes = [f"{kinds} in namespace {opts.namespace}, submitted through the Kubernetes API with strict field "
                 "validation (the command is the kubectl equivalent)",
                 "reports come back through the pod logs" + (f" and stay on PVC {opts.results_pvc}"
                                                              if opts.results_pvc else "")]
        if opts.kind == "mpijob":
            notes.append("the launcher runs mpirun --hostfile /etc/mpi/hostfile and fails (exit 97) unless the ranks "
                         "land on the workers, not on the launcher")
        return Plan(backend=self.name, files={filename: to_yaml(docs)},
                    commands=[["kubectl", "create", "--validate=strict", "-f", filename]], notes=notes)

    # ---- I/O ---------------------------------------------------------------------------------------------------

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        self._client(K8sOptions.from_dict(spec.options, "k8s options"))

    def _client(self, opts: K8sOptions) -> Any:
        if self._api is not None:
            return self._api
        self._api = new_api_client(_kubernetes(), opts.kubeconfig, opts.context)
        return self._api

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the API; turn its errors into one clear line."""
        k8s = _kubernetes()
        try:
            return fn(*args, **kwargs)
        except k8s.client.exceptions.ApiException as exc:
            raise UsageError(f"{what}: {_api_message(exc)}") from None
        except Exception as exc:  # urllib3 connection errors and the like
            if isinstance(exc, GpuacceptError):
                raise
            raise UsageError(f"{what}: cannot reach the Kubernetes API ({type(exc).__name__}: {exc})") from None

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        opts = K8sOptions.from_dict(spec.options, "k8s options")
        k8s = _kubernetes()
        api = self._client(opts)
        docs: list[dict[str, Any]] = []
        for text in plan.files.values():
            docs.extend(d for d in yaml.safe_load_all(text) if d)
        created: list[tuple[str, str]] = []
        handle = K8sHandle(opts.kind, opts.namespace, docs[-1]["metadata"]["name"], created, opts.to_dict())
        for doc in docs:
            kind, name = doc["kind"], doc["metadata"]["name"]
            try:
                self._create(k8s, api, doc)
            except k8s.client.exceptions.ApiException as exc:
                self._delete_all(handle)
                raise UsageError(f"creating {kind} {opts.namespace}/{name}: {_api_message(exc, kind)}; "
                                 "nothing was left submitted") from None
            except Exception as exc:
                self._delete_all(handle)
                raise UsageError(f"creating {kind} {opts.namespace}/{name}: cannot reach the Kubernetes API "
                                 f"({type(exc).__name__}: {exc})") from None
            created.append((kind, name))
        return Submission(backend=self.name, job_id=f"{opts.namespace}/{handle.name}", handle=handle)

    def _create(self, k8s: Any, api: Any, doc: dict[str, Any]) -> None:
        group, version, plural = RESOURCES[doc["kind"]]
        ns = doc["metadata"]["namespace"]
        common = {"field_validation": "Strict", "_headers": {"Content-Type": "application/json"},
                  "_preload_content": False}
        if group == "":
            k8s.client.CoreV1Api(api).create_namespaced_service(ns, doc, **common)
        else:
            k8s.client.CustomObjectsApi(api).create_namespaced_custom_object(group, version, ns, plural, doc,
                                                                             **common)

    def resume(self, spec: JobSpec) -> Submission:
        """The handle of a job submitted earlier from ``spec`` (after ``--detach``), to poll, gather or cancel."""
        opts = K8sOptions.from_dict(spec.options, "k8s options")
        docs = build_manifests(spec, opts)
        objects = [(str(d["kind"]), str(d["metadata"]["name"])) for d in docs]
        handle = K8sHandle(opts.kind, opts.namespace, objects[-1][1], objects, opts.to_dict())
        return Submission(backend=self.name, job_id=f"{opts.namespace}/{handle.name}", handle=handle)

    def _get(self, handle: K8sHandle, kind: str, name: str) -> dict[str, Any] | None:
        k8s = _kubernetes()
        group, version, plural = RESOURCES[kind]
        api = k8s.client.CustomObjectsApi(self._client(K8sOptions.from_dict(handle.options)))
        try:
            resp = api.get_namespaced_custom_object_status(group, version, handle.namespace, plural, name,
                                                           _preload_content=False)
        except k8s.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise UsageError(f"reading {kind} {handle.namespace}/{name}: {_api_message(exc)}") from None
        except Exception as exc:
            if isinstance(exc, GpuacceptError):
                raise
            raise UsageError(f"reading {kind} {handle.namespace}/{name}: cannot reach the Kubernetes API "
                             f"({type(exc).__name__}: {exc})") from None
        return dict(json.loads(resp.data))

    def _pods(self, handle: K8sHandle, role: str | None = None) -> list[dict[str, Any]]:
        k8s = _kubernetes()
        core = k8s.client.CoreV1Api(self._client(K8sOptions.from_dict(handle.options)))
        resp = self._call(f"listing the pods of {handle.namespace}/{handle.name}", core.list_namespaced_pod,
                          handle.namespace, label_selector=selector(handle.kind, handle.name, role),
                          _preload_content=False)
        return list(json.loads(resp.data).get("items") or [])

    def poll(self, submission: Submission) -> JobState:
        """The job's state. A failing API read gives state ``unknown`` (the watch goes on) until
        :data:`MAX_POLL_FAILURES` in a row, then UsageError."""
        import urllib3

        handle: K8sHandle = submission.handle
        kind, name = handle.objects[-1]
        try:
            obj = self._get(handle, kind, name)
            pods = self._pods(handle) if obj is not None else []
        except (GpuacceptError, OSError, urllib3.exceptions.HTTPError) as exc:
            handle.poll_failures += 1
            message = str(exc) if isinstance(exc, GpuacceptError) else f"{type(exc).__name__}: {exc}"
            if handle.poll_failures >= MAX_POLL_FAILURES:
                raise UsageError(f"{message} ({handle.poll_failures} reads in a row failed)") from None
            return JobState("unknown", done=False, detail=f"cannot read the job: {message}")
        handle.poll_failures = 0
        if obj is None:
            return JobState("deleted", done=True, ok=False, detail=f"{kind} {handle.namespace}/{name} is gone")
        return job_state(obj, pods)

    def cancel(self, submission: Submission) -> None:
        handle = submission.handle
        if isinstance(handle, K8sHandle):
            self._delete_all(handle)

    def _delete_all(self, handle: K8sHandle) -> None:
        """Delete what was created, pods included (background propagation); best effort, idempotent."""
        k8s = _kubernetes()
        api = self._client(K8sOptions.from_dict(handle.options))
        for kind, name in reversed(handle.objects):
            group, version, plural = RESOURCES[kind]
            try:
                if group == "":
                    k8s.client.CoreV1Api(api).delete_namespaced_service(
                        name, handle.namespace, propagation_policy="Background", _preload_content=False)
                else:
                    k8s.client.CustomObjectsApi(api).delete_namespaced_custom_object(
                        group, version, handle.namespace, plural, name, propagation_policy="Background",
                        _preload_content=False)
            except k8s.client.exceptions.ApiException as exc:
                if exc.status != 404:
                    handle.problems.append(f"deleting {kind} {name}: {_api_message(exc)}")
            except Exception as exc:
                handle.problems.append(f"deleting {kind} {name}: {type(exc).__name__}: {exc}")

    def _log(self, handle: K8sHandle, pod: str, tail: int | None = None) -> str:
        k8s = _kubernetes()
        core = k8s.client.CoreV1Api(self._client(K8sOptions.from_dict(handle.options)))
        kwargs: dict[str, Any] = {"container": _LOG_CONTAINER[handle.kind], "_preload_content": False}
        if tail is not None:
            kwargs["tail_lines"] = tail
        try:
            resp = core.read_namespaced_pod_log(pod, handle.namespace, **kwargs)
        except k8s.client.exceptions.ApiException as exc:
            handle.problems.append(f"{pod}: no log ({_api_message(exc)})")
            return ""
        except Exception as exc:  # urllib3 connection errors and the like
            if isinstance(exc, GpuacceptError):
                raise
            handle.problems.append(f"{pod}: no log (cannot reach the Kubernetes API: {type(exc).__name__}: {exc})")
            return ""
        return bytes(resp.data).decode("utf-8", "replace")

    def gather(self, submission: Submission, spec: JobSpec) -> list[NodeReport]:
        """Reports parsed from the pod logs. Logs and reports are also written under ``spec.run_results_dir``.

        ``submission.hosts`` becomes the Kubernetes nodes the node pods ran on (for an MPIJob, the workers), and
        every report names its node (``host``) and the pod it came from (``pod``), so that a failure can be
        traced to a physical node.
        Unreadable logs or report blocks are listed in ``submission.handle.problems``.
        """
        handle: K8sHandle = submission.handle
        try:
            pods = self._pods(handle)
        except UsageError as exc:
            raise InputError(f"cannot gather the reports: {exc}") from None
        # An MPIJob's reports are all in the launcher's log, named after the worker pods: map those to nodes.
        workers = self._pods(handle, "worker") if handle.kind == "mpijob" else pods
        pod_nodes = {pod: node for pod, node, _phase in pod_rows(workers)}
        out_dir = Path(spec.run_results_dir)
        reports: list[NodeReport] = []
        for pod, _node, _phase in pod_rows(pods):
            text = self._log(handle, pod)
            if not text:
                continue
            _write(out_dir / "logs" / f"{pod}.log", text)
            found = reports_from_log(text, pod)
            handle.problems.extend(found.problems)
            on_nodes(found.reports, pod_nodes, None if handle.kind == "mpijob" else pod)
            for i, report in enumerate(found.reports):
                sub = pod if len(found.reports) == 1 else f"{pod}-{i}"
                _write(out_dir / "k8s" / sub / "report.json", json.dumps(report.to_dict(), indent=2) + "\n")
                reports.append(report)
        submission.hosts = list(dict.fromkeys(node for node in pod_nodes.values() if node))
        return reports

    def logs(self, submission: Submission) -> str:
        handle = submission.handle
        if not isinstance(handle, K8sHandle):
            return ""
        try:
            pods = self._pods(handle)
        except GpuacceptError as exc:
            return str(exc)
        failed = [row for row in pod_rows(pods) if row[2] == "Failed"] or pod_rows(pods)
        chunks = []
        for pod, node, phase in failed[:8]:
            text = self._log(handle, pod, tail=40)
            chunks.append(f"==> pod {pod} ({phase}{' on ' + node if node else ''}) <==\n{text.rstrip()}")
        return "\n".join(chunks)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None


def _api_message(exc: Any, kind: str | None = None) -> str:
    """One line from an ApiException: the Status message when there is one."""
    message = status_message(exc)
    status = getattr(exc, "status", None)
    if status == 404 and kind and kind in RESOURCES and RESOURCES[kind][0] not in ("", "batch"):
        group, version, plural = RESOURCES[kind]
        return (f"the cluster does not serve {group}/{version} {plural}: install its controller (CRD) "
                f"or choose another --kind" + (f" ({message})" if message else ""))
    if status == 409:
        return f"already exists: choose another --name or delete it first ({message or exc.reason})"
    text = message or str(getattr(exc, "reason", "")) or "error"
    return f"HTTP {status}: {text}" if status else text
