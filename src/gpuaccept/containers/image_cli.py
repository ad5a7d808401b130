"""Subcommand ``image build``: build the multinode or runtime image with docker buildx or podman.

``gpuaccept image build IMAGE [--platform P[,P]] [--tag TAG] [--push|--load]
[--build-arg K=V]... [--builder auto|docker|podman] [--file F] [--context DIR]
[--cluster-arch ARCH[,ARCH]] [--cluster-report REF] [--dry-run]``

``--dry-run`` prints the plan's commands (a shell script) and runs nothing;
otherwise the same commands run with their output passed through. Warnings
go to stderr, one line each. Exit 0 built, 1 a builder command failed, 2 bad
input (unknown image or platform, missing Dockerfile, no builder).

Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from gpuaccept.errors import UsageError


def register(subparsers: Any) -> None:
    img = subparsers.add_parser("image", help="build the gpuaccept container images",
                                description="Build the gpuaccept container images (images/<name>/Dockerfile, "
                                            "context: the source tree).")
    isub = img.add_subparsers(dest="image_command", metavar="ACTION", parser_class=type(img))
    img.set_defaults(handler=lambda args: _missing_action(img))

    b = isub.add_parser(
        "build", help="build an image for one or more platforms with docker buildx or podman",
        description="Build IMAGE (multinode or runtime) from images/IMAGE/Dockerfile in a gpuaccept source tree: "
                    "the checkout gpuaccept runs from, or --context DIR. Every build gets --build-arg "
                    "GPUACCEPT_VERSION=<this version>; set the base with --build-arg BASE_IMAGE=REF.")
    b.add_argument("image", metavar="IMAGE", help="multinode or runtime (with --file: any lowercase name)")
    b.add_argument("--platform", default=None, metavar="P[,P]",
                   help="linux/amd64, linux/arm64 or both, comma-separated (default: this host's). Grace Hopper "
                        "and Grace Blackwell nodes are linux/arm64")
    b.add_argument("--tag", "-t", default=None, metavar="TAG",
                   help="image reference (default: gpuaccept-IMAGE:VERSION; --push needs one naming a registry)")
    out = b.add_mutually_exclusive_group()
    out.add_argument("--push", dest="output", action="store_const", const="push", default="none",
                     help="push the image (several platforms: a manifest list) to the registry named by --tag")
    out.add_argument("--load", dest="output", action="store_const", const="load",
                     help="keep the image in the local image store (docker: one platform only; podman always does)")
    b.add_argument("--build-arg", dest="build_args", action="append", default=[], metavar="K=V",
                   help="a build argument, e.g. BASE_IMAGE=nvcr.io/nvidia/pytorch:25.01-py3 (repeatable)")
    b.add_argument("--builder", choices=("auto", "docker", "podman"), default="auto",
                   help="docker (docker buildx build) or podman (podman build); auto: docker with buildx, else "
                        "podman")
    b.add_argument("--file", "-f", default=None, metavar="DOCKERFILE",
                   help="build this Dockerfile instead of images/IMAGE/Dockerfile")
    b.add_argument("--context", default=None, metavar="DIR",
                   help="build context (default: the gpuaccept source tree this package runs from)")
    b.add_argument("--cluster-arch", default=None, metavar="ARCH[,ARCH]",
                   help="the target nodes' architectures (aarch64, x86_64, ...; Kubernetes: "
                        "'kubectl get nodes -L kubernetes.io/arch'); warn when the build leaves one out")
    b.add_argument("--cluster-report", default=None, metavar="REF",
                   help="a report (file, run directory or run id) from the target nodes: warn when the build "
                        "leaves out an architecture its env check recorded")
    b.add_argument("--db", default=None, metavar="URL", help="history store to look a --cluster-report run id up in")
    b.add_argument("--dry-run", action="store_true", help="print the builder commands and run nothing")
    b.set_defaults(handler=cmd_build)


def _missing_action(parser: argparse.ArgumentParser) -> int:
    raise UsageError(f"{parser.prog} needs an action: build (see '{parser.prog} --help')")


def _warn(message: str) -> None:
    print(f"gpuaccept: warning: {message}", file=sys.stderr, flush=True)


def _cluster(args: argparse.Namespace) -> dict[str, str]:
    """platform -> where that is known, from --cluster-arch and --cluster-report."""
    from gpuaccept.containers import image

    cluster: dict[str, str] = {}
    if args.cluster_arch is not None:
        for item in (a.strip() for a in args.cluster_arch.split(",")):
            if not item:
                continue
            try:
                cluster.setdefault(image.normalize_platform(item), "from --cluster-arch")
            except UsageError:
                raise UsageError(f"--cluster-arch {item!r}: unknown architecture (known: aarch64, x86_64, "
                                 "arm64, amd64)") from None
    if args.cluster_report is not None:
        from gpuaccept.results.load import load_report

        report = load_report(args.cluster_report, db=args.db, report_dir=None)
        for key, source in image.report_platforms(report, args.cluster_report).items():
            cluster.setdefault(key, source)
    return cluster


def cmd_build(args: argparse.Namespace) -> int:
    import gpuaccept
    from gpuaccept.containers import image

    custom = args.file is not None
    name = image.check_image_name(args.image, custom)
    host = platform.machine()
    if args.platform is not None:
        platforms = image.parse_platforms(args.platform)
    else:
        default = image.machine_platform(host)
        if default is None:
            raise UsageError(f"this host is {host}, which gpuaccept builds no image for; name --platform "
                             f"({', '.join(image.PLATFORMS)})")
        platforms = (default,)
    if args.output == "push" and args.tag is None:
        raise UsageError("--push needs --tag naming the registry, e.g. registry.example.com/gpuaccept-"
                         f"{name}:{gpuaccept.__version__}")
    tag = image.check_tag(args.tag if args.tag is not None else image.default_tag(name, gpuaccept.__version__))
    build_args = tuple(image.parse_build_arg(a) for a in args.build_args)
    cluster = _cluster(args)
    context, dockerfile = image.locate(name, args.context, args.file, Path(gpuaccept.__file__).parent)
    builder, notes = image.detect_builder(args.builder, shutil.which, image.docker_has_buildx)
    opts = image.BuildOptions(image=name, platforms=platforms, tag=tag, builder=builder, context=context,
                              dockerfile=dockerfile, version=gpuaccept.__version__, output=args.output,
                              build_args=build_args)
    plan = image.plan_build(opts)
    if not args.dry_run:  # a builder that is not there is the one error to say, before any warning about the build
        image.check_builder(builder, shutil.which, image.docker_has_buildx)
    for message in (*notes, *plan.warnings, *image.cluster_warnings(platforms, cluster),
                    *image.emulation_warnings(platforms, host, image.binfmt_registered)):
        _warn(message)
    if args.dry_run:
        sys.stdout.write(plan.render())
        return 0
    failed = image.run_plan(plan, lambda line: print(f"[IMAGE] {line}", flush=True))
    if failed is not None:
        print(f"gpuaccept: error: {failed.step.argv[0]} exited {failed.returncode}: {failed.step.shell()}",
              file=sys.stderr)
        return 1
    done = "pushed" if args.output == "push" else "built"
    print(f"[IMAGE] {done} {tag} for {', '.join(platforms)} with {builder}", flush=True)
    return 0
