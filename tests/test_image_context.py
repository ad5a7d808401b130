"""The files each image's Dockerfile copies from the checkout are enough to build gpuaccept's wheel (a file the
package build needs, such as the man page its data-files install, must be copied too). Checked without podman:
the COPY sources are copied into an empty directory and pip builds the wheel there."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = ["images/multinode/Dockerfile", "images/runtime/Dockerfile", "images/runtime/Dockerfile.single"]


def copied(dockerfile: Path) -> list[tuple[str, str]]:
    """``(source, destination)`` of each ``COPY`` from the build context (not ``--from=`` a stage) that lands in
    ``/tmp/gpuaccept-src``, where the image builds the package."""
    out = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] != ["COPY"] or any(w.startswith("--from") for w in words):
            continue
        *sources, dest = [w for w in words[1:] if not w.startswith("--")]
        if dest.startswith("/tmp/gpuaccept-src"):
            out += [(s, dest) for s in sources]
    return out


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_copied_files_build_the_wheel(name: str, tmp_path: Path) -> None:
    tree = tmp_path / "gpuaccept-src"
    tree.mkdir()
    pairs = copied(ROOT / name)
    assert pairs, f"{name} copies nothing into /tmp/gpuaccept-src"
    for source, dest in pairs:
        rel = dest.removeprefix("/tmp/gpuaccept-src").strip("/")
        target = tree / rel / Path(source).name if dest.endswith("/") else tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, target)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "-w", str(tmp_path / "out"), str(tree)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (tmp_path / "out").glob("gpuaccept-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith("share/man/man1/gpuaccept.1") for n in names)
    assert "gpuaccept/data/faults.yaml" in names
