"""The per-SKU data file and its loader: contents, name matching, strict validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuaccept.errors import ConfigError
from gpuaccept.hw.sku import DTYPES, Sku, load_skus, match_sku, parse_skus

REQUIRED_IDS = ("h100_sxm", "h100_pcie", "h100_nvl", "h200_sxm", "a100_sxm4_40gb", "a100_sxm4_80gb",
                "a100_pcie_40gb", "a100_pcie_80gb", "l40s", "b200", "l4", "a10")

# Names as NVML / torch.cuda.get_device_name() report them.
REAL_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100_sxm",
    "NVIDIA H100 PCIe": "h100_pcie",
    "NVIDIA H100 NVL": "h100_nvl",
    "NVIDIA H200": "h200_sxm",
    "NVIDIA H200 NVL": "h200_nvl",
    "NVIDIA A100-SXM4-80GB": "a100_sxm4_80gb",
    "NVIDIA A100-SXM4-40GB": "a100_sxm4_40gb",
    "NVIDIA A100-PCIE-40GB": "a100_pcie_40gb",
    "NVIDIA A100 80GB PCIe": "a100_pcie_80gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA B200": "b200",
    "NVIDIA L4": "l4",
    "NVIDIA A10": "a10",
}


def test_every_required_sku_loads_with_sane_values() -> None:
    skus = load_skus()
    assert set(REQUIRED_IDS) <= set(skus)
    for sku in skus.values():
        assert isinstance(sku, Sku)
        assert sku.memory_gib > 10 and sku.memory_bandwidth_gbs > 100 and sku.max_power_w > 50
        assert sku.pcie_gen in (4, 5) and sku.pcie_width == 16
        assert set(sku.peak) <= set(DTYPES)
        for dtype in ("fp32", "tf32", "fp16", "bf16"):
            assert (sku.peak_tflops(dtype) or 0) > 0, (sku.id, dtype)
        # dense tensor-core figures keep the datasheet ratios: tf32 = bf16 / 2 = fp16 / 2, fp8 = 2 x bf16
        bf16 = sku.peak_tflops("bf16") or 0.0
        assert sku.peak_tflops("fp16") == pytest.approx(bf16, rel=0.01)
        assert sku.peak_tflops("tf32") == pytest.approx(bf16 / 2, rel=0.02)  # L40S: 183 vs 362.05
        fp8 = sku.peak_tflops("fp8")
        if sku.compute_capability >= (8, 9):
            assert fp8 == pytest.approx(2 * bf16, rel=0.02), sku.id
        else:
            assert fp8 is None, f"{sku.id} (cc {sku.compute_capability}) cannot run fp8"
        for family in ("gemm", "gemm_bf16", "gemm_fp8", "memory_d2d", "pcie"):
            assert 0 < sku.pass_fraction(family) <= 1


def test_known_spec_values() -> None:
    skus = load_skus()
    h100 = skus["h100_sxm"]
    assert h100.peak_tflops("bf16") == pytest.approx(989.4)
    assert h100.peak_tflops("fp8") == pytest.approx(1978.9)
    assert h100.memory_bandwidth_gbs == 3350 and h100.nvlink_gbs == 900 and h100.max_power_w == 700
    assert skus["a100_sxm4_80gb"].peak_tflops("bf16") == 312.0
    assert skus["a100_sxm4_80gb"].memory_bandwidth_gbs == 2039
    assert skus["a100_sxm4_40gb"].memory_bandwidth_gbs == 1555
    assert skus["h200_sxm"].memory_bandwidth_gbs == 4800
    assert skus["l40s"].nvlink_gbs is None


@pytest.mark.parametrize(("gpu_name", "sku_id"), sorted(REAL_NAMES.items()))
def test_real_names_match(gpu_name: str, sku_id: str) -> None:
    sku = match_sku(gpu_name)
    assert sku is not None and sku.id == sku_id


@pytest.mark.parametrize("gpu_name", ["NVIDIA A10G", "NVIDIA L40", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090",
                                      "NVIDIA A100", "", "cpu"])
def test_unknown_or_ambiguous_names_do_not_match(gpu_name: str) -> None:
    assert match_sku(gpu_name) is None


@pytest.mark.parametrize("gpu_name", ["NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                                      "NVIDIA H100 80GB HBM3 MIG 7g.80gb", "NVIDIA H200 MIG 1g.18gb"])
def test_mig_instances_match_no_sku(gpu_name: str) -> None:
    """A MIG slice has a share of the GPU's SMs and bandwidth: the whole GPU's peaks must not judge it."""
    assert match_sku(gpu_name.replace(" MIG", "").rsplit(" ", 1)[0]) is not None  # the parent GPU is known
    assert match_sku(gpu_name) is None


def test_matching_ignores_case_and_separators() -> None:
    sku = match_sku("nvidia a100_sxm4-80gb")
    assert sku is not None and sku.id == "a100_sxm4_80gb"
    assert match_sku("NVIDIA  H100   NVL") is not None


def test_pass_fraction_falls_back_to_family_prefix_and_sku_overrides() -> None:
    skus = load_skus()
    assert skus["h100_sxm"].pass_fraction("gemm_bf16") == skus["h100_sxm"].pass_fraction("gemm") == 0.6
    assert skus["h100_sxm"].pass_fraction("gemm_fp8") == 0.5
    assert skus["l4"].pass_fraction("gemm_bf16") == 0.45
    with pytest.raises(KeyError):
        skus["h100_sxm"].pass_fraction("no_such_family")


def test_pcie_bandwidth() -> None:
    skus = load_skus()
    assert skus["h100_sxm"].pcie_bandwidth_gbs() == pytest.approx(63.0, rel=0.01)
    assert skus["a100_sxm4_80gb"].pcie_bandwidth_gbs() == pytest.approx(31.5, rel=0.01)


# --------------------------------------------------------------------------- strict validation


def _minimal() -> dict[str, Any]:
    return {
        "version": 1,
        "defaults": {"pass_fractions": {"gemm": 0.6}},
        "skus": [{
            "id": "x100", "name": "X100", "source": "test", "match": ["X100"], "compute_capability": "9.0",
            "memory_gib": 80, "peak_tflops": {"bf16": 100.0}, "memory_bandwidth_gbs": 1000,
            "pcie": {"gen": 5, "width": 16}, "nvlink_gbs": None, "max_power_w": 300,
        }],
    }


def _write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "skus.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_minimal_file_loads(tmp_path: Path) -> None:
    skus = load_skus(_write(tmp_path, _minimal()))
    assert list(skus) == ["x100"]
    assert skus["x100"].peak_tflops("bf16") == 100.0 and skus["x100"].peak_tflops("fp8") is None
    assert match_sku("Vendor X100", skus) is skus["x100"]


def test_fp64_vector_peak_is_optional_and_read_as_a_number(tmp_path: Path) -> None:
    doc = _minimal()
    assert load_skus(_write(tmp_path, doc))["x100"].fp64_vector_tflops is None
    doc["skus"][0]["fp64_vector_tflops"] = 30
    assert load_skus(_write(tmp_path, doc))["x100"].fp64_vector_tflops == 30.0


def test_copy_reference_figures_are_optional_numbers(tmp_path: Path) -> None:
    doc = _minimal()
    x = load_skus(_write(tmp_path, doc))["x100"]
    assert x.p2p_gbs is None and x.h2d_gbs is None
    doc["skus"][0].update({"p2p_gbs": 390, "h2d_gbs": 52})
    x = load_skus(_write(tmp_path, doc))["x100"]
    assert (x.p2p_gbs, x.h2d_gbs) == (390.0, 52.0)
    doc["skus"][0]["h2d_gbs"] = "fast"
    with pytest.raises(ConfigError, match="h2d_gbs"):
        load_skus(_write(tmp_path, doc))
    packaged = load_skus()
    assert packaged["h100_sxm"].h2d_gbs == 52 and packaged["h200_sxm"].h2d_gbs == 52
    assert packaged["h100_sxm"].pass_fraction("h2d") == 0.92 and packaged["h100_sxm"].p2p_gbs is None


def test_packaged_file_loaded_by_path_equals_default(tmp_path: Path) -> None:
    from importlib import resources

    text = resources.files("gpuaccept").joinpath("data", "skus.yaml").read_text(encoding="utf-8")
    path = tmp_path / "copy.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_skus(path) == load_skus()


@pytest.mark.parametrize(("mutate", "key"), [
    (lambda d: d["skus"][0].update(colour="green"), "skus[0].colour"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["skus"][0].update(memory_gib="eighty"), "skus[0].memory_gib"),
    (lambda d: d["skus"][0].update(memory_gib=True), "skus[0].memory_gib"),
    (lambda d: d["skus"][0].update(memory_gib=-1), "skus[0].memory_gib"),
    (lambda d: d["skus"][0]["peak_tflops"].update(fp4=9000), "skus[0].peak_tflops.fp4"),
    (lambda d: d["skus"][0]["peak_tflops"].update(bf16="fast"), "skus[0].peak_tflops.bf16"),
    (lambda d: d["skus"][0].pop("max_power_w"), "skus[0].max_power_w"),
    (lambda d: d["skus"][0]["pcie"].update(gen=9), "skus[0].pcie.gen"),
    (lambda d: d["skus"][0]["pcie"].update(lanes=16), "skus[0].pcie.lanes"),
    (lambda d: d["skus"][0].update(match="X100"), "skus[0].match"),
    (lambda d: d["skus"][0].update(compute_capability=9.0), "skus[0].compute_capability"),
    (lambda d: d["skus"][0].update(id="X-100"), "skus[0].id"),
    (lambda d: d["skus"][0].update(pass_fractions={"gemm": 1.5}), "skus[0].pass_fractions.gemm"),
    (lambda d: d["defaults"]["pass_fractions"].update(pcie="0.7"), "defaults.pass_fractions.pcie"),
    (lambda d: d["skus"].append(dict(d["skus"][0])), "skus[1].id"),
    (lambda d: d["skus"].append({**d["skus"][0], "id": "x200"}), "skus[1].match"),
    (lambda d: d.update(skus=[]), "skus"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d["skus"][0].update(nvlink_all_pairs="yes"), "skus[0].nvlink_all_pairs"),
    (lambda d: d["skus"][0].update(nvlink_all_pairs=True), "skus[0].nvlink_all_pairs"),  # no nvlink_gbs
    (lambda d: d["skus"][0].update(fp64_vector_tflops="fast"), "skus[0].fp64_vector_tflops"),
    (lambda d: d["skus"][0].update(fp64_vector_tflops=0), "skus[0].fp64_vector_tflops"),
])
def test_malformed_file_raises_config_error_naming_the_key(tmp_path: Path, mutate: Any, key: str) -> None:
    doc = _minimal()
    mutate(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ConfigError) as info:
        load_skus(path)
    assert info.value.key == key
    assert info.value.source == str(path)
    assert key in str(info.value)


def test_invalid_yaml_and_missing_file_raise_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("skus: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_skus(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_skus(tmp_path / "absent.yaml")


def test_most_specific_pattern_wins_and_ties_match_nothing() -> None:
    doc = _minimal()
    base = doc["skus"][0]
    doc["skus"] = [
        {**base, "id": "plain", "match": ["X100"]},
        {**base, "id": "nvl", "match": ["X100 NVL"]},
        {**base, "id": "pcie", "match": ["X100 PCIE"]},
        {**base, "id": "excluded", "match": ["X100 FAST SLOW"], "exclude": ["SLOW"]},
    ]
    skus = parse_skus(doc, "test")
    assert match_sku("Vendor X100", skus) is skus["plain"]
    assert match_sku("Vendor X100 NVL", skus) is skus["nvl"]
    assert match_sku("Vendor X100-PCIe", skus) is skus["pcie"]
    assert match_sku("Vendor X100 NVL PCIe", skus) is None  # two equally specific matches
    assert match_sku("Vendor X100 FAST SLOW", skus) is skus["plain"]  # excluded word
    assert match_sku("Vendor X1000", skus) is None  # whole words only
