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


@pytest.mark.timeout(60)
def test_a_redis_outage_is_one_line_when_it_starts_and_one_when_it_ends(tmp_path, caplog):
    """The webhook loop against a real redis-server killed twice: per outage one warning and one 'back'
    line, never a traceback per pass."""
    import logging

    from coordinator.notify import Notifier
    from coordinator.state.redis_server import EmbeddedRedis, connect, free_port
    from coordinator.state.store import FarmStore

    server = EmbeddedRedis(tmp_path / "redis", unix_socket=False, port=free_port())
    server.start()
    store = FarmStore(connect(server.url))
    notifier = Notifier(store, interval_s=0.02)
    caplog.set_level(logging.INFO, logger="farm")
    notifier.start()
    try:
        for outage in range(2):
            time.sleep(0.2)
            server.proc.kill()
            server.proc.wait(10)
            time.sleep(0.5)  # many passes while it is down
            server.start()
            deadline = time.monotonic() + 20
            while sum("back after" in r.getMessage() for r in caplog.records) <= outage:
                assert time.monotonic() < deadline, "the loop never said Redis was back"
                time.sleep(0.05)
    finally:
        notifier.stop()
        server.stop()
    mine = [r for r in caplog.records if r.name == "farm.notify"]
    print("\n".join(r.getMessage() for r in mine))
    assert not [r for r in mine if r.exc_info], "a traceback was logged"
    assert [r.levelname for r in mine] == ["WARNING", "INFO"] * 2, [r.getMessage() for r in mine]
