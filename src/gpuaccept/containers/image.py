"""``gpuaccept image build``: the build of the multinode and runtime images as a plan of builder commands.

Builders
    ``docker`` runs ``docker buildx build`` (one command for any number of
    platforms); ``podman`` runs ``podman build``, with ``--manifest TAG``
    when several platforms are asked for (podman 4 then builds a manifest
    list, and pushes it with ``podman manifest push --all``). Auto-detection
    (:func:`detect_builder`) prefers docker with buildx, then podman.

Plans
    :func:`plan_build` turns :class:`BuildOptions` into a :class:`BuildPlan`:
    steps (argv tuples, each optionally guarded by a probe command) and
    warnings. ``--dry-run`` prints :meth:`BuildPlan.render`, a shell script
    of exactly the commands :func:`run_plan` executes.

Images
    ``images/<name>/Dockerfile`` with the repository root as build context.
    Installed from a checkout (editable), the root is found from the package
    location (:func:`checkout_root`); otherwise ``--context DIR`` must name
    one. Every build gets ``--build-arg GPUACCEPT_VERSION=<package version>``;
    the Dockerfiles also take ``ARG BASE_IMAGE``.

Everything here except :func:`locate`, :func:`run_plan` and the default
probes is a pure function of its arguments.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuaccept.argtypes import check_image
from gpuaccept.errors import InputError, UsageError

IMAGES = ("multinode", "runtime")
BUILDERS = ("docker", "podman")
VERSION_ARG = "GPUACCEPT_VERSION"
BASE_ARG = "BASE_IMAGE"
OUTPUTS = ("push", "load", "none")

#: Platforms gpuaccept images are built for, with the ``uname -m`` of their nodes.
PLATFORMS: dict[str, str] = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
_ALIASES = {"amd64": "linux/amd64", "x86_64": "linux/amd64", "x86-64": "linux/amd64", "linux/x86_64": "linux/amd64",
            "arm64": "linux/arm64", "aarch64": "linux/arm64", "linux/aarch64": "linux/arm64",
            "linux/arm64/v8": "linux/arm64", "arm64/v8": "linux/arm64"}
_NO_MATCH = "no match for platform in manifest"

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")


class BuilderMissing(UsageError):
    """No usable container builder (exit 2)."""


@dataclass(frozen=True)
class BuildOptions:
    """What to build, resolved: a known builder, existing paths, validated platforms and tag."""

    image: str
    platforms: tuple[str, ...]
    tag: str
    builder: str
    context: Path
    dockerfile: Path
    version: str
    output: str = "none"
    build_args: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Step:
    """One command; when ``only_if`` is set, it runs only where that probe command exits 0."""

    argv: tuple[str, ...]
    only_if: tuple[str, ...] | None = None

    def shell(self) -> str:
        line = shlex.join(self.argv)
        return f"{shlex.join(self.only_if)} && {line}" if self.only_if else line


@dataclass(frozen=True)
class BuildPlan:
    """The commands of a build, in order, and what the user should know before it runs."""

    builder: str
    steps: tuple[Step, ...]
    warnings: tuple[str, ...] = ()

    def render(self) -> str:
        return "".join(step.shell() + "\n" for step in self.steps)


# ---- parsing and validation -------------------------------------------------------------------------------------


def normalize_platform(text: str) -> str:
    """``linux/arm64`` (also ``arm64``, ``aarch64``, ``linux/arm64/v8``...) -> a key of PLATFORMS."""
    key = text.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PLATFORMS:
        raise UsageError(f"unknown platform {text.strip()!r} (known: {', '.join(PLATFORMS)})")
    return key


def parse_platforms(text: str) -> tuple[str, ...]:
    """``"linux/amd64,linux/arm64"`` -> normalized platforms, in order, without repeats."""
    items = [t for t in (p.strip() for p in text.split(",")) if t]
    if not items:
        raise UsageError("--platform: name at least one platform, e.g. linux/amd64,linux/arm64")
    try:
        return tuple(dict.fromkeys(normalize_platform(p) for p in items))
    except UsageError as exc:
        raise UsageError(f"--platform: {exc}") from None


def machine_platform(machine: str) -> str | None:
    """The platform of a ``uname -m`` value (None when gpuaccept builds nothing for it)."""
    return _ALIASES.get(machine.strip().lower()) or (machine if machine in PLATFORMS else None)


def parse_build_arg(text: str) -> tuple[str, str]:
    """``K=V`` -> ``(K, V)``; V may be empty or contain ``=``."""
    key, sep, value = text.partition("=")
    if not sep or not _KEY.match(key):
        raise UsageError(f"--build-arg {text!r}: expected KEY=VALUE with KEY a name such as {BASE_ARG}")
    if key == VERSION_ARG:
        raise UsageError(f"--build-arg {VERSION_ARG} is set by gpuaccept from the installed package version")
    return key, value


def check_tag(tag: str) -> str:
    """``tag`` when it is a valid image reference (``[registry[:port]/]name[:tag]``, lowercase name)."""
    try:
        check_image(tag)
        ok = "@" not in tag
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"--tag {tag!r} is not a valid image reference (expected [REGISTRY/]NAME[:TAG], "
                         "NAME in lowercase, e.g. registry.example.com/gpuaccept-runtime:0.1.0)")
    return tag


def default_tag(image: str, version: str) -> str:
    return f"gpuaccept-{image}:{version}"


def check_image_name(image: str, custom_file: bool) -> str:
    """A known image name, or (with ``--file``) any lowercase name for the default tag."""
    if image in IMAGES or (custom_file and _NAME.match(image)):
        return image
    if custom_file:
        raise UsageError(f"image name {image!r}: use lowercase letters, digits and . _ -")
    raise UsageError(f"unknown image {image!r} (known: {', '.join(IMAGES)}; or give --file DOCKERFILE)")


# ---- where the Dockerfiles are ----------------------------------------------------------------------------------


def checkout_root(package_dir: Path) -> Path | None:
    """The source tree holding ``package_dir`` (``<root>/src/gpuaccept``) when it is one, else None."""
    src = package_dir.resolve().parent
    if src.name == "src" and (src.parent / "pyproject.toml").is_file():
        return src.parent
    return None


def locate(image: str, context: str | None, dockerfile: str | None, package_dir: Path) -> tuple[Path, Path]:
    """``(context, dockerfile)`` for a build; UsageError/InputError when either does not exist."""
    if context is not None:
        ctx = Path(context)
    else:
        root = checkout_root(package_dir)
        if root is None:
            raise UsageError(f"gpuaccept is not installed from a source checkout ({package_dir}); pass --context DIR "
                             f"naming a gpuaccept source tree (the one holding images/{image}/Dockerfile)")
        ctx = root
    if not ctx.is_dir():
        raise InputError(f"--context {ctx}: no such directory")
    path = Path(dockerfile) if dockerfile is not None else ctx / "images" / image / "Dockerfile"
    if not path.is_file():
        hint = "" if dockerfile is not None else f" (--context names a gpuaccept source tree holding images/{image})"
        raise InputError(f"Dockerfile {path} does not exist{hint}")
    return ctx, path


# ---- builders ---------------------------------------------------------------------------------------------------


def detect_builder(choice: str, which: Callable[[str], str | None],
                   has_buildx: Callable[[], bool]) -> tuple[str, list[str]]:
    """The builder to use and warnings: ``choice`` as named, or for ``auto`` docker (with buildx), else podman.

    ``which`` finds a command (``shutil.which``); ``has_buildx`` says whether
    ``docker buildx version`` works and is only called when docker is found.
    """
    if choice in BUILDERS:
        return choice, []
    if choice != "auto":
        raise UsageError(f"--builder {choice!r}: expected auto, docker or podman")
    docker, podman = which("docker"), which("podman")
    if docker and has_buildx():
        return "docker", []
    if podman:
        notes = ["docker is installed without buildx ('docker buildx version' fails); building with podman"] \
            if docker else []
        return "podman", notes
    if docker:
        return "docker", []  # run_plan explains the missing buildx plugin
    raise BuilderMissing("no container builder found: install docker with the buildx plugin, or podman "
                         "(or name one with --builder)")


def docker_has_buildx(docker: str = "docker") -> bool:
    """Whether ``docker buildx version`` exits 0."""
    try:
        return subprocess.run([docker, "buildx", "version"], capture_output=True, timeout=30,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# ---- the plan ---------------------------------------------------------------------------------------------------


def plan_build(opts: BuildOptions) -> BuildPlan:
    """The builder commands for ``opts``; UsageError for a combination the builder cannot do."""
    if opts.builder not in BUILDERS:
        raise UsageError(f"unknown builder {opts.builder!r} (expected one of {', '.join(BUILDERS)})")
    if opts.output not in OUTPUTS:
        raise UsageError(f"unknown output {opts.output!r} (expected one of {', '.join(OUTPUTS)})")
    if not opts.platforms:
        raise UsageError("name at least one platform")
    multi = len(opts.platforms) > 1
    platforms = ",".join(opts.platforms)
    args: list[str] = []
    for key, value in ((VERSION_ARG, opts.version), *opts.build_args):
        args += ["--build-arg", f"{key}={value}"]
    warnings: list[str] = []
    if opts.builder == "docker":
        if multi and opts.output == "load":
            raise UsageError(f"--load with several platforms ({platforms}): docker cannot load a multi-platform "
                             "image into its image store; use --push, or build one platform at a time with --load")
        output = opts.output
        if output == "none" and not multi:
            output = "load"  # like podman: a single-platform image lands in the local image store
        elif output == "none":
            warnings.append(f"a multi-platform docker build ({platforms}) without --push stays in the build cache "
                            "only; add --push to publish it")
        argv = ["docker", "buildx", "build", "--platform", platforms, "--file", str(opts.dockerfile),
                "--tag", opts.tag, *args]
        if output != "none":
            argv.append(f"--{output}")
        argv.append(str(opts.context))
        return BuildPlan("docker", (Step(tuple(argv)),), tuple(warnings))
    steps: list[Step] = []
    name = ["--manifest", opts.tag] if multi else ["--tag", opts.tag]
    if multi:  # podman adds to an existing manifest list of the same name: start afresh
        steps.append(Step(("podman", "manifest", "rm", opts.tag), only_if=("podman", "manifest", "exists", opts.tag)))
    steps.append(Step(("podman", "build", "--platform", platforms, "--file", str(opts.dockerfile), *name, *args,
                       str(opts.context))))
    if opts.output == "push":
        push = ("podman", "manifest", "push", "--all", opts.tag, f"docker://{opts.tag}") if multi \
            else ("podman", "push", opts.tag)
        steps.append(Step(push))
    return BuildPlan("podman", tuple(steps), tuple(warnings))


def cluster_warnings(platforms: Sequence[str], cluster: Mapping[str, str]) -> list[str]:
    """One warning per cluster platform the build leaves out; ``cluster`` maps platform -> where that is known."""
    out = []
    for platform, source in cluster.items():
        if platform in platforms:
            continue
        fix = f" (add --platform {platform})" if platform in PLATFORMS else ""
        out.append(f"the cluster's nodes are {platform} ({source}) but the image is built for {', '.join(platforms)} "
                   f"only; pulling it there fails with '{_NO_MATCH}'{fix}")
    return out


def emulation_warnings(platforms: Sequence[str], host_machine: str, registered: Callable[[str], bool]) -> list[str]:
    """Warnings for platforms this host runs only under emulation that is not set up.

    ``registered(name)`` says whether binfmt_misc has the handler ``name``
    (e.g. ``qemu-aarch64``; see ``/proc/sys/fs/binfmt_misc``).
    """
    host = machine_platform(host_machine)
    out = []
    for platform in platforms:
        if platform == host:
            continue
        handler = f"qemu-{PLATFORMS[platform]}"
        if not registered(handler):
            out.append(f"building {platform} on this {host_machine} host needs qemu emulation, and binfmt_misc has "
                       f"no {handler} handler: RUN steps will fail with 'exec format error' (Debian: apt-get install "
                       f"qemu-user-static binfmt-support; update-binfmts --enable {handler})")
    return out


def binfmt_registered(name: str, root: Path = Path("/proc/sys/fs/binfmt_misc")) -> bool:
    """Whether binfmt_misc has an enabled handler ``name``."""
    try:
        return (root / name).read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        return False


def report_platforms(report: object, source: str) -> dict[str, str]:
    """platform -> description of its nodes, from the ``env`` check of a node or cluster report."""
    from gpuaccept.model import ClusterReport, NodeReport

    reports: list[NodeReport] = []
    if isinstance(report, ClusterReport):
        reports = [e.report for e in report.nodes if e.report is not None]
    elif isinstance(report, NodeReport):
        reports = [report]
    hosts: dict[str, list[str]] = {}
    for node in reports:
        for check in node.checks:
            machine = check.details.get("machine") if check.name == "env" else None
            if isinstance(machine, str) and machine:
                hosts.setdefault(machine_platform(machine) or f"linux/{machine}", []).append(node.host)
                break
    if not hosts:
        raise InputError(f"--cluster-report {source}: no node in it recorded its architecture (the env check's "
                         "'machine'); use --cluster-arch")
    out = {}
    for platform, names in hosts.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out[platform] = f"{'node' if len(names) == 1 else 'nodes'} {shown} in {source}"
    return out


# ---- running ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepFailed:
    """The step that failed and its exit status."""

    step: Step
    returncode: int


def check_builder(builder: str, which: Callable[[str], str | None], has_buildx: Callable[[], bool]) -> None:
    """BuilderMissing unless ``builder`` can run here."""
    if which(builder) is None:
        raise BuilderMissing(f"{builder} is not installed (choose another with --builder, or install it)")
    if builder == "docker" and not has_buildx():
        raise BuilderMissing("docker has no buildx plugin ('docker buildx version' fails; Debian's docker.io ships "
                             "without it): install docker-buildx-plugin (or docker-buildx), or use --builder podman")


def run_plan(plan: BuildPlan, announce: Callable[[str], None]) -> StepFailed | None:
    """Run the steps in order (output passes through); the first failing one, or None."""
    for step in plan.steps:
        announce(step.shell())
        if step.only_if is not None:
            probe = subprocess.run(step.only_if, capture_output=True, check=False)
            if probe.returncode != 0:
                continue
        try:
            code = subprocess.run(step.argv, check=False).returncode
        except OSError as exc:
            raise BuilderMissing(f"cannot run {step.argv[0]}: {exc.strerror}") from None
        if code != 0:
            return StepFailed(step, code)
    return None
