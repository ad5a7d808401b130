"""``gpuaccept node-status``'s I/O: the verdict (a report read, or the suite run in a child process) and the
node patch sent through the ``kubernetes`` client. The pure parts are in :mod:`.nodepatch`.

The suite runs as ``python -m gpuaccept run`` in a child process, as a user would run it: torch is
never imported here, and SIGTERM or SIGHUP sent to this process is passed on to the run, which stops
its checks and saves what it measured.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import IO, Any

from gpuaccept.errors import GpuacceptError, InputError, ReportWriteError, UsageError
from gpuaccept.health.nodepatch import NodeChange, json_patch
from gpuaccept.launch.k8s.client import kubernetes_module, status_message
from gpuaccept.model import NodeReport

JSON_PATCH = "application/json-patch+json"
REQUEST_TIMEOUT_S = 30
ATTEMPTS = 3
"""Reads and patches of a node whose taints changed between the two (HTTP 409/422 on our ``test``)."""


class NodeUpdateError(GpuacceptError):
    """The Kubernetes API refused the node's change or could not be reached (the verdict stands)."""


class SuiteInterrupted(GpuacceptError):
    """The suite run was stopped by a signal; nothing was decided."""


def node_name(given: str | None, environ: dict[str, str] | os._Environ[str]) -> str:
    """``--node``, else ``$NODE_NAME`` (the DaemonSet sets it from ``spec.nodeName``), else the host name."""
    import socket

    name = given or environ.get("NODE_NAME") or socket.gethostname()
    if not name or any(c.isspace() or c == "/" for c in name) or len(name) > 253:
        raise UsageError(f"--node {name!r}: not a Kubernetes node name")
    return name


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# ---- the verdict from a suite run -------------------------------------------------------------------------------

@dataclass
class SuiteRun:
    """What ``run_suite`` did: the report (None when none was written) and the run's exit code."""

    report: NodeReport | None
    returncode: int
    run_dir: Path


@contextlib.contextmanager
def _forwarding(child: subprocess.Popen[bytes]) -> Iterator[list[int]]:
    """SIGTERM and SIGHUP sent to us go to the child run; the list holds the signals seen."""
    seen: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s in old:
        signal.signal(s, forward)
    try:
        yield seen
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _out_fd(stream: IO[str]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's StringIO): inherit
        return None


def run_suite(suite_args: list[str], node: str, report_dir: Path | None) -> SuiteRun:
    """``gpuaccept run SUITE_ARGS`` in a child process, its output on our stderr, its report under
    ``report_dir`` (a temporary directory removed afterwards when None). Raises UsageError when the run
    refuses its options (exit 2), ReportWriteError when it could not write its report (exit 4),
    SuiteInterrupted on a signal."""
    with contextlib.ExitStack() as stack:
        base = report_dir if report_dir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuaccept-node-status-")))
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        run_id = f"{stamp}-{node.split('.')[0]}-health-{uuid.uuid4().hex[:4]}"
        argv = [sys.executable, "-m", "gpuaccept", "run", *suite_args, "--no-history", "--report-dir", str(base),
                "--run-id", run_id]
        env = dict(os.environ)
        env.setdefault("GPUACCEPT_HOSTNAME", node)
        sys.stderr.flush()
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=_out_fd(sys.stderr), env=env)
        with _forwarding(child) as seen:
            try:
                rc = child.wait()
            except KeyboardInterrupt:
                seen.append(int(signal.SIGINT))
                rc = child.wait()
        run_dir = base / run_id
        if seen or rc == 130:
            raise SuiteInterrupted(f"the suite run was interrupted (exit {rc}); the node is left as it is")
        if rc == 2:
            raise UsageError("the suite refused its options (exit 2, the reason is above); nothing was decided")
        if rc == 4:
            raise ReportWriteError(f"the suite could not write its report under {base} (exit 4); "
                                   "nothing was decided")
        report = _read_run(run_dir)
        return SuiteRun(report, rc, run_dir)


def _read_run(run_dir: Path) -> NodeReport | None:
    from gpuaccept.results.load import load_dir

    if not run_dir.is_dir():
        return None
    loaded = load_dir(run_dir)
    return loaded if isinstance(loaded, NodeReport) else None


def read_report(path: str) -> Any:
    """A node or cluster report from a ``report.json``/``cluster-report.json`` or a run directory."""
    from gpuaccept.results.load import load_dir, load_file

    p = Path(path).expanduser()
    if p.is_file():
        return load_file(p)
    if p.is_dir():
        return load_dir(p)
    raise InputError(f"--report {path}: no such file or directory")


