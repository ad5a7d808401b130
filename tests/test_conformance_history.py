"""A node's configuration per run in the history (schema v5) and ``gpuaccept conformance changes``, on SQLite
and a real PostgreSQL server: what changed since the node last passed, by item and part, and the v4 migration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.conformance import evaluate_conformance
from gpuaccept.errors import InputError, UsageError
from gpuaccept.model import CheckResult, NodeReport, Status
from gpuaccept.results import migrations
from gpuaccept.results.config_history import changes, config_rows, node_configs
from gpuaccept.results.history import open_store
from tests.helpers import gpuaccept
from tests.pg_server import shared_server
from tests.store_reports import T0, node_report
from tests.test_conformance import CASES, node
from tests.test_store import write_old_history

DAY = 86400.0
BEEF = "GPU-00000000-0000-0000-0000-00000000beef"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hist' / 'history.db'}"
    return shared_server().new_database()


def _run(tmp_path: Path, run_id: str, day: int, case: dict[str, Any] | None = None, fail: bool = False) -> NodeReport:
    """gpu07's node report on day ``day``: the usual checks and a conformance check of the healthy node + ``case``."""
    rep = node_report("gpu07", run_id, T0 + day * DAY, fail=fail)
    out = evaluate_conformance(node(tmp_path / run_id, case), None)
    rep.checks.insert(0, CheckResult("conformance", out.status, out.reason, 1.0, details=out.details))
    rep.verdict = rep.decide()
    return rep


@pytest.fixture
def reports(tmp_path: Path) -> list[NodeReport]:
    """Day 0 passes; day 1 passes; day 2 another NIC firmware and GPU 3 replaced, memtest fails; day 3 fails too."""
    drift = {**CASES["cases"]["nic_firmware"], "nvml": {"gpus.3.uuid": BEEF}}
    return [_run(tmp_path, "d0", 0), _run(tmp_path, "d1", 1), _run(tmp_path, "d2", 2, drift, fail=True),
            _run(tmp_path, "d3", 3, CASES["cases"]["nic_firmware"], fail=True)]


def test_rows_are_keyed_by_part(reports: list[NodeReport]) -> None:
    conf = reports[0].checks[0]
    rows = {r[2]: r for r in config_rows("gpu07", [(conf.name, conf.details)])}
    ids = conf.details["conformance"]["ids"]
    assert rows["gpu.3.vbios_version"][:2] == ("gpu07", ids["gpu.3.uuid"])
    assert rows["nic.mlx5_4.fw_ver"][1] == ids["nic.mlx5_4.node_guid"] and rows["kernel"][1] == "node"
    assert json.loads(rows["gpu.0.persistence_mode"][3]) is True and rows["gpu.0.persistence_mode"][4] == 0
    assert rows["gpu.3.uuid"][1:] == (ids["gpu.3.uuid"], "gpu.3.uuid", json.dumps(ids["gpu.3.uuid"]), 1)
    assert config_rows("gpu07", [("env", {})]) == []


def test_changes_since_the_last_pass(url: str, reports: list[NodeReport]) -> None:
    with open_store(url) as store:
        for rep in reports:
            store.add_node_report(rep)
        assert [c.run_id for c in node_configs(store, "gpu07")] == ["d3", "d2", "d1", "d0"]
        result = changes(store, "gpu07")
        guid = reports[0].checks[0].details["conformance"]["ids"]["nic.mlx5_4.node_guid"]
        assert result["since"] == {"run_id": "d1", "started": reports[1].started, "verdict": "success"}
        assert result["latest"]["run_id"] == "d3" and result["latest"]["verdict"] == "failure"
        assert result["changes"] == [{"item": "nic.mlx5_4.fw_ver", "part": guid, "before": "28.39.1002",
                                      "after": "28.41.1000"}]
        assert result["parts"] == []  # GPU 3 came back on day 3
        since_run = changes(store, "gpu07", since="d2")
        assert since_run["changes"] == [] and [p["after"] for p in since_run["parts"]] == [
            reports[0].checks[0].details["conformance"]["ids"]["gpu.3.uuid"]]
        by_date = changes(store, "gpu07", since=reports[2].started)  # the newest at or before the date: d2
        assert by_date["since"]["run_id"] == "d2"
        with pytest.raises(InputError, match="no configuration stored at or before"):
            changes(store, "gpu07", since="2020-01-01")
        with pytest.raises(UsageError, match="not a run of gpu07 with a configuration, nor a date"):
            changes(store, "gpu07", since="no-such-run")
        with pytest.raises(InputError, match="gpu99: no configuration in the history"):
            changes(store, "gpu99")
        store.add_node_report(reports[2])  # stored again: its rows are replaced, not doubled
        assert len(node_configs(store, "gpu07")) == 4
        assert sum(1 for r in store.read_rows("SELECT run FROM config WHERE item = 'kernel'")) == 4


