"""node-problem-detector (NPD) custom-plugin monitor for gpuaccept: pure functions.

``gpuaccept node-status npd DIR`` writes two files:

- ``gpuaccept-monitor.json``: a custom plugin monitor config (NPD's ``--config.custom-plugin-monitor``).
  Its format is NPD's ``CustomPluginConfig`` (kubernetes/node-problem-detector,
  ``pkg/custompluginmonitor/types/config.go`` and ``types.go``; the example is
  ``config/custom-plugin-monitor.json``): ``plugin`` must be ``custom``; ``pluginConfig`` holds
  ``invoke_interval`` and ``timeout`` (Go durations), ``max_output_length`` and ``concurrency``;
  ``source`` names the monitor; ``conditions`` are the default states (``type``, ``reason``,
  ``message``) of the node conditions it sets; each rule has ``type`` (``permanent`` sets the
  condition named by ``condition``, ``temporary`` only emits an event), ``reason``, ``path`` of the
  plugin, ``args`` and a ``timeout`` that NPD refuses when it is longer than the global one.
- ``gpuaccept-plugin.sh``: the plugin. It runs ``gpuaccept node-status label --summary`` with the rule's
  ``args`` (``--profile quick``, or ``--report PATH`` to judge a report something else wrote) and
  maps its exit code to NPD's plugin protocol: 0 OK (healthy), 1 NonOK (a check failed), anything
  else Unknown (2: no verdict, bad input, nothing measured, interrupted). The first line of its
  output is the condition's message (NPD cuts it at ``max_output_length``).

One permanent rule only: NPD runs every rule's plugin itself, so a temporary rule next to it would
run the checks twice per interval. ``concurrency`` is 1 for the same reason. The plugin runs in
NPD's container: that image needs gpuaccept (and, for ``--profile``, the GPUs and torch).
"""

from __future__ import annotations

import re
from typing import Any

from gpuaccept.errors import ConfigError

CONFIG_FILE = "gpuaccept-monitor.json"
PLUGIN_FILE = "gpuaccept-plugin.sh"
SOURCE = "gpuaccept-custom-plugin-monitor"
CONDITION = "GpuacceptUnhealthy"
HEALTHY_REASON = "GpuacceptChecksPass"
PROBLEM_REASON = "GpuacceptChecksFail"
OK, NONOK, UNKNOWN = 0, 1, 2
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

PLUGIN_SCRIPT = """\
#!/bin/sh
# node-problem-detector custom plugin (written by gpuaccept node-status npd).
# Runs gpuaccept node-status label --summary with the rule's args and maps its exit code to NPD's
# plugin protocol: 0 OK (the node passed), 1 NonOK (a check failed), 2 Unknown (anything else:
# no verdict, bad input, nothing measured, interrupted). The first output line is the message.
out=$("${GPUACCEPT_BIN:-gpuaccept}" node-status label --summary "$@" 2>/dev/null)
rc=$?
line=$(printf '%s\\n' "$out" | head -n 1)
if [ -z "$line" ]; then
  line="gpuaccept node-status exited $rc with no verdict"
fi
printf '%s\\n' "$line"
case "$rc" in
  0) exit 0 ;;
  1) exit 1 ;;
  *) exit 2 ;;
esac
"""


def go_duration_s(text: str, flag: str) -> float:
    """Seconds in a Go duration (``30s``, ``10m``, ``1h30m``); ConfigError for anything Go would refuse."""
    if not _DURATION.match(text):
        raise ConfigError(flag, text, "a Go duration such as 30s, 10m or 1h30m")
    return sum(float(n) * _UNITS[u] for n, _frac, u in re.findall(r"([0-9]+(\.[0-9]+)?)(ns|us|µs|ms|s|m|h)", text))


def npd_config(plugin_path: str, args: list[str], *, interval: str = "30m", timeout: str = "10m",
               max_output_length: int = 200) -> dict[str, Any]:
    """The custom plugin monitor config: one permanent rule that sets condition :data:`CONDITION`."""
    if go_duration_s(interval, "--invoke-interval") <= 0:
        raise ConfigError("--invoke-interval", interval, "must be more than 0")
    limit = go_duration_s(timeout, "--timeout")
    if limit <= 0 or limit > go_duration_s(interval, "--invoke-interval"):
        raise ConfigError("--timeout", timeout, f"must be more than 0 and at most --invoke-interval ({interval}): "
                                                    "a run longer than the interval would overlap the next")
    if not plugin_path.startswith("/"):
        raise ConfigError("--plugin-path", plugin_path, "must be an absolute path in NPD's container")
    if not 1 <= max_output_length <= 4096:
        raise ConfigError("--npd-max-output", str(max_output_length), "1 to 4096 characters")
    return {
        "plugin": "custom",
        "pluginConfig": {"invoke_interval": interval, "timeout": timeout, "max_output_length": max_output_length,
                         "concurrency": 1, "enable_message_change_based_condition_update": False},
        "source": SOURCE,
        "metricsReporting": True,
        "conditions": [{"type": CONDITION, "reason": HEALTHY_REASON,
                        "message": "gpuaccept has not found a problem on this node"}],
        "rules": [{"type": "permanent", "condition": CONDITION, "reason": PROBLEM_REASON, "path": plugin_path,
                   "args": list(args), "timeout": timeout}],
    }
