"""Kubernetes manifests for a JobSpec: pure functions, deterministic output.

One builder per ``--kind``:

- ``job``: an Indexed ``batch/v1`` Job plus a headless Service. Each pod's
  hostname is ``<name>-<index>`` in the Service's subdomain, so node rank 0 is
  reachable as ``<name>-0.<name>``; the node rank is the completion index
  (``PET_NODE_RANK`` from the ``batch.kubernetes.io/job-completion-index``
  annotation, the same value as ``JOB_COMPLETION_INDEX``).
- ``jobset``: a ``jobset.x-k8s.io/v1alpha2`` JobSet with one replicated Job of
  the same shape; rank 0 is ``<name>-node-0-0.<name>``.
- ``pytorchjob``: a Kubeflow ``kubeflow.org/v1`` PyTorchJob (Master and
  Worker replicas, ``nprocPerNode``); the operator injects ``PET_*``.
- ``mpijob``: a Kubeflow ``kubeflow.org/v2beta1`` MPIJob (Launcher and Worker,
  ``slotsPerWorker``); the launcher runs
  :func:`gpuaccept.launch.pod_script.mpi_launcher_script`.
- ``trainjob``: a Kubeflow Trainer ``trainer.kubeflow.org/v1alpha1`` TrainJob
  on a torch runtime (``numNodes``, ``numProcPerNode``, ``resourcesPerNode``),
  with scheduling and volumes in ``runtimePatches`` (Kubeflow Trainer v2.2 and later) or
  ``podTemplateOverrides`` (v2.1, which rejects ``runtimePatches``), chosen by ``--trainer-version``.

Every kind keeps one pod of the run per host: the node pods carry a required pod
anti-affinity on ``kubernetes.io/hostname`` (for an MPIJob, the workers), so a
run with ``--gpus-per-node 4`` on 8-GPU hosts still tests distinct hosts.

Distributed jobs start one ``torchrun`` per pod, which reads the rendezvous
from ``PET_NNODES``/``PET_NODE_RANK``/``PET_MASTER_ADDR``/``PET_MASTER_PORT``
(set here for job and jobset, injected by the operators otherwise).
Containers are never privileged unless ``--privileged``; otherwise every container sets
``allowPrivilegeEscalation: false``. No pod of the run talks to the Kubernetes API (the
MPIJob launcher of mpi-operator v2 starts the ranks over ssh, not ``kubectl exec``), so pods
set ``automountServiceAccountToken: false`` unless ``--service-account`` names an account
(its token is then mounted as the cluster decides). A TrainJob's pod template cannot carry
that field (and, before Kubeflow Trainer v2.2, no container security context either).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from gpuaccept.errors import ConfigError
from gpuaccept.launch.jobargv import node_argv, torchrun_argv
from gpuaccept.launch.k8s.options import K8sOptions, check_dns_subdomain, label_value
from gpuaccept.launch.pod_script import (
    MPI_LAUNCHER_ENV,
    NODE_SCRIPT,
    RESULTS_ENV,
    mpi_forward_env,
    mpi_launcher_script,
    mpi_ranks_per_worker,
)
from gpuaccept.launch.spec import MAX_NAME, JobSpec, with_known_gpus

NODE_CONTAINER = "node"
PYTORCH_CONTAINER = "pytorch"  # the training operator finds the container by this name
REPLICATED_JOB = "node"  # the JobSet replicated job; also the torch runtime's job name
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
HOSTNAME_KEY = "kubernetes.io/hostname"
TRAINJOB_LABEL = "jobset.sigs.k8s.io/jobset-name"  # set by JobSet on the pods of a TrainJob's JobSet
API_VERSIONS = {
    "job": ("batch/v1", "Job"),
    "jobset": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
    "mpijob": ("kubeflow.org/v2beta1", "MPIJob"),
    "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
}
# Longest suffix each kind adds to the name in pod hostnames and Services (before the index digits).
_SUFFIX = {"job": "-", "jobset": "-node-0-", "pytorchjob": "-worker-", "mpijob": "-launcher", "trainjob": "-node-0-"}


def object_name(spec: JobSpec, kind: str) -> str:
    """The name of the Kubernetes objects: ``spec.name``, prefixed when it starts with a digit.

    Services, PyTorchJobs, MPIJobs and TrainJobs need an RFC 1035 label (a
    letter first). Raises ConfigError when the pod hostnames would pass 63.
    """
    name = spec.name if spec.name[0].isalpha() else f"gpuaccept-{spec.name}"[:MAX_NAME].rstrip("-")
    longest = len(name) + len(_SUFFIX[kind]) + len(str(max(spec.nodes - 1, 0)))
    if longest > 63:
        raise ConfigError("--name", spec.name, f"too long for --kind {kind} with {spec.nodes} nodes: pod hostnames "
                                               f"would have {longest} characters (at most 63)")
    return name


def build_manifests(spec: JobSpec, opts: K8sOptions) -> list[dict[str, Any]]:
    """Every object to create, in creation order. Raises ConfigError for what the kind cannot express."""
    if not spec.image:
        raise ConfigError("--image", "", "the k8s backend needs a container image (with gpuaccept installed "
                                         "for the suite), e.g. --image nvcr.io/nvidia/pytorch:25.01-py3")
    spec = with_known_gpus(spec, "Kubernetes", opts.resources.get(opts.gpu_resource))
    pod_spec = dataclasses.replace(spec, results_dir=opts.pod_results_dir)
    builders = {"job": _job, "jobset": _jobset, "pytorchjob": _pytorchjob, "mpijob": _mpijob,
                "trainjob": _trainjob}
    return builders[opts.kind](pod_spec, opts, object_name(spec, opts.kind))


def selector(kind: str, name: str, role: str | None = None) -> str:
    """Label selector of the pods whose logs hold the reports (for an MPIJob, only the launcher's);
    ``role`` picks other pods of the run (an MPIJob's workers)."""
    if kind == "trainjob":
        return f"{TRAINJOB_LABEL}={name}"
    base = f"app.kubernetes.io/name=gpuaccept,app.kubernetes.io/instance={name}"
    role = role or ("launcher" if kind == "mpijob" else None)
    return base + (f",gpuaccept/role={role}" if role else "")


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Multi-document YAML; multi-line strings (scripts) as literal blocks. ``yaml.safe_load_all`` reads it back."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100,
                         allow_unicode=True, explicit_start=True)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


# ---- shared pieces ---------------------------------------------------------------------------------------------

def _labels(spec: JobSpec, opts: K8sOptions, name: str, role: str | None = None,
            top: bool = False) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": "gpuaccept", "app.kubernetes.io/instance": name}
    run_id = label_value(spec.run_id)
    if run_id:
        labels["gpuaccept/run-id"] = run_id
    if role:
        labels["gpuaccept/role"] = role
    labels.update(opts.labels)
    if top and opts.queue:
        labels[QUEUE_LABEL] = opts.queue
    return labels


def _metadata(spec: JobSpec, opts: K8sOptions, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": opts.namespace, "labels": _labels(spec, opts, name, top=True)}


def _job_argv(spec: JobSpec) -> list[str]:
    """What the container runs: the job, under one torchrun per pod when distributed."""
    if spec.distributed:
        return torchrun_argv(spec, [], str(spec.nodes))
    return node_argv(spec)


def _env(spec: JobSpec, opts: K8sOptions, extra: list[dict[str, Any]] | None = None,
         node_name: bool = True) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in spec.env.items()]
    ours: list[dict[str, Any]] = [{"name": RESULTS_ENV, "value": spec.run_results_dir}]
    if node_name:
        # Reports name the Kubernetes node, not the pod.
        ours.append({"name": "GPUACCEPT_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    ours.extend(extra or [])
    env.extend(e for e in ours if e["name"] not in spec.env)
    return env


def _pet_env(spec: JobSpec, master: str, opts: K8sOptions) -> list[dict[str, Any]]:
    """torchrun's rendezvous for the job and jobset kinds (the operators inject these for the others)."""
    if not spec.distributed:
        return []
    return [
        {"name": "PET_NNODES", "value": str(spec.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(spec.nproc)},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": INDEX_ANNOTATION}}},
        {"name": "PET_MASTER_ADDR", "value": master},
        {"name": "PET_MASTER_PORT", "value": str(opts.master_port)},
    ]


def _resources(spec: JobSpec, opts: K8sOptions) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if spec.gpus_per_node:
        limits[opts.gpu_resource] = str(spec.gpus_per_node)
    limits.update(opts.resources)
    requests: dict[str, str] = {}
    if opts.cpu:
        requests["cpu"] = opts.cpu
    if opts.memory:
        requests["memory"] = opts.memory
        limits["memory"] = opts.memory
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _volumes(spec: JobSpec, opts: K8sOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) of a node pod: /dev/shm in memory, the results PVC, the spec's mounts."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if opts.shm_size:
        shm["sizeLimit"] = opts.shm_size
    volumes: list[dict[str, Any]] = [{"name": "shm", "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": "shm", "mountPath": "/dev/shm"}]
    if opts.results_pvc:
        volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": opts.results_pvc}})
        mounts.append({"name": "results", "mountPath": opts.pod_results_dir})
    for i, m in enumerate(spec.mounts):
        vol_name = f"mount-{i}"
        if m.source.startswith("/"):
            volumes.append({"name": vol_name, "hostPath": {"path": m.source}})
        else:
            claim = check_dns_subdomain(m.source, "--mount")
            pvc: dict[str, Any] = {"claimName": claim}
            if m.readonly:
                pvc["readOnly"] = True
            volumes.append({"name": vol_name, "persistentVolumeClaim": pvc})
        mount: dict[str, Any] = {"name": vol_name, "mountPath": m.target}
        if m.readonly:
            mount["readOnly"] = True
        mounts.append(mount)
    seen: set[str] = set()
    for mount in mounts:
        path = mount["mountPath"].rstrip("/") or "/"
        if path in seen:
            raise ConfigError("--mount", mount["mountPath"], "two volumes are mounted at this path "
                                                             "(/dev/shm and --pod-results-dir are taken)")
        seen.add(path)
    return volumes, mounts


def _container(spec: JobSpec, opts: K8sOptions, name: str, command: list[str], env: list[dict[str, Any]],
               mounts: list[dict[str, Any]] | None, gpus: bool = True) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": spec.image}
    if opts.image_pull_policy:
        c["imagePullPolicy"] = opts.image_pull_policy
    c["command"] = command
    if spec.workdir:
        c["workingDir"] = spec.workdir
    c["env"] = env
    if gpus:
        resources = _resources(spec, opts)
        if resources:
            c["resources"] = resources
    if mounts:
        c["volumeMounts"] = mounts
    c["securityContext"] = security_context(opts)
    return c


def security_context(opts: K8sOptions) -> dict[str, Any]:
    """A container's securityContext: privileged only when asked, else no privilege escalation."""
    return {"privileged": True} if opts.privileged else {"allowPrivilegeEscalation": False}


def one_per_node(match_labels: dict[str, str]) -> dict[str, Any]:
    """Required pod anti-affinity: no two pods matching ``match_labels`` on one host (``kubernetes.io/hostname``).

    Each "node" of the run is then a distinct physical node, even when it requests fewer GPUs than the host has.
    """
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": dict(match_labels)}, "topologyKey": HOSTNAME_KEY}]}}


def _node_match(name: str, role: str | None = None) -> dict[str, str]:
    """Labels every node pod of the run carries (the MPIJob launcher is not a node pod: ``role`` picks workers)."""
    labels = {"app.kubernetes.io/name": "gpuaccept", "app.kubernetes.io/instance": name}
    if role:
        labels["gpuaccept/role"] = role
    return labels


def _pod_spec(opts: K8sOptions, containers: list[dict[str, Any]], volumes: list[dict[str, Any]] | None,
              spread: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"restartPolicy": "Never", **extra}
    if opts.service_account:
        pod["serviceAccountName"] = opts.service_account
    else:  # nothing in the pods uses the API: no token to steal
        pod["automountServiceAccountToken"] = False
    if opts.priority_class:
        pod["priorityClassName"] = opts.priority_class
    if opts.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if opts.node_selector:
        pod["nodeSelector"] = dict(opts.node_selector)
    if spread:
        pod["affinity"] = one_per_node(spread)
    if opts.tolerations:
        pod["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    pod["containers"] = containers
    if volumes:
        pod["volumes"] = volumes
    return pod


def _node_pod(spec: JobSpec, opts: K8sOptions, name: str, container: str, role: str,
              extra_env: list[dict[str, Any]] | None = None, **pod_extra: Any) -> dict[str, Any]:
    """Pod template of a node that runs the job itself (job, jobset, pytorchjob)."""
    volumes, mounts = _volumes(spec, opts)
    command = ["sh", "-c", NODE_SCRIPT, "gpuaccept", *_job_argv(spec)]
    c = _container(spec, opts, container, command, _env(spec, opts, extra_env), mounts)
    return {"metadata": {"labels": _labels(spec, opts, name, role)},
            "spec": _pod_spec(opts, [c], volumes, _node_match(name), **pod_extra)}


def _indexed_job_spec(spec: JobSpec, template: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = {"completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes}
    if spec.distributed:
        job["backoffLimit"] = 0  # a lost rank fails the job at once
    else:
        job["backoffLimitPerIndex"] = 0  # one try per node; a failing node does not stop the others
    if spec.time_limit_min:
        job["activeDeadlineSeconds"] = spec.time_limit_min * 60
    job["template"] = template
    return job


def _run_policy(spec: JobSpec, clean: str) -> dict[str, Any]:
    policy: dict[str, Any] = {"cleanPodPolicy": clean, "backoffLimit": 0}
    if spec.time_limit_min:
        policy["activeDeadlineSeconds"] = spec.time_limit_min * 60
    return policy


def _head(kind: str, spec: JobSpec, opts: K8sOptions, name: str) -> dict[str, Any]:
    api, k = API_VERSIONS[kind]
    return {"apiVersion": api, "kind": k, "metadata": _metadata(spec, opts, name)}


# ---- one builder per kind --------------------------------------------------------------------------------------

def _job(spec: JobSpec, opts: K8sOptions, name: str) -> list[dict[str, Any]]:
    meta = _metadata(spec, opts, name)
    meta["labels"].pop(QUEUE_LABEL, None)  # Kueue admits the Job, not the Service
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"app.kubernetes.io/name": "gpuaccept", "app.kubernetes.io/instance": name}},
    }
    template = _node_pod(spec, opts, name, NODE_CONTAINER, "node", _pet_env(spec, f"{name}-0.{name}", opts),
                         subdomain=name)
    return [service, {**_head("job", spec, opts, name), "spec": _indexed_job_spec(spec, template)}]


def _jobset(spec: JobSpec, opts: K8sOptions, name: str) -> list[dict[str, Any]]:
    master = f"{name}-{REPLICATED_JOB}-0-0.{name}"
    template = _node_pod(spec, opts, name, NODE_CONTAINER, "node", _pet_env(spec, master, opts))
    js = _head("jobset", spec, opts, name)
    js["spec"] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": name},
        "failurePolicy": {"maxRestarts": 0},
        "successPolicy": {"operator": "All"},
        "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                            "template": {"spec": _indexed_job_spec(spec, template)}}],
    }
    return [js]


def _pytorchjob(spec: JobSpec, opts: K8sOptions, name: str) -> list[dict[str, Any]]:
    def replica(role: str, count: int) -> dict[str, Any]:
        template = _node_pod(spec, opts, name, PYTORCH_CONTAINER, role)
        template["spec"]["containers"][0]["ports"] = [{"name": "pytorchjob-port",
                                                       "containerPort": opts.master_port}]
        return {"replicas": count, "restartPolicy": "Never", "template": template}

    replicas = {"Master": replica("master", 1)}
    if spec.nodes > 1:
        replicas["Worker"] = replica("worker", spec.nodes - 1)
    job = _head("pytorchjob", spec, opts, name)
    job["spec"] = {"nprocPerNode": str(spec.nproc), "runPolicy": _run_policy(spec, "None"),
                   "pytorchReplicaSpecs": replicas}
    return [job]


def _mpijob(spec: JobSpec, opts: K8sOptions, name: str) -> list[dict[str, Any]]:
    ranks = mpi_ranks_per_worker(spec)
    script = mpi_launcher_script(spec.nodes, ranks, mpi_forward_env(spec), opts.mpirun_args)
    launcher_env = _env(spec, opts, [{"name": k, "value": v} for k, v in MPI_LAUNCHER_ENV.items()],
                        node_name=False)
    launcher = _container(spec, opts, "launcher", ["sh", "-c", script, "gpuaccept-launcher", *node_argv(spec)],
                          launcher_env, None, gpus=False)
    volumes, mounts = _volumes(spec, opts)
    # Ranks are started through sshd, so they see mpirun's environment (-x), not the pod's.
    worker = _container(spec, opts, "worker", ["/usr/sbin/sshd", "-De"], _env(spec, opts, node_name=False), mounts)
    job = _head("mpijob", spec, opts, name)
    job["spec"] = {
        "slotsPerWorker": spec.nproc,
        "mpiImplementation": "OpenMPI",
        "launcherCreationPolicy": "WaitForWorkersReady",
        "runPolicy": _run_policy(spec, "Running"),
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": {
                "metadata": {"labels": _labels(spec, opts, name, "launcher")},
                "spec": _pod_spec(opts, [launcher], None)}},
            "Worker": {"replicas": spec.nodes, "restartPolicy": "Never", "template": {
                "metadata": {"labels": _labels(spec, opts, name, "worker")},
                "spec": _pod_spec(opts, [worker], volumes, _node_match(name, "worker"))}},
        },
    }
    return [job]


