"""Issue 28, one command-line grammar: rules that hold for EVERY parser of ``gpuaccept``, walked from
``cli.build_parser()`` (a new flag that breaks one fails here), and the user-visible cases of each rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuaccept.argtypes import parse_duration, parse_time_limit
from tests.cli_inproc import run_main
from tests.parser_walk import options, subparsers

DURATION_NAME = re.compile(r"(?:^|_)(?:timeout|budget|deadline|interval|max_age|time)$")


def _is_duration(action: object) -> bool:
    return getattr(getattr(action, "type", None), "grammar", None) == "duration"


def test_every_flag_for_a_span_of_time_takes_the_one_duration_syntax() -> None:
    """A flag named for a span of time (or with a time metavar) is duration-typed, and each accepts 90s, 10m, 1h30m
    and a bare number (seconds; minutes for a scheduler's --time)."""
    seen = 0
    for where, p in subparsers():
        for a in options(p):
            if DURATION_NAME.search(a.dest) or a.metavar in ("S", "SECONDS", "SPAN", "MIN", "DURATION", "TIME"):
                assert _is_duration(a), f"{where} {a.option_strings[0]}: not duration-typed"
            if _is_duration(a):
                seen += 1
                for text in ("90s", "10m", "1h30m", "600"):
                    assert a.type(text), (where, a.option_strings, text)  # type: ignore[misc]
                assert a.metavar in ("DURATION", "TIME"), (where, a.option_strings, a.metavar)
    assert seen >= 12  # run, launch x7, healthcheck x2, nccl-tests, isolate, serve-metrics, node-status ...


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("1h30m", 5400), ("2d", 172800),
                                                ("1w", 604800), ("600", 600), ("1.5m", 90)])
def test_duration_values(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "minutes"), [
    ("30", 30), ("00:30:00", 30), ("1:30", 2), ("1:00:01", 61), ("1-0", 1440), ("1-02:30", 1590),
    ("1-02:30:30", 1591), ("1h", 60), ("90s", 2), ("1h30m", 90), ("2d", 2880)])
def test_scheduler_time_limit_takes_slurms_forms_and_durations(text: str, minutes: int) -> None:
    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["0", "00:00:00", "1x", "1:2:3:4", "-5", "367d", "1-", "abc"])
def test_scheduler_time_limit_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time_limit(text)


def test_healthcheck_budget_takes_the_run_syntax() -> None:
    """``healthcheck --budget 1m`` said "'1m' is not a number" while ``run --budget 1m`` worked."""
    r = run_main("healthcheck", "--budget", "1x")
    assert "not a duration such as 90s" in r.one_line_error()
    from gpuaccept.cli import build_parser

    args = build_parser().parse_args(["healthcheck", "--budget", "1m", "--deadline", "30s"])
    assert (args.budget, args.deadline) == (60.0, 30.0)
    assert build_parser().parse_args(["run", "--budget", "1m"]).budget == 60.0


def test_negative_duration_is_a_value_not_an_option() -> None:
    assert "must be more than 0 seconds" in run_main("healthcheck", "--deadline", "-5").one_line_error()


@pytest.mark.parametrize(("given", "sbatch"), [("00:30:00", "30"), ("1h", "60"), ("45", "45"), ("1-00:00", "1440")])
def test_launch_slurm_time_reaches_sbatch(tmp_path: object, given: str, sbatch: str) -> None:
    r = run_main("launch", "slurm", "--results-dir", str(tmp_path), "--run-id", "t", "--time", given, "--dry-run")
    assert r.rc == 0, r.err
    assert f"#SBATCH --time={sbatch}\n" in r.out


def _typo(flag: str) -> str:
    """``--profile`` -> ``--prfoile``: two letters swapped (not a prefix, so argparse does not take it)."""
    i = next(i for i in range(3, len(flag) - 1) if flag[i] != flag[i + 1] and "-" not in flag[i:i + 2])
    return flag[:i] + flag[i + 1] + flag[i] + flag[i + 2:]


def test_every_parse_error_points_to_its_own_help_and_names_the_near_flag() -> None:
    """``run --profle quick`` said ``(see 'gpuaccept --help')``; now each sub-command's error names its own help,
    and a mistyped flag gets "did you mean"."""
    checked = 0
    for where, p in subparsers():
        if not where:
            continue
        visible = [f for a in options(p) if a.help != "==SUPPRESS==" for f in a.option_strings
                   if f.startswith("--") and len(f) > 6]
        if not visible:
            continue
        flag = visible[0]
        positionals = ["x" for a in p._actions if not a.option_strings and a.nargs in (None, "+")]
        needed = [a for a in options(p) if a.required] + [g._group_actions[0] for g in p._mutually_exclusive_groups
                                                           if g.required]
        required = [v for a in needed for v in (a.option_strings[0], next(iter(a.choices or ["1"])))]
        r = run_main(*where.split(), *required, _typo(flag), *positionals)
        line = r.one_line_error()
        assert f"(see 'gpuaccept {where} --help')" in line, (where, line)
        assert "did you mean" in line and flag in line.split("did you mean", 1)[1], (where, line)
        checked += 1
    assert checked >= 25


