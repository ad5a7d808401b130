"""Evaluate a ValidatingAdmissionPolicy on an admission request the way the API server does, with cel-python.

What is modelled (the parts the health DaemonSet's policy uses): ``matchConstraints.resourceRules`` (group,
resource, operation), ``matchConditions`` (all must be true, else the policy does not apply), ``variables``
(in order, each seeing the earlier ones as ``variables.NAME``), ``validations`` (each must be true; the first
false one gives the denial, with ``messageExpression``, else ``message``, else the failed expression), and
``failurePolicy: Fail`` (an expression that errors denies). Not modelled: the API server's static type and
cost checks of the expressions, parameters, audit annotations, and bindings' ``matchResources`` selectors.

The request is an AdmissionRequest as JSON (``operation``, ``resource``, ``userInfo`` with ``username`` and
``extra``); ``object`` is the object after the change. :func:`denied_message` gives the message the API server
returns (``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>'
denied request: <message>``).
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _env() -> Any:
    import celpy  # the dev extra's cel-python; imported here so that importing this module needs no CEL

    return celpy.Environment()


def _eval(expression: str, activation: dict[str, Any]) -> Any:
    import celpy

    env = _env()
    result = env.program(env.compile(expression)).evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def _matches(constraints: dict[str, Any], request: dict[str, Any]) -> bool:
    group = request["resource"].get("group", "")
    for rule in constraints.get("resourceRules", []):
        if (group in rule["apiGroups"] or "*" in rule["apiGroups"]) and \
                (request["resource"]["resource"] in rule["resources"] or "*" in rule["resources"]) and \
                (request["operation"] in rule["operations"] or "*" in rule["operations"]):
            return True
    return False


def denial(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any = None) -> str | None:
    """The denial message of ``policy`` for this request, or None when it admits it (or does not apply)."""
    import celpy
    from celpy import celtypes

    spec = policy["spec"]
    if not _matches(spec["matchConstraints"], request):
        return None
    act: dict[str, Any] = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                           "oldObject": celpy.json_to_cel(old)}
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    try:
        for condition in spec.get("matchConditions", []):
            if not bool(_eval(condition["expression"], act)):
                return None
        variables: dict[str, Any] = {}
        for var in spec.get("variables", []):
            act["variables"] = celtypes.MapType({celtypes.StringType(k): v for k, v in variables.items()})
            variables[var["name"]] = _eval(var["expression"], act)
        act["variables"] = celtypes.MapType({celtypes.StringType(k): v for k, v in variables.items()})
        for validation in spec["validations"]:
            if bool(_eval(validation["expression"], act)):
                continue
            if "messageExpression" in validation:
                return str(_eval(validation["messageExpression"], act))
            return str(validation.get("message") or f"failed expression: {validation['expression']}")
    except celpy.CELEvalError as exc:
        return f"expression error: {exc}" if fail_closed else None
    return None


def denied_message(policy: dict[str, Any], binding: dict[str, Any], resource: str, name: str, message: str) -> str:
    """The Status message of the API server for a denial (``admission.NewForbidden`` of the dispatcher's error)."""
    return (f'{resource} "{name}" is forbidden: ValidatingAdmissionPolicy \'{policy["metadata"]["name"]}\' with '
            f"binding '{binding['metadata']['name']}' denied request: {message}")


def node_update(username: str, node_name: str | None = None, extra: dict[str, list[str]] | None = None) -> \
        dict[str, Any]:
    """An AdmissionRequest for a patch (UPDATE) of a node by ``username``, whose token names ``node_name``."""
    info: dict[str, Any] = {"username": username, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if extra is not None or node_name is not None:
        info["extra"] = dict(extra or {})
        if node_name is not None:
            info["extra"]["authentication.kubernetes.io/node-name"] = [node_name]
    return {"operation": "UPDATE", "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "userInfo": info}
