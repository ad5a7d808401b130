"""The Kubernetes sweep (pure): a PriorityClass and a CronJob that test idle GPU nodes and yield to real work.

Each sweep is a Job of ``nodes`` pods, one per node (a required pod anti-affinity on the host name), each asking
for all ``gpus_per_node`` GPUs of its node: the scheduler can place such a pod only on a node whose GPUs are
all free, i.e. an idle node. The PriorityClass is negative and never preempts (``preemptionPolicy: Never``),
so every real pod comes first and preempts a sweep pod when it needs the node; a preempted pod is not counted
as a failure (``podFailurePolicy`` ignores the ``DisruptionTarget`` condition) and is not retried. A pod that
finds no idle node in time goes with the Job's ``activeDeadlineSeconds``. Each pod runs ``gpuaccept run`` and
stores its result in the history given by a Secret (``GPUACCEPT_DB``), with its node's name and hardware
identity; ``gpuaccept trend`` then flags a node whose figures fall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuaccept.argtypes import check_image
from gpuaccept.errors import ConfigError

NAME = "gpuaccept-sweep"
SCHEDULING_SLACK_S = 1800
"""How long (s) a sweep Job's pods may wait for an idle node, on top of their own time limit."""


@dataclass(frozen=True)
class CronSweep:
    image: str
    namespace: str = "gpuaccept"
    schedule: str = "17 * * * *"
    nodes: int = 4
    gpus_per_node: int = 8
    priority: int = -100
    profile: str = "quick"
    db_secret: str | None = None
    deadline_s: int = 1800
    node_selector: tuple[str, ...] = ()
    gpu_resource: str = "nvidia.com/gpu"

    def validate(self) -> None:
        from gpuaccept.launch.k8s.options import check_dns_label, check_dns_subdomain

        try:
            check_image(self.image)
        except ValueError as exc:
            raise ConfigError("--image", self.image, str(exc)) from None
        check_dns_label(self.namespace, "--namespace")
        if self.db_secret:
            check_dns_subdomain(self.db_secret, "--db-secret")
        fields = self.schedule.split()
        if len(fields) != 5 and not (len(fields) == 1 and fields[0].startswith("@")):
            raise ConfigError("--schedule", self.schedule, "a cron schedule of five fields (e.g. '17 * * * *')")
        if self.priority >= 0:
            raise ConfigError("--priority", str(self.priority), "must be negative, so that real work comes first")


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME}


def priority_class(sweep: CronSweep) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": NAME, "labels": _labels()}, "value": sweep.priority,
            "preemptionPolicy": "Never", "globalDefault": False,
            "description": "gpuaccept idle-node sweep: runs only where nothing else wants the GPUs"}


def _container(sweep: CronSweep) -> dict[str, Any]:
    node = {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    env: list[dict[str, Any]] = [{"name": "GPUACCEPT_HOSTNAME", **node}, {"name": "HOME", "value": "/tmp"},
                                 {"name": "TMPDIR", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if sweep.db_secret:
        env.append({"name": "GPUACCEPT_DB", "valueFrom": {"secretKeyRef": {"name": sweep.db_secret, "key": "url"}}})
    return {"name": "gpuaccept", "image": sweep.image,
            "command": ["gpuaccept", "run", "--profile", sweep.profile, "--require-gpu",
                        "--expect-gpus", str(sweep.gpus_per_node), "--report-dir", "/tmp/reports", "--no-html"],
            "env": env, "resources": {"limits": {sweep.gpu_resource: str(sweep.gpus_per_node)}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}}}


def cron_job(sweep: CronSweep) -> dict[str, Any]:
    labels = _labels()
    pod: dict[str, Any] = {
        "priorityClassName": NAME, "restartPolicy": "Never", "activeDeadlineSeconds": sweep.deadline_s,
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": dict(labels)}, "topologyKey": "kubernetes.io/hostname"}]}},
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(sweep)],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]}
    if sweep.node_selector:
        pod["nodeSelector"] = dict(s.split("=", 1) for s in sweep.node_selector)
    job = {"parallelism": sweep.nodes, "completions": sweep.nodes, "backoffLimit": sweep.nodes,
           "activeDeadlineSeconds": sweep.deadline_s + SCHEDULING_SLACK_S, "ttlSecondsAfterFinished": 86400,
           "podFailurePolicy": {"rules": [
               {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
               {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}}]},
           "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": NAME, "namespace": sweep.namespace, "labels": labels},
            "spec": {"schedule": sweep.schedule, "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 600,
                     "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
                     "jobTemplate": {"metadata": {"labels": dict(labels)}, "spec": job}}}


def manifests(sweep: CronSweep) -> list[dict[str, Any]]:
    """The PriorityClass first (the CronJob's pods name it), then the CronJob."""
    sweep.validate()
    return [priority_class(sweep), cron_job(sweep)]


def to_yaml(docs: list[dict[str, Any]]) -> str:
    from gpuaccept.launch.k8s.manifests import to_yaml as dump

    return dump(docs)
