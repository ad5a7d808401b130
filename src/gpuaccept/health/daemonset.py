"""The health DaemonSet of ``gpuaccept node-status daemonset``: pure functions, deterministic output.

Six objects: a ServiceAccount, a ClusterRole that may only ``get`` and ``patch`` nodes (what
``node-status label --apply`` calls: it reads the node's taints, then patches its label, annotations and
taint), a ClusterRoleBinding of the two, a ValidatingAdmissionPolicy and its binding
(:func:`own_node_policy`) that let that service account change only the node its pod runs on, and
a DaemonSet whose pod runs :data:`LOOP_SCRIPT`: ``gpuaccept node-status label --apply`` with the suite
options, then a pause of ``interval_s``, forever.

RBAC cannot name "the caller's own node", so the ClusterRole alone lets a stolen pod token patch
every node. The policy closes that: a service-account token bound to a pod carries the pod's node
(``authentication.kubernetes.io/node-name`` in the request's user extra; Kubernetes 1.30 and later,
where the ``ServiceAccountTokenPodNodeInfo`` gate is on by default, GA in 1.32), and an UPDATE
(a patch) of a node by our service account is denied unless the node is that one, or when the
token names no node. ``admission_policy=False`` leaves the two objects out for older clusters.

The pod learns its node from the downward API (``NODE_NAME`` and ``GPUACCEPT_HOSTNAME`` from
``spec.nodeName``, so its reports name the node, not the pod). It always tolerates our own taint:
a node tainted after a failure keeps its health pod, which is what clears the taint once the node
passes again. The container runs with no privilege escalation, every capability dropped, a
read-only root file system (``/tmp`` is an ``emptyDir``, ``HOME`` points there) and the runtime's
default seccomp profile. GPUs: with ``gpus`` > 0 the pod requests that many from the device
plugin (and holds them while it lives); with 0 it requests none and asks the NVIDIA container
runtime for every GPU with ``NVIDIA_VISIBLE_DEVICES=all``, as monitoring agents such as
dcgm-exporter do (this needs the NVIDIA runtime for the pod: ``runtime_class``, or the node's
default runtime, and a toolkit that honours the variable for unprivileged containers; the checks
then share the GPUs with whatever runs there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuaccept.argtypes import check_image
from gpuaccept.errors import ConfigError
from gpuaccept.health.nodepatch import TAINT
from gpuaccept.launch.k8s.options import (
    PULL_POLICIES,
    check_dns_label,
    check_dns_subdomain,
    check_label_key,
    check_request,
)

CONTAINER = "health"
MAX_UID = 2**32 - 2
"""The largest user id Linux has (``(uid_t) -1`` means none)."""
INTERVAL_ENV = "GPUACCEPT_HEALTH_INTERVAL"
DEFAULT_NAME = "gpuaccept-health"
RBAC_API = "rbac.authorization.k8s.io/v1"
ADMISSION_API = "admissionregistration.k8s.io/v1"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
"""The user-info extra key that holds the node of the pod a service-account token is bound to."""
LOOP_SCRIPT = """\
# gpuaccept health loop: node-status label --apply with the arguments given, then a pause, until SIGTERM.
stop() {
  # $! (not a variable set after the fork): a signal may come before such an assignment runs
  if [ -n "$!" ]; then
    kill -TERM "$!" 2>/dev/null
    wait "$!" 2>/dev/null
  fi
  exit 0
}
trap stop TERM INT
interval="${GPUACCEPT_HEALTH_INTERVAL:?}"
while :; do
  gpuaccept node-status label --apply "$@" &
  wait "$!"
  rc=$?
  echo "[HEALTH] gpuaccept node-status exited $rc; next check in $interval s" >&2
  sleep "$interval" &
  wait "$!"
