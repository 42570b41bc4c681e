"""The dashboard against a careless or hostile client, over real sockets: a foreign Host (DNS
rebinding) is refused, bad requests are 4xx without tracebacks, a stalled body or request head times
out and the server keeps answering."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard


def _request(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


@pytest.fixture
def dashboard(store, tmp_data):
    # the stall limit, short for the test
    server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data, request_timeout_s=1.0)
    yield port
    stop_dashboard(server)


@pytest.mark.timeout(60)
def test_a_foreign_host_is_refused_and_local_names_are_served(dashboard) -> None:
    for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example"):
        status, body = _request(dashboard, "GET", "/api/renders", headers={"Host": host})
        assert status == 421 and "Traceback" not in body, host
    status, _ = _request(dashboard, "POST", "/api/login", b"token=sekrit", {"Host": "evil.example"})
    assert status == 421
    for host in (f"127.0.0.1:{dashboard}", f"localhost:{dashboard}", socket.gethostname()):
        assert _request(dashboard, "GET", "/healthz", headers={"Host": host})[0] == 200, host


@pytest.mark.timeout(60)
def test_bad_requests_are_4xx_in_one_line(dashboard) -> None:
    cases = [
        ("POST", "/api/login", b"{not json", {"Content-Type": "application/json"}),
        ("GET", "/api/renders/../../etc/passwd", b"", {}),
        ("GET", "/api/renders/nope", b"", {}),
    ]
    for method, path, body, headers in cases:
        status, text = _request(dashboard, method, path, body, headers)
        assert 400 <= status < 500 and "Traceback" not in text and "\n" not in text.strip(), (path, status, text)
    for length, code in ((b"-5", b"400"), (b"abc", b"400"), (b"71680", b"413")):  # the body is never sent
        with socket.create_connection(("127.0.0.1", dashboard), timeout=5) as raw:
            raw.sendall(b"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + length + b"\r\n\r\n")
            assert raw.recv(200).split(b" ")[1] == code, length


@pytest.mark.timeout(60)
def test_a_stalled_body_times_out_and_the_dashboard_keeps_answering(dashboard) -> None:
    stalled = socket.create_connection(("127.0.0.1", dashboard), timeout=10)
    stalled.sendall(b"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\ntoken=")
    head = socket.create_connection(("127.0.0.1", dashboard), timeout=10)
    head.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0")  # a request head that never ends
    answer = _until_closed(stalled)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"Traceback" not in answer, answer
    assert _until_closed(head) == b""  # the server gave up on the head and closed
    stalled.close()
    head.close()
    status, body = _request(dashboard, "GET", "/healthz")
    assert status == 200, body
    assert json.loads(body) is not None


def _until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


@pytest.mark.timeout(60)
def test_token_rotate_ends_old_sessions_and_the_new_token_works(store, tmp_data) -> None:
    """`farm token rotate` rewrites DATA/token: the dashboard follows the file, so the old token and the
    login cookie made from it are refused and the new token logs in."""
    from coordinator.api.auth import rotate_token, write_token
    from protos.auth import JoinToken

    old = str(JoinToken("", "old-secret"))
    write_token(tmp_data / "token", JoinToken.parse(old))
    server, port = start_dashboard(store, port=0, token=old, data_dir=tmp_data, token_file=tmp_data / "token")
    try:
        csrf = "c" * 32
        cookie = _login(port, "old-secret", csrf)
        assert _request(port, "GET", "/api/renders", headers={"Cookie": cookie})[0] == 200
        new = JoinToken.parse(rotate_token(tmp_data)).secret
        time.sleep(1.2)  # the file is looked at once a second
        assert _request(port, "GET", "/api/renders", headers={"Cookie": cookie})[0] == 401
        assert _request(port, "GET", "/api/renders", headers={"Authorization": "Bearer old-secret"})[0] == 401
        assert _request(port, "GET", "/api/workers", headers={"Authorization": f"Bearer {new}"})[0] == 200
        with pytest.raises(AssertionError):
            _login(port, "old-secret", csrf)
        fresh = _login(port, new, csrf)
        assert fresh != cookie and _request(port, "GET", "/metrics", headers={"Cookie": fresh})[0] == 200
    finally:
        stop_dashboard(server)


def _login(port: int, token: str, csrf: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/api/login", body=f"token={token}",
                     headers={"Cookie": f"farm_csrf={csrf}", "X-CSRF-Token": csrf,
                              "Content-Type": "application/x-www-form-urlencoded"})
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200, reply.status
        return f"farm_csrf={csrf}; " + reply.getheader("Set-Cookie").split(";")[0]
    finally:
        conn.close()
