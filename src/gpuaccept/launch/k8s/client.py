"""The ``kubernetes`` Python client (the optional ``k8s`` extra), imported only when the API is called.

Shared by the launch backend and ``gpuaccept node-status``: the import with a one-line error when the
package is missing, the API client from a kubeconfig or the pod's service account, and one line from
an API error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from gpuaccept.errors import ConfigError, UsageError


class MissingClient(UsageError):
    """The ``kubernetes`` package is not installed."""


def kubernetes_module(why: str) -> Any:
    """The ``kubernetes`` package; MissingClient (a one-line UsageError starting with ``why``) without it."""
    try:
        import kubernetes
    except ImportError:
        raise MissingClient(f"{why} through the kubernetes Python client, which is not installed: "
                            "pip install 'gpuaccept[k8s]'") from None
    return kubernetes


def new_api_client(k8s: Any, kubeconfig: str | None, context: str | None) -> Any:
    """An ApiClient: the pod's service account when running in a pod with no kubeconfig given or found
    (``$KUBECONFIG``, ``~/.kube/config``), else the kubeconfig. ConfigError when neither loads."""
    try:
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ and not (
                os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().exists()):
            k8s.config.load_incluster_config()
            return k8s.client.ApiClient()
        return k8s.config.new_client_from_config(config_file=kubeconfig, context=context)
    except (k8s.config.ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ConfigError("--kubeconfig", where, f"cannot load a Kubernetes configuration: {exc}") from None


def status_message(exc: Any) -> str:
    """The ``message`` of the Status object in an ApiException's body, else a piece of the body."""
    try:
        body = json.loads(exc.body) if exc.body else {}
        return str(body.get("message", "")) if isinstance(body, dict) else ""
    except (ValueError, TypeError):
        return str(exc.body or "")[:300]
