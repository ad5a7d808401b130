"""Validate Kubernetes manifests the way the API server's strict field validation does.

- Built-in kinds (Service, Job; ServiceAccount, ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy,
  its binding and DaemonSet of the health DaemonSet) with ``kubernetes-validate`` in strict mode.
- Custom resources against the openAPIV3Schema of their CRD
  (``tests/data/k8s-schemas``, see its README), made strict by
  :func:`strict_schema`: jsonschema lets undeclared fields through because
  these schemas do not set ``additionalProperties``, while the API server
  rejects them under ``fieldValidation=Strict``.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parent / "data" / "k8s-schemas"
CRD_FILES = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_v1alpha2_JobSet.json",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_v1_PyTorchJob.json",
    ("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_v2beta1_MPIJob.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_v1alpha1_TrainJob.json",
}
BUILTIN = {("v1", "Service"), ("batch/v1", "Job"), ("v1", "ServiceAccount"), ("apps/v1", "DaemonSet"),
           ("batch/v1", "CronJob"), ("scheduling.k8s.io/v1", "PriorityClass"),
           ("rbac.authorization.k8s.io/v1", "ClusterRole"), ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
           ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
           ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding")}
K8S_VERSIONS = ("1.31", "1.37")
"""Kubernetes versions the built-in kinds are validated against (backoffLimitPerIndex is GA in 1.33, beta before)."""

_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_LABEL_KEY = (r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
              r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
OBJECT_META: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": _DNS_LABEL},
        "labels": {"type": "object", "propertyNames": {"pattern": _LABEL_KEY},
                   "additionalProperties": {"type": "string", "pattern": _LABEL_VALUE}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
"""The top-level ``metadata`` of a custom resource: the API server validates it as an ObjectMeta."""


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a CRD's openAPIV3Schema in which undeclared fields are errors.

    - ``additionalProperties: false`` on every object schema that has neither
      ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields``
      (an object with no ``properties`` then accepts only ``{}``, as pruning
      would leave it);
    - ``x-kubernetes-int-or-string`` without a type becomes integer-or-string;
    - ``nullable: true`` also accepts null;
    - the top-level ``metadata`` is validated as an ObjectMeta.
    """
    out = _strict(copy.deepcopy(schema))
    out.setdefault("properties", {})["metadata"] = OBJECT_META
    return out


def _strict(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    for key in ("properties", "patternProperties"):
        if isinstance(node.get(key), dict):
            node[key] = {k: _strict(v) for k, v in node[key].items()}
    for key in ("items", "not"):
        if isinstance(node.get(key), dict):
            node[key] = _strict(node[key])
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _strict(node["additionalProperties"])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            node[key] = [_strict(v) for v in node[key]]
    if node.get("x-kubernetes-int-or-string") and "type" not in node and "anyOf" not in node:
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and isinstance(node.get("type"), str):
        node["type"] = [node["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if node.get("x-kubernetes-embedded-resource"):
        props = node.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    is_object = node.get("type") == "object" or "properties" in node
    if is_object and "additionalProperties" not in node and not preserve:
        node["additionalProperties"] = False
    return node


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    raw = json.loads((SCHEMAS / CRD_FILES[(api_version, kind)]).read_text())
    schema = strict_schema(raw)
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    cls = jsonschema.validators.Draft7Validator
    cls.check_schema(schema)
    return cls(schema)


def errors(doc: dict[str, Any]) -> list[str]:
    """Every validation error of ``doc`` as ``path: message``; empty when the API server would accept it."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in BUILTIN:
        import kubernetes_validate

        found = []
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                found.append(f"k8s {version}: {'.'.join(str(p) for p in exc.path)}: {exc.message}")
        return found
    if key not in CRD_FILES:
        return [f"no schema for {key}"]
    validator = crd_validator(str(key[0]), str(key[1]))
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
