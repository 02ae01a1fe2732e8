"""A headless Chromium for the tests, driven over the DevTools protocol, and a local web server.

    with serve(folder) as base, Browser.launch() as browser:
        page = browser.load(base + "index.html")  # status, title, h1, images, links, ids

Debian's `chromium` (installed by `make setup`) is started with --remote-debugging-port=0; the
port it picked is read from DevToolsActivePort in its throw-away profile, and one page is
driven through a flattened target session over websocket-client. `load` navigates, waits for
the load event and then for every <img> to finish, and reads the DOM: the HTTP status of the
document, the title, the h1s, each image's naturalWidth, each link's resolved href and every
element id (for #anchors). A missing browser is a failure with a one-line reason, never a skip.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import websocket

BROWSERS = ("chromium", "chromium-browser")
START_TIMEOUT_S = 30.0
PAGE_TIMEOUT_S = 30.0

# Runs in the page once it has loaded: every image eager and finished (or failed), then the
# facts the test checks, as plain JSON.
INSPECT = """
(async () => {
  const images = [...document.images];
  images.forEach(img => { img.loading = "eager"; });
  const settled = img => img.complete ? null : new Promise(done => {
    img.addEventListener("load", done); img.addEventListener("error", done);
  });
  const timeout = new Promise(done => setTimeout(done, IMAGE_WAIT_MS));
  await Promise.race([Promise.all(images.map(settled)), timeout]);
  return {
    title: document.title,
    h1: [...document.querySelectorAll("h1")].map(h => h.textContent.trim()),
    images: images.map(img => ({src: img.currentSrc || img.src, width: img.naturalWidth})),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    ids: [...document.querySelectorAll("[id]")].map(e => e.id),
  };
})()
""".replace("IMAGE_WAIT_MS", str(int(PAGE_TIMEOUT_S * 500)))


class BrowserError(RuntimeError):
    """The browser is missing, did not start, or did not load a page in time."""


@dataclass(frozen=True)
class Loaded:
    url: str
    status: int  # HTTP status of the document
    title: str
    h1: list[str]
    images: list[dict]  # {"src", "width"}: width is naturalWidth, 0 when it did not show
    links: list[str]  # resolved hrefs
    ids: list[str]


def find_browser() -> str:
    """The path of Debian's chromium; BrowserError with a one-line reason when missing."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserError(
        "no headless browser: `chromium` is not installed (`make setup` installs it with "
        "`apt-get install -y chromium`; it needs root and Debian's package lists)"
    )


class Browser:
    """One headless Chromium and one page in it."""

    def __init__(self, process: subprocess.Popen, profile: Path, ws: websocket.WebSocket):
        self._process = process
        self._profile = profile
        self._ws = ws
        self._next_id = 0
        self._events: list[dict] = []
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self._call("Page.enable", session=True)
        self._call("Network.enable", session=True)

    @classmethod
    @contextlib.contextmanager
    def launch(cls) -> Iterator[Browser]:
        executable = find_browser()
        profile = Path(tempfile.mkdtemp(prefix="sdq-chromium-"))
        args = [
            executable,
            "--headless",
            "--no-sandbox",  # the tests run as root in CI, where the sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ]
        log = open(profile / "chromium.log", "wb")  # a pipe left unread could fill and stall it
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        browser = None
        try:
            # no Origin header: chromium refuses DevTools connections from an origin it was
            # not told to allow (--remote-allow-origins), and a client without one is allowed
            url = _devtools_url(process, profile)
            ws = websocket.create_connection(url, timeout=5, suppress_origin=True)
            browser = cls(process, profile, ws)
            yield browser
        finally:
            if browser is not None:
                with contextlib.suppress(Exception):
                    browser._ws.close()
            _stop(process)
            log.close()
            shutil.rmtree(profile, ignore_errors=True)

    def load(self, url: str) -> Loaded:
        """Navigate to `url`, wait for it and its images, and read what the test checks."""
        self._events.clear()
        nav = self._call("Page.navigate", url=url, session=True)
        if nav.get("errorText"):
            raise BrowserError(f"{url}: {nav['errorText']}")
        frame = nav["frameId"]
        response = self._wait_event(
            "Network.responseReceived",
            lambda p: p.get("type") == "Document" and p.get("frameId") == frame,
            url,
        )
        self._wait_event("Page.loadEventFired", lambda p: True, url)
        result = self._call(
            "Runtime.evaluate",
            expression=INSPECT,
            awaitPromise=True,
            returnByValue=True,
            session=True,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{url}: inspecting the page failed: {result['exceptionDetails']}")
        facts = result["result"]["value"]
        return Loaded(url=url, status=int(response["response"]["status"]), **facts)

    def set_width(self, width: int, height: int = 900) -> None:
        """Lay pages out in a window `width` CSS pixels wide (until set again)."""
        self._call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
            session=True,
        )

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page loaded last (returned by value)."""
        result = self._call(
            "Runtime.evaluate", expression=expression, returnByValue=True, session=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluating failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def _call(self, method: str, session: bool = False, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        self._ws.send(json.dumps(message))
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            reply = self._receive(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def _wait_event(self, method: str, wanted, url: str) -> dict:
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and wanted(event.get("params", {})):
                    del self._events[: i + 1]
                    return event["params"]
            reply = self._receive(deadline, f"{url}: {method}")
            if "method" in reply:
                self._events.append(reply)

    def _receive(self, deadline: float, what: str) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrowserError(f"{what}: no answer from the browser in {PAGE_TIMEOUT_S:.0f} s")
        self._ws.settimeout(left)
        try:
            return json.loads(self._ws.recv())
        except websocket.WebSocketTimeoutException:
            raise BrowserError(
                f"{what}: no answer from the browser in {PAGE_TIMEOUT_S:.0f} s"
            ) from None


def _stop(process: subprocess.Popen) -> None:
    """End the browser and the helper processes it started (its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _devtools_url(process: subprocess.Popen, profile: Path) -> str:
    """The browser's websocket address, from DevToolsActivePort (port, then path)."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (profile / "chromium.log").read_text(errors="replace").strip().splitlines()
            last = log[-1] if log else "no output"
            raise BrowserError(f"chromium exited with status {process.returncode}: {last}")
        if marker.is_file():
            lines = marker.read_text().split()
            if len(lines) == 2:
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        time.sleep(0.05)
    raise BrowserError(f"chromium did not open its DevTools port in {START_TIMEOUT_S:.0f} s")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A browser that drops a connection it no longer needs is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve `folder` on 127.0.0.1 (an ephemeral port) from a thread; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=os.fspath(folder))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
