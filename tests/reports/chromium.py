"""A real headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages separated by NUL bytes on file descriptors 3 and 4), standard library only.

`Chromium(path).open(html_path, screenshot)` loads a page in a new tab, waits for its load event, and
returns what a page test needs: console errors and exceptions, failed resource loads, each <img> with
its natural size, the page's height; the full-page PNG screenshot goes to `screenshot`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser")
VIEWPORT = (1200, 900)


def find_chromium() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@dataclass
class PageReport:
    console_errors: list[str] = field(default_factory=list)
    failed_loads: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)  # {"alt", "naturalWidth", "naturalHeight"}
    height: int = 0


class DevTools:
    """Requests and events over the browser's pipe; events are kept until read."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise ConnectionError("chromium closed its DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params: Any) -> dict:
        self.next_id += 1
        request: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            request["sessionId"] = session
        os.write(self.write_fd, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_event(self, method: str, session: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            self.events.append(self._read_message(deadline))


def _collect(events: list[dict[str, Any]], report: PageReport) -> None:
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            report.console_errors.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            report.console_errors.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            report.console_errors.append(params["entry"].get("text", ""))
        elif method == "Network.loadingFailed":
            report.failed_loads.append(params.get("errorText", "failed"))


def _launch(browser: str, profile: str) -> tuple[subprocess.Popen, DevTools]:
    """Start the browser with its DevTools pipe on its fds 3 (commands in) and 4 (answers out)."""
    commands_r, commands_w = os.pipe()
    answers_r, answers_w = os.pipe()
    # move the child's ends above 9, so bash's 3<&N 4>&M cannot clobber one with the other
    child_in, child_out = (
        fcntl.fcntl(commands_r, fcntl.F_DUPFD, 10),
        fcntl.fcntl(answers_w, fcntl.F_DUPFD, 10),
    )
    for fd in (commands_r, answers_w):
        os.close(fd)
    args = [
        "--headless",
        "--remote-debugging-pipe",
        f"--user-data-dir={profile}",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
        "about:blank",
    ]
    proc = subprocess.Popen(
        [
            "bash",  # dash cannot redirect descriptors above 9
            "-c",
            f'exec "$0" "$@" 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-',
            browser,
            *args,
        ],
        pass_fds=(child_in, child_out),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(child_in)
    os.close(child_out)
    return proc, DevTools(commands_w, answers_r)


class Chromium:
    """One headless browser with a fresh profile (context manager); `open` loads one page in a new tab."""

    def __init__(self, browser: str) -> None:
        self.browser = browser
        self._profile = tempfile.TemporaryDirectory(prefix="lumobench-chromium-")

    def __enter__(self) -> Chromium:
        self.proc, self.tools = _launch(self.browser, self._profile.name)
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError, ConnectionError):
            self.tools.call("Browser.close", timeout=10)
        os.close(self.tools.write_fd)
        os.close(self.tools.read_fd)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._profile.cleanup()

    def open(self, page: Path, screenshot: Path, timeout: float = 60) -> PageReport:
        """Load `page` (a local file), wait for its load event, screenshot the whole page."""
        tools = self.tools
        target = tools.call("Target.createTarget", url="about:blank", timeout=timeout)["targetId"]
        session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.call(f"{domain}.enable", session)
        tools.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=VIEWPORT[0],
            height=VIEWPORT[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        tools.call("Page.navigate", session, url=page.resolve().as_uri())
        tools.wait_event("Page.loadEventFired", session, timeout)
        probe = (
            "JSON.stringify({height: document.documentElement.scrollHeight, images: Array.from("
            "document.images, i => ({alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth, "
            "naturalHeight: i.naturalHeight}))})"
        )
        found = json.loads(tools.call("Runtime.evaluate", session, expression=probe)["result"]["value"])
        shot = tools.call(
            "Page.captureScreenshot",
            session,
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": VIEWPORT[0], "height": found["height"], "scale": 1},
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        report = PageReport(images=found["images"], height=found["height"])
        _collect([e for e in tools.events if e.get("sessionId") == session], report)
        tools.call("Target.closeTarget", targetId=target)
        return report
