"""The rails isolate names, as its JSON ``rail_table``, its console table and its HTML NIC x node table: built from
a pair job's log made of the recorded perftest outputs of tests/data/perftest (400 Gb/s on NDR, and the slow
NIC's 201 Gb/s), tagged as :mod:`gpuaccept.perftest.node` tags them, and judged by the real reader and judge."""

from __future__ import annotations

import json
from pathlib import Path

from gpuaccept.isolate import rdma
from gpuaccept.isolate.plan import Run
from gpuaccept.isolate.rails import RailReport, rail_rows, table
from tests.launch_support import gpuaccept, one_error_line

DATA = Path(__file__).parent / "data" / "perftest"
NICS = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]


def pair_log(node: str, partner: str, slow: str | None = "mlx5_3", rose: int = 0) -> str:
    """The tagged log of one pair job: ``partner`` serving, ``node``'s NICs the clients (rate 400 Gb/s)."""
    good = (DATA / "write_bw_cuda_ndr_client.txt").read_text()
    slow_text = (DATA / "write_bw_cuda_slow_client.txt").read_text()
    server = (DATA / "read_bw_gbits_server.txt").read_text()
    lines = []
    for i, nic in enumerate(NICS):
        port = 18515 + i
        client = slow_text.replace("mlx5_3", nic) if nic == slow else good.replace("mlx5_0", nic)
        counters = {"rose": {"symbol_error": rose}} if rose and nic == slow else {}
        for side, who, text in (("server", partner, server.replace("mlx5_0", nic)), ("client", node, client)):
            lines += [f"@rdma {i} {side} {who} {nic} {port}| {line}" for line in text.splitlines()]
            end = {"exit": 0, "counters": counters, "rate_gbps": 400.0}
            lines.append(f"@rdma {i} {side} {who} {nic} {port}# {json.dumps(end)}")
    return "\n".join(lines) + "\n"


def report_of(node: str = "node-b", partner: str = "node-a", slow: str | None = "mlx5_3", rose: int = 0) -> RailReport:
    found, results = rdma.verdicts(node, NICS, pair_log(node, partner, slow, rose), Run(True, None))
    return RailReport(node, partner, "--rail-ports", found, [{"rails": results}])


def test_each_rail_is_named_with_node_index_port_gpu_figure_and_verdict() -> None:
    rows = rail_rows(report_of(rose=7))
    assert [(r["node"], r["rail"], r["port"], r["gpu"], r["verdict"]) for r in rows] == [
        ("node-b", i, f"mlx5_{i}:1", i, "bad" if i == 3 else "ok") for i in range(4)]
    assert [round(r["figure"]) for r in rows] == [400, 400, 400, 201]
    assert {r["unit"] for r in rows} == {"Gb/s"} and {r["bound"] for r in rows} == {380.0}
    assert rows[3]["evidence"][0] == "node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"
    assert "client error counters rose: symbol_error +7" in rows[3]["evidence"]
    data = report_of().to_dict()
    assert data["node"] == "node-b" and data["rail_table"][3]["partner"] == "node-a"
    assert data["rails"][3]["gbps"] == rows[3]["figure"] and data["rails"][3]["bound_gbps"] == 380.0


def test_the_console_table_names_the_slow_rail_of_the_node() -> None:
    lines = table(report_of())
    assert lines[0].split()[:6] == ["NODE", "RAIL", "PORT", "GPU", "FIGURE", "VERDICT"]
    bad = [line for line in lines[1:] if " BAD " in line]
    assert len(bad) == 1 and bad[0].split()[:7] == ["node-b", "3", "mlx5_3:1", "3", "201.4", "Gb/s", ">="]
    assert all(line.split()[8] == "ok" for line in lines[1:4])


def test_a_failed_pair_job_is_bad_on_every_rail_without_a_figure() -> None:
    found, _ = rdma.verdicts("node-b", NICS, "", Run(False, None, "job cancelled"))
    rows = rail_rows(RailReport("node-b", "node-a", "--rail-ports", found))
    assert [(r["verdict"], r["figure"], r["unit"]) for r in rows] == [("bad", None, None)] * 4
    assert rows[0]["evidence"] == ["rdma pair test failed: job cancelled"]


def test_the_html_nic_by_node_table_marks_the_cell_under_its_bound() -> None:
    from gpuaccept.report.html_rails import nic_node_table, render_rails_html, rows_of

    data = {"rails": {"node-b": report_of().to_dict(), "node-c": report_of("node-c", slow="mlx5_1").to_dict()}}
    rows = rows_of(data)
    assert len(rows) == 8
    html = nic_node_table(rows)
    assert "<th>node-b</th><th>node-c</th>" in html
    body = html.split("<tbody>")[1]
    lines = body.split("</tr>")
    assert lines[3].startswith("<tr><th>rail 3 &middot; mlx5_3:1</th>")
    assert '<td class="bad"' in lines[3].split("</th>")[1].split("</td>")[0]  # node-b's rail 3
    assert lines[3].split("</td>")[1] == "<td>399.6 Gb/s"  # node-c's rail 3 is good
    assert "201.4 Gb/s &lt; 380</td>" in lines[3] and "201.4 Gb/s &lt; 380</td>" in lines[1]
    assert body.count('class="bad"') == 2
    page = render_rails_html(data)
    assert "2 bad rail(s) of 8; partner(s): node-a." in page
    assert "<b>node-c rail 1 (mlx5_1:1, GPU 1)</b>: node-c rail 1 (mlx5_1): 201 Gb/s, expected &gt;= 380: FAIL" in page
    assert nic_node_table([]) == "" and "No rail was tested." in render_rails_html({})


def test_html_without_rails_is_a_usage_error() -> None:
    for args in (["--backend", "mpi", "--nodes", "a,b"], ["--simulate", "--nodes", "4"]):
        assert "--html writes the rails: give --per-rail or --rails-of" in one_error_line(
            gpuaccept("isolate", *args, "--html", "x.html", "--dry-run"))
