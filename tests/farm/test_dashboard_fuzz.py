"""The dashboard under a seeded fuzz of raw HTTP: malformed request lines and headers, mutated valid
requests, hostile bodies to every action (with and without the token and CSRF). Over real sockets to
a real dashboard on a throwaway Redis: no answer is 5xx, nothing is logged as a failure, and the
dashboard still serves the page and the API afterwards."""

from __future__ import annotations

import json
import logging
import random
import socket
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard
from tests.farm.test_dashboard import get_json, new_render

SEED = 20261201
REQUESTS = 1200
CSRF = "f" * 32
IDS = ["r20250101-120000-abc123", "r20250101-120000-abc123.text", "studio-1", "nope", "..", "%2e%2e", "%00",
       "%ff%fe", "a" * 300, "a%2Fb", "%C3%A9t%C3%A9", "-x", "x:y", "", "*", "%"]
ROUTES = ["/", "/index.html", "/static/app.js", "/static/../dashboard.py", "/static/%2e%2e/x", "/healthz",
          "/api/time", "/api/session", "/api/renders", "/api/renders/{id}", "/api/renders/{id}/events",
          "/api/renders/{id}/preview.png", "/api/renders/{id}/video.mp4", "/api/events", "/api/workers",
          "/api/metrics-summary", "/metrics", "/api/login", "/api/logout", "/api/renders/{id}/cancel",
          "/api/renders/{id}/priority", "/api/renders/{id}/requeue", "/api/tasks/{id}/requeue",
          "/api/workers/{id}/drain", "/nothing/here", "//api//renders", "*", "http://127.0.0.1/api/renders"]
QUERIES = ["", "?limit=5", "?limit=-1", "?limit=abc", "?limit=" + "9" * 40, "?after=0", "?after=abc",
           "?after=1-2-3", "?download=1", "?v=%zz", "?&&==", "?a=%00"]
METHODS = ["GET"] * 6 + ["POST"] * 6 + ["HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "get", "G ET", "\x00", "TRACE"]
VERSIONS = ["HTTP/1.1"] * 12 + ["HTTP/1.0", "HTTP/1.2", "HTTP/2", "HTTP/1.1 x", "", "HTTP/x.y"]


def _json_value(rng: random.Random, depth: int = 0):
    pick = rng.randrange(9 if depth < 4 else 6)
    return [lambda: rng.randint(-2**70, 2**70), lambda: rng.choice([1e309, -1e309, 0.5, float("nan")]),
            lambda: "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(20))),
            lambda: None, lambda: rng.random() < 0.5, lambda: "sekrit",
            lambda: [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))],
            lambda: {rng.choice(["token", "priority", "x", ""]): _json_value(rng, depth + 1)
                     for _ in range(rng.randrange(4))},
            lambda: "[" * rng.randrange(1, 40000)][pick]()


def _body(rng: random.Random) -> tuple[bytes, str]:
    kind = rng.randrange(5)
    if kind == 0:
        text = json.dumps(_json_value(rng)) if rng.random() < 0.9 else "[" * rng.randrange(1000, 60000)
        return text.encode(), "application/json"
    if kind == 1:
        return f"token={rng.choice(['sekrit', '', '%zz', 'x' * 500])}&priority={rng.randint(-9, 9)}".encode(), \
            "application/x-www-form-urlencoded"
    if kind == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(200))), rng.choice(["", "text/plain", "\x01"])
    if kind == 3:
        return b"{not json", "application/json"
    return b"", ""


