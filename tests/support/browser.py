"""A real headless Chromium for dashboard tests, driven over the DevTools protocol.

    with chromium(executable, tmp_path) as page:
        page.navigate(daemon.url + "/")
        page.wait_for("document.querySelectorAll('tr').length > 2")
        page.evaluate("document.title")
        page.screenshot(path)

No browser download and no new dependency: the Debian ``chromium`` package, started with
``--remote-debugging-port=0`` and a fresh profile, and a small synchronous CDP client on
the ``websockets`` library that uvicorn[standard] already installs. Chromium runs in its
own process group, which is killed on exit with everything it started.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    "--window-size=1280,800",
]


class CDPError(RuntimeError):
    pass


def find_or_install_chromium() -> tuple[str | None, str]:
    """The ``chromium`` executable, installing the Debian package as root if missing.

    Returns ``(path, "")``, or ``(None, why)`` when there is none and it cannot be had.
    """
    path = shutil.which("chromium")
    if path:
        return path, ""
    if not shutil.which("apt-get"):
        return None, "chromium is not installed and there is no apt-get to install it"
    if os.geteuid() != 0:
        return None, "chromium is not installed and installing it needs root (apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    log = []
    for attempt in (install, ["apt-get", "update", "-q"], install):
        done = subprocess.run(attempt, env=env, capture_output=True, text=True, timeout=900)
        log.append(done.stdout[-2000:] + done.stderr[-2000:])
        if attempt is install and done.returncode == 0:
            break
    path = shutil.which("chromium")
    if path:
        return path, ""
    return None, "apt-get install chromium failed:\n" + "\n".join(log)[-3000:]


class Page:
    """One page target: send commands, evaluate script, wait, take screenshots.

    Events that arrive while waiting for a reply are kept: ``problems()`` returns the
    uncaught exceptions, console errors and browser log errors (CSP violations among
    them) seen so far.
    """

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Log.enable")

    def send(self, method: str, timeout: float = 20.0, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CDPError(f"{method}: no reply within {timeout}s")
            message = json.loads(self._ws.recv(timeout=remaining))
            if message.get("id") == call_id:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str, *, await_promise: bool = False) -> Any:
        """The value of a JavaScript expression (JSON-serialisable results only)."""
        result = self.send(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=await_promise,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"evaluating {expression!r}: {text}")
        return result["result"].get("value")

    def navigate(self, url: str, timeout: float = 20.0) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout=timeout)

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            with suppress(CDPError):  # e.g. while a navigation swaps the document
                value = self.evaluate(expression)
                if value:
                    return value
            time.sleep(0.05)
        raise AssertionError(f"{expression!r} still {value!r} after {timeout}s")

    def set_viewport(self, width: int, height: int) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate(
                "({w: document.documentElement.scrollWidth,"
                " h: document.documentElement.scrollHeight})"
            )
            params["captureBeyondViewport"] = True
            params["clip"] = {"x": 0, "y": 0, "width": size["w"], "height": size["h"], "scale": 1}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def problems(self) -> list[str]:
        found = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(
                    "exception: "
                    + (details.get("exception", {}).get("description") or details.get("text", ""))
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(
                    "console.error: "
                    + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                found.append(
                    f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
                )
        return found


@contextmanager
def chromium(executable: str, workdir: Path) -> Iterator[Page]:
    """Start Chromium with a fresh profile under ``workdir``; yield its first page."""
    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    log = (workdir / "chromium.log").open("ab")
    proc = subprocess.Popen(
        [
            executable,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    try:
        url = _page_target(proc, profile, workdir)
        with connect(url, max_size=None, open_timeout=10) as ws:
            yield Page(ws)
    finally:
        _kill_group(proc)


def _page_target(proc: subprocess.Popen[bytes], profile: Path, workdir: Path) -> str:
    """The DevTools websocket of the first page, once Chromium says where it listens."""
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with suppress(OSError, ValueError, IndexError, httpx.HTTPError):
            port = int(port_file.read_text().split()[0])
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
            for target in targets:
                if target.get("type") == "page":
                    url: str = target["webSocketDebuggerUrl"]
                    return url
        time.sleep(0.05)
    output = (workdir / "chromium.log").read_text(errors="replace")[-3000:]
    raise AssertionError(f"chromium did not open its DevTools port:\n{output}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    # Renderers and zygotes share the group; take any that outlived the browser.
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
