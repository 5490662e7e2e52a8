"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages separated by NUL bytes on file descriptors 3 and 4), standard library only.

`Browser.load(url)` opens a page in a fresh tab and reports what the browser itself saw:
failed requests (a missing image, style sheet or script is `net::ERR_FILE_NOT_FOUND`), any
request to the network, script exceptions, console errors, images that did not decode, and
the page's links; `screenshot()` captures the tab as PNG.

    python tests/browser.py SITE_DIR SHOT_DIR [--full]   # every page of a site, screenshots
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
#: What the page reports once loaded: broken images and every link and script it names.
PROBE = """JSON.stringify({
  title: document.title,
  brokenImages: [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
                                    .map(i => i.getAttribute('src')),
  images: document.images.length,
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  scripts: [...document.scripts].map(s => s.src).filter(Boolean),
  styles: [...document.styleSheets].filter(s => s.href).map(s => s.href),
  styled: getComputedStyle(document.querySelector('header') || document.body).position,
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  height: document.documentElement.scrollHeight,
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  charts: [...document.querySelectorAll('[data-chart]')].filter(e => e.offsetParent !== null)
                                                         .map(e => e.dataset.drawn === '1'),
})"""


def find_chromium() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLoad:
    url: str
    failed: list[str] = field(default_factory=list)  # "url: error"
    network: list[str] = field(default_factory=list)  # requests that left the disk
    exceptions: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)

    def problems(self) -> list[str]:
        out = [f"failed to load {f}" for f in self.failed]
        out += [f"network request {u}" for u in self.network]
        out += [f"script exception: {e}" for e in self.exceptions]
        out += [f"console error: {e}" for e in self.console_errors]
        out += [f"image did not load: {s}" for s in self.probe.get("brokenImages", [])]
        if self.probe.get("overflow", 0) > 0:
            out.append(f"wider than the window by {self.probe['overflow']} px")
        if not all(self.probe.get("charts", [])):
            out.append("a visible chart was not drawn")
        return out


class Browser:
    def __init__(self, binary: str, width: int = 1280, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="topas-site-browser-")
        cmd_r, self._cmd_w = os.pipe()
        self._resp_r, resp_w = os.pipe()

        def fds() -> None:  # the child reads commands on fd 3 and answers on fd 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_r, resp_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        # --no-sandbox: Chromium refuses its sandbox as root, and Ubuntu 24.04 (GitHub's
        # runners) forbids the user namespaces it needs; it only ever opens our own files here
        args = [
            binary, "--headless", "--no-sandbox", "--remote-debugging-pipe", "--disable-gpu",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--allow-file-access-from-files", f"--user-data-dir={self._profile}",
            f"--window-size={width},{height}", "--hide-scrollbars", "about:blank",
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            args, preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(cmd_r)
        os.close(resp_w)
        self._buf = b""
        self._next = 0
        self._events: list[dict[str, Any]] = []
        self.width, self.height = width, height

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.call("Browser.close")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._cmd_w)
        os.close(self._resp_r)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise RuntimeError("Chromium stopped answering on the DevTools pipe")
            chunk = os.read(self._resp_r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        out: dict[str, Any] = json.loads(msg)
        return out

    def call(
        self, method: str, session: str | None = None, timeout: float = 60, **params: Any
    ) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read(timeout)
            if m.get("id") == self._next:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                result: dict[str, Any] = m.get("result", {})
                return result
            self._events.append(m)

    def _wait_event(self, name: str, session: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if any(e.get("method") == name and e.get("sessionId") == session for e in self._events):
                return
            self._events.append(self._read(max(0.1, deadline - time.monotonic())))

    def load(self, url: str, timeout: float = 60) -> tuple[PageLoad, str]:
        """Open `url` in a new tab and wait for its load event; returns what went wrong and
        the tab's session (for `screenshot`, `close_tab`)."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable", session)
        self.call("Emulation.setDeviceMetricsOverride", session, width=self.width,
                  height=self.height, deviceScaleFactor=1, mobile=False)  # fmt: skip
        self._events.clear()
        self.call("Page.navigate", session, url=url)
        self._wait_event("Page.loadEventFired", session, timeout)
        probe = self.call("Runtime.evaluate", session, expression=PROBE, returnByValue=True)
        page = PageLoad(url, probe=json.loads(probe["result"]["value"]))
        urls: dict[str, str] = {}
        for e in self._events:
            if e.get("sessionId") != session:
                continue
            p = e.get("params", {})
            match e.get("method"):
                case "Network.requestWillBeSent":
                    u = p["request"]["url"]
                    urls[p["requestId"]] = u
                    if not u.startswith(("file:", "data:", "about:")):
                        page.network.append(u)
                case "Network.loadingFailed":
                    page.failed.append(f"{urls.get(p['requestId'], '?')}: {p.get('errorText')}")
                case "Runtime.exceptionThrown":
                    page.exceptions.append(str(p["exceptionDetails"].get("text")))
                case "Log.entryAdded" if p["entry"].get("level") == "error":
                    page.console_errors.append(str(p["entry"].get("text")))
        self._target = target
        return page, session

    def evaluate(self, session: str, expression: str) -> Any:
        """The value of a JavaScript expression in the tab (JSON-serialisable)."""
        out = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails'].get('text')}")
        return out["result"].get("value")

    def screenshot(self, session: str, path: Path, full_height: int = 0) -> Path:
        """The first screen, or with `full_height` (the page's scroll height) all of it."""
        params: dict[str, Any] = {"format": "png"}
        if full_height:
            params["captureBeyondViewport"] = True
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": full_height,
                              "scale": 1}  # fmt: skip
        data = self.call("Page.captureScreenshot", session, **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close_tab(self) -> None:
        self.call("Target.closeTarget", targetId=self._target)


def crawl(
    browser: Browser, index: Path, shots: Path | None = None, full: bool = False
) -> dict[str, PageLoad]:
    """Load `index` and every local page it links to, transitively; a link to a missing file
    is a failed load of that page. With `shots`, a screenshot of each page's first screen."""
    seen: dict[str, PageLoad] = {}
    todo = [index.resolve().as_uri()]
    while todo:
        url = todo.pop(0)
        if url in seen:
            continue
        page, session = browser.load(url)
        seen[url] = page
        if shots is not None:
            name = url.rsplit("/", 1)[-1].replace(".html", ".png")
            height = int(page.probe.get("height", 0)) if full else 0
            browser.screenshot(session, shots / name, min(height, 16000))
        browser.close_tab()
        for link in page.probe.get("links", []):
            base, _, frag = link.partition("#")
            if base == url and frag and frag not in page.probe.get("ids", []):
                page.failed.append(f"{link}: no element with id {frag!r}")
            if base.endswith(".html") and base.startswith("file:") and base not in seen:
                todo.append(base)
            elif not base.startswith("file:"):
                page.network.append(link)
    return seen


def main() -> None:
    site, shots = Path(sys.argv[1]), Path(sys.argv[2])
    full = "--full" in sys.argv[3:]
    shots.mkdir(parents=True, exist_ok=True)
    binary = find_chromium()
    if binary is None:
        sys.exit("no Chromium found (make browser installs it)")
    with Browser(binary) as b:
        for url, page in crawl(b, site / "index.html", shots, full).items():
            print(url, page.probe.get("images"), "images", page.problems() or "ok")


if __name__ == "__main__":
    main()
