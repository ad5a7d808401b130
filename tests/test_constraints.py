"""``gpuaccept constraints``: the pure text, the CLI, and real pip obeying the file.

The pip test makes a virtual environment and wheels of its own (and a project with an in-tree
build backend for an editable install), works offline (``--no-index``, no pip configuration),
and runs the module standalone with that environment's python, as the images do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from gpuaccept.cli import main
from gpuaccept.containers.constraints import (
    Installed,
    canonical_name,
    constraints_text,
    installed,
    is_pep440,
    site_paths,
    url_pin,
)

MODULE = Path(__file__).resolve().parent.parent / "src" / "gpuaccept" / "containers" / "constraints.py"


def pins(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# --- the pure text ----------------------------------------------------------------------------


def test_every_distribution_pinned_by_version_in_canonical_order() -> None:
    text = constraints_text([Installed("PyYAML", "6.0.2", "/site"), Installed("absl_py", "2.1.0", "/site"),
                             Installed("torch", "2.6.0a0+ecf3bae40a.nv25.01", "/site")], source="/usr/bin/python3")
    assert pins(text) == ["absl_py==2.1.0", "PyYAML==6.0.2", "torch==2.6.0a0+ecf3bae40a.nv25.01"]
    assert text.splitlines()[0] == "# pip constraints: every distribution installed for /usr/bin/python3"


def test_direct_url_installs_pinned_by_version_with_their_origin() -> None:
    wheel = {"url": "file:///opt/transfer/torch-2.6.0-cp312-linux_x86_64.whl",
             "archive_info": {"hash": "sha256=abc"}}
    text = constraints_text([Installed("torch", "2.6.0", "/site", wheel)])
    lines = text.splitlines()
    assert "torch==2.6.0" in lines
    comment = lines[lines.index("torch==2.6.0") - 1]
    assert comment.startswith("# torch: installed from file:///opt/transfer/torch-2.6.0") and "by version" in comment


def test_editable_installs_pinned_by_version_never_by_url() -> None:
    editable = {"url": "file:///src/apex", "dir_info": {"editable": True}}
    for urls in (False, True):
        text = constraints_text([Installed("apex", "0.1", "/site", editable)], urls=urls)
        assert pins(text) == ["apex==0.1"]
        assert "# apex: editable install of file:///src/apex" in text
    assert "a constraint cannot be editable" in constraints_text([Installed("apex", "0.1", "/s", editable)], urls=True)


def test_urls_option_pins_exact_sources_by_url() -> None:
    vcs = {"url": "https://github.com/org/pkg.git", "vcs_info": {"vcs": "git", "commit_id": "0123abc"},
           "subdirectory": "python"}
    archive = {"url": "https://example.org/b-1.0.tar.gz", "archive_info": {"hash": "sha256=ff00"}}
    local_dir = {"url": "file:///src/c", "dir_info": {}}
    floating = {"url": "https://github.com/org/d.git", "vcs_info": {"vcs": "git", "requested_revision": "main"}}
    text = constraints_text([Installed("a", "1", "/s", vcs), Installed("b", "1.0", "/s", archive),
                             Installed("c", "2", "/s", local_dir), Installed("d", "3", "/s", floating)], urls=True)
    assert pins(text) == ["a @ git+https://github.com/org/pkg.git@0123abc#subdirectory=python",
                          "b @ https://example.org/b-1.0.tar.gz#sha256=ff00",
                          "c @ file:///src/c",
                          "d==3"]
    assert "# d: installed from https://github.com/org/d.git; pinned by version: its URL does not name one" in text


def test_url_pin_none_without_an_exact_source() -> None:
    assert url_pin({"url": "file:///x", "dir_info": {"editable": True}}) is None
    assert url_pin({"url": "https://h/r.git", "vcs_info": {"vcs": "git"}}) is None
    assert url_pin({"archive_info": {}}) is None
    assert url_pin({"url": "https://h/x.whl", "unknown_info": {}}) is None


def test_versions_pip_cannot_read_and_broken_metadata_are_left_out_with_the_reason() -> None:
    text = constraints_text([Installed("oldpkg", "1.0-custom build", "/site"), Installed("", "", "/site/broken"),
                             Installed("fine", "1.0", "/site")])
    assert pins(text) == ["fine==1.0"]
    assert "# left out: oldpkg 1.0-custom build (in /site): not a PEP 440 version" in text
    assert "# left out: a distribution in /site/broken" in text and "metadata is broken" in text


def test_shadowed_distributions_noted_first_one_pinned() -> None:
    text = constraints_text([Installed("numpy", "1.26.4", "/usr/local/lib/dist-packages"),
                             Installed("NumPy", "1.21.5", "/usr/lib/python3/dist-packages")])
    assert pins(text) == ["numpy==1.26.4"]
    assert "# also found: NumPy 1.21.5 in /usr/lib/python3/dist-packages (shadowed" in text


@pytest.mark.parametrize(("version", "valid"), [
    ("1.0", True), ("2.6.0a0+ecf3bae40a.nv25.01", True), ("1!2.0.post1.dev3", True), ("1.0-1", True),
    ("0.13.0+dfsg", True), ("v1.2rc1", True), ("1.0-custom build", False), ("latest", False), ("1.0+", False),
    ("", False),
])
def test_pep440(version: str, valid: bool) -> None:
    assert is_pep440(version) is valid


def test_canonical_name() -> None:
    assert canonical_name("Foo.Bar__baz-Qux") == "foo-bar-baz-qux"


def test_reads_this_environment() -> None:
    found = {canonical_name(d.name): d for d in installed(site_paths())}
    assert found["pytest"].version == metadata.version("pytest")


def test_site_paths_drop_only_the_programs_own_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path), "/usr/lib/python3.11", "/site"])
    assert site_paths(str(tmp_path / "constraints.py")) == ["/usr/lib/python3.11", "/site"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", "/site"])  # python -c
    assert site_paths() == ["/site"]
    monkeypatch.setattr(sys, "path", ["/site", str(tmp_path)])  # the current directory is an install here
    assert site_paths() == ["/site", str(tmp_path)]


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.txt"
    assert main(["constraints", "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert f"pytest=={metadata.version('pytest')}" in lines
    assert f"wrote {out}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]  # no temporary file left


def test_cli_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["constraints"]) == 0
    assert f"rich=={metadata.version('rich')}" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("where", ["missing-dir/c.txt", "."])
def test_cli_unwritable_output_exit_2_one_line(tmp_path: Path, where: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(tmp_path.rglob("*"))
    assert main(["constraints", "-o", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gpuaccept: error: cannot write --output {tmp_path / where}: ")
    assert sorted(tmp_path.rglob("*")) == before


def test_standalone_module_unwritable_output_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(MODULE), "-o", str(tmp_path / "no" / "c.txt")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"constraints.py: error: cannot write {tmp_path / 'no' / 'c.txt'}: " \
                                  "No such file or directory"


# --- real pip ---------------------------------------------------------------------------------

BACKEND = '''\
"""A PEP 517/660 build backend for one tiny project (name and version below)."""
import os, zipfile

NAME, VERSION = "devproj", "0.3"


def _wheel(directory, files):
    dist = f"{NAME}-{VERSION}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n"
    files[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    files[f"{dist}/RECORD"] = "".join(f"{p},,\\n" for p in files) + f"{dist}/RECORD,,\\n"
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {f"{NAME}/__init__.py": ""})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {f"_{NAME}.pth": os.path.dirname(os.path.abspath(__file__)) + "\\n"})
'''


def make_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of ``name`` ``version`` requiring ``requires``."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


class Venv:
    """A virtual environment whose pip sees only ``wheels`` (no index, no configuration)."""

    def __init__(self, path: Path, wheels: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
        self.python = path / "bin" / "python"
        self.wheels = wheels
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        self.env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), "-m", "pip", *args, "--no-index", "--find-links", str(self.wheels)],
                              capture_output=True, text=True, timeout=300, env=self.env)

    def versions(self) -> dict[str, str]:
        listed = self.pip("list", "--format", "json")
        return {canonical_name(d["name"]): d["version"] for d in json.loads(listed.stdout)}

    def constraints(self, out: Path, *options: str) -> str:
        """The module run standalone with this environment's python, as the images do."""
        subprocess.run([str(self.python), str(MODULE), "-o", str(out), *options], check=True, timeout=120,
                       env=self.env)
        return out.read_text()