@pytest.mark.parametrize(("argv", "hint"), [
    (["rn"], "did you mean run?"), (["baseline", "shwo"], "did you mean show?"),
    (["launch", "slrum"], "did you mean slurm?"), (["run", "--profile", "quik"], "did you mean quick?"),
    (["run", "--checks", "computee", "--plan", "--device", "cpu"], "did you mean compute?")])
def test_did_you_mean_for_subcommands_choices_and_checks(argv: list[str], hint: str) -> None:
    assert hint in run_main(*argv).one_line_error()


def test_a_cut_list_of_names_still_shows_the_near_one() -> None:
    from gpuaccept.inputs import shown_names

    names = [f"metric_{i:02d}" for i in range(30)] + ["gemm_bf16_tflops"]
    text = shown_names("gemm_bf16_tflopz", names)
    assert text.startswith("gemm_bf16_tflops, ") and text.endswith(", ...")
    assert shown_names("x", []) == "none"


def test_every_help_exits_0() -> None:
    """``gpuaccept nccl-tests parse --help`` was an error; every sub-command's ``--help`` prints and exits 0."""
    for where, _p in subparsers():
        r = run_main(*where.split(), "--help")
        assert r.rc == 0 and r.out.startswith("usage: gpuaccept"), (where, r.err)


def test_nccl_tests_parse_is_an_action_and_the_old_spellings_still_work() -> None:
    log = str(Path(__file__).parent / "data" / "nccl-tests" / "all_reduce_J.json")
    new = run_main("nccl-tests", "parse", log, "--json")
    assert new.rc == 0, new.err
    for old in (["nccl-tests", "--json", "parse", log], ["nccl-tests", "run", "parse", log, "--json"]):
        r = run_main(*old)
        assert (r.rc, json.loads(r.out)) == (0, json.loads(new.out)), old
    assert "unknown nccl-tests binary 'bogus'" in run_main("nccl-tests", "bogus").one_line_error()
    assert "required: LOG|JSON|-" in run_main("nccl-tests", "parse").one_line_error()


def test_every_json_flag_has_one_meaning() -> None:
    """``--json`` took a PATH in run and isolate and was a switch elsewhere; now it is ``--json [PATH|-]``
    everywhere: no value or ``-`` is stdout."""
    found = []
    for where, p in subparsers():
        for a in options(p):
            if "--json" in a.option_strings:
                found.append(where)
                assert (a.nargs, a.const, a.default, a.metavar) == ("?", "-", None, "PATH|-"), where
    assert {"run", "checks", "history", "compare", "trend", "analyze", "isolate", "nccl-tests run",
            "nccl-tests parse", "baseline show"} <= set(found)


def test_json_to_stdout_or_a_file(tmp_path: Path) -> None:
    r = run_main("checks", "--json")
    rows = json.loads(r.out)
    assert r.rc == 0 and {"name", "params"} <= set(rows[0])
    out = tmp_path / "checks.json"
    r = run_main("checks", "--json", str(out))
    assert r.rc == 0 and json.loads(out.read_text()) == rows
    assert r.out.startswith(rows[0]["name"])  # the text is still printed
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    assert "--json" in run_main("checks", f"--json={link}").one_line_error()
    assert not (tmp_path / "elsewhere.json").exists()


def test_a_bare_json_before_positionals_does_not_take_one(tmp_path: Path) -> None:
    """``analyze --json A B`` (the old switch spelling) reads A and B; a path there is ``--json=PATH``."""
    reports = sorted((Path(__file__).parent / "data" / "reports").glob("*.json"))[:2]
    assert len(reports) == 2
    before = [f.read_bytes() for f in reports]
    r = run_main("analyze", "--json", *map(str, reports))
    assert r.rc in (0, 1) and json.loads(r.out)["nodes"] >= 1, r.err
    assert [f.read_bytes() for f in reports] == before
    out = tmp_path / "a.json"
    r = run_main("analyze", f"--json={out}", *map(str, reports))
    assert json.loads(out.read_text())["nodes"] >= 1 and "node report(s)" in r.out