done
"""
"""``sh -c`` script of the health container; ``$@`` are node-status's options. The checks run in the
background and the shell waits for them, so SIGTERM (a rollout, a drain) stops them at once."""


@dataclass(frozen=True)
class HealthDaemonOptions:
    """What ``node-status daemonset`` builds; :meth:`validate` refuses what the API server would."""

    image: str
    node_status_args: list[str] = field(default_factory=list)
    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAME
    interval_s: int = 600
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    gpus: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    runtime_class: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    image_pull_policy: str | None = None
    cpu: str | None = None
    memory: str | None = None
    priority_class: str | None = None
    run_as_user: int | None = None
    tmp_size: str = "4Gi"
    admission_policy: bool = True

    def validate(self) -> None:
        if not self.image:
            raise ConfigError("--image", self.image, "the DaemonSet needs an image with gpuaccept[k8s] in it")
        try:
            check_image(self.image)
        except ValueError as exc:
            raise ConfigError("--image", "", str(exc)) from None
        check_dns_label(self.name, "--name")
        check_dns_label(self.namespace, "--namespace")
        if not 1 <= self.interval_s <= 7 * 24 * 3600:
            raise ConfigError("--interval", str(self.interval_s), "seconds between checks: 1 to 604800")
        if self.gpus < 0:
            raise ConfigError("--gpus-per-node", str(self.gpus), "must be 0 or more")
        check_label_key(self.gpu_resource, "--gpu-resource")
        if self.runtime_class is not None:
            check_dns_subdomain(self.runtime_class, "--runtime-class")
        if self.priority_class is not None:
            check_dns_subdomain(self.priority_class, "--priority-class")
        for secret in self.image_pull_secrets:
            check_dns_subdomain(secret, "--image-pull-secret")
        if self.image_pull_policy is not None and self.image_pull_policy not in PULL_POLICIES:
            raise ConfigError("--image-pull-policy", self.image_pull_policy, f"one of {', '.join(PULL_POLICIES)}")
        for flag, qty in (("--cpus", self.cpu), ("--memory", self.memory), ("--tmp-size", self.tmp_size)):
            if qty is not None:
                check_request(qty, flag)
        if self.run_as_user is not None and not 0 <= self.run_as_user <= MAX_UID:
            raise ConfigError("--run-as-user", str(self.run_as_user), f"a user id is 0 to {MAX_UID}")


def own_toleration() -> dict[str, Any]:
    """Tolerates our taint, whatever its value: the health pod must stay on a node it tainted."""
    return {"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}


def cluster_role(name: str) -> dict[str, Any]:
    """Read and patch nodes: nothing else (no list, no watch, no other resource)."""
    return {"apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": {"name": name, "labels": _labels(name)},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]}


def service_account_user(name: str, namespace: str) -> str:
    """The user name the API server gives service account ``namespace/name``."""
    return f"system:serviceaccount:{namespace}:{name}"


def own_node_policy(name: str, namespace: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: service account ``namespace/name`` may update (patch) only its own node.

    It matches only that service account's requests (``matchConditions``), so nobody else's node updates are
    evaluated; ``variables.nodeName`` is the node its token is bound to ('' when the token names none: a
    legacy secret token, a token not bound to a pod, a cluster before 1.30), and both validations must hold.
    """
    claim = f"request.userInfo.extra['{NODE_NAME_CLAIM}']"
    has_claim = f"has(request.userInfo.extra) && '{NODE_NAME_CLAIM}' in request.userInfo.extra && size({claim}) > 0"
    return {"apiVersion": ADMISSION_API, "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": _labels(name)},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["*"],
                                                        "operations": ["UPDATE"], "resources": ["nodes"]}]},
                "matchConditions": [{"name": "health-service-account",
                                     "expression": f"request.userInfo.username == "
                                                   f"'{service_account_user(name, namespace)}'"}],
                "variables": [{"name": "nodeName", "expression": f"{has_claim} ? {claim}[0] : ''"}],
                "validations": [
                    {"expression": "variables.nodeName != ''", "reason": "Forbidden",
                     "message": f"the token of {namespace}/{name} names no node (a pod-bound token on Kubernetes "
                                f"1.30 or later carries {NODE_NAME_CLAIM}); it may patch only its own node"},
                    {"expression": "object.metadata.name == variables.nodeName", "reason": "Forbidden",
                     "messageExpression": f"'{namespace}/{name} may patch only its own node ' + variables.nodeName"
                                          " + ', not ' + object.metadata.name"},
                ]}}