def test_no_passing_run_is_an_input_error(url: str, reports: list[NodeReport]) -> None:
    with open_store(url) as store:
        store.add_node_report(reports[3])
        with pytest.raises(InputError, match="no passing run with a configuration in the history; give --since"):
            changes(store, "gpu07")


def test_a_v4_history_is_migrated_with_its_configurations(url: str, reports: list[NodeReport]) -> None:
    write_old_history(url, reports, 4)
    with open_store(url) as store:
        assert store.schema_version() == migrations.LATEST  # v5 (config) and later
        assert [c.run_id for c in node_configs(store, "gpu07")] == ["d3", "d2", "d1", "d0"]
        assert changes(store, "gpu07")["changes"][0]["item"] == "nic.mlx5_4.fw_ver"


def test_the_command(tmp_path: Path, reports: list[NodeReport]) -> None:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(db) as store:
        for rep in reports[:3]:
            store.add_node_report(rep)
    r = gpuaccept("conformance", "changes", "gpu07", "--db", db)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (f"gpu07: 1 item(s) changed, 1 part(s) replaced since run d1 ({reports[1].started}, success); "
                        f"latest run d2 ({reports[2].started}, failure)")
    assert lines[1].startswith("  nic.mlx5_4.fw_ver [") and lines[1].endswith("]: 28.39.1002 -> 28.41.1000")
    assert lines[2].startswith("  part gpu.3.uuid: GPU-") and lines[2].endswith(f" -> {BEEF}")
    r = gpuaccept("conformance", "changes", "gpu07", "--db", db, "--json", "--since", "d0")
    assert r.returncode == 0 and json.loads(r.stdout)["since"]["run_id"] == "d0"
    r = gpuaccept("conformance", "changes", "gpu99", "--db", db)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "gpu99: no configuration in the history" in r.stderr
    assert reports[0].checks[0].status is Status.PASS


def test_nodes_of_a_cluster_report_keep_their_configuration(url: str, tmp_path: Path) -> None:
    from gpuaccept.model import ClusterReport, NodeEntry, NodeState

    def cluster(run_id: str, day: int, case: dict[str, Any] | None) -> ClusterReport:
        where = tmp_path / f"{run_id}-{len(list(tmp_path.glob(run_id + '*')))}"
        reps = [_run(where, f"{run_id}-{h}", day, case if h == "b" else None) for h in ("a", "b")]
        for rep, host in zip(reps, ("gpu06", "gpu07"), strict=True):
            rep.host = host
        return ClusterReport(run_id, "slurm", reps[0].started, expected_nodes=2,
                             nodes=[NodeEntry(r.host, NodeState.REPORTED, r) for r in reps])

    with open_store(url) as store:
        store.add_cluster_report(cluster("c1", 0, None))
        store.add_cluster_report(cluster("c2", 1, CASES["cases"]["persistence_off"]))
        result = changes(store, "gpu07", since="c1-b")
        assert [(c["item"], c["before"], c["after"]) for c in result["changes"]] == [
            ("gpu.0.persistence_mode", True, False)]
        assert changes(store, "gpu06", since="c1-a")["changes"] == []
        store.add_cluster_report(cluster("c2", 1, None))  # the cluster stored again: its nodes' rows replaced
        assert changes(store, "gpu07", since="c1-b")["changes"] == []
        assert len(node_configs(store, "gpu07")) == 2
