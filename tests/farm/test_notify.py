"""--notify URL: the leading coordinator POSTs JSON once when a render ends (a real HTTP receiver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coordinator.server import serve, stop
from tests.farm.farm_harness import ROOT, join_token

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


@pytest.fixture
def receiver():
    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    server.shutdown()
    server.server_close()


def wait_for(got: list, n: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.timeout(90)
def test_webhook_posts_once_when_a_render_ends(store, tmp_data, tiny_packs, receiver):
    url, got = receiver
    (tmp_data / "packs").symlink_to(tiny_packs)
    server, port = serve(store, tmp_data, token="n" * 24)
    token = join_token(tmp_data, "n" * 24)  # TLS: the client pins this farm's CA
    farm = lambda *a: subprocess.run([*CLI, *a, "--coordinator", f"127.0.0.1:{port}"],  # noqa: E731
                                     capture_output=True, text=True, cwd=ROOT, timeout=60,
                                     env={**os.environ, "FARM_TOKEN": token})
    try:
        bad = farm("submit", "-p", "a fox", "--notify", "file:///etc/passwd")
        assert bad.returncode == 2 and "http://" in bad.stderr
        rid = farm("submit", "-p", "a fox", "--notify", url).stdout.strip()
        other = farm("submit", "-p", "a heron", "--notify", url).stdout.strip()
        time.sleep(1.5)
        assert got == []  # nothing while they wait in the queue
        assert farm("cancel", rid).returncode == 0
        store.set_render_state(other, "done", output=str(tmp_data / "x.mp4"))
        wait_for(got, 2)
        time.sleep(2.5)  # later passes send nothing again
    finally:
        stop(server)
    by_id = {g["render_id"]: g for g in got}
    assert len(got) == 2 and by_id[rid]["state"] == "cancelled" and by_id[other]["state"] == "done", got
    assert by_id[other]["prompt"] == "a heron" and by_id[other]["fetch"].startswith(f"farm fetch {other}")
