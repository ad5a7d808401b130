"""Files and directories on a shared machine (issue #26, items 1-4): real links, a real FIFO, /dev/full and a
real ordinary user, through the CLI where a user meets them."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from gpuaccept import safefs
from gpuaccept.errors import UsageError
from gpuaccept.outputs import FILE, STREAM, write_output
from tests.helpers import ROOT, gpuaccept, one_line_error
from tests.unprivileged import account_dir, ordinary_account

NODE_REPORT = ROOT / "tests" / "data" / "reports" / "node-cpu.json"
HC = ("healthcheck", "--device", "cpu", "--skip", "env,compute,health", "--deadline", "60")


def _hc(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A healthcheck of disk_space alone, with room for a loaded machine (the check's own timeout is 5 s)."""
    config = tmp_path / "hc.yaml"
    config.write_text("checks:\n  disk_space: {timeout_s: 50}\n")
    return gpuaccept(*HC, "--config", str(config), *args, **env)


# ---- item 1: healthcheck's report directory and its pruning -----------------------------------------------------

def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "hc-20200101T000000Z-other-0000").mkdir(parents=True)
    (victim / "hc-20200101T000000Z-other-0000" / "precious").write_text("keep me")
    return victim


def test_healthcheck_refuses_a_report_dir_that_is_a_link_and_touches_nothing_behind_it(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "rep").symlink_to(victim)
    r = _hc(tmp_path, "--keep", "1", "--report-dir", str(tmp_path / "rep"))
    one_line_error(r, "is a symbolic link")
    assert sorted(p.name for p in victim.iterdir()) == ["hc-20200101T000000Z-other-0000"]
    assert (victim / "hc-20200101T000000Z-other-0000" / "precious").read_text() == "keep me"


def test_healthcheck_default_dir_is_private_state_not_a_fixed_tmp_name(tmp_path: Path) -> None:
    tmp, state = tmp_path / "tmp", tmp_path / "state" / "gpuaccept"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), "GPUACCEPT_REPORT_DIR": ""}
    env["STATE_DIRECTORY" if os.geteuid() == 0 else "XDG_STATE_HOME"] = str(state)
    r = _hc(tmp_path, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(tmp.iterdir()) == []  # nothing under the temporary directory
    made = state if os.geteuid() == 0 else state / "gpuaccept" / "healthcheck"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    runs = [p for p in made.iterdir() if p.name.startswith("hc-")]
    assert len(runs) == 1 and (runs[0] / safefs.MARKER).is_file() and (runs[0] / "report.json").is_file()


def test_healthcheck_refuses_a_world_writable_report_dir(tmp_path: Path) -> None:
    rep = tmp_path / "rep"
    rep.mkdir()
    rep.chmod(0o777)
    one_line_error(_hc(tmp_path, "--report-dir", str(rep)), "writable by others")
    assert list(rep.iterdir()) == []


def test_healthcheck_refuses_a_report_dir_of_another_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to own a directory as another user (CI runs as root)")
    with ordinary_account() as account:
        other = account_dir(account, "gpuaccept-other-")
        other.chmod(0o700)
        try:
            one_line_error(_hc(tmp_path, "--report-dir", str(other)), f"owned by uid {account.uid}")
            assert list(other.iterdir()) == []
        finally:
            os.rmdir(other)


def test_keep_prunes_only_runs_it_made_and_never_through_a_link(tmp_path: Path) -> None:
    rep = tmp_path / "rep"
    rep.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    foreign = rep / "hc-20000101T000000Z-foreign-0000"  # looks like a run, but no marker: not ours
    foreign.mkdir()
    (rep / "hc-20000101T000000Z-link-0000").symlink_to(victim / "hc-20200101T000000Z-other-0000")
    for _ in range(2):
        assert _hc(tmp_path, "--keep", "1", "--report-dir", str(rep)).returncode == 0
    ours = [p for p in rep.iterdir() if p.is_dir() and not p.is_symlink() and (p / safefs.MARKER).exists()]
    assert len(ours) == 1  # the older of the two runs it made is gone
    assert foreign.is_dir() and (rep / "hc-20000101T000000Z-link-0000").is_symlink()
    assert (victim / "hc-20200101T000000Z-other-0000" / "precious").read_text() == "keep me"


def test_prune_skips_a_marked_run_swapped_for_a_link(tmp_path: Path) -> None:
    parent = safefs.private_dir(tmp_path / "p")
    victim = _victim(tmp_path)
    for name in ("hc-1", "hc-2", "hc-3"):
        safefs.mark(safefs.private_dir(parent / name, parents=False))
    (victim / "hc-20200101T000000Z-other-0000" / safefs.MARKER).write_text("")
    os.rename(parent / "hc-1", tmp_path / "moved")
    (parent / "hc-1").symlink_to(victim / "hc-20200101T000000Z-other-0000")
    assert safefs.prune(parent, 1, lambda n: n.startswith("hc-")) == [parent / "hc-2"]
    assert (victim / "hc-20200101T000000Z-other-0000" / "precious").exists()


def test_private_dir_refuses_a_link_and_a_file(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="symbolic link"):
        safefs.private_dir(tmp_path / "link")
    with pytest.raises(UsageError, match="not a directory"):
        safefs.private_dir(tmp_path / "file")


# ---- item 2: run ids and host names stay inside the report directory -------------------------------------------

def test_a_host_name_from_the_environment_cannot_leave_the_report_dir(tmp_path: Path) -> None:
    rep = tmp_path / "deep" / "er" / "R"
    r = gpuaccept("run", "--checks", "env", "--device", "cpu", "--report-dir", str(rep),
                  GPUACCEPT_HOSTNAME="x/../../../escaped")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name.endswith("escaped")) == []
    (run,) = [p for p in rep.iterdir() if p.is_dir()]
    assert "-x-..-..-..-escaped-" in run.name and (run / "report.json").is_file()


