"""``gpuaccept image build``: plans (golden files), bad input, warnings, and real podman builds for amd64 and arm64.

The podman tests keep their image store in a temporary directory
(``CONTAINERS_STORAGE_CONF``) and use runc with lower ulimits
(``CONTAINERS_CONF``), as podman 4.3 on Debian 12 needs. Their base images
are a static busybox per architecture, unpacked from Debian by mmdebstrap
(about 10 s each); arm64 RUN steps run under qemu-user-static via binfmt_misc.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuaccept
from gpuaccept.containers import image
from gpuaccept.errors import InputError, UsageError
from gpuaccept.results.load import load_file
from tests.helpers import ROOT, cli_env
from tests.launch_support import check_golden, one_error_line
from tests.sshd import need_binary

VERSION = gpuaccept.__version__
REPORTS = ROOT / "tests" / "data" / "reports"
DEBIAN = "http://deb.debian.org/debian"


def gpuaccept_cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
                  timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuaccept", *args], capture_output=True, text=True, cwd=cwd,
                          env=env if env is not None else cli_env(), timeout=timeout, check=False)


def source_tree(root: Path) -> Path:
    """A minimal build context with images/{multinode,runtime}/Dockerfile."""
    for name in image.IMAGES:
        (root / "images" / name).mkdir(parents=True, exist_ok=True)
        (root / "images" / name / "Dockerfile").write_text("FROM scratch\n")
    return root


def options(tmp_path: Path, **overrides: object) -> image.BuildOptions:
    values: dict[str, object] = dict(image="runtime", platforms=("linux/arm64",), tag="reg.example.com/rt:1",
                                     builder="podman", context=Path("ctx"),
                                     dockerfile=Path("ctx/images/runtime/Dockerfile"), version="9.9.9")
    values.update(overrides)
    return image.BuildOptions(**values)


# ---- parsing --------------------------------------------------------------------------------------------------


def test_platforms_are_normalized_in_order_without_repeats() -> None:
    assert image.parse_platforms("arm64, linux/amd64,aarch64") == ("linux/arm64", "linux/amd64")
    assert image.parse_platforms("linux/arm64/v8") == ("linux/arm64",)
    assert image.parse_platforms("x86_64") == ("linux/amd64",)


@pytest.mark.parametrize("text", ["linux/s390x", "windows/amd64", ",", "arm"])
def test_unknown_platforms_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--platform"):
        image.parse_platforms(text)


def test_build_args() -> None:
    assert image.parse_build_arg("BASE_IMAGE=nvcr.io/nvidia/pytorch:25.01-py3") == \
        ("BASE_IMAGE", "nvcr.io/nvidia/pytorch:25.01-py3")
    assert image.parse_build_arg("A=x=y") == ("A", "x=y")
    assert image.parse_build_arg("EMPTY=") == ("EMPTY", "")
    for bad in ("NOVALUE", "1A=x", "=x", "A B=c"):
        with pytest.raises(UsageError, match="KEY=VALUE"):
            image.parse_build_arg(bad)
    with pytest.raises(UsageError, match="package version"):
        image.parse_build_arg("GPUACCEPT_VERSION=0.0.1")


@pytest.mark.parametrize("tag", ["gpuaccept-runtime:0.1.0", "localhost/x", "registry.example.com:5000/a/b-c:v1.2_3",
                                 "nvcr.io/team/gpuaccept"])
def test_valid_tags(tag: str) -> None:
    assert image.check_tag(tag) == tag


@pytest.mark.parametrize("tag", ["Runtime:1", "a b", "x:", "x@sha256:abc", "-x", "x:-1", ""])
def test_invalid_tags(tag: str) -> None:
    with pytest.raises(UsageError, match="not a valid image reference"):
        image.check_tag(tag)


def test_image_names() -> None:
    assert image.check_image_name("runtime", custom_file=False) == "runtime"
    assert image.check_image_name("tiny", custom_file=True) == "tiny"
    with pytest.raises(UsageError, match="known: multinode, runtime"):
        image.check_image_name("tiny", custom_file=False)
    with pytest.raises(UsageError, match="lowercase"):
        image.check_image_name("Tiny", custom_file=True)


# ---- where the Dockerfiles are --------------------------------------------------------------------------------


def test_checkout_root_is_found_from_the_package_location(tmp_path: Path) -> None:
    assert image.checkout_root(ROOT / "src" / "gpuaccept") == ROOT
    (tmp_path / "src" / "gpuaccept").mkdir(parents=True)
    assert image.checkout_root(tmp_path / "src" / "gpuaccept") is None  # no pyproject.toml
    site = tmp_path / "lib" / "python3.11" / "site-packages" / "gpuaccept"
    site.mkdir(parents=True)
    assert image.checkout_root(site) is None


def test_locate_uses_the_checkout_unless_a_context_is_given(tmp_path: Path) -> None:
    tree = source_tree(tmp_path / "tree")
    (tree / "pyproject.toml").write_text("[project]\nname = 'gpuaccept'\n")
    package = tree / "src" / "gpuaccept"
    package.mkdir(parents=True)
    assert image.locate("multinode", None, None, package) == (tree, tree / "images" / "multinode" / "Dockerfile")
    other = source_tree(tmp_path / "other")
    assert image.locate("runtime", str(other), None, package) == (other, other / "images" / "runtime" / "Dockerfile")
    custom = tmp_path / "custom.Dockerfile"
    custom.write_text("FROM scratch\n")
    assert image.locate("tiny", str(other), str(custom), package) == (other, custom)


def test_locate_errors(tmp_path: Path) -> None:
    site = tmp_path / "site-packages" / "gpuaccept"
    site.mkdir(parents=True)
    with pytest.raises(UsageError, match=r"not installed from a source checkout.*--context DIR"):
        image.locate("runtime", None, None, site)
    with pytest.raises(InputError, match="no such directory"):
        image.locate("runtime", str(tmp_path / "nope"), None, site)
    with pytest.raises(InputError, match="images/runtime/Dockerfile does not exist"):
        image.locate("runtime", str(tmp_path), None, site)
    with pytest.raises(InputError, match=r"missing\.Dockerfile does not exist"):
        image.locate("runtime", str(tmp_path), str(tmp_path / "missing.Dockerfile"), site)


# ---- builders -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("installed", "buildx", "expected", "noted"), [
    ({"docker", "podman"}, True, "docker", False),
    ({"docker", "podman"}, False, "podman", True),
    ({"podman"}, False, "podman", False),
    ({"docker"}, False, "docker", False),
    ({"docker"}, True, "docker", False),
])
def test_auto_detection(installed: set[str], buildx: bool, expected: str, noted: bool) -> None:
    probes: list[str] = []

    def which(name: str) -> str | None:
        return f"/usr/bin/{name}" if name in installed else None

    def has_buildx() -> bool:
        probes.append("buildx")
        return buildx

    builder, notes = image.detect_builder("auto", which, has_buildx)
    assert builder == expected
    assert bool(notes) == noted
    assert probes == (["buildx"] if "docker" in installed else [])


def test_named_builder_and_no_builder() -> None:
    assert image.detect_builder("podman", lambda _: None, lambda: False) == ("podman", [])
    with pytest.raises(image.BuilderMissing, match="no container builder found"):
        image.detect_builder("auto", lambda _: None, lambda: False)
    with pytest.raises(image.BuilderMissing, match="podman is not installed"):
        image.check_builder("podman", lambda _: None, lambda: True)
    with pytest.raises(image.BuilderMissing, match="no buildx plugin"):
        image.check_builder("docker", lambda n: f"/usr/bin/{n}", lambda: False)


# ---- plans ----------------------------------------------------------------------------------------------------


def test_docker_multi_platform_load_is_refused(tmp_path: Path) -> None:
    opts = options(tmp_path, builder="docker", platforms=("linux/amd64", "linux/arm64"), output="load")
    with pytest.raises(UsageError, match="docker cannot load a multi-platform image"):
        image.plan_build(opts)


def test_docker_output_defaults(tmp_path: Path) -> None:
    single = image.plan_build(options(tmp_path, builder="docker"))
    assert single.steps[0].argv[-2:] == ("--load", "ctx") and not single.warnings
    multi = image.plan_build(options(tmp_path, builder="docker", platforms=("linux/amd64", "linux/arm64")))
    assert "--load" not in multi.steps[0].argv and "--push" not in multi.steps[0].argv
    assert len(multi.warnings) == 1 and "build cache only" in multi.warnings[0]


def test_podman_load_is_its_default_and_multi_platform_builds_a_fresh_manifest_list(tmp_path: Path) -> None:
    assert image.plan_build(options(tmp_path, output="load")) == image.plan_build(options(tmp_path))
    plan = image.plan_build(options(tmp_path, platforms=("linux/amd64", "linux/arm64"), output="load"))
    assert [s.argv[:3] for s in plan.steps] == [("podman", "manifest", "rm"), ("podman", "build", "--platform")]
    assert plan.steps[0].only_if == ("podman", "manifest", "exists", "reg.example.com/rt:1")
    assert "--manifest" in plan.steps[1].argv and "--tag" not in plan.steps[1].argv


def test_cluster_warnings() -> None:
    assert image.cluster_warnings(["linux/arm64"], {"linux/arm64": "from --cluster-arch"}) == []
    assert image.cluster_warnings(["linux/amd64", "linux/arm64"], {"linux/arm64": "x"}) == []
    [only] = image.cluster_warnings(["linux/amd64"], {"linux/arm64": "from --cluster-arch"})
    assert "no match for platform in manifest" in only and only.endswith("(add --platform linux/arm64)")
    [odd] = image.cluster_warnings(["linux/amd64"], {"linux/ppc64le": "node p9"})
    assert "linux/ppc64le" in odd and "add --platform" not in odd


def test_emulation_warnings(tmp_path: Path) -> None:
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    (tmp_path / "qemu-x86_64").write_text("disabled\n")

    def registered(name: str) -> bool:
        return image.binfmt_registered(name, tmp_path)

    assert image.emulation_warnings(["linux/amd64", "linux/arm64"], "x86_64", registered) == []
    [warning] = image.emulation_warnings(["linux/amd64", "linux/arm64"], "aarch64", registered)
    assert "no qemu-x86_64 handler" in warning and "exec format error" in warning


def test_report_platforms(tmp_path: Path) -> None:
    node = load_file(REPORTS / "node-cpu.json")
    assert image.report_platforms(node, "r.json") == {"linux/amd64": "node vm in r.json"}
    with pytest.raises(InputError, match="recorded its architecture"):
        image.report_platforms(load_file(REPORTS / "cluster-h100.json"), "c.json")


# ---- the command ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("builder", "platforms"), [("docker", "linux/arm64"), ("docker", "linux/amd64,linux/arm64"),
                                                    ("podman", "linux/arm64"), ("podman", "linux/amd64,linux/arm64")])
def test_dry_run_matches_the_golden_plan(tmp_path: Path, builder: str, platforms: str) -> None:
    source_tree(tmp_path / "ctx")
    r = gpuaccept_cli("image", "build", "runtime", "--builder", builder, "--platform", platforms, "--push",
                      "--tag", "registry.example.com/gpuaccept-runtime:1", "--build-arg",
                      "BASE_IMAGE=nvcr.io/nvidia/pytorch:25.01-py3", "--context", "ctx", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = r.stdout.replace(f"GPUACCEPT_VERSION={VERSION}", "GPUACCEPT_VERSION={version}")
    check_golden(f"image/{builder}-{'multi' if ',' in platforms else 'arm64'}-push.sh", text)


def test_dry_run_is_a_script_sh_accepts(tmp_path: Path) -> None:
    source_tree(tmp_path / "ctx")
    r = gpuaccept_cli("image", "build", "multinode", "--builder", "podman", "--platform", "amd64,arm64",
                      "--build-arg", "NOTE=two words; $(not run)", "--context", "ctx", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    check = subprocess.run(["sh", "-n"], input=r.stdout, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    assert "'NOTE=two words; $(not run)'" in r.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["nosuch"], "unknown image 'nosuch' (known: multinode, runtime"),
    (["runtime", "--context", "empty"], "images/runtime/Dockerfile does not exist"),
    (["runtime", "--context", "ctx", "--file", "nope/Dockerfile"], "Dockerfile nope/Dockerfile does not exist"),
    (["runtime", "--context", "ctx", "--platform", "linux/riscv64"], "--platform: unknown platform 'linux/riscv64'"),
    (["runtime", "--context", "ctx", "--builder", "docker", "--platform", "linux/amd64,linux/arm64", "--load"],
     "docker cannot load a multi-platform image"),
    (["runtime", "--context", "ctx", "--push"], "--push needs --tag"),
    (["runtime", "--context", "ctx", "--tag", "Bad Tag"], "not a valid image reference"),
    (["runtime", "--context", "ctx", "--build-arg", "oops"], "KEY=VALUE"),
    (["runtime", "--context", "ctx", "--cluster-arch", "sparc"], "--cluster-arch 'sparc': unknown architecture"),
    (["runtime", "--context", "ctx", "--cluster-report", "missing/report.json"], "no such file or directory"),
    (["runtime", "--context", "ctx", "--push", "--load"], "not allowed with argument"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    source_tree(tmp_path / "ctx")
    (tmp_path / "empty").mkdir()
    assert message in one_error_line(gpuaccept_cli("image", "build", *args, "--dry-run", cwd=tmp_path))


def test_no_builder_installed(tmp_path: Path) -> None:
    source_tree(tmp_path / "ctx")
    bare = tmp_path / "bin"
    bare.mkdir()
    env = cli_env(PATH=str(bare))
    r = gpuaccept_cli("image", "build", "runtime", "--context", "ctx", "--platform", "arm64", "--dry-run",
                      cwd=tmp_path, env=env)
    assert "no container builder found" in one_error_line(r)
    r = gpuaccept_cli("image", "build", "runtime", "--context", "ctx", "--platform", "arm64", "--builder", "podman",
                      cwd=tmp_path, env=env)
    assert "podman is not installed" in one_error_line(r)
    # a named builder still prints its plan where it is not installed
    r = gpuaccept_cli("image", "build", "runtime", "--context", "ctx", "--platform", "arm64", "--builder", "docker",
                      "--dry-run", cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout.startswith("docker buildx build --platform linux/arm64 "), r.stderr


def test_platform_differing_from_the_cluster_warns_on_one_line(tmp_path: Path) -> None:
    source_tree(tmp_path / "ctx")
    arm = json.loads((REPORTS / "node-cpu.json").read_text())
    for check in arm["checks"]:
        if check["name"] == "env":
            check["details"]["machine"] = "aarch64"
    arm["host"] = "gh-001"
    (tmp_path / "arm.json").write_text(json.dumps(arm))
    r = gpuaccept_cli("image", "build", "runtime", "--builder", "docker", "--context", "ctx", "--platform",
                      "linux/amd64", "--cluster-report", "arm.json", "--cluster-arch", "x86_64,aarch64", "--dry-run",
                      cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("docker buildx build --platform linux/amd64 ")
    warnings = [line for line in r.stderr.splitlines() if "cluster's nodes" in line]
    assert warnings == [
        "gpuaccept: warning: the cluster's nodes are linux/arm64 (from --cluster-arch) but the image is built for "
        "linux/amd64 only; pulling it there fails with 'no match for platform in manifest' "
        "(add --platform linux/arm64)"], r.stderr
    r = gpuaccept_cli("image", "build", "runtime", "--builder", "docker", "--context", "ctx", "--platform",
                      "linux/amd64", "--cluster-report", "arm.json", "--dry-run", cwd=tmp_path)
    assert "(node gh-001 in arm.json)" in r.stderr
    r = gpuaccept_cli("image", "build", "runtime", "--builder", "docker", "--context", "ctx", "--platform",
                      "linux/amd64,linux/arm64", "--push", "--tag", "r.io/x:1", "--cluster-report", "arm.json",
                      "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and "cluster's nodes" not in r.stderr, r.stderr


def test_default_platform_is_the_hosts(tmp_path: Path) -> None:
    source_tree(tmp_path / "ctx")
    r = gpuaccept_cli("image", "build", "runtime", "--builder", "docker", "--context", "ctx", "--dry-run",
                      cwd=tmp_path)
    host = image.machine_platform(platform.machine())
    assert r.returncode == 0, r.stderr
    assert f"--platform {host} " in r.stdout and f"--tag gpuaccept-runtime:{VERSION} " in r.stdout


# ---- real podman builds ---------------------------------------------------------------------------------------


TINY = """\
ARG TARGETARCH
ARG BASE_IMAGE=localhost/gpuaccept-test-base-${TARGETARCH}:1
FROM ${BASE_IMAGE}
ARG GPUACCEPT_VERSION
LABEL org.opencontainers.image.version=${GPUACCEPT_VERSION}
RUN ["/bin/busybox", "sh", "-c", "/bin/busybox uname -m > /built-arch"]
"""


def ensure_emulation(platform_key: str) -> None:
    """binfmt_misc must run ``platform_key`` binaries on this host; under CI=true (root) it is set up here."""
    arch = image.PLATFORMS[platform_key]
    if image.machine_platform(platform.machine()) == platform_key:
        return
    need_binary(f"qemu-{arch}-static", "runs foreign-architecture RUN steps (Debian: qemu-user-static)")
    handler = f"qemu-{arch}"
    if not image.binfmt_registered(handler) and os.environ.get("CI") == "true" and os.geteuid() == 0:
        binfmt = Path("/proc/sys/fs/binfmt_misc")
        if not (binfmt / "register").exists():
            subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt)], capture_output=True,
                           check=False)
        update = need_binary("update-binfmts", "registers the qemu handlers (Debian: binfmt-support)")
        subprocess.run([update, "--enable", handler], capture_output=True, check=False)
    if not image.binfmt_registered(handler):
        why = f"binfmt_misc has no {handler} handler (mount binfmt_misc, then update-binfmts --enable {handler})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI=true, so this is a failure, not a skip")
        pytest.skip(why)


class Podman:
    """podman with a private image store under a temporary directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        conf, storage = directory / "containers.conf", directory / "storage.conf"
        conf.write_text('[engine]\nruntime = "runc"\n\n[containers]\n'
                        'default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n')
        storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{directory / "root"}"\n'
                           f'runroot = "{directory / "run"}"\n')
        self.env = cli_env(CONTAINERS_CONF=str(conf), CONTAINERS_STORAGE_CONF=str(storage))
        self.bases: set[str] = set()

    def __call__(self, *args: str, timeout: float = 120) -> str:
        r = subprocess.run(["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout,
                           check=False)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    def base(self, platform_key: str) -> None:
        """localhost/gpuaccept-test-base-ARCH:1: a static busybox of that architecture from Debian."""
        arch = platform_key.split("/")[1]
        if arch in self.bases:
            return
        tar = self.directory / f"base-{arch}.tar"
        r = subprocess.run(["mmdebstrap", f"--arch={arch}", "--variant=extract", "--include=busybox-static",
                            "--quiet", "bookworm", str(tar), DEBIAN], capture_output=True, text=True, timeout=240,
                           check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        self("import", "--arch", arch, str(tar), f"localhost/gpuaccept-test-base-{arch}:1")
        self.bases.add(arch)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    need_binary("podman", "the podman builder is tested for real")
    need_binary("runc", "podman 4.3 runs its build containers with runc here")
    need_binary("mmdebstrap", "makes the tiny base images")
    yield Podman(tmp_path_factory.mktemp("podman"))


def build(podman: Podman, tmp_path: Path, platforms: str, tag: str) -> subprocess.CompletedProcess[str]:
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(TINY)
    return gpuaccept_cli("image", "build", "tiny", "--builder", "podman", "--file", "ctx/Dockerfile", "--context",
                         "ctx", "--platform", platforms, "--tag", tag, cwd=tmp_path, env=podman.env)


@pytest.mark.slow
@pytest.mark.parametrize(("platform_key", "machine"), [("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")])
def test_podman_builds_one_platform(podman: Podman, tmp_path: Path, platform_key: str, machine: str) -> None:
    ensure_emulation(platform_key)
    podman.base(platform_key)
    tag = f"localhost/gpuaccept-tiny:{platform_key.split('/')[1]}"
    r = build(podman, tmp_path, platform_key, tag)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    info = json.loads(podman("image", "inspect", tag))[0]
    assert info["Architecture"] == platform_key.split("/")[1]
    assert info["Labels"]["org.opencontainers.image.version"] == VERSION
    ran = podman("run", "--rm", "--platform", platform_key, tag, "/bin/busybox", "cat", "/built-arch")
    assert ran.strip() == machine
    assert f"[IMAGE] built {tag} for {platform_key} with podman" in r.stdout


@pytest.mark.slow
def test_podman_builds_a_manifest_list_and_a_rebuild_replaces_it(podman: Podman, tmp_path: Path) -> None:
    for key in image.PLATFORMS:
        ensure_emulation(key)
        podman.base(key)
    tag = "localhost/gpuaccept-tiny:multi"
    r = build(podman, tmp_path, "linux/amd64,linux/arm64", tag)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    dry = gpuaccept_cli("image", "build", "tiny", "--builder", "podman", "--file", "ctx/Dockerfile", "--context",
                        "ctx", "--platform", "linux/amd64,linux/arm64", "--tag", tag, "--dry-run", cwd=tmp_path,
                        env=podman.env)
    announced = [line.removeprefix("[IMAGE] ") for line in r.stdout.splitlines() if line.startswith("[IMAGE] ")]
    assert announced[:-1] == dry.stdout.splitlines()  # the real build ran exactly the dry run's commands
    (tmp_path / "ctx" / "Dockerfile").write_text(TINY + 'RUN ["/bin/busybox", "touch", "/second"]\n')
    r = gpuaccept_cli("image", "build", "tiny", "--builder", "podman", "--file", "ctx/Dockerfile", "--context",
                      "ctx", "--platform", "linux/amd64,linux/arm64", "--tag", tag, cwd=tmp_path, env=podman.env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    manifests = json.loads(podman("manifest", "inspect", tag))["manifests"]
    assert sorted(m["platform"]["architecture"] for m in manifests) == ["amd64", "arm64"]


@pytest.mark.slow
def test_a_failing_build_exits_1_naming_the_command(podman: Podman, tmp_path: Path) -> None:
    host = image.machine_platform(platform.machine())
    if host is None:
        pytest.skip(f"no test base image for a {platform.machine()} host")
    podman.base(host)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(TINY + 'RUN ["/bin/busybox", "false"]\n')
    r = gpuaccept_cli("image", "build", "broken", "--builder", "podman", "--file", "ctx/Dockerfile", "--context",
                      "ctx", "--tag", "localhost/broken:1", cwd=tmp_path, env=podman.env)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1].startswith("gpuaccept: error: podman exited ")
    assert "podman build --platform" in r.stderr.splitlines()[-1]


def test_docker_buildx_builds_for_real_where_it_is_installed(tmp_path: Path) -> None:
    """Debian's docker.io has no buildx, so CI checks the docker path as plans; where buildx works, build for real."""
    host = image.machine_platform(platform.machine())
    probe = subprocess.run("docker buildx version && docker info", shell=True, capture_output=True, check=False)
    if probe.returncode != 0 or host is None:
        pytest.skip("docker with the buildx plugin and a running daemon are not available here")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "marker").write_text("x\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nARG GPUACCEPT_VERSION\n"
                                    "LABEL org.opencontainers.image.version=${GPUACCEPT_VERSION}\n"
                                    "COPY marker /marker\n")
    tag = f"gpuaccept-test-docker:{os.getpid()}"
    r = gpuaccept_cli("image", "build", "tiny", "--builder", "docker", "--file", "ctx/Dockerfile", "--context", "ctx",
                      "--platform", host, "--load", "--tag", tag, cwd=tmp_path)
    try:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        inspect = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True, check=True)
        info = json.loads(inspect.stdout)[0]
        assert info["Architecture"] == host.split("/")[1]
        assert info["Config"]["Labels"]["org.opencontainers.image.version"] == VERSION
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)