def own_node_policy_binding(name: str) -> dict[str, Any]:
    """Binds :func:`own_node_policy` to every node request, denying what it rejects."""
    return {"apiVersion": ADMISSION_API, "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": _labels(name)},
            "spec": {"policyName": name, "validationActions": ["Deny"]}}


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "gpuaccept-health", "app.kubernetes.io/instance": name}


def _env(opts: HealthDaemonOptions) -> list[dict[str, Any]]:
    node = {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    env: list[dict[str, Any]] = [{"name": "NODE_NAME", **node}, {"name": "GPUACCEPT_HOSTNAME", **node},
                                 {"name": INTERVAL_ENV, "value": str(opts.interval_s)},
                                 {"name": "HOME", "value": "/tmp"}, {"name": "TMPDIR", "value": "/tmp"},
                                 {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if opts.gpus == 0:
        env += [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    return env


def _container(opts: HealthDaemonOptions) -> dict[str, Any]:
    c: dict[str, Any] = {"name": CONTAINER, "image": opts.image}
    if opts.image_pull_policy:
        c["imagePullPolicy"] = opts.image_pull_policy
    c["command"] = ["/bin/sh", "-c", LOOP_SCRIPT, "gpuaccept-health", *opts.node_status_args]
    c["env"] = _env(opts)
    requests = {k: v for k, v in (("cpu", opts.cpu), ("memory", opts.memory)) if v}
    limits: dict[str, str] = {}
    if opts.memory:
        limits["memory"] = opts.memory
    if opts.gpus:
        limits[opts.gpu_resource] = str(opts.gpus)
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    if resources:
        c["resources"] = resources
    c["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    sc: dict[str, Any] = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                          "capabilities": {"drop": ["ALL"]}}
    if opts.run_as_user is not None:
        sc["runAsUser"] = opts.run_as_user
        sc["runAsNonRoot"] = opts.run_as_user != 0
    c["securityContext"] = sc
    return c


def daemonset(opts: HealthDaemonOptions) -> dict[str, Any]:
    labels = _labels(opts.name)
    pod: dict[str, Any] = {"serviceAccountName": opts.name, "automountServiceAccountToken": True}
    if opts.priority_class:
        pod["priorityClassName"] = opts.priority_class
    if opts.runtime_class:
        pod["runtimeClassName"] = opts.runtime_class
    if opts.node_selector:
        pod["nodeSelector"] = dict(opts.node_selector)
    pod["tolerations"] = [own_toleration(), *(dict(t) for t in opts.tolerations if t != own_toleration())]
    if opts.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    pod["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    pod["terminationGracePeriodSeconds"] = 30
    pod["containers"] = [_container(opts)]
    pod["volumes"] = [{"name": "tmp", "emptyDir": {"sizeLimit": opts.tmp_size}}]
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": opts.name, "namespace": opts.namespace, "labels": labels},
            "spec": {"selector": {"matchLabels": dict(labels)},
                     "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}}


def health_manifests(opts: HealthDaemonOptions) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole, ClusterRoleBinding, the own-node policy and its binding (unless
    ``admission_policy`` is False) and DaemonSet, in the order to create them: the policy is in force before
    the first pod can patch."""
    opts.validate()
    name, ns = opts.name, opts.namespace
    policy = [own_node_policy(name, ns), own_node_policy_binding(name)] if opts.admission_policy else []
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": ns, "labels": _labels(name)}},
        cluster_role(name),
        {"apiVersion": RBAC_API, "kind": "ClusterRoleBinding", "metadata": {"name": name, "labels": _labels(name)},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
        *policy,
        daemonset(opts),
    ]
