"""The Helm chart ``charts/gpuaccept``, rendered and linted by a real Helm engine (the helm-python-sdk wheel).

The chart's JobSet must be the one ``gpuaccept launch k8s --kind jobset``
writes for the same inputs; :func:`test_chart_renders_what_the_launcher_writes`
runs both and compares them, modulo what only one side has (listed in
:data:`CHART_ONLY_LABELS` and :func:`test_ssh_port_is_the_only_addition`).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuaccept import __version__
from gpuaccept.launch.pod_script import NODE_SCRIPT
from tests.helpers import ROOT, gpuaccept
from tests.k8s_strict import errors
from tests.k8s_support import need_module

need_module("helm_python")

import helm_python  # noqa: E402  (after the skip-or-fail check)

CHART = ROOT / "charts" / "gpuaccept"
JOBSET_TEMPLATE = "gpuaccept/templates/jobset.yaml"

CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
CHART_ONLY_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
"""Labels Helm conventions add to the JobSet's own metadata; the launcher does not set them."""


def render(values: dict[str, Any], name: str = "gpuaccept", namespace: str = "default") -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt is not one)."""
    with helm_python.Chart.load(CHART) as chart:
        out = chart.render(values=values, name=name, namespace=namespace)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def launcher(tmp_path: Path, *argv: str) -> list[dict[str, Any]]:
    """What ``gpuaccept launch k8s --kind jobset ARGV --dry-run --output DIR`` writes."""
    out = tmp_path / "plan"
    proc = gpuaccept("launch", "k8s", "--kind", "jobset", *argv, "--dry-run", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    files = list(out.glob("*.yaml"))
    assert len(files) == 1, files
    return [d for d in yaml.safe_load_all(files[0].read_text()) if d]


def without_chart_only(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    docs = copy.deepcopy(docs)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == f"gpuaccept-{CHART_META['version']}"
        for key in CHART_ONLY_LABELS:
            del labels[key]
    return docs


def container(doc: dict[str, Any]) -> dict[str, Any]:
    pod = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    return dict(c)


# The same inputs twice: launcher flags and chart values (release name and namespace apart).
# Extra env is listed in name order: the chart's env is a map, rendered sorted by name.
CASES = {
    "minimal": (
        ["--nodes", "2", "--gpus-per-node", "8", "--image", "img", "--run-id", "r1"],
        {"nodes": 2, "gpusPerNode": 8, "image": "img", "runId": "r1"}, "gpuaccept", "default"),
    "full": (
        ["--name", "accept-h100", "--namespace", "gpu-team", "--nodes", "4", "--gpus-per-node", "8",
         "--image", "nvcr.io/nvidia/pytorch:25.01-py3", "--run-id", "20260101T000000Z-accept-h100-ab12",
         "--profile", "quick", "--checks", "compute,memory", "--env", "MSG=it's a \"test\"\nsecond line",
         "--env", "NCCL_DEBUG=INFO", "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration",
         "dedicated=ml:NoExecute", "--node-selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
         "--gpu-resource", "nvidia.com/mig-7g.80gb", "--time", "30"],
        {"name": "accept-h100", "nodes": 4, "gpusPerNode": 8, "image": "nvcr.io/nvidia/pytorch:25.01-py3",
         "runId": "20260101T000000Z-accept-h100-ab12", "profile": "quick", "checks": ["compute", "memory"],
         "env": {"MSG": "it's a \"test\"\nsecond line", "NCCL_DEBUG": "INFO"},
         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                         {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"}],
         "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
         "gpuResource": "nvidia.com/mig-7g.80gb", "timeLimitMinutes": 30}, "ignored-release", "gpu-team"),
    "digit-name-no-gpus-skip": (
        ["--name", "2026-acceptance", "--nodes", "3", "--gpus-per-node", "0", "--image", "img:1", "--run-id", "run.3",
         "--profile", "full", "--skip", "memtest,nbody", "--env", "GPUACCEPT_HOSTNAME=pinned"],
        {"nodes": 3, "gpusPerNode": 0, "image": "img:1", "runId": "run.3", "profile": "full",
         "skip": ["memtest", "nbody"], "env": {"GPUACCEPT_HOSTNAME": "pinned"}}, "2026-acceptance", "default"),
    "per-node-only": (
        ["--nodes", "2", "--gpus-per-node", "4", "--image", "img", "--run-id", "r2", "--per-node-only"],
        {"nodes": 2, "gpusPerNode": 4, "image": "img", "runId": "r2", "perNodeOnly": True}, "gpuaccept", "default"),
    "one-node": (
        ["--nodes", "1", "--gpus-per-node", "8", "--image", "img", "--run-id", "r3"],
        {"nodes": 1, "gpusPerNode": 8, "image": "img", "runId": "r3"}, "gpuaccept", "default"),
    "master-port": (
        ["--nodes", "2", "--gpus-per-node", "0", "--image", "img", "--run-id", "r4", "--master-port", "29611"],
        {"nodes": 2, "gpusPerNode": 0, "image": "img", "runId": "r4", "masterPort": 29611}, "gpuaccept", "default"),
}


@pytest.mark.parametrize("case", CASES)
def test_chart_renders_what_the_launcher_writes(tmp_path: Path, case: str) -> None:
    argv, values, release, namespace = CASES[case]
    ours = render(values, name=release, namespace=namespace)
    theirs = launcher(tmp_path, *argv)
    assert [d["kind"] for d in ours] == [d["kind"] for d in theirs] == ["JobSet"]
    assert without_chart_only(ours) == theirs


def test_ssh_port_is_the_only_addition() -> None:
    """``sshPort`` (the launcher has no such option) adds the container port and its env, nothing else."""
    base = {"image": "img", "runId": "r1", "nodes": 2}
    plain, with_ssh = render(base)[0], render({**base, "sshPort": 2222})[0]
    c = container(with_ssh)
    assert c.pop("ports") == [{"name": "ssh", "containerPort": 2222, "protocol": "TCP"}]
    assert c["env"].pop() == {"name": "GPUACCEPT_SSH_PORT", "value": "2222"}
    assert c == container(plain)
    rest_a, rest_b = copy.deepcopy(with_ssh), copy.deepcopy(plain)
    for doc in (rest_a, rest_b):
        doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"] = []
    assert rest_a == rest_b


# ---- strict validation, lint -----------------------------------------------------------------------------------

@pytest.mark.parametrize("values", [
    {"image": "img"},
    CASES["full"][1],
    {**CASES["digit-name-no-gpus-skip"][1], "sshPort": 22, "tolerations": [{"operator": "Exists"}]},
])
def test_rendered_manifests_pass_strict_validation(values: dict[str, Any]) -> None:
    docs = render(values, name="accept")
    assert docs
    for doc in docs:
        assert errors(doc) == [], (doc["kind"], errors(doc))


def test_lint_is_clean() -> None:
    report = helm_python.lint(CHART, values={"image": "img"}, strict=True)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report
    # Without an image the chart cannot be installed, and lint says so.
    bare = helm_python.lint(CHART)
    assert any("missing property 'image'" in e for e in bare["errors"]), bare


# ---- the schema refuses what the chart cannot use --------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ({"gpus": 8}, "additional properties 'gpus' not allowed"),
    ({"tolerations": [{"key": "gpu", "efect": "NoSchedule"}]}, "additional properties 'efect' not allowed"),
    ({"nodes": "four"}, "at '/nodes': got string, want integer"),
    ({"nodes": 0}, "at '/nodes': minimum"),
    ({"env": {"NCCL_IB_DISABLE": 1}}, "at '/env/NCCL_IB_DISABLE': got number, want string"),
    ({"env": {"BAD NAME": "x"}}, "BAD NAME"),
    ({"sshPort": 70000}, "at '/sshPort': maximum"),
    ({"profile": "fast"}, "at '/profile': value must be one of"),
    ({"checks": "compute"}, "at '/checks': got string, want array"),
    ({"nodeSelector": {"a": "bad value"}}, "at '/nodeSelector/a'"),
    ({"tolerations": [{"key": "gpu", "effect": "NoScheduled"}]}, "at '/tolerations/0/effect'"),
    ({"runId": "../escape"}, "at '/runId'"),
    ({"name": "My_Run"}, "at '/name'"),
    ({"image": None}, "at '/image'"),
])
def test_schema_violations_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as exc:
        render({"image": "img", **values})
    text = str(exc.value)
    assert "values don't meet the specifications of the schema" in text
    assert message in text, text


def test_missing_image_is_refused() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="missing property 'image'"):
        render({})


def test_schema_rejects_unknown_values_everywhere_and_values_yaml_covers_it() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert schema["properties"]["tolerations"]["items"]["additionalProperties"] is False
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    # Every value is documented in values.yaml, except the image, which has no default.
    assert sorted(defaults) == sorted(set(schema["properties"]) - {"image"})
    assert schema["required"] == ["image"]


@pytest.mark.parametrize("release, values, message", [
    ("my.release", {}, 'name "my.release" is not a DNS label'),
    ("ok", {"name": "j" * 48, "nodes": 100_000_000}, "at most 63"),
])
def test_template_errors_are_clear(release: str, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render({"image": "img", **values}, name=release)


# ---- names, run ids, the launcher script -----------------------------------------------------------------------

def test_default_run_id_is_made_like_the_launchers() -> None:
    [doc] = render({"image": "img", "nodes": 2}, name="accept")
    run_id = doc["metadata"]["labels"]["gpuaccept/run-id"]
    assert re.fullmatch(r"\d{8}T\d{6}Z-accept-[0-9a-f]{4}", run_id), run_id
    c = container(doc)
    assert c["command"][-2:] == ["--report-dir", f"/tmp/gpuaccept-results/{run_id}"]
    assert {"name": "GPUACCEPT_RESULTS_DIR", "value": f"/tmp/gpuaccept-results/{run_id}"} in c["env"]


def test_long_release_name_is_shortened_like_the_launcher(tmp_path: Path) -> None:
    long = "a" * 47 + "-" + "b" * 5  # 53 characters, Helm's longest release name; cut at 48, then the '-' goes
    [doc] = render({"image": "img", "runId": "r1"}, name=long)
    [theirs] = launcher(tmp_path, "--name", long, "--gpus-per-node", "8", "--image", "img", "--run-id", "r1")
    assert doc["metadata"]["name"] == theirs["metadata"]["name"] == "a" * 47


def test_launcher_file_is_the_launchers_node_script() -> None:
    """One source of truth: the chart's default entrypoint is the launcher's NODE_SCRIPT, byte for byte."""
    assert (CHART / "files" / "launcher.sh").read_text() == NODE_SCRIPT
    [doc] = render({"image": "img"})
    assert container(doc)["command"][:4] == ["sh", "-c", NODE_SCRIPT, "gpuaccept"]


def test_set_file_replaces_the_launcher_script(tmp_path: Path) -> None:
    script = tmp_path / "site-launcher.sh"
    script.write_text('# site wrapper\nnvidia-smi -L\nexec "$@"\n')
    values = {"image": "img", **helm_python.parse_set_file(f"launcher={script}")}
    [doc] = render(values)
    assert container(doc)["command"][:4] == ["sh", "-c", script.read_text(), "gpuaccept"]


def test_chart_version_follows_the_package() -> None:
    assert CHART_META["appVersion"] == __version__


def test_set_flags_as_helm_parses_them() -> None:
    """``--set`` types numbers (fine for nodes, refused for env); ``--set-string`` keeps strings."""
    values: dict[str, Any] = {}
    for expression in ("image=img", "nodes=4", "gpusPerNode=8", "checks={compute,memory}", "sshPort=2222"):
        values.update(helm_python.parse_set_string(expression))
    values.update(helm_python.parse_set_string_values("env.NCCL_IB_DISABLE=1"))
    [doc] = render(values)
    assert doc["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] == 4
    assert {"name": "NCCL_IB_DISABLE", "value": "1"} in container(doc)["env"]
    with pytest.raises(helm_python.HelmValuesError, match="got number, want string"):
        render({**values, **helm_python.parse_set_string("env.NCCL_IB_DISABLE=1")})
