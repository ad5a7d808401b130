"""A pip constraints file of an environment: ``name==version`` for every installed distribution.

``pip install -c FILE PKG`` then installs PKG only if nothing already installed has to change
(pip says ResolutionImpossible otherwise). :func:`constraints_text` is pure (distributions in,
file text out); :func:`installed` reads the environment and :func:`write_atomic` writes.

Direct-URL installs (a wheel file, a VCS checkout, a local directory; PEP 610's
``direct_url.json``) and editable installs are pinned by version too, with a comment that names
where they came from. A pin by URL (``--urls``, for non-editable installs) makes pip fetch that
URL each time it resolves the package, and an install fails outright once a local file of it is
gone (images often install torch from a wheel file and delete the file). Left out, with a comment that
says why: versions that are not PEP 440 (pip rejects a file that pins one) and broken metadata.

The module imports only the standard library, so it also runs on its own with any Python 3.8+::

    python3 constraints.py [--output FILE] [--urls]

which is how the images pin their base image's packages before installing gpuaccept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

# PEP 440's version grammar (as in the packaging library), and PEP 508's project names.
_VERSION = re.compile(
    r"^\s*v?(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*"
    r"(?:[-_.]?(?:alpha|a|beta|b|preview|pre|c|rc)[-_.]?[0-9]*)?"
    r"(?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?"
    r"(?:[-_.]?dev[-_.]?[0-9]*)?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$",
    re.IGNORECASE,
)
_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


@dataclass(frozen=True)
class Installed:
    """One installed distribution: its metadata name and version, the directory it is in,
    and its parsed ``direct_url.json`` (None for an install from an index)."""

    name: str
    version: str
    location: str
    direct_url: dict[str, Any] | None = None


def canonical_name(name: str) -> str:
    """PEP 503's normalized form: ``Foo.Bar_baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_pep440(version: str) -> bool:
    return bool(_VERSION.match(version))


def url_pin(direct_url: dict[str, Any]) -> str | None:
    """The PEP 508 URL that reinstalls exactly this direct-URL install, or None when there is none
    (an editable install, a VCS install without a commit id, a malformed record)."""
    url = direct_url.get("url")
    if not isinstance(url, str) or not url:
        return None
    fragments = []
    if "vcs_info" in direct_url:
        vcs = direct_url["vcs_info"]
        commit = vcs.get("commit_id") if isinstance(vcs, dict) else None
        if not commit or not isinstance(vcs.get("vcs"), str):
            return None
        url = f"{vcs['vcs']}+{url}@{commit}"
    elif "archive_info" in direct_url:
        info = direct_url["archive_info"]
        digest = info.get("hash") if isinstance(info, dict) else None
        if isinstance(digest, str) and "=" in digest:
            fragments.append(digest)
    elif "dir_info" in direct_url:
        info = direct_url["dir_info"]
        if isinstance(info, dict) and info.get("editable"):
            return None
    else:
        return None
    subdirectory = direct_url.get("subdirectory")
    if isinstance(subdirectory, str) and subdirectory:
        fragments.append(f"subdirectory={subdirectory}")
    return url + ("#" + "&".join(fragments) if fragments else "")


def _origin(direct_url: dict[str, Any]) -> str:
    """``editable install of URL`` or ``installed from URL`` for a comment."""
    url = str(direct_url.get("url", "an unknown URL"))
    info = direct_url.get("dir_info")
    if isinstance(info, dict) and info.get("editable"):
        return f"editable install of {url}"
    return f"installed from {url}"


def _entry(dist: Installed, urls: bool) -> list[str]:
    """The lines for one distribution: comments, then its pin (none when it is left out)."""
    if not is_pep440(dist.version):
        return [f"# left out: {dist.name} {dist.version} (in {dist.location}): not a PEP 440 version, "
                "and pip rejects a constraints file that pins one"]
    pin = f"{dist.name}=={dist.version}"
    if dist.direct_url is None:
        return [pin]
    origin = _origin(dist.direct_url)
    if urls:
        url = url_pin(dist.direct_url)
        if url is not None:
            return [f"# {dist.name}: {origin}; pinned by URL (pip fetches it whenever it resolves {dist.name})",
                    f"{dist.name} @ {url}"]
        why = ("a constraint cannot be editable" if origin.startswith("editable")
               else "its URL does not name one exact source")
        return [f"# {dist.name}: {origin}; pinned by version: {why}", pin]
    return [f"# {dist.name}: {origin}; pinned by version", pin]


