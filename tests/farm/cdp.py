"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
ended by NUL on fds 3/4), so browser tests can log in, click, hover and play video with no extra package."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any


def _onto_3_and_4(read_end: int, write_end: int) -> None:
    """In the child: its command pipe on fd 3, its reply pipe on fd 4 (moved high first: no clash)."""
    os.dup2(read_end, 100)
    os.dup2(write_end, 101)
    os.dup2(100, 3)
    os.dup2(101, 4)


class Browser:
    """One headless Chromium with one page; call(method, **params) runs a CDP command on the page."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000) -> None:
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4.
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--remote-debugging-pipe", "--autoplay-policy=no-user-gesture-required",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: _onto_3_and_4(to_child, from_child),  # noqa: PLW1509
        )
        os.close(to_child)
        os.close(from_child)
        self._next, self._buffer, self.session = 0, b"", None
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime"):
            self.call(f"{domain}.enable")

    def _message(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _send(self, method: str, params: dict | None = None, session: str | None = None,
              timeout: float = 30) -> dict:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message(timeout)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def call(self, method: str, **params: Any) -> dict:
        return self._send(method, params, self.session)

    def js(self, expression: str, timeout: float = 30) -> Any:
        """Evaluate in the page (promises awaited); the value, or a RuntimeError with the JS error."""
        result = self._send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                 "returnByValue": True}, self.session, timeout)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {}).get("description", result))
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"never true in the page: {expression}")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def viewport(self, width: int, height: int, mobile: bool = False) -> None:
        """Lay the page out as on a screen this size (a phone with mobile=True)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=mobile)

    def screenshot(self, path: Path, selector: str | None = None) -> Path:
        """The viewport, or (given a CSS selector) just that element's box."""
        params: dict[str, Any] = {"format": "png"}
        if selector:
            box = self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                          " return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; })()")
            params.update(clip={**box, "scale": 1}, captureBeyondViewport=True)
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._send("Browser.close", timeout=5)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)