# ---- the node patch ---------------------------------------------------------------------------------------------

def _node_json(core: Any, name: str) -> dict[str, Any]:
    import json

    resp = core.read_node(name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
    return dict(json.loads(resp.data))


def apply_change(api: Any, change: NodeChange, *, server_dry_run: bool = False) -> list[dict[str, Any]]:
    """Read the node, patch it to ``change`` (one JSON patch), and return the patch sent.

    ``server_dry_run`` sends it with ``dryRun=All``: the API server checks it, RBAC included, and
    stores nothing. A patch refused because the taints changed since the read (409, or 422 on the
    ``test``) is made again from a new read, :data:`ATTEMPTS` times in all. InputError when the node does
    not exist; NodeUpdateError for any other refusal or when the API cannot be reached.
    """
    k8s = kubernetes_module("node-status label --apply patches the node")
    core = k8s.client.CoreV1Api(api)
    ops: list[dict[str, Any]] = []
    for attempt in range(1, ATTEMPTS + 1):
        try:
            node = _node_json(core, change.node)
        except k8s.client.exceptions.ApiException as exc:
            if exc.status == 404:
                raise InputError(f"no node {change.node} in the cluster (see --node)") from None
            raise NodeUpdateError(f"reading node {change.node}: {_api_error(exc)}") from None
        except Exception as exc:  # urllib3 connection errors and the like
            raise NodeUpdateError(f"reading node {change.node}: cannot reach the Kubernetes API "
                                  f"({type(exc).__name__}: {exc})") from None
        ops = json_patch(node, change)
        try:
            core.patch_node(change.node, ops, dry_run="All" if server_dry_run else None, _content_type=JSON_PATCH,
                            _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
            return ops
        except k8s.client.exceptions.ApiException as exc:
            raced = exc.status in (409, 422) and any(op["op"] == "test" for op in ops)
            if raced and attempt < ATTEMPTS:
                continue
            more = f" ({attempt} attempts: its taints kept changing)" if raced else ""
            raise NodeUpdateError(f"patching node {change.node}: {_api_error(exc)}{more}") from None
        except Exception as exc:
            raise NodeUpdateError(f"patching node {change.node}: cannot reach the Kubernetes API "
                                  f"({type(exc).__name__}: {exc})") from None
    raise AssertionError("unreachable")  # pragma: no cover


def list_nodes(api: Any) -> dict[str, Any]:
    """Every Node of the cluster (``GET /api/v1/nodes``, a ``NodeList``): what the circuit breaker counts.
    NodeUpdateError when the API refuses (the service account needs ``list`` on nodes) or cannot be reached."""
    import json

    k8s = kubernetes_module("node-status counts the cluster's tainted nodes")
    try:
        resp = k8s.client.CoreV1Api(api).list_node(_preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
        return dict(json.loads(resp.data))
    except k8s.client.exceptions.ApiException as exc:
        raise NodeUpdateError(f"listing nodes: {_api_error(exc)}") from None
    except Exception as exc:
        raise NodeUpdateError(f"listing nodes: cannot reach the Kubernetes API ({type(exc).__name__}: {exc})") from None


def patch_ops(api: Any, name: str, ops: list[dict[str, Any]]) -> None:
    """Send one JSON patch to node ``name``; NodeUpdateError when refused."""
    k8s = kubernetes_module("node-status patches nodes")
    try:
        k8s.client.CoreV1Api(api).patch_node(name, ops, _content_type=JSON_PATCH, _preload_content=False,
                                             _request_timeout=REQUEST_TIMEOUT_S)
    except k8s.client.exceptions.ApiException as exc:
        raise NodeUpdateError(f"patching node {name}: {_api_error(exc)}") from None
    except Exception as exc:
        raise NodeUpdateError(f"patching node {name}: cannot reach the Kubernetes API "
                              f"({type(exc).__name__}: {exc})") from None


def _api_error(exc: Any) -> str:
    status = getattr(exc, "status", None)
    text = status_message(exc) or str(getattr(exc, "reason", "")) or "error"
    if status == 403 and "ValidatingAdmissionPolicy" in text:
        text += " (the health DaemonSet's policy lets its service account patch only the node its pod runs on)"
    elif status == 403:
        text += " (the service account needs get and patch on nodes: see node-status daemonset)"
    return f"HTTP {status}: {text}" if status else text
