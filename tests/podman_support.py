"""Podman for the image tests: a private image store, base images made once per session.

:class:`Podman` runs ``podman --root R --runroot RR`` in a temporary directory, with a
``containers.conf`` named by ``CONTAINERS_CONF`` for those processes only: ``runc`` as the
runtime (crun refuses cgroup v1 hybrid hosts) and lower default ulimits (a root without
CAP_SYS_RESOURCE cannot raise nofile to podman's default, and every ``podman run`` fails).
The store is removed at the end of the session, images and all.

One store serves the whole session (:func:`shared_podman`, removed at exit, like
tests/pg_server.py's server); images made through :meth:`Podman.cached` are made once in it:

- :func:`debian_base`: a Debian minbase image made by mmdebstrap from Debian's packages (the
  tests' stand-in for a CUDA base image).
- :func:`offline_pip`: wheels downloaded once (this environment's torch, gpuaccept's dependencies
  and build requirements) and the ``-v`` options that make pip inside a build use only them.
- :func:`torch_base`: the stand-in for an NGC PyTorch image: the Debian base with Debian's python3
  and pip and a CPU torch installed from a wheel file that is gone afterwards
  (tests/data/images/torch-base.Dockerfile).

A missing podman, runc or mmdebstrap is a skip, or under CI=true a failure (:func:`need_binary`).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

from tests.sshd import need_binary

ROOT = Path(__file__).resolve().parent.parent
IMAGES_DATA = Path(__file__).parent / "data" / "images"
DEBIAN_MIRROR = os.environ.get("GPUACCEPT_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, the wheels' Python
DEBIAN_BASE = "localhost/gpuaccept-test/debian:bookworm"
TORCH_BASE = "localhost/gpuaccept-test/torch:bookworm"


def containers_conf_text(runtime: str = "runc", nofile: int = 4096, nproc: int = 4096) -> str:
    """The ``containers.conf`` of the test store."""
    return "\n".join([
        "[engine]",
        f'runtime = "{runtime}"',
        "",
        "[containers]",
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]',
        "",
    ])


def pip_conf_text(wheel_dir: str) -> str:
    """A pip configuration that installs from ``wheel_dir`` only."""
    return f"[global]\nno-index = true\nfind-links = {wheel_dir}\n"


@dataclass
class Podman:
    """A podman image store under ``directory``; :meth:`run` runs podman commands against it."""

    binary: str
    directory: Path
    images: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    wheelhouse: OfflinePip | None = None

    @property
    def conf(self) -> Path:
        return self.directory / "containers.conf"

    def argv(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.directory / "root"), "--runroot", str(self.directory / "run"), *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 120, check: bool = True,
            stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
        """``podman ARGS``; with ``check``, a failure fails the test with podman's output."""
        proc = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, env=self.env(),
                              stdin=stdin)
        if check and proc.returncode != 0:
            pytest.fail(f"podman {' '.join(args[:3])} ... exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                        f"{proc.stderr[-3000:]}")
        return proc

    def build(self, tag: str, dockerfile: Path, context: Path, build_args: dict[str, str] | None = None,
              extra: Sequence[str] = (), timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``podman build`` on the host network (apt and pip inside reach the mirrors); times it."""
        args = ["build", "--network", "host", "-t", tag, "-f", str(dockerfile), *extra]
        for key, value in (build_args or {}).items():
            args += ["--build-arg", f"{key}={value}"]
        start = time.monotonic()
        proc = self.run(*args, str(context), timeout=timeout, check=check)
        self.timings[f"build {tag}"] = time.monotonic() - start
        return proc

    def image_size(self, ref: str) -> int:
        """Bytes of the image's layers, uncompressed (what ``podman images`` shows)."""
        return int(self.run("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())

    def labels(self, ref: str) -> dict[str, str]:
        labels: dict[str, str] = json.loads(
            self.run("image", "inspect", "--format", "{{json .Labels}}", ref).stdout) or {}
        return labels

    def container_exists(self, name: str) -> bool:
        return self.run("container", "exists", name, check=False).returncode == 0

    def cached(self, key: str, make: Callable[[], str]) -> str:
        """The image made by ``make`` (its reference), made once per store."""
        if key not in self.images:
            start = time.monotonic()
            self.images[key] = make()
            self.timings[f"make {key}"] = time.monotonic() - start
        return self.images[key]


@dataclass
class OfflinePip:
    """Wheels in ``directory`` and a pip.conf that makes pip in a build use nothing else."""

    directory: Path
    pip_conf: Path
    torch_requirement: str

    def volumes(self) -> list[str]:
        """``podman build`` options: the wheels at /wheels, the configuration at /etc/pip.conf (empty
        mount points of both stay in the image)."""
        return ["-v", f"{self.directory}:/wheels:ro", "-v", f"{self.pip_conf}:/etc/pip.conf:ro"]


_STORE: Podman | None = None


def shared_podman() -> Podman:
    """The session's image store, made on first use in a temporary directory and removed at exit."""
    global _STORE
    binary = need_binary("podman", "the image tests build and run images; apt-get install podman")
    need_binary("runc", "podman runs containers with runc here; apt-get install runc")
    if _STORE is None:
        store = Podman(binary, Path(tempfile.mkdtemp(prefix="gpuaccept-podman-")))
        store.conf.write_text(containers_conf_text())
        atexit.register(_remove, store)
        _STORE = store
    return _STORE


def _remove(store: Podman) -> None:
    if store.timings:
        print("[podman timings] " + ", ".join(f"{k}: {v:.0f} s" for k, v in store.timings.items()), file=sys.stderr)
    # containers, then images (which unmounts their layers); not 'system reset', which also touches
    # state outside --root such as networks
    for args in (("rm", "--all", "--force"), ("rmi", "--all", "--force")):
        subprocess.run(store.argv(*args), capture_output=True, timeout=300, env=store.env(), stdin=subprocess.DEVNULL)
    shutil.rmtree(store.directory, ignore_errors=True)


def make_debian_base(store: Podman, tag: str = DEBIAN_BASE, include: Sequence[str] = ()) -> str:
    """A Debian minbase (merged /usr) from ``DEBIAN_MIRROR`` by mmdebstrap, imported as ``tag``."""
    mmdebstrap = need_binary("mmdebstrap", "the image tests make their Debian base image; apt-get install mmdebstrap")
    argv = [mmdebstrap, "--quiet", "--variant=minbase", "--format=tar",
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"]
    if include:
        argv.append("--include=" + ",".join(include))
    argv += [DEBIAN_SUITE, "-", DEBIAN_MIRROR]
    log = store.directory / "mmdebstrap.log"
    with open(log, "wb") as err, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err,
                                                  stdin=subprocess.DEVNULL) as debs:
        assert debs.stdout is not None
        imported = subprocess.run(store.argv("import", "-", tag), stdin=debs.stdout, capture_output=True,
                                  text=True, timeout=600, env=store.env())
        debs.stdout.close()
        debs.wait(timeout=600)
    if debs.returncode != 0 or imported.returncode != 0:
        pytest.fail(f"mmdebstrap ({debs.returncode}) | podman import ({imported.returncode}) failed:\n"
                    f"{log.read_text(errors='replace')[-3000:]}\n{imported.stderr[-3000:]}")
    return tag


def debian_base(store: Podman) -> str:
    """The Debian minbase image (made once per store)."""
    return store.cached("debian-base", lambda: make_debian_base(store))


def wheel_requirements() -> list[str]:
    """What the images' pip needs offline: this environment's torch (pinned to the exact build, a
    local CPU wheel here), gpuaccept's own dependencies and its build requirements."""
    import tomllib

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        pytest.skip("torch is not installed here, and its wheel goes into the test images")
    deps = [r for r in metadata.requires("gpuaccept") or [] if "extra ==" not in r]
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    return [f"torch=={torch_version}", *deps, *build]  # torch first: make_wheelhouse relies on it


def make_wheelhouse(directory: Path) -> OfflinePip:
    """Download :func:`wheel_requirements` (binary wheels for this interpreter) into ``directory``."""
    if sys.version_info[:2] != (3, 11) or os.uname().machine != "x86_64":
        pytest.skip(f"the test images run Debian {DEBIAN_SUITE}'s Python 3.11 on x86_64; the wheels are "
                    "downloaded for this interpreter, which differs")
    wheels = directory / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    requirements = wheel_requirements()
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest",
                           str(wheels), *requirements], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        pytest.fail(f"pip download failed:\n{proc.stderr[-3000:]}")
    conf = directory / "pip.conf"
    conf.write_text(pip_conf_text("/wheels"))
    return OfflinePip(wheels, conf, requirements[0])


def offline_pip(store: Podman) -> OfflinePip:
    """The wheels of :func:`wheel_requirements` and their pip.conf (downloaded once per store)."""
    if store.wheelhouse is None:
        start = time.monotonic()
        store.wheelhouse = make_wheelhouse(store.directory / "wheelhouse")
        store.timings["download wheels"] = time.monotonic() - start
    return store.wheelhouse


def torch_base(store: Podman) -> str:
    """The NGC PyTorch stand-in (made once per store)."""
    def make() -> str:
        store.build(TORCH_BASE, IMAGES_DATA / "torch-base.Dockerfile", IMAGES_DATA,
                    {"BASE_IMAGE": debian_base(store)}, extra=offline_pip(store).volumes())
        return TORCH_BASE

    return store.cached("torch-base", make)


MULTINODE = "localhost/gpuaccept-test/multinode:test"
TEST_SOURCE = "https://example.org/gpuaccept.git"


def multinode_image(store: Podman) -> str:
    """The multinode image (images/multinode, NCCL_TESTS=off) on the NGC stand-in, built once per store."""
    import gpuaccept

    def make() -> str:
        store.build(MULTINODE, ROOT / "images" / "multinode" / "Dockerfile", ROOT,
                    {"BASE_IMAGE": torch_base(store), "NCCL_TESTS": "off", "GPUACCEPT_VERSION": gpuaccept.__version__,
                     "GPUACCEPT_SOURCE": TEST_SOURCE}, extra=offline_pip(store).volumes())
        return MULTINODE

    return store.cached("multinode", make)

