"""Drive headless Chromium over the DevTools protocol (``--remote-debugging-pipe``) for page tests.

No Python package needed: Chromium reads CDP commands from fd 3 and writes
replies and events to fd 4, each message NUL-terminated JSON. :func:`render`
opens a file, waits for the load event, evaluates expressions, and takes a
PNG screenshot, collecting every console message, uncaught exception, log
entry (CSP violations land there) and network request on the way.

Also here: :func:`require_binary` (skip when a system binary is missing,
fail instead when ``CI=true``) and a small PNG decoder (zlib + numpy) to check
that a screenshot is not blank.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")


def require_binary(*names: str, why: str = "") -> str:
    """The path of the first of ``names`` on PATH; skip the test if none (fail instead when CI=true)."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    message = f"{' or '.join(names)} not found on PATH{': ' + why if why else ''}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: the CI script must install it)")
    pytest.skip(message)


class CdpError(RuntimeError):
    pass


@dataclass
class PageRun:
    """What happened while a page loaded and was inspected."""

    console: list[dict[str, Any]] = field(default_factory=list)
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes = b""

    def errors(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions, and error/warning log entries, as text."""
        out = []
        for c in self.console:
            if c.get("type") in ("error", "assert", "warning"):
                out.append("console." + str(c.get("type")) + ": " +
                           " ".join(str(a.get("value", a.get("description", ""))) for a in c.get("args", [])))
        for x in self.exceptions:
            d = x.get("exceptionDetails", {})
            out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
        for entry in self.log:
            if entry.get("level") in ("error", "warning"):
                out.append(f"log.{entry.get('level')} ({entry.get('source')}): {entry.get('text')}")
        return out


class Chromium:
    """A headless Chromium process speaking CDP over a pipe."""

    def __init__(self, binary: str, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="gpuaccept-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Move the child's ends above fd 4 so that dup2 onto 3 and 4 never clobbers them.
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child_fds() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--mute-audio", "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"]
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                     preexec_fn=child_fds, close_fds=False)
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._from_child], [], [], min(left, 1.0))
            if not ready:
                if self.proc.poll() is not None:
                    raise CdpError(f"Chromium exited with {self.proc.returncode}: {self._stderr_tail()}")
                continue
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise CdpError(f"Chromium closed the pipe: {self._stderr_tail()}")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send a command and return its result; events that arrive meanwhile go to ``self.events``."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self._to_child, data)
            data = data[n:]
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, session: str | None = None) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                return ev
        deadline = time.monotonic() + self.timeout_s
        while True:
            ev = self._read_message(deadline)
            if "method" in ev:
                self.events.append(ev)
                if ev["method"] == method and (session is None or ev.get("sessionId") == session):
                    return ev


def render(path: Path, expressions: dict[str, str], width: int = 1280, height: int = 2000,
           settle_s: float = 0.3) -> PageRun:
    """Load ``path`` in headless Chromium at ``width`` x ``height`` CSS pixels and inspect it.

    ``expressions`` maps a name to a JavaScript expression evaluated after the
    load event (result by value, in ``PageRun.values``).
    """
    binary = require_binary(*CHROMIUM_NAMES, why="the HTML report is tested in headless Chromium")
    with Chromium(binary) as cr:
        target = cr.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cr.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            cr.send(f"{domain}.enable", session=session)
        cr.send("Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        cr.events.clear()
        nav = cr.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        if nav.get("errorText"):
            raise CdpError(f"navigation failed: {nav['errorText']}")
        cr.wait_event("Page.loadEventFired", session)
        time.sleep(settle_s)
        run = PageRun()
        for name, expr in expressions.items():
            res = cr.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=session)
            if "exceptionDetails" in res:
                raise CdpError(f"evaluating {name!r}: {res['exceptionDetails']}")
            run.values[name] = res["result"].get("value")
        shot = cr.send("Page.captureScreenshot", {"format": "png"}, session=session)
        run.screenshot = base64.b64decode(shot["data"])
        for ev in cr.events:
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled":
                run.console.append(params)
            elif method == "Runtime.exceptionThrown":
                run.exceptions.append(params)
            elif method == "Log.entryAdded":
                run.log.append(params.get("entry", {}))
            elif method == "Network.requestWillBeSent":
                run.requests.append(params.get("request", {}).get("url", ""))
        return run


def decode_png(data: bytes) -> np.ndarray:
    """Pixels of an 8-bit RGB or RGBA, non-interlaced PNG as a (height, width, channels) uint8 array."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, ihdr = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]:
            raise ValueError(f"bad CRC in {kind!r} chunk")
        if kind == b"IHDR":
            ihdr = body
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", ihdr)
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prior = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        ftype, line = raw[y, 0], raw[y, 1:]
        if ftype == 0:
            cur = line.copy()
        elif ftype == 2:
            cur = line + prior
        elif ftype == 1:
            cur = np.empty_like(line)
            for c in range(bpp):
                cur[c::bpp] = np.cumsum(line[c::bpp], dtype=np.uint8)
        elif ftype in (3, 4):
            cur_l = line.astype(np.int32).tolist()
            up = prior.astype(np.int32).tolist()
            for x in range(stride):
                a = cur_l[x - bpp] if x >= bpp else 0
                b = up[x]
                if ftype == 3:
                    cur_l[x] = (cur_l[x] + ((a + b) >> 1)) & 0xFF
                else:
                    c = up[x - bpp] if x >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    cur_l[x] = (cur_l[x] + pred) & 0xFF
            cur = np.array(cur_l, dtype=np.uint8)
        else:
            raise ValueError(f"bad PNG filter type {ftype} in row {y}")
        out[y] = cur
        prior = cur
    return out.reshape(height, width, bpp)
