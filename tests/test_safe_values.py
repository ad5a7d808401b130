"""Values refused when a plan is made, by the same rule that refuses them later (issue #26, item 12), and the
validators of gpuaccept.argtypes on their own."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuaccept import argtypes
from tests.helpers import gpuaccept, one_line_error

DAEMONSET = ("node-status", "daemonset", "--image", "reg.example.com/gpuaccept:1", "--profile", "quick")
BCP = ("launch", "bcp", "--image", "img", "--instance", "i", "--run-id", "r1", "--dry-run")


@pytest.mark.parametrize(("args", "words"), [
    ([*DAEMONSET, "--checks", "$(id)"], "unknown check '$(id)'"),
    ([*DAEMONSET, "--gpus", "a,b"], "--gpus"),
    ([*DAEMONSET, "--budget", "1s"], "--budget"),
    ([*DAEMONSET, "--cpus", "-1"], "a request is a quantity more than 0"),
    ([*DAEMONSET, "--memory", "1e999"], "a request is a quantity more than 0"),
    ([*DAEMONSET, "--run-as-user", "99999999999999999999"], "must be a whole number from 0 to 4294967294"),
    (["node-status", "daemonset", "--image", "Reg/X;id", "--profile", "quick"], "is not an image reference"),
    (["launch", "slurm", "--device", "cpu", "--dry-run", "--nodes", "99999999999"], "--nodes: must be at most"),
    ([*BCP, "--result-mount", "/results; rm -rf /"], "--result-mount"),
    ([*BCP, "--dataset", "123:/data;id"], "--dataset"),
    (["image", "build", "runtime", "--tag", "UPPER/x:1", "--dry-run"], "not a valid image reference"),
    (["isolate", "--backend", "ssh", "--nodes", "a;id,b$(id)", "--dry-run"], "is not a host name"),
    (["isolate", "--backend", "mpi", "--rails-of", "x/../../esc=n2", "--dry-run"], "--rails-of: 'x/../../esc'"),
    (["report", "/dev/zero"], "not a regular file or directory"),
])
def test_a_value_that_would_be_refused_later_is_refused_now(tmp_path: Path, args: list[str], words: str) -> None:
    r = gpuaccept(*args, "--results-dir", str(tmp_path / "res")) if args[0] == "launch" else gpuaccept(*args)
    one_line_error(r, words)
    assert "--run-id" not in r.stderr.replace("--run-id r1", "")
    assert not (tmp_path / "res").exists()


def test_the_daemonset_still_prints_for_good_values() -> None:
    r = gpuaccept(*DAEMONSET, "--checks", "env", "--cpus", "500m", "--memory", "8Gi", "--run-as-user", "1000")
    assert r.returncode == 0, r.stderr
    assert "runAsUser: 1000" in r.stdout and "memory: 8Gi" in r.stdout


@pytest.mark.parametrize("ref", ["nvcr.io/nvidia/pytorch:24.01-py3", "gpuaccept-runtime:0.1", "localhost:5000/a/b",
                                 "Reg.Example.com/x/y@sha256:" + "0" * 64, "a__b/c-d.e"])
def test_image_references_accepted(ref: str) -> None:
    assert argtypes.check_image(ref) == ref


@pytest.mark.parametrize("ref", ["UPPER/x:1", "x:", "a;b", "x y", "/x", "x:1:2", "r.io/x@sha256:abc"])
def test_image_references_refused(ref: str) -> None:
    with pytest.raises(ValueError, match="not an image reference"):
        argtypes.check_image(ref)


@pytest.mark.parametrize(("raw", "safe"), [("gpu node#1", "gpu-node-1"), ("x/../../../escaped", "x-..-..-..-escaped"),
                                           ("..", "host"), ("node17", "node17"), ("-a.", "a")])
def test_host_part_is_a_host_name_and_a_run_id_part(raw: str, safe: str) -> None:
    assert argtypes.host_part(raw) == safe
    assert argtypes.check_host(safe) == safe
    assert argtypes.check_run_id(f"20260101T000000Z-{safe}-abcd")


@pytest.mark.parametrize("text", ["..", "../x", "a/b", ".a", "", "a b", "x" * 201])
def test_run_ids_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a run id"):
        argtypes.check_run_id(text)


@pytest.mark.parametrize("text", ["/results", "/a/b.c_d-e", "/"])
def test_container_paths_accepted(text: str) -> None:
    assert argtypes.check_abs_path(text) == text


@pytest.mark.parametrize("text", ["results", "/a/../b", "/a b", "/a;b", "/$(id)", "/a\nb"])
def test_container_paths_refused(text: str) -> None:
    with pytest.raises(ValueError):
        argtypes.check_abs_path(text)


def test_count_bounds() -> None:
    convert = argtypes.count(1, 10)
    assert convert("10") == 10 and convert(" 1 ") == 1
    for bad in ("0", "11", "-1", "1e3", "x", "9" * 30):
        with pytest.raises(argparse.ArgumentTypeError, match="whole number from 1 to 10"):
            convert(bad)
