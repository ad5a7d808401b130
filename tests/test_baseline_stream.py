"""``baseline create --history`` reads the history's node reports one at a time (issue 27: 1,024 runs in 5.6 GB)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.model import NodeReport
from gpuaccept.results import baseline_cli
from gpuaccept.results.baseline_learn import learn_baseline
from gpuaccept.results.history import open_store
from gpuaccept.results.store import Store
from tests.store_reports import cluster_report


def test_history_reports_are_read_lazily_and_learn_the_same_baseline(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    cr = cluster_report("c1", [f"n{i}" for i in range(5)])
    with open_store(url) as store:
        store.add_cluster_report(cr)
    reads: list[str] = []
    real = Store.get_run

    def counting(self: Store, run_id: str, host: str | None = None) -> Any:
        reads.append(run_id)
        return real(self, run_id, host)

    monkeypatch.setattr(Store, "get_run", counting)
    args = argparse.Namespace(db=url, host=None, since=None)
    with baseline_cli._from_history(args) as (count, stream):
        assert count == 5 and reads == []  # nothing read before it is asked for
        first = next(stream)
        assert isinstance(first, NodeReport) and len(reads) == 1
        streamed = learn_baseline([first, *stream], created="t")
    assert len(reads) == 5
    direct = learn_baseline([cr], created="t")
    assert streamed.to_yaml() == direct.to_yaml()
