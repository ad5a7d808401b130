"""A recorded stand-in for the Kubernetes API server, on 127.0.0.1, for the real ``kubernetes`` client.

No machine here reaches a cluster, so the k8s backend's submission is tested
against this HTTP server. It speaks the API's REST paths and answers as the
API server does for what the backend uses (responses modelled on the API
reference: created objects echoed with a uid, ``Status`` objects for errors,
``PodList`` for pods, plain text for logs), and it records every request so
the tests can check what was sent: method, path, query (``fieldValidation``,
``labelSelector``, ``propagationPolicy``), the bearer token and the JSON body.

Scripted behaviour: ``statuses[(plural, name)]`` is a list of ``status``
values returned one per GET (the last one repeats); ``pods`` and ``logs`` are
what the pod endpoints return; ``served`` lists the resources the "cluster"
has (a CRD that is not installed answers 404, as the real server does);
``reject[(method, plural)]`` forces an error status for such requests.

Nodes (cluster-scoped, ``/api/v1/nodes/NAME``; ``/api/v1/nodes`` lists them, refused with ``reject[("LIST",
"nodes")]``) answer GET and PATCH as the API server does for
``gpuaccept node-status``: ``nodes`` holds them; a PATCH must be an RFC 6902 JSON patch
(``application/json-patch+json``; other patch types answer 415 here, since nothing of ours sends
them), applied op by op with ``add``/``remove``/``replace``/``test`` semantics; a failing op answers 422
as the API server's patch handler does (``NewGenericServerResponse(StatusUnprocessableEntity)``), and
the result is validated as the server would (label values, one taint per key and effect: 422
Invalid). ``dryRun=All`` validates and stores nothing. ``before_patch`` callbacks run before a patch
is applied (another controller changing the node between our read and our patch). ``admission`` holds
(ValidatingAdmissionPolicy, binding) pairs that a node patch must pass, evaluated with CEL
(:mod:`tests.vap_cel`) on the request of ``user_info`` (who the token authenticates as), after the
object is validated, as the API server orders them; a denial answers 403 with the server's message.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "gpuaccept-test-token"
SERVED = {("", "v1", "services"), ("", "v1", "pods"), ("batch", "v1", "jobs"),
          ("jobset.x-k8s.io", "v1alpha2", "jobsets"), ("kubeflow.org", "v1", "pytorchjobs"),
          ("kubeflow.org", "v2beta1", "mpijobs"), ("trainer.kubeflow.org", "v1alpha1", "trainjobs")}


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeKubeAPI:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (group, plural, ns, name)
        self.statuses: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.pods: list[dict[str, Any]] = []
        self.logs: dict[tuple[str, str], str] = {}  # (pod, container) -> text
        self.served = set(SERVED)
        self.reject: dict[tuple[str, str], tuple[int, str, str]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.before_patch: list[Callable[[dict[str, Any]], None]] = []
        self.admission: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.user_info: dict[str, Any] = {"username": "tester", "groups": ["system:authenticated"]}
        self._lock = threading.Lock()
        self._uid = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _handle(self) -> None:
                api._dispatch(self)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeKubeAPI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}],
        }))
        return path

    def calls(self, method: str | None = None, contains: str = "") -> list[dict[str, Any]]:
        return [r for r in self.requests if (method is None or r["method"] == method) and contains in r["path"]]

    # ---- the server side -------------------------------------------------------------------------------------

    def _dispatch(self, h: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(h.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        record = {"method": h.command, "path": parsed.path, "query": query, "body": body,
                  "auth": h.headers.get("Authorization"), "content_type": h.headers.get("Content-Type")}
        with self._lock:
            self.requests.append(record)
            if record["auth"] != f"Bearer {TOKEN}":
                return self._send(h, 401, status_body(401, "Unauthorized", "Unauthorized"))
            try:
                code, payload = self._route(h.command, parsed.path, query, body)
            except KeyError as exc:
                code, payload = 404, status_body(404, "NotFound", f"{exc.args[0]} not found")
        self._send(h, code, payload)

    def _send(self, h: BaseHTTPRequestHandler, code: int, payload: Any) -> None:
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        h.send_response(code)
        h.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        if parts[:3] == ["api", "v1", "nodes"]:
            return self._node(method, parts[3:], query, body)
        if parts[:1] == ["api"]:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"]:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return 404, status_body(404, "NotFound", "the server could not find the requested resource")
        if len(rest) < 3 or rest[0] != "namespaces" or (group, version, rest[2]) not in self.served:
            return 404, status_body(404, "NotFound", "the server could not find the requested resource")
        ns, plural, tail = rest[1], rest[2], rest[3:]
        if (method, plural) in self.reject:
            code, reason, message = self.reject[(method, plural)]
            return code, status_body(code, reason, message)
        if plural == "pods":
            return self._pods(ns, tail, query)
        if method == "POST" and not tail:
            name = body["metadata"]["name"]
            key = (group, plural, ns, name)
            if key in self.objects:
                return 409, status_body(409, "AlreadyExists", f'{plural}.{group} "{name}" already exists')
            self._uid += 1
            obj = json.loads(json.dumps(body))
            obj["metadata"].update(uid=f"uid-{self._uid}", creationTimestamp="2026-01-01T00:00:00Z",
                                   resourceVersion=str(self._uid))
            self.objects[key] = obj
            return 201, obj
        if not tail:
            return 405, status_body(405, "MethodNotAllowed", "not supported here")
        name = tail[0]
        key = (group, plural, ns, name)
        if key not in self.objects:
            return 404, status_body(404, "NotFound", f'{plural}.{group} "{name}" not found')
        if method == "GET":
            obj = dict(self.objects[key])
            script = self.statuses.get((plural, name))
            if script:
                obj["status"] = script.pop(0) if len(script) > 1 else script[0]
            return 200, obj
        if method == "DELETE":
            del self.objects[key]
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "kind": plural}}
        return 405, status_body(405, "MethodNotAllowed", "not supported here")

    def _node(self, method: str, tail: list[str], query: dict[str, str], body: Any) -> tuple[int, Any]:
        if not tail and method == "GET":  # the NodeList (list nodes), as the API server answers it
            if ("LIST", "nodes") in self.reject:
                code, reason, message = self.reject[("LIST", "nodes")]
                return code, status_body(code, reason, message)
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                         "items": [copy.deepcopy(self.nodes[n]) for n in sorted(self.nodes)]}
        if len(tail) != 1:
            return 405, status_body(405, "MethodNotAllowed", "not supported here")
        name = tail[0]
        if (method, "nodes") in self.reject:
            code, reason, message = self.reject[(method, "nodes")]
            return code, status_body(code, reason, message)
        if name not in self.nodes:
            return 404, status_body(404, "NotFound", f'nodes "{name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(self.nodes[name])
        if method != "PATCH":
            return 405, status_body(405, "MethodNotAllowed", "not supported here")
        if self.requests[-1]["content_type"] != "application/json-patch+json":
            return 415, status_body(415, "UnsupportedMediaType", "only JSON patches are modelled by this fake")
        if not isinstance(body, list):
            return 400, status_body(400, "BadRequest", "a JSON patch is a list of operations")
        for hook in self.before_patch:
            hook(self.nodes[name])
        try:
            patched = apply_json_patch(self.nodes[name], body)
        except JsonPatchError as exc:
            return 422, status_body(422, "", str(exc))
        problems = node_problems(patched)
        if problems:
            return 422, status_body(422, "Invalid", f'Node "{name}" is invalid: {"; ".join(problems)}')
        for policy, binding in self.admission:
            from tests.vap_cel import denial, denied_message

            request = {"operation": "UPDATE", "resource": {"group": "", "version": "v1", "resource": "nodes"},
                       "userInfo": copy.deepcopy(self.user_info), "dryRun": query.get("dryRun") == "All"}
            message = denial(policy, request, patched, self.nodes[name])
            if message is not None:
                return 403, status_body(403, "Forbidden", denied_message(policy, binding, "nodes", name, message))
        if query.get("dryRun") != "All":
            self._uid += 1
            patched["metadata"]["resourceVersion"] = str(1000 + self._uid)
            self.nodes[name] = patched
        return 200, copy.deepcopy(patched)

    def _pods(self, ns: str, tail: list[str], query: dict[str, str]) -> tuple[int, Any]:
        if not tail:
            wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if kv)
            items = [p for p in self.pods if p["metadata"].get("namespace", "default") == ns and
                     all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                         "items": items}
        pod = tail[0]
        if tail[1:] == ["log"]:
            container = query.get("container", "")
            if (pod, container) not in self.logs:
                return 400, status_body(400, "BadRequest",
                                        f'container "{container}" in pod "{pod}" is waiting to start')
            text = self.logs[(pod, container)]
            if "tailLines" in query:
                text = "\n".join(text.splitlines()[-int(query["tailLines"]):]) + "\n"
            return 200, text
        raise KeyError(f'pods "{pod}"')


def pod(name: str, labels: dict[str, str], node: str, phase: str = "Succeeded", namespace: str = "default",
        waiting: str | None = None) -> dict[str, Any]:
    """A pod as the API lists it (the fields the backend reads)."""
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": "node", "state": {"waiting": {"reason": waiting,
                                                                               "message": "Back-off pulling image"}}}]
    spec: dict[str, Any] = {"containers": [{"name": "node"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec, "status": status}


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node as the API returns it (the fields node-status reads and writes, and some it must leave)."""
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                            "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
    if taints is not None:
        spec["taints"] = [dict(t) for t in taints]
    return {"kind": "Node", "apiVersion": "v1", "metadata": meta, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


class JsonPatchError(ValueError):
    pass


def _tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise JsonPatchError(f"invalid JSON pointer {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for t in tokens[:-1]:
        if isinstance(cur, dict) and t in cur:
            cur = cur[t]
        elif isinstance(cur, list) and t.isdigit() and int(t) < len(cur):
            cur = cur[int(t)]
        else:
            raise JsonPatchError(f"missing path: /{'/'.join(tokens)}")
    return cur


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 on a copy of ``doc`` (add, remove, replace, test: what node-status sends)."""
    out = copy.deepcopy(doc)
    for op in ops:
        kind, tokens = op.get("op"), _tokens(op.get("path", ""))
        parent, last = _parent(out, tokens), tokens[-1]
        if kind == "test":
            if isinstance(parent, dict):
                have = parent.get(last, JsonPatchError)
            else:
                have = parent[int(last)] if last.isdigit() and int(last) < len(parent) else JsonPatchError
            if have != op.get("value"):
                raise JsonPatchError(f"testing value /{'/'.join(tokens)} failed")
        elif kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind in ("remove", "replace"):
            if isinstance(parent, dict):
                if last not in parent:
                    raise JsonPatchError(f"{kind} operation does not apply: doc is missing key: {last}")
                if kind == "remove":
                    del parent[last]
                else:
                    parent[last] = copy.deepcopy(op["value"])
            else:
                i = int(last)
                if i >= len(parent):
                    raise JsonPatchError(f"{kind} operation does not apply: index {i} out of range")
                if kind == "remove":
                    parent.pop(i)
                else:
                    parent[i] = copy.deepcopy(op["value"])
        else:
            raise JsonPatchError(f"unexpected kind: {kind}")
    return out


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def node_problems(n: dict[str, Any]) -> list[str]:
    """What the API server's node validation refuses, for the fields node-status writes."""
    out = []
    for v in (n["metadata"].get("labels") or {}).values():
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
            out.append(f"metadata.labels: Invalid value: {v!r}")
    annotations = n["metadata"].get("annotations") or {}
    if not all(isinstance(v, str) for v in annotations.values()):
        out.append("metadata.annotations: values must be strings")
    elif sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        out.append("metadata.annotations: Too long: must have at most 262144 bytes")
    seen = set()
    for i, t in enumerate(n.get("spec", {}).get("taints") or []):
        if t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            out.append(f"spec.taints[{i}].effect: Unsupported value: {t.get('effect')!r}")
        key = (t.get("key"), t.get("effect"))
        if key in seen:
            out.append(f"spec.taints[{i}]: Duplicate value: taints must be unique by key and effect pair")
        seen.add(key)
    return out
