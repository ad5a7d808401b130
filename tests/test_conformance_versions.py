"""Manifest versions stay text: ``driver_version: 550.540`` or ``cuda_driver_version: 12.10`` written unquoted
keep their digits (YAML would make floats of them); a float given as data for a version is refused, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaccept.checks.conformance_manifest import judge, load_manifest, parse_manifest
from gpuaccept.errors import ConfigError
from gpuaccept.model import Status
from tests.helpers import gpuaccept


def _manifest(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"conformance: 1\nitems:\n{body}")
    return path


def test_unquoted_versions_keep_their_text(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path, "  driver_version: 550.540\n  cuda_driver_version: [12.10, 12.4]\n"
                                          "  gpu_count: 8\n  gpu.*.power_limit_w: {min: 650.5, max: 700}\n"))
    rules = {r.pattern: r for r in m.rules}
    assert rules["driver_version"].allowed == ("550.540",)
    assert rules["cuda_driver_version"].allowed == ("12.10", "12.4")
    assert rules["gpu_count"].allowed == (8,) and rules["gpu.*.power_limit_w"].minimum == 650.5
    items = {"driver_version": "550.54", "cuda_driver_version": "12.1", "gpu_count": 8, "gpu.0.power_limit_w": 700.0}
    # 550.54 is not 550.540, 12.1 is not 12.10: as numbers they would have passed
    assert [(f.status, f.item) for f in judge(items, m)] == [(Status.FAIL, "driver_version"),
                                                            (Status.FAIL, "cuda_driver_version")]
    assert judge({**items, "driver_version": "550.540", "cuda_driver_version": "12.10"}, m) == []


def test_a_float_given_as_data_for_a_version_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        parse_manifest({"conformance": 1, "items": {"driver_version": 550.54}}, "m.yaml")
    assert "items.driver_version.value" in str(err.value) and "quote it: '550.54'" in str(err.value)


def test_numbers_for_numeric_items_are_still_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"items.gpu_count.value: expected an integer, got 8.5"):
        load_manifest(_manifest(tmp_path, "  gpu_count: 8.5\n"))
    with pytest.raises(Exception, match="finite"):
        load_manifest(_manifest(tmp_path, "  gpu.*.power_limit_w: {min: .nan}\n"))


def test_cli_check_reads_unquoted_version(tmp_path: Path) -> None:
    r = gpuaccept("conformance", "check", str(_manifest(tmp_path, "  driver_version: 550.540\n")))
    assert r.returncode == 0 and "1 rule(s), valid" in r.stdout