def test_when_a_bare_json_bites_the_error_says_json_equals_path(tmp_path: Path) -> None:
    """``compare --json out.json A B``: out.json is taken as a report (a bare --json before positionals prints to
    stdout), so the error, from the parser or from the command, says how to write the file: ``--json=out.json``."""
    reports = [str(p) for p in sorted((Path(__file__).parent / "data" / "reports").glob("*.json"))[:2]]
    out = str(tmp_path / "out.json")
    hint = f"to write {out}: --json={out})"
    parser_error = run_main("compare", "--json", out, *reports).one_line_error()
    assert parser_error.startswith("gpuaccept: error: unrecognized arguments: ") and hint in parser_error
    assert parser_error.endswith("(see 'gpuaccept compare --help')")
    command_error = run_main("analyze", "--json", out, *reports).one_line_error()
    assert f"{out}: no such file or directory" in command_error and command_error.endswith(hint)
    plain = run_main("compare", reports[0]).one_line_error()  # no bare --json: no hint
    assert "--json" not in plain


def test_plan_and_dry_run_have_one_meaning_each() -> None:
    """``--plan``: the suite's plan, in every command that runs the suite (the suite help says "--plan shows which
    and why"); ``--dry-run``: print what would be done, do nothing."""
    from gpuaccept.suiteplan import PLAN_HELP

    suites, dry = [], []
    for where, p in subparsers():
        flags = {f: a for a in options(p) for f in a.option_strings}
        if "--budget" in flags and "--profile" in flags and "--plan" not in flags:
            raise AssertionError(f"{where}: the suite options without --plan")
        if "--plan" in flags:
            suites.append(where)
            assert flags["--plan"].help.startswith(PLAN_HELP), where
        if "--dry-run" in flags:
            dry.append(where)
            assert flags["--dry-run"].nargs == 0 and re.match(r"print .*nothing", flags["--dry-run"].help), where
    assert {"run", "launch slurm", "launch k8s", "node-status label", "node-status daemonset",
            "node-status npd"} <= set(suites)
    assert {"launch slurm", "isolate", "image build", "node-status label"} <= set(dry)


def test_launch_and_node_status_print_the_suite_plan(tmp_path: Path) -> None:
    from tests.helpers import gpuaccept

    for argv in (["launch", "slurm", "--results-dir", str(tmp_path), "--plan"], ["node-status", "label", "--plan"],
                 ["node-status", "daemonset", "--image", "i", "--plan"], ["node-status", "npd", "d", "--plan"]):
        proc = gpuaccept(*argv, "--profile", "quick", "--device", "cpu", "--budget", "2m", PATH="/nonexistent")
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        assert plan["profile"] == "quick" and plan["checks"], argv  # no sbatch needed: nothing is submitted
    assert "goes without --report" in run_main("node-status", "label", "--plan", "--report", "x.json").one_line_error()
    assert "give one" in run_main("node-status", "label", "--profile", "quick", "--dry-run", "--apply").one_line_error()
    r = run_main("launch", "local", "--results-dir", str(tmp_path), "--plan", "--", "true")
    assert "with a command after -- there is none" in r.one_line_error()


def test_old_spellings_are_hidden_aliases_of_the_new_names() -> None:
    """One name per meaning: report directory --report-dir, threshold --max-z, exit 1 on a problem --exit-code,
    -f only for --file, mounts --mount, k8s --training-runtime; the old names parse, map to the new dest and are
    not in the help."""
    from fnmatch import fnmatch

    from gpuaccept.cliargs import RENAMED

    matched: set[str] = set()
    for where, p in subparsers():
        for pattern, renames in RENAMED.items():
            if not fnmatch(where, pattern):
                continue
            matched.add(pattern)
            flags = {f: a for a in options(p) for f in a.option_strings}
            text = p.format_help()
            for old, new in renames.items():
                assert flags[old].help == "==SUPPRESS==" and flags[new].help != "==SUPPRESS==", (where, old)
                assert flags[old].dest == flags[new].dest, (where, old)
                assert re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", text) is None, (where, old)
                assert re.search(rf"(?<![\w-]){re.escape(new)}(?![\w-])", text), (where, new)
    assert matched == set(RENAMED)