def _headers(rng: random.Random, port: int, body: bytes, ctype: str) -> list[str]:
    host = rng.choice([f"127.0.0.1:{port}"] * 8 + ["localhost", "evil.example", "", "[::1", "127.0.0.1:abc",
                                                   "a" * 300, f"127.0.0.1:{port}, evil.example"])
    lines = [] if rng.random() < 0.03 else [f"Host: {host}"]
    auth = rng.choice([None, None, "Bearer sekrit", "Bearer sekrit", "Bearer wrong", "Bearer ", "Basic eA==",
                       "Bearer LTXF1." + "a" * 64 + ".sekrit", "Bearer LTXF1.zz.sekrit"])
    if auth:
        lines.append(f"Authorization: {auth}")
    if rng.random() < 0.6:
        lines.append(rng.choice([f"Cookie: farm_csrf={CSRF}", "Cookie: farm_csrf=short", "Cookie: ;;==;\"",
                                 f"Cookie: farm_csrf={CSRF}; farm_session=" + "0" * 64]))
        lines.append(f"X-CSRF-Token: {rng.choice([CSRF, CSRF, 'x', ''])}")
    if ctype:
        lines.append(f"Content-Type: {ctype}")
    length = rng.choice(["ok"] * 10 + ["none", "-1", "abc", "99999999", "dup", "chunked", "badchunk"])
    lines += {"ok": [f"Content-Length: {len(body)}"], "none": [], "-1": ["Content-Length: -1"],
              "abc": ["Content-Length: abc"], "99999999": ["Content-Length: 99999999"],
              "dup": [f"Content-Length: {len(body)}", "Content-Length: 3"],
              "chunked": ["Transfer-Encoding: chunked"], "badchunk": ["Transfer-Encoding: chunked"]}[length]
    extra = rng.choice([None, None, "Range: bytes=" + rng.choice(["5-2", "x", "0-", "-9", "1-2,3-4", "99999-"]),
                        "Last-Event-ID: " + rng.choice(["0", "zz", "1-1", "9" * 60]),
                        "Origin: " + rng.choice(["http://evil.example", "null", f"http://127.0.0.1:{port}"]),
                        "NoColonHeader", "Bad Header : x", "X-Big: " + "b" * 20000, "X-Ctl: a\x01b"])
    if extra:
        lines.append(extra)
    if length == "chunked":
        body_out = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    elif length == "badchunk":
        body_out = b"zz\r\n" + body
    else:
        body_out = body
    lines.append("")
    return lines, body_out


def structured(rng: random.Random, port: int) -> bytes:
    """A request put together from plausible and hostile parts."""
    path = rng.choice(ROUTES).replace("{id}", rng.choice(IDS)) + rng.choice(QUERIES)
    body, ctype = _body(rng)
    lines, body_out = _headers(rng, port, body, ctype)
    head = f"{rng.choice(METHODS)} {path} {rng.choice(VERSIONS)}".rstrip()
    return ("\r\n".join([head, *lines]) + "\r\n").encode("utf-8", "surrogateescape") + body_out


def mutated(rng: random.Random, port: int) -> bytes:
    """A valid request with a few bytes flipped, dropped, doubled or inserted (its end kept, so the
    request is complete more often than not)."""
    body = json.dumps({"priority": rng.randint(-5, 5), "token": "sekrit"}).encode()
    path = rng.choice(["/api/renders", "/api/renders/r20250101-120000-abc123/priority", "/api/login",
                       "/api/workers", "/api/renders/r20250101-120000-abc123"])
    raw = bytearray((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer sekrit\r\n"
                     f"Cookie: farm_csrf={CSRF}\r\nX-CSRF-Token: {CSRF}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(raw) - 4)
        op = rng.randrange(4)
        if op == 0:
            raw[at] = rng.randrange(256)
        elif op == 1:
            del raw[at]
        elif op == 2:
            raw[at:at] = raw[at:at + rng.randint(1, 8)]
        else:
            raw[at:at] = rng.choice([b"\r\n", b"\x00", b":", b" ", b"%", b"\xff", b"\r\n\r\n"])
    return bytes(raw)


def exchange(port: int, raw: bytes) -> str:
    """Send one request on a fresh connection; its status code, or "closed" when the server hung up
    without one (an incomplete request, after the head/body timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(raw)
        except OSError:
            pass  # refused while sending (e.g. 413 then close): read what it said
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
    if not data:
        return "closed"
    parts = data.split(b" ", 2)
    assert parts[0].startswith(b"HTTP/1."), data[:200]
    return parts[1].decode()


@pytest.mark.timeout(600)
def test_a_thousand_hostile_requests_get_no_5xx_and_the_dashboard_keeps_serving(store, tmp_data, caplog):
    new_render(store)
    server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data, request_timeout_s=1.0)
    rng = random.Random(SEED)
    requests = [(mutated if rng.random() < 0.35 else structured)(rng, port) for _ in range(REQUESTS)]
    caplog.set_level(logging.WARNING)
    try:
        with ThreadPoolExecutor(8) as pool:
            outcomes = Counter(pool.map(lambda raw: exchange(port, raw), requests))
        base = f"http://127.0.0.1:{port}"
        assert [r["id"] for r in get_json(f"{base}/api/renders")["renders"]] == ["r20250101-120000-abc123"]
        assert get_json(f"{base}/healthz", headers={}) == {"ok": True}
    finally:
        stop_dashboard(server)
    print(f"dashboard fuzz: {REQUESTS} requests (seed {SEED}): {dict(sorted(outcomes.items()))}")
    assert not [s for s in outcomes if s != "closed" and s >= "500"], outcomes
    answered = sum(n for s, n in outcomes.items() if s != "closed")
    assert answered >= 1000, outcomes
    assert len([s for s in outcomes if s != "closed"]) >= 8  # many kinds of answer: the fuzz reached deep
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures[:5]
