"""NVLink error counters around a check's load: recorded NVML snapshots before and after, and a fake NVML.

``healthy_h100_sxm_8x.json`` is the node at rest; ``nvlink_errors_rising_after.json`` the same node after a
load during which cuda:6 link 3 gained 12 replays and 40 CRC flit errors and cuda:2 link 11 one recovery.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuaccept.checks.base import Outcome
from gpuaccept.checks.nvlink_watch import NvlinkWatch, node_reader
from gpuaccept.hw.nvlink_counters import diff_nvlink
from gpuaccept.hw.nvml import NvmlSnapshot, NvmlUnavailable, snapshot_from_dict
from gpuaccept.model import Metric, Status

DATA = Path(__file__).parent / "data" / "nvml"


def snap(name: str) -> NvmlSnapshot:
    return snapshot_from_dict(json.loads((DATA / f"{name}.json").read_text()))


def replay(*snaps: NvmlSnapshot) -> Any:
    """A reader that returns the given snapshots in turn (the before and after reads)."""
    it: Iterator[NvmlSnapshot] = iter(snaps)
    return lambda: next(it)


def passed() -> Outcome:
    return Outcome.passed("8 GPUs copied", [Metric("p2p_unidir_gbs", 380.0, "GB/s", device="cuda:0")])


def test_diff_names_each_rising_link() -> None:
    d = diff_nvlink(snap("healthy_h100_sxm_8x"), snap("nvlink_errors_rising_after"))
    assert sorted(r.describe() for r in d.rises) == [
        "cuda:2 link 11 recovery +1", "cuda:6 link 3 CRC flit +40", "cuda:6 link 3 replay +12"]
    assert d.not_read == [] and d.reset == [] and d.gone == []
    assert d.steady["cuda:0"] == {"nvlink_crc_flit_errors": 18, "nvlink_replay_errors": 18,
                                  "nvlink_recovery_errors": 18}
    assert "nvlink_replay_errors" not in d.steady["cuda:6"]


def test_rising_replay_fails_naming_gpu_and_link() -> None:
    watch = NvlinkWatch.start(replay(snap("healthy_h100_sxm_8x"), snap("nvlink_errors_rising_after")))
    out = watch.finish(passed())
    assert out.status is Status.FAIL
    assert out.reason.startswith("NVLink errors rose under load: ")
    assert "cuda:6 link 3 replay +12" in out.reason and "cuda:2 link 11 recovery +1" in out.reason
    assert out.reason.endswith("8 GPUs copied")
    by = {(m.name, m.device): m for m in out.metrics if m.name.startswith("nvlink_")}
    assert len(by) == 8 * 3  # every GPU and counter read in both snapshots
    replay6 = by[("nvlink_replay_errors_delta", "cuda:6")]
    assert replay6.value == 12 and replay6.tags == {"links": "3"}
    assert replay6.threshold is not None and replay6.threshold.op == "<=" and replay6.threshold.value == 0
    assert by[("nvlink_replay_errors_delta", "cuda:0")].value == 0
    assert {"device": "cuda:6", "link": 3, "counter": "nvlink_replay_errors", "delta": 12} in \
        out.details["nvlink_counters"]["rising"]


def test_steady_counters_pass_unchanged() -> None:
    healthy = snap("healthy_h100_sxm_8x")
    out = NvlinkWatch.start(replay(healthy, healthy)).finish(passed())
    assert out.status is Status.PASS and out.reason == "8 GPUs copied"
    deltas = [m for m in out.metrics if m.name.endswith("_errors_delta")]
    assert len(deltas) == 24 and all(m.value == 0 for m in deltas)
    assert out.details["nvlink_counters"]["rising"] == []


def test_unsupported_counters_are_not_read_not_failed() -> None:
    l40s = snap("unsupported_l40s_4x")
    out = NvlinkWatch.start(replay(l40s, l40s)).finish(passed())
    assert out.status is Status.PASS
    assert not [m for m in out.metrics if m.name.endswith("_errors_delta")]
    info = out.details["nvlink_counters"]
    assert len(info["not_read"]) == 4 * 3 and info["not_read"][0].startswith("cuda:0 CRC flit: ")
    assert info["summary"] == "not read: CRC flit, recovery, replay"


def test_cleared_counters_are_noted_not_risen() -> None:
    out = NvlinkWatch.start(replay(snap("nvlink_errors_rising_after"), snap("healthy_h100_sxm_8x"))).finish(passed())
    assert out.status is Status.PASS
    notes = " ".join(out.details["nvlink_counters"]["notes"])
    assert "cuda:6 link 3 replay 12 -> 0" in notes and "cleared" in notes


def test_nvml_missing_is_a_note() -> None:
    def broken() -> NvmlSnapshot:
        raise NvmlUnavailable("NVML not available: NVML Shared Library Not Found")

    out = NvlinkWatch.start(broken).finish(passed())
    assert out.status is Status.PASS
    assert out.details["nvlink_counters"]["notes"] == [
        "NVLink counters not read before the run: NVML not available: NVML Shared Library Not Found"]


def test_a_fail_stays_a_fail_and_an_error_is_not_turned() -> None:
    before, after = snap("healthy_h100_sxm_8x"), snap("nvlink_errors_rising_after")
    err = NvlinkWatch.start(replay(before, after)).finish(Outcome(Status.ERROR, "copy crashed"))
    assert err.status is Status.ERROR and "cuda:6 link 3 replay +12" in err.reason


def test_counters_read_through_nvml_rise_between_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real reader (:func:`gpuaccept.hw.nvml.read_snapshot`) against a fake NVML whose link 3 replay count
    rises while the "load" runs."""
    from tests.test_nvml import H100_SPEC, FakeNvml

    count = {"replay": 5}
    spec = dict(H100_SPEC)
    spec["nvmlDeviceGetNvLinkErrorCounter"] = lambda link, counter: (
        count["replay"] if counter == pynvml.NVML_NVLINK_ERROR_DL_REPLAY and link == 3 else 0)
    FakeNvml([spec]).install(monkeypatch)
    watch = NvlinkWatch.start(node_reader)
    count["replay"] += 7  # the load
    out = watch.finish(passed())
    assert out.status is Status.FAIL
    assert "cuda:0 link 3 replay +7" in out.reason
    # link 2 is down in the spec: never asked, so never compared
    assert out.details["nvlink_counters"]["rising"] == [
        {"device": "cuda:0", "link": 3, "counter": "nvlink_replay_errors", "delta": 7}]