@pytest.mark.slow
def test_pip_refuses_an_install_that_would_replace_a_pinned_package(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    for version in ("1.0", "2.0"):
        make_wheel(wheels, "basepkg", version)
    make_wheel(wheels, "needsnew", "1.0", ("basepkg>=2",))
    make_wheel(wheels, "needsany", "1.0", ("basepkg", "fromfile"))
    make_wheel(wheels, "fromfile", "1.1")
    gone = make_wheel(tmp_path / "transfer", "fromfile", "1.0")  # installed from a file, deleted after
    project = tmp_path / "devproj"
    project.mkdir()
    (project / "backend.py").write_text(BACKEND)
    (project / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                            'backend-path = ["."]\n')

    env = Venv(tmp_path / "venv", wheels)
    for args in (["basepkg==1.0"], [str(gone)], ["-e", str(project)]):
        done = env.pip("install", *args)
        assert done.returncode == 0, done.stderr
    gone.unlink()
    before = env.versions()
    assert (before["basepkg"], before["fromfile"], before["devproj"]) == ("1.0", "1.0", "0.3")

    text = env.constraints(tmp_path / "c.txt")
    assert {"basepkg==1.0", "fromfile==1.0", "devproj==0.3"} <= set(pins(text))
    assert f"# fromfile: installed from {gone.as_uri()}" in text
    assert "# devproj: editable install of " in text

    refused = env.pip("install", "-c", str(tmp_path / "c.txt"), "needsnew")
    assert refused.returncode != 0
    assert "ResolutionImpossible" in refused.stderr
    assert "The conflict is caused by" in refused.stdout and "basepkg>=2" in refused.stdout
    upgrade = env.pip("install", "-c", str(tmp_path / "c.txt"), "--upgrade", "basepkg", "fromfile")
    assert upgrade.returncode == 0, upgrade.stderr
    assert env.versions() == before  # --upgrade under the file changes nothing

    # what can be added without a change is added, the file-installed package untouched
    added = env.pip("install", "-c", str(tmp_path / "c.txt"), "needsany")
    assert added.returncode == 0, added.stderr
    assert env.versions() == {**before, "needsany": "1.0"}

    # why direct-URL installs are pinned by version: pinned by URL, any install that needs the package
    # fetches that URL, and the file is gone
    by_url = env.constraints(tmp_path / "urls.txt", "--urls")
    assert f"fromfile @ {gone.as_uri()}#sha256=" in by_url
    make_wheel(wheels, "alsoneeds", "1.0", ("fromfile",))
    failed = env.pip("install", "-c", str(tmp_path / "urls.txt"), "alsoneeds")
    assert failed.returncode != 0 and "No such file or directory" in failed.stderr
    assert env.pip("install", "-c", str(tmp_path / "c.txt"), "alsoneeds").returncode == 0