def test_a_host_name_with_odd_characters_is_written_so_it_reads_back(tmp_path: Path) -> None:
    rep = tmp_path / "R"
    r = gpuaccept("run", "--checks", "env", "--device", "cpu", "--report-dir", str(rep),
                  GPUACCEPT_HOSTNAME="gpu node#1")
    assert r.returncode == 0, r.stderr
    (run,) = [p for p in rep.iterdir() if p.is_dir()]
    assert "-gpu-node-1-" in run.name
    shown = gpuaccept("report", run.name, "--report-dir", str(rep), "--format", "json", "--db",
                      f"sqlite:///{tmp_path / 'none.db'}")
    assert shown.returncode == 0, shown.stderr
    assert '"host": "gpu-node-1"' in shown.stdout


@pytest.mark.parametrize("run_id", ["../../x", "..", "a/b", ".hidden"])
def test_a_run_id_that_is_not_a_name_is_refused(tmp_path: Path, run_id: str) -> None:
    rep = tmp_path / "a" / "R"
    one_line_error(gpuaccept("run", "--checks", "env", "--device", "cpu", "--report-dir", str(rep),
                             "--run-id", run_id), "is not a run id")
    assert not (tmp_path / "a").exists() and not (tmp_path / "x").exists()


# ---- item 3: sshd-config's directory --------------------------------------------------------------------------

def test_sshd_config_makes_an_existing_open_directory_private(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(0o777)
    r = gpuaccept("sshd-config", "--port", "2222", "--dir", str(d))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for key in ("ssh_host_ed25519_key", "authorized_keys"):
        assert stat.S_IMODE((d / key).stat().st_mode) == 0o600, key


def test_sshd_config_refuses_a_link_and_a_directory_of_another_user(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    one_line_error(gpuaccept("sshd-config", "--port", "2222", "--dir", str(tmp_path / "link")), "symbolic link")
    assert list((tmp_path / "real").iterdir()) == []
    if os.geteuid() != 0:
        return
    with ordinary_account() as account:
        other = account_dir(account, "gpuaccept-sshd-")
        try:
            r = gpuaccept("sshd-config", "--port", "2222", "--dir", str(other))
            one_line_error(r, f"owned by uid {account.uid}")
            assert list(other.iterdir()) == [] and stat.S_IMODE(other.stat().st_mode) == 0o755
        finally:
            os.rmdir(other)


# ---- item 4: -o writes according to what the path is ---------------------------------------------------------

OUTPUT_COMMANDS = {
    "report": ("report", str(NODE_REPORT), "--format", "json", "-o"),
    "baseline create": ("baseline", "create", "--from", str(NODE_REPORT), "--min-samples", "1", "-o"),
    "constraints": ("constraints", "-o"),
}


@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_output_to_dev_full_is_an_error_and_the_device_stays(command: str) -> None:
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode), "/dev/full is not the device here (replaced by a file?)"
    r = gpuaccept(*OUTPUT_COMMANDS[command], "/dev/full")
    one_line_error(r, "No space left on device")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_output_to_a_fifo_reaches_its_reader(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    r = gpuaccept(*OUTPUT_COMMANDS[command], str(fifo))
    reader.join(30)
    if reader.is_alive():  # nothing opened the pipe: release the reader
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and len(got) == 1 and len(got[0]) > 20


@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_output_to_a_link_is_refused_and_both_stay(tmp_path: Path, command: str) -> None:
    target = tmp_path / "target"
    target.write_text("old")
    (tmp_path / "link").symlink_to(target)
    one_line_error(gpuaccept(*OUTPUT_COMMANDS[command], str(tmp_path / "link")), "is a symbolic link")
    assert (tmp_path / "link").is_symlink() and target.read_text() == "old"


def test_write_output_replaces_a_regular_file_and_streams_to_a_device(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old")
    assert write_output(str(path), "new\n") == FILE
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert write_output("/dev/null", "x") == STREAM and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary file left
    with pytest.raises(UsageError, match="is a directory"):
        write_output(str(tmp_path), "x")