def constraints_text(dists: Iterable[Installed], *, urls: bool = False, source: str = "") -> str:
    """The constraints file for ``dists``, given in sys.path order: the first of a name is the one pip
    sees; later ones are shadowed and noted. Sorted by canonical name; ``source`` names the
    environment in the header."""
    chosen: dict[str, Installed] = {}
    notes: dict[str, list[str]] = {}
    broken: list[str] = []
    for dist in dists:
        if not dist.name or not dist.version or not _NAME.match(dist.name):
            broken.append(f"# left out: a distribution in {dist.location} with the name {dist.name!r} and the "
                          f"version {dist.version!r}: its metadata is broken")
            continue
        key = canonical_name(dist.name)
        first = chosen.setdefault(key, dist)
        if first is not dist:
            notes.setdefault(key, []).append(f"# also found: {dist.name} {dist.version} in {dist.location} "
                                             f"(shadowed: pip sees the one in {first.location})")
    lines = ["# pip constraints: every distribution installed" + (f" for {source}" if source else ""),
             "# written by 'gpuaccept constraints'; use: pip install -c THIS_FILE PACKAGE",
             "# pip then refuses any install that would change one of these packages (ResolutionImpossible)"]
    lines.extend(broken)
    for key in sorted(chosen):
        lines.extend(_entry(chosen[key], urls))
        lines.extend(notes.get(key, []))
    return "\n".join(lines) + "\n"


def site_paths(argv0: str = "") -> list[str]:
    """sys.path without the entry Python put first for the running program (the script's directory,
    or the current directory under ``-c``/``-m``): not an installation that pip manages."""
    paths = list(sys.path)
    if paths and not getattr(sys.flags, "safe_path", False):
        first = os.path.abspath(paths[0])
        script_dir = os.path.dirname(os.path.abspath(argv0)) if argv0 else None
        if first in (os.getcwd(), script_dir):
            paths = paths[1:]
    return paths


def installed(paths: Sequence[str]) -> list[Installed]:
    """The distributions found on ``paths``, in path order (unreadable metadata gives empty fields)."""
    found: list[Installed] = []
    for dist in metadata.distributions(path=list(paths)):
        try:
            name, version = dist.metadata["Name"] or "", dist.metadata["Version"] or ""
        except Exception:  # a dist-info directory without a readable METADATA file
            name, version = "", ""
        direct: dict[str, Any] | None = None
        try:
            raw = dist.read_text("direct_url.json")
        except OSError:
            raw = None
        if raw:
            try:
                loaded = json.loads(raw)
            except ValueError:
                loaded = {"url": "(an unreadable direct_url.json)", "dir_info": {}}
            direct = loaded if isinstance(loaded, dict) else None
        try:
            location = str(dist.locate_file(""))
        except (NotImplementedError, OSError):  # a distribution from a custom finder
            location = "(unknown)"
        found.append(Installed(str(name), str(version), location, direct))
    return found


def environment_name() -> str:
    """The running interpreter, for the header: ``/usr/bin/python3 (Python 3.12.3)``."""
    return f"{sys.executable} (Python {sys.version.split()[0]})"


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename, so a
    failed write leaves nothing behind; a device or FIFO is written as a stream, a link refused (the
    standalone twin of :func:`gpuaccept.outputs.write_output`). Raises OSError."""
    directory = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    if os.path.islink(path):  # as gpuaccept.outputs: never through a link
        raise OSError(40, "it is a symbolic link; name its target", path)
    if os.path.exists(path) and not os.path.isfile(path):  # a device or FIFO: a stream, never replaced
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (no gpuaccept installed): 0 written, 2 when the output cannot be written."""
    parser = argparse.ArgumentParser(prog="constraints.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", "-o", default="-", metavar="FILE", help="where to write ('-': stdout)")
    parser.add_argument("--urls", action="store_true", help="pin direct-URL installs by their URL")
    args = parser.parse_args(argv)
    text = constraints_text(installed(site_paths(sys.argv[0])), urls=args.urls, source=environment_name())
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    try:
        write_atomic(args.output, text)
    except OSError as exc:
        print(f"constraints.py: error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
