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
"""

from __future__ import annotations

import json
import threading
import urllib.parse
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
