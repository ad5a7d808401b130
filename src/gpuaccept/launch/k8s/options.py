"""Options of the Kubernetes backend, validated from flags or a YAML job spec.

Every value that ends up in a manifest is checked here against the API
server's own rules (DNS names, label keys and values, resource quantities,
toleration effects), so a bad flag fails with one clear line before anything
is planned or submitted.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.errors import ConfigError
from gpuaccept.launch.spec import as_list, option_values

KINDS = ("job", "jobset", "pytorchjob", "mpijob", "trainjob")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TRAINER_LATEST = "2.2"
"""Kubeflow Trainer release whose TrainJob API the manifests follow by default (``runtimePatches``)."""
_TRAINER_VERSION = re.compile(r"^v?(\d+)\.(\d+)(\.\d+)?$")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# The pattern of resource.Quantity in every CRD's openAPIV3Schema.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY = re.compile(rf"^(\+|-)?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$")


def check_dns_label(value: str, flag: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ConfigError(flag, value, "must be a DNS label: lower-case letters, digits and '-', at most 63")
    return value


def check_dns_subdomain(value: str, flag: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ConfigError(flag, value, "must be a DNS subdomain: lower-case letters, digits, '-' and '.'")
    return value


def check_label_key(key: str, flag: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ConfigError(flag, key, "the key prefix must be a DNS subdomain (example.com/name)")
    if len(name) > 63 or not _LABEL_NAME.match(name):
        raise ConfigError(flag, key, "a label key is letters, digits, '-', '_' and '.', at most 63, "
                                     "starting and ending with a letter or digit")
    return key


def check_label_value(value: str, flag: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ConfigError(flag, value, "a label value is letters, digits, '-', '_' and '.', at most 63, "
                                       "starting and ending with a letter or digit")
    return value


def label_value(text: str) -> str:
    """``text`` made a valid label value (invalid characters become '-', at most 63)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def check_quantity(value: str, flag: str) -> str:
    if not QUANTITY.match(value):
        raise ConfigError(flag, value, "not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    return value


_SCALE = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60, "n": 1e-9,
          "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def check_request(value: str, flag: str) -> str:
    """A quantity a pod may request: :func:`check_quantity`, more than 0 and below 2^63 (Kubernetes' own
    limit); ``-1`` and ``1e999`` are quantities by the pattern but not requests."""
    check_quantity(value, flag)
    m = re.fullmatch(r"\+?([0-9.]+)((?:[eE][+-]?[0-9.]+)?)((?:[KMGTPE]i|[numkMGTPE])?)", value)
    try:
        amount = float(m.group(1) + m.group(2)) * _SCALE[m.group(3)] if m else -1.0
    except ValueError:
        amount = -1.0
    if not 0 < amount < 2.0**63:
        raise ConfigError(flag, value, "a request is a quantity more than 0 and below 2^63 (e.g. 8, 500m, 64Gi)")
    return value


def parse_key_values(items: list[str], flag: str) -> dict[str, str]:
    """``["a=b", ...]`` with label-style keys and values."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(flag, item, "expected KEY=VALUE")
        out[check_label_key(key, flag)] = check_label_value(value, flag)
    return out


def parse_toleration(text: str, flag: str = "--toleration") -> dict[str, Any]:
    """``KEY[=VALUE][:EFFECT]``, as ``kubectl taint`` writes taints; ``*`` tolerates every taint.

    Without a value the operator is Exists; without an effect every effect is tolerated.
    """
    if text in ("*", "*:"):
        return {"operator": "Exists"}
    head, colon, effect = text.partition(":")
    if colon and effect not in EFFECTS:
        raise ConfigError(flag, text, f"the effect must be one of {', '.join(EFFECTS)}")
    key, eq, value = head.partition("=")
    if not key:
        raise ConfigError(flag, text, "expected KEY[=VALUE][:EFFECT] (or * for every taint)")
    check_label_key(key, flag)
    tol: dict[str, Any] = {"key": key}
    if eq:
        tol["operator"] = "Equal"
        tol["value"] = check_label_value(value, flag)
    else:
        tol["operator"] = "Exists"
    if effect:
        tol["effect"] = effect
    return tol


def parse_resources(items: list[str], flag: str = "--resource") -> dict[str, str]:
    """Extra resource limits ``NAME=QUANTITY`` (e.g. ``rdma/ib=1``)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, qty = item.partition("=")
        if not sep:
            raise ConfigError(flag, item, "expected NAME=QUANTITY (e.g. rdma/ib=1)")
        check_label_key(name, flag)
        out[name] = check_quantity(qty, flag)
    return out


def trainer_release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a Kubeflow Trainer release (``2.1``, ``v2.2.0``); ConfigError before v2.1."""
    m = _TRAINER_VERSION.match(str(version))
    release = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if release < (2, 1):
        raise ConfigError("--trainer-version", str(version), "expected a Kubeflow Trainer release of 2.1 or later "
                                                             "(e.g. 2.1, v2.2.0)")
    return release


@dataclass(frozen=True)
class K8sOptions:
    """The k8s backend's options. Quantities are Kubernetes quantity strings; ``master_port`` is a TCP port."""

    kind: str = "job"
    namespace: str = "default"
    gpu_resource: str = "nvidia.com/gpu"
    resources: dict[str, str] = field(default_factory=dict)
    cpu: str | None = None
    memory: str | None = None
    shm_size: str | None = None
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    image_pull_secrets: list[str] = field(default_factory=list)
    image_pull_policy: str | None = None
    service_account: str | None = None
    priority_class: str | None = None
    queue: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    privileged: bool = False
    host_network: bool = False
    results_pvc: str | None = None
    pod_results_dir: str = "/tmp/gpuaccept-results"
    runtime: str = "torch-distributed"
    runtime_kind: str = "ClusterTrainingRuntime"
    trainer_version: str = TRAINER_LATEST
    master_port: int = 29500
    mpirun_args: list[str] = field(default_factory=list)
    kubeconfig: str | None = None
    context: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def runtime_patches(self) -> bool:
        """Whether the TrainJob API has ``runtimePatches`` (Trainer v2.2+) rather than ``podTemplateOverrides``."""
        return trainer_release(self.trainer_version) >= (2, 2)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "k8s options") -> K8sOptions:
        """Validate ``raw`` (flag values or a YAML mapping). Unknown keys are an error."""
        values = option_values(cls.__dataclass_fields__, raw, source, "k8s")
        # YAML may give the flag forms ("key=value:Effect", ["k=v"]) or the manifest forms (dicts).
        if "tolerations" in values:
            values["tolerations"] = [parse_toleration(t) if isinstance(t, str) else t
                                     for t in as_list(values["tolerations"], "k8s options", "tolerations")]
        for name, flag in (("node_selector", "--node-selector"), ("labels", "--label"),
                           ("resources", "--resource")):
            if name in values and not isinstance(values[name], dict):
                items = [str(i) for i in as_list(values[name], "k8s options", name)]
                values[name] = parse_resources(items, flag) if name == "resources" else parse_key_values(items, flag)
            elif name in values:
                values[name] = {str(k): str(v) for k, v in values[name].items()}
        for name in ("image_pull_secrets", "mpirun_args"):
            if name in values:
                values[name] = [str(i) for i in as_list(values[name], "k8s options", name)]
        for name in ("cpu", "memory", "shm_size"):
            if name in values:
                values[name] = str(values[name])
        for name in ("privileged", "host_network"):
            if name in values and not isinstance(values[name], bool):
                raise ConfigError(source, name, f"must be true or false, got {values[name]!r}")
        opts = cls(**values)
        opts.validate()
        return opts

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("--kind", str(self.kind), f"must be one of {', '.join(KINDS)}")
        check_dns_label(self.namespace, "--namespace")
        check_label_key(self.gpu_resource, "--gpu-resource")
        for name, qty in self.resources.items():
            check_label_key(name, "--resource")
            check_quantity(str(qty), "--resource")
        for flag, maybe_qty in (("--cpus", self.cpu), ("--memory", self.memory), ("--shm-size", self.shm_size)):
            if maybe_qty is not None:
                check_quantity(str(maybe_qty), flag)
        for tol in self.tolerations:
            if not isinstance(tol, dict) or tol.get("operator") not in ("Exists", "Equal"):
                raise ConfigError("--toleration", str(tol), "a toleration needs operator Exists or Equal")
            if tol.get("effect") not in (None, *EFFECTS):
                raise ConfigError("--toleration", str(tol), f"the effect must be one of {', '.join(EFFECTS)}")
        for key, value in self.node_selector.items():
            check_label_key(key, "--node-selector")
            check_label_value(value, "--node-selector")
        for key, value in self.labels.items():
            check_label_key(key, "--label")
            check_label_value(value, "--label")
        for secret in self.image_pull_secrets:
            check_dns_subdomain(secret, "--image-pull-secret")
        if self.image_pull_policy is not None and self.image_pull_policy not in PULL_POLICIES:
            raise ConfigError("--image-pull-policy", self.image_pull_policy,
                              f"must be one of {', '.join(PULL_POLICIES)}")
        for flag, maybe_name in (("--service-account", self.service_account),
                                 ("--priority-class", self.priority_class), ("--results-pvc", self.results_pvc),
                                 ("--training-runtime", self.runtime)):
            if maybe_name is not None:
                check_dns_subdomain(maybe_name, flag)
        if self.queue is not None:
            check_label_value(self.queue, "--queue")
        if self.runtime_kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
            raise ConfigError("--runtime-kind", self.runtime_kind, "must be ClusterTrainingRuntime or TrainingRuntime")
        trainer_release(self.trainer_version)
        if not self.pod_results_dir.startswith("/"):
            raise ConfigError("--pod-results-dir", self.pod_results_dir, "must be an absolute path in the container")
        if not isinstance(self.master_port, int) or not 1 <= self.master_port <= 65535:
            raise ConfigError("--master-port", str(self.master_port), "must be a TCP port (1-65535)")
        if self.kind == "trainjob" and self.priority_class:
            raise ConfigError("--priority-class", self.priority_class,
                              "a TrainJob cannot set a priority class (its runtime does); use another --kind")
        if self.mpirun_args and self.kind != "mpijob":
            raise ConfigError("--mpirun-arg", self.mpirun_args[0], "only applies to --kind mpijob")