def test_old_and_new_spellings_parse_alike() -> None:
    from gpuaccept.cli import build_parser

    def parse(*argv: str) -> dict[str, object]:
        return vars(build_parser().parse_args(list(argv)))

    assert parse("trend", "--host", "h", "--metric", "m", "--max-drop-sigma", "4")["max_z"] == 4.0
    assert parse("trend", "--host", "h", "--metric", "m")["max_z"] == 3.0  # the alias leaves the default alone
    assert parse("baseline", "create", "--from", "d", "--trim-z", "2") == parse("baseline", "create", "--from", "d",
                                                                               "--max-z", "2")
    assert parse("analyze", "x", "--fail-on-outliers")["exit_code"] is True
    assert parse("analyze", "x")["exit_code"] is False
    assert parse("trend", "--host", "h", "--metric", "m", "--no-exit-code")["exit_code"] is False
    assert parse("report", "r", "-f", "md")["format"] == "md"
    assert parse("serve-metrics", "--from", "/d")["source_dir"] == "/d"
    assert parse("isolate", "--results-dir", "/d")["report_dir"] == "/d"
    assert "argument --db: not allowed with argument --from" in run_main(
        "serve-metrics", "--from", "/d", "--db", "sqlite:///x").one_line_error()
    assert "--file DOCKERFILE, -f DOCKERFILE" in run_main("image", "build", "--help").out


def test_launch_old_spellings_reach_the_job(tmp_path: Path) -> None:
    old = run_main("launch", "slurm", "--results-dir", str(tmp_path), "--run-id", "t", "--dry-run",
                   "--container-mounts", "/a:/b,/c:/d", "--image", "img:1")
    new = run_main("launch", "slurm", "--report-dir", str(tmp_path), "--run-id", "t", "--dry-run",
                   "--mount", "/a:/b", "--mount", "/c:/d", "--image", "img:1")
    assert old.rc == new.rc == 0, old.err + new.err
    assert old.out == new.out and str(tmp_path) in new.out and "/a:/b,/c:/d" in new.out


def test_every_help_has_a_description_and_examples() -> None:
    for where, p in subparsers():
        assert p.description, f"gpuaccept {where} --help has no description"
        text = p.format_help()
        examples = text.split("\nexamples:\n", 1)[1].splitlines() if "\nexamples:\n" in text else []
        lines = [line for line in examples if line.startswith("  ")]
        assert len(lines) >= (3 if where == "" else 2), f"gpuaccept {where} --help: fewer than 2 examples"
        if where:
            assert all(f"gpuaccept {where.split()[0]}" in line for line in lines), (where, lines)


def test_every_example_parses() -> None:
    """The examples are real command lines: each parses (nothing is run)."""
    import shlex

    from gpuaccept.cli import build_parser
    from gpuaccept.cliexamples import EXAMPLES
    from gpuaccept.nccltests.cli import default_action

    for where, lines in EXAMPLES.items():
        for line in lines:
            argv = shlex.split(line.split("|")[-1].split(">")[0])
            assert argv[0] == "gpuaccept", line
            if where != "completion" or "completion" in {w for w, _p in subparsers()}:
                args = build_parser().parse_args(default_action(argv[1:]))
                assert args.command == argv[1], line


def test_top_help_groups_the_commands() -> None:
    from gpuaccept.cliexamples import GROUPS

    text = run_main("--help").out
    heads = [text.index(f"\n{group}:\n") for group, _names in GROUPS if f"\n{group}:\n" in text]
    assert len(heads) >= 5 and heads == sorted(heads)
    listed = {n for _g, names in GROUPS for n in names}
    assert {w for w, _p in subparsers() if w and " " not in w} <= listed  # no command left out of a group
    assert text.count("\n  run ") == 1  # once, in its group (not also argparse's flat list)


def test_shell_completion_knows_every_command_and_only_the_visible_flags(tmp_path: Path) -> None:
    """``gpuaccept completion bash`` (shtab, from the parser): bash completes a command and a backend's flag."""
    import importlib.util
    import shutil
    import subprocess

    assert importlib.util.find_spec("shtab"), "shtab is a dev dependency (pip install -e '.[dev]')"
    r = run_main("completion", "bash")
    assert r.rc == 0, r.err
    script = tmp_path / "gpuaccept.bash"
    script.write_text(r.out)
    assert "--training-runtime" in r.out and "--max-z" in r.out and "--results-dir" not in r.out
    assert run_main("completion", "zsh").out.startswith("#compdef gpuaccept")
    bash = shutil.which("bash")
    assert bash is not None
    probe = (f"source {script}; COMP_WORDS=(gpuaccept healthch); COMP_CWORD=1; _shtab_gpuaccept; "
             "echo \"${COMPREPLY[@]}\"; COMP_WORDS=(gpuaccept launch k8s --training-r); COMP_CWORD=3; "
             "_shtab_gpuaccept; echo \"${COMPREPLY[@]}\"")
    out = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.split("\n")[:2] == ["healthcheck", "--training-runtime"], out
