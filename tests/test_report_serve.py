"""``gpuaccept serve-metrics``: a real server process on a loopback port, scraped over HTTP."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuaccept.report.prometheus import render_prometheus
from gpuaccept.report.serve import DirSource, ReportCollector
from tests.helpers import ROOT, cli_env, gpuaccept
from tests.report_data import CLUSTER, NODE_CPU, cluster, node_cpu, write_json

STARTUP_S = 60.0


@contextmanager
def serving(*args: str) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """``gpuaccept serve-metrics --port 0 --bind 127.0.0.1 ARGS`` running; yields (port, process)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuaccept", "serve-metrics", "--port", "0", "--bind",
                             "127.0.0.1", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(), cwd=ROOT)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + STARTUP_S
        port = None
        seen = ""
        while port is None:
            left = deadline - time.monotonic()
            assert left > 0, f"serve-metrics did not start: {seen}"
            ready, _, _ = select.select([proc.stderr], [], [], left)
            line = proc.stderr.readline() if ready else ""
            if not line and proc.poll() is not None:
                raise AssertionError(f"serve-metrics exited {proc.returncode}: {seen}{proc.stderr.read()}")
            seen += line
            m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", line)
            if m:
                port = int(m.group(1))
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def scrape(port: int) -> dict[str, list[Sample]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def one(fams: dict[str, list[Sample]], name: str) -> float:
    (sample,) = fams[name]
    return sample.value


def _run_dir(root: Path, report_file: Path, name: str | None = None, file_name: str = "report.json") -> Path:
    data = report_file.read_text()
    d = root / (name or report_file.stem)
    d.mkdir(parents=True)
    (d / file_name).write_text(data)
    (d / "logs").mkdir()
    return d


def test_serves_the_newest_reports_from_a_directory(tmp_path: Path) -> None:
    reports = tmp_path / "gpuaccept-reports"
    _run_dir(reports, NODE_CPU, "20261122T020807Z-vm-fadd")
    _run_dir(reports, CLUSTER, "20261120T031500Z-slurm-4812", "cluster-report.json")
    with serving("--from", str(reports)) as (port, proc):
        fams = scrape(port)
        assert one(fams, "gpuaccept_exporter_up") == 1
        assert one(fams, "gpuaccept_exporter_reports") == 5
        assert one(fams, "gpuaccept_exporter_unreadable_reports") == 0
        hosts = {s.labels["host"] for s in fams["gpuaccept_run_info"]}
        assert hosts == {"vm", "gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"}
        assert {s.labels["run_id"] for s in fams["gpuaccept_cluster_run_info"]} == {"20261120T031500Z-slurm-4812"}
        copy = {s.labels["metric"]: s.value for s in fams["gpuaccept_metric"] if s.labels["host"] == "vm"}
        assert copy["stream_copy_gbs"] == node_cpu().checks[2].metrics[0].value

        # a newer run on host vm, and a broken report file: read afresh at the next scrape
        newer = node_cpu()
        newer.run_id = "20261123T090000Z-vm-beef"
        newer.started, newer.finished = "2026-11-23T09:00:00Z", "2026-11-23T09:00:09Z"
        newer.checks[2].metrics[0].value = 31.25
        d = reports / newer.run_id
        d.mkdir()
        write_json(d / "report.json", newer)
        broken = reports / "20261123T100000Z-vm-dead"
        broken.mkdir()
        (broken / "report.json").write_text('{"schema_version": 1, "run_id": "trunc')
        fams = scrape(port)
        assert one(fams, "gpuaccept_exporter_up") == 1
        assert one(fams, "gpuaccept_exporter_unreadable_reports") == 1
        vm = {s.labels["metric"]: s.value for s in fams["gpuaccept_metric"] if s.labels["host"] == "vm"}
        assert vm["stream_copy_gbs"] == 31.25
        assert {s.labels["run_id"] for s in fams["gpuaccept_run_info"] if s.labels["host"] == "vm"} == \
            {newer.run_id}
        status = {(s.labels["host"], s.labels["check"], s.labels["status"]): s.value
                  for s in fams["gpuaccept_check_status"]}
        assert status[("gpu-node-03", "compute", "fail")] == 1

        # the run directory disappears: its host's next-newest run is served again
        shutil.rmtree(d)
        fams = scrape(port)
        vm = {s.labels["metric"]: s.value for s in fams["gpuaccept_metric"] if s.labels["host"] == "vm"}
        assert vm["stream_copy_gbs"] == node_cpu().checks[2].metrics[0].value

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert proc.stderr is not None
        assert "20261123T100000Z-vm-dead/report.json: not valid JSON" in proc.stderr.read()


def test_serves_the_history_store(tmp_path: Path) -> None:
    from gpuaccept.results.history import open_store

    url = f"sqlite:///{tmp_path / 'history.db'}"
    store = open_store(url)
    try:
        store.add_cluster_report(cluster())
        older = node_cpu()
        store.add_node_report(older)
        newer = node_cpu()
        newer.run_id, newer.started = "20261123T090000Z-vm-beef", "2026-11-23T09:00:00Z"
        newer.checks[1].metrics[0].value = 0.5
        store.add_node_report(newer)
    finally:
        store.close()
    with serving("--db", url) as (port, _):
        fams = scrape(port)
    assert one(fams, "gpuaccept_exporter_up") == 1
    info = {s.labels["host"]: s.labels["run_id"] for s in fams["gpuaccept_run_info"]}
    assert info["vm"] == "20261123T090000Z-vm-beef" and len(info) == 5
    vm = {s.labels["metric"]: s.value for s in fams["gpuaccept_metric"] if s.labels["host"] == "vm"}
    assert vm["gemm_fp32_tflops"] == 0.5
    assert len(fams["gpuaccept_metric_outlier_zscore"]) == 25  # the stored cluster run's analysis


def test_collector_exports_what_the_textfile_holds(tmp_path: Path) -> None:
    """The same samples by prometheus_client's exposition (serve-metrics) as in the textfile (report --format prom)."""
    _run_dir(tmp_path, CLUSTER, "c", "cluster-report.json")
    registry = CollectorRegistry(auto_describe=False)
    log = open(os.devnull, "w")
    try:
        registry.register(ReportCollector(DirSource(tmp_path), log=log))  # type: ignore[arg-type]
        served = generate_latest(registry).decode()
    finally:
        log.close()

    def samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in text_string_to_metric_families(text)
                for s in f.samples if not s.name.startswith("gpuaccept_exporter_")}

    assert samples(served) == samples(render_prometheus(cluster()))


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    for flag in ("--report-dir", "--from"):  # --from: the old spelling, an error names the new one
        proc = gpuaccept("serve-metrics", "--port", "0", flag, str(tmp_path / "nope"))
        assert proc.returncode == 2 and proc.stderr.startswith("gpuaccept: error: --report-dir") and \
            "Traceback" not in proc.stderr
    proc = gpuaccept("serve-metrics", "--port", "70000")
    assert proc.returncode == 2 and "not a port number" in proc.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = gpuaccept("serve-metrics", "--port", str(port), "--bind", "127.0.0.1", "--from", str(tmp_path),
                         timeout=60)
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    foreign = tmp_path / "foreign.db"
    foreign.write_bytes(b"this is not a database at all" * 100)
    before = foreign.read_bytes()
    proc = gpuaccept("serve-metrics", "--port", "0", "--db", f"sqlite:///{foreign}")
    assert proc.returncode == 2 and str(foreign) in proc.stderr and "Traceback" not in proc.stderr
    assert foreign.read_bytes() == before


