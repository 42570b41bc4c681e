"""`farm bench transfer` (alias `blobs`): blob put/get through a real coordinator vs raw TCP loopback.

This process is the coordinator (embedded Redis, `serve()`, its blob store on disk); a child process
is the worker side and moves the bytes the way the agent does (protos.blobwire: views, hashed while
streaming, the fetched blob written to a cache file as it lands). The reference is the same number
of bytes over a plain TCP socket between the same two processes. Each pair runs put, raw send, get,
raw receive back to back, so machine load hits both sides of a ratio alike; the median and spread
of the per-pair ratios are printed with the goal beside them.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import typer

GOAL_GBPS, GOAL_RATIO = 1.0, 0.7
_BLOCK = 4 * 1024 * 1024


def _recv_exact(conn: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = conn.recv_into(buf[got:], min(_BLOCK, len(buf) - got))
        if not n:
            raise OSError("peer closed early")
        got += n


def _tcp_server(buf: memoryview, direction: str, ready: threading.Event, port_box: list[int]) -> None:
    """One raw TCP transfer of buf: receive into it ('in') or send it ('out'), then a one-byte ack."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port_box.append(srv.getsockname()[1])
        ready.set()
        conn, _ = srv.accept()
        with conn:
            if direction == "in":
                _recv_exact(conn, buf)
                conn.sendall(b"!")
            else:
                for i in range(0, len(buf), _BLOCK):
                    conn.sendall(buf[i : i + _BLOCK])
                conn.recv(1)


def _child_main(address: str, token: str, cache: str) -> None:
    """The worker side: reads commands on stdin, answers seconds (and shas) on stdout."""
    from protos.auth import auth_metadata, farm_channel
    from protos.blobwire import BlobStub, receive_into_buffer
    from worker.blobcache import BlobCache

    stub, metadata, store = BlobStub(farm_channel(address, token)), auth_metadata(token), BlobCache(Path(cache))
    data = b""
    for line in sys.stdin:
        cmd = json.loads(line)
        sink = memoryview(bytearray(cmd["size"])) if cmd["op"] == "tcp_recv" else None
        start = time.perf_counter()
        out: dict = {}
        if cmd["op"] == "data":
            data = os.urandom(cmd["size"])
            stub.put(b"warm", timeout=60, metadata=metadata)  # the TLS handshake is not part of a transfer
        elif cmd["op"] == "put":
            out["sha"] = stub.put(data, timeout=600, metadata=metadata)
        elif cmd["op"] == "get":
            with store.writer(cmd["sha"]) as keep:
                got = receive_into_buffer(stub.get(cmd["sha"], 600, metadata), cmd["sha"], keep)
            out["size"] = len(got)
            del got
            (Path(cache) / cmd["sha"][:2] / cmd["sha"][2:]).unlink()
        elif cmd["op"] == "tcp_send":
            with socket.create_connection(("127.0.0.1", cmd["port"])) as conn:
                view = memoryview(data)
                for i in range(0, len(view), _BLOCK):
                    conn.sendall(view[i : i + _BLOCK])
                conn.recv(1)
        elif cmd["op"] == "tcp_recv":
            with socket.create_connection(("127.0.0.1", cmd["port"])) as conn:
                _recv_exact(conn, sink)
                conn.sendall(b"!")
        out["s"] = time.perf_counter() - start
        print(json.dumps(out), flush=True)


class _Child:
    def __init__(self, address: str, token: str, cache: Path) -> None:
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        code = "import sys; from farm_cli.bench_transfer import _child_main; _child_main(*sys.argv[1:])"
        self.proc = subprocess.Popen([sys.executable, "-c", code, address, token, str(cache)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("bench child died")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _raw(child: _Child, buf: memoryview, direction: str) -> float:
    ready, port = threading.Event(), []
    server = threading.Thread(target=_tcp_server, args=(buf, direction, ready, port), daemon=True)
    server.start()
    ready.wait(60)
    seconds = child.ask(op="tcp_send" if direction == "in" else "tcp_recv", port=port[0], size=len(buf))["s"]
    server.join(600)
    return seconds


def run_pairs(size: int, pairs: int, data: Path) -> dict[str, list[float]]:
    """GB/s per pair for put, raw send, get, raw receive."""
    from coordinator import redis_server
    from coordinator.auth import load_or_create_token
    from coordinator.server import serve, stop
    from coordinator.store import FarmStore

    gb = size / 1e9
    rates: dict[str, list[float]] = {"put": [], "tcp_in": [], "get": [], "tcp_out": []}
    with redis_server.EmbeddedRedis(data / "redis") as redis:
        store = FarmStore(redis_server.connect(redis.url), "bench")
        token = load_or_create_token(data)
        server, port = serve(store, data, "127.0.0.1", 0, token)
        child = _Child(f"127.0.0.1:{port}", token, data / "cache")
        try:
            child.ask(op="data", size=size)
            buf = memoryview(bytearray(os.urandom(size)))  # made (and touched) once, before any clock starts
            for _ in range(pairs):
                put = child.ask(op="put")
                rates["put"].append(gb / put["s"])
                rates["tcp_in"].append(gb / _raw(child, buf, "in"))
                rates["get"].append(gb / child.ask(op="get", sha=put["sha"])["s"])
                rates["tcp_out"].append(gb / _raw(child, buf, "out"))
        finally:
            child.close()
            stop(server, grace=0)
    return rates


def _line(name: str, rates: list[float], raw: list[float]) -> str:
    ratios = [r / t for r, t in zip(rates, raw, strict=True)]
    ok = statistics.median(rates) >= GOAL_GBPS and statistics.median(ratios) >= GOAL_RATIO
    return (f"{name:5} {statistics.median(rates):6.2f} GB/s (spread {min(rates):.2f}-{max(rates):.2f})  "
            f"raw TCP {statistics.median(raw):6.2f} GB/s  ratio {statistics.median(ratios):.2f} "
            f"(spread {min(ratios):.2f}-{max(ratios):.2f})  goal >= {GOAL_GBPS:g} GB/s and >= {GOAL_RATIO:g}x "
            f"raw: {'met' if ok else 'NOT met'}")


def transfer(mib: int, pairs: int, data: Path | None) -> None:
    """Print put/get GB/s vs raw TCP loopback, paired medians and spreads."""
    size = mib * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="farm-bench-transfer-", dir=data) as tmp:
        rates = run_pairs(size, pairs, Path(tmp))
    typer.echo(f"blob transfer, {mib} MiB, {pairs} interleaved pairs, TLS gRPC channel, coordinator + worker "
               f"processes on this machine ({os.cpu_count()} cores)")
    typer.echo(_line("put", rates["put"], rates["tcp_in"]))
    typer.echo(_line("get", rates["get"], rates["tcp_out"]))