def _trainjob(spec: JobSpec, opts: K8sOptions, name: str) -> list[dict[str, Any]]:
    for flag, value in (("--host-network", opts.host_network), ("--image-pull-policy", opts.image_pull_policy),
                        ("--workdir", spec.workdir)):
        if value:
            raise ConfigError(flag, str(value), "a TrainJob cannot set this (its runtime does); use another --kind")
    volumes, mounts = _volumes(spec, opts)
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": ["sh", "-c", NODE_SCRIPT, "gpuaccept", *_job_argv(spec)],
        "env": _env(spec, opts),
        "numNodes": spec.nodes,
        "numProcPerNode": spec.nproc,
    }
    resources = _resources(spec, opts)
    if resources:
        trainer["resourcesPerNode"] = resources
    container: dict[str, Any] = {"name": NODE_CONTAINER, "volumeMounts": mounts}
    if opts.runtime_patches or opts.privileged:  # Trainer before v2.2 has no container securityContext
        container["securityContext"] = security_context(opts)
    pod = _pod_spec(opts, [container], volumes, {TRAINJOB_LABEL: name})
    del pod["restartPolicy"]  # the runtime's
    pod.pop("automountServiceAccountToken", None)  # not a field of a TrainJob's pod template
    job = _head("trainjob", spec, opts, name)
    pod_labels = _labels(spec, opts, name, "node")
    job["spec"] = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": opts.runtime_kind, "name": opts.runtime},
        "trainer": trainer,
    }
    if opts.runtime_patches:
        job["spec"]["runtimePatches"] = [{"manager": "gpuaccept", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": REPLICATED_JOB, "template": {"spec": {"template": {
                "metadata": {"labels": pod_labels}, "spec": pod}}}}]}}}}]
    else:  # Trainer before v2.2
        if opts.privileged:
            raise ConfigError("--privileged", "true", f"Kubeflow Trainer {opts.trainer_version} cannot set a "
                                                      "container's security context in a TrainJob (v2.2 can)")
        job["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": REPLICATED_JOB}],
                                                "metadata": {"labels": pod_labels}, "spec": pod}]
    if spec.time_limit_min:
        job["spec"]["activeDeadlineSeconds"] = spec.time_limit_min * 60
    return [job]