def test_max_age_leaves_out_old_runs(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    def iso(delta: timedelta) -> str:
        return (datetime.now(timezone.utc) - delta).isoformat(timespec="seconds").replace("+00:00", "Z")

    fresh, old = node_cpu(), node_cpu()
    fresh.host, fresh.started, fresh.finished = "fresh-node", iso(timedelta(minutes=10)), None
    old.host, old.started, old.finished = "old-node", iso(timedelta(days=10)), None
    for rep in (fresh, old):
        for c in rep.checks:
            c.host = None
        (tmp_path / rep.host).mkdir()
        write_json(tmp_path / rep.host / "report.json", rep)
    assert [r.host for r in DirSource(tmp_path).snapshot().nodes] == ["fresh-node", "old-node"]
    assert [r.host for r in DirSource(tmp_path, max_age_s=86400).snapshot().nodes] == ["fresh-node"]


def _bad_reports(reports: Path) -> None:
    """Two reports that parse as JSON but break naive handling: a 10**400 value, a deeply nested array."""
    huge = node_cpu()
    huge.host, huge.run_id = "huge-host", "20261123T110000Z-huge-0001"
    d = reports / huge.run_id
    d.mkdir(parents=True)
    text = write_json(d / "report.json", huge).read_text()
    value = str(huge.checks[2].metrics[0].value)
    (d / "report.json").write_text(text.replace(value, "1" + "0" * 400, 1))
    deep = reports / "20261123T120000Z-deep-0001"
    deep.mkdir()
    (deep / "report.json").write_text('{"schema_version": 1, "run_id": "x", "argv": ' + "[" * 100000
                                      + "]" * 100000 + "}")


def test_one_bad_report_is_skipped_and_the_other_hosts_are_served(tmp_path: Path) -> None:
    reports = tmp_path / "gpuaccept-reports"
    _run_dir(reports, NODE_CPU, "20261122T020807Z-vm-fadd")
    _bad_reports(reports)
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        fams_direct = ReportCollector(DirSource(reports), log=fh).families()
    by_name = {f.name: f for f in fams_direct}
    assert by_name["gpuaccept_exporter_unreadable_reports"].samples[0][1] == 2
    assert {labels["host"] for labels, _ in by_name["gpuaccept_run_info"].samples} == {"vm"}
    assert log.read_text().count("gpuaccept serve-metrics:") == 2
    with serving("--from", str(reports)) as (port, _proc):
        fams = scrape(port)
        assert one(fams, "gpuaccept_exporter_up") == 1
        assert one(fams, "gpuaccept_exporter_unreadable_reports") == 2
        assert {s.labels["host"] for s in fams["gpuaccept_run_info"]} == {"vm"}
