"""`farm bench transfer` (alias `blobs`): blob put/get through a real coordinator vs raw TCP loopback.

This process is the coordinator (embedded Redis, `serve()`, its blob store on disk, its data channel over
TLS plus a second, plain one on the same store); a child process is the worker side and moves the bytes
the way the agent does, by each path: the FarmBlobs gRPC calls (protos.blobwire) and the data channel
(protos.bulkwire) over TLS and plain TCP — hashed while streaming at both ends, the fetched blob written
to a cache file as it lands. The reference is the same number of bytes over a plain TCP socket between
the same two processes. Each pair runs, for every path, put, raw send, get, raw receive back to back,
so machine load hits both sides of a ratio alike; the median and spread of the per-pair rates and
ratios are printed with the goal beside them.

Then small blobs, what a render mostly moves (a stage-2 tile's inputs are 9 blobs, ~0.7 MiB in all; its
output ~0.3 MiB): put and get round-trip milliseconds of 256 KiB and 1 MiB blobs, each path in turn per
round, the data channel on its kept connections as the agent uses it, and over TLS with a new
connection (TCP connect and TLS handshake) per blob as before version 2.
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
SMALL_KIB, SMALL_ROUNDS = (256, 1024), 40


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


def _small(cmd: dict, stub, metadata, store, ends: dict, secret: str) -> dict[str, list[float]]:
    """cmd["rounds"] rounds (after an untimed one that opens the kept connections) of a put then a get
    of a fresh cmd["size"]-byte blob by each path in turn: milliseconds per transfer, keyed 'path op'."""
    from protos import bulkclient
    from protos.blobwire import receive_into_buffer

    paths = {"grpc": None, **ends, "fresh": ends["tls"]}  # fresh: a new connection per transfer
    ms: dict[str, list[float]] = {f"{p} {op}": [] for p in paths for op in ("put", "get")}
    for r in range(cmd["rounds"] + 1):
        for path, end in paths.items():
            pool = bulkclient.Pool() if path == "fresh" else bulkclient.POOL
            data = os.urandom(cmd["size"])
            start = time.perf_counter()
            sha = bulkclient.put(end, secret, data, pool=pool) if end else stub.put(data, 60, metadata)
            if path == "fresh":
                pool.clear()
            mid = time.perf_counter()
            if end:
                with store.landing(sha) as land:
                    got = bulkclient.get(end, secret, sha, land, pool=pool)
            else:
                with store.writer(sha) as keep:
                    got = receive_into_buffer(stub.get(sha, 60, metadata), sha, keep)
            done = time.perf_counter()
            if path == "fresh":
                pool.clear()
            assert len(got) == cmd["size"]
            del got
            (store.root / sha[:2] / sha[2:]).unlink()
            if r:
                ms[f"{path} put"].append((mid - start) * 1e3)
                ms[f"{path} get"].append((done - mid) * 1e3)
    return ms


def _child_main(address: str, cache: str) -> None:
    """The worker side: reads commands on stdin (the token comes first, never on argv), answers seconds
    (and shas) on stdout."""
    from protos import bulkclient
    from protos.auth import JoinToken, auth_metadata, farm_channel, fetch_ca
    from protos.blobwire import BlobStub, receive_into_buffer
    from worker.blobcache import BlobCache

    token = sys.stdin.readline().strip()
    stub, metadata, store = BlobStub(farm_channel(address, token)), auth_metadata(token), BlobCache(Path(cache))
    secret, ca = JoinToken.parse(token).secret, fetch_ca(address, JoinToken.parse(token).fingerprint)
    data, ends = b"", {}
    for line in sys.stdin:
        cmd = json.loads(line)
        sink = memoryview(bytearray(cmd["size"])) if cmd["op"] == "tcp_recv" else None
        end = ends.get(cmd.get("path"))
        start = time.perf_counter()
        out: dict = {}
        if cmd["op"] == "small":
            out["ms"] = _small(cmd, stub, metadata, store, ends, secret)
        elif cmd["op"] == "data":
            data = os.urandom(cmd["size"])
            ends = {"tls": bulkclient.Endpoint("127.0.0.1", cmd["tls"], ca),
                    "plain": bulkclient.Endpoint("127.0.0.1", cmd["plain"], None)}
            stub.put(b"warm", timeout=60, metadata=metadata)  # the TLS handshake is not part of a transfer
        elif cmd["op"] == "put":
            out["sha"] = bulkclient.put(end, secret, data) if end else stub.put(data, timeout=600, metadata=metadata)
        elif cmd["op"] == "get":
            if end:  # as the agent does: straight into a map of the cache file
                with store.landing(cmd["sha"]) as land:
                    got = bulkclient.get(end, secret, cmd["sha"], land)
            else:
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
        code = "import sys; from farm_cli.bench.transfer import _child_main; _child_main(*sys.argv[1:])"
        self.proc = subprocess.Popen([sys.executable, "-c", code, address, str(cache)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.proc.stdin.write(token + "\n")

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


PATHS = {"grpc": "gRPC (TLS)", "tls": "data channel, TLS", "plain": "data channel, plain TCP"}


def run_pairs(size: int, pairs: int, data: Path, rounds: int = SMALL_ROUNDS) -> tuple[dict, dict]:
    """GB/s per pair for each path's put, raw send, get, raw receive (keys like 'tls put', 'tls tcp_in');
    and per small size (KiB), milliseconds per put and get of each path (keys like 'tls put')."""
    from coordinator.api.auth import load_or_create_token
    from coordinator.api.bulk_server import BulkServer
    from coordinator.server import serve, stop
    from coordinator.state import redis_server
    from coordinator.state.store import FarmStore

    gb = size / 1e9
    rates: dict[str, list[float]] = {f"{p} {k}": [] for p in PATHS for k in ("put", "tcp_in", "get", "tcp_out")}
    with redis_server.EmbeddedRedis(data / "redis") as redis:
        store = FarmStore(redis_server.connect(redis.url), "bench")
        token = load_or_create_token(data)
        server, port = serve(store, data, "127.0.0.1", 0, token)  # its data channel: TLS, the default
        tls = server.bulk
        plain = BulkServer(tls.blobs, tls.secret, tls.serving, tls.leader, "127.0.0.1", 0).start()
        child = _Child(f"127.0.0.1:{port}", token, data / "cache")
        try:
            child.ask(op="data", size=size, tls=tls.port, plain=plain.port)
            buf = memoryview(bytearray(os.urandom(size)))  # made (and touched) once, before any clock starts
            for _ in range(pairs):
                for path in PATHS:
                    put = child.ask(op="put", path=path)
                    rates[f"{path} put"].append(gb / put["s"])
                    rates[f"{path} tcp_in"].append(gb / _raw(child, buf, "in"))
                    rates[f"{path} get"].append(gb / child.ask(op="get", sha=put["sha"], path=path)["s"])
                    rates[f"{path} tcp_out"].append(gb / _raw(child, buf, "out"))
            del buf
            small = {kib: child.ask(op="small", size=kib * 1024, rounds=rounds)["ms"] for kib in SMALL_KIB}
        finally:
            child.close()
            plain.stop()
            stop(server, grace=0)
    return rates, small


def _line(name: str, rates: list[float], raw: list[float]) -> str:
    ratios = [r / t for r, t in zip(rates, raw, strict=True)]
    ok = statistics.median(rates) >= GOAL_GBPS and statistics.median(ratios) >= GOAL_RATIO
    return (f"  {name:24} {statistics.median(rates):5.2f} GB/s ({min(rates):.2f}-{max(rates):.2f})  "
            f"raw TCP {statistics.median(raw):5.2f} ({min(raw):.2f}-{max(raw):.2f})  "
            f"ratio {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})  "
            f"{'met' if ok else 'NOT met'}")


SMALL_PATHS = {"grpc": "gRPC", "tls": "data TLS", "plain": "data plain", "fresh": "data TLS, new conn each"}


def _small_line(kib: int, ms: dict[str, list[float]], direction: str) -> str:
    """Median (10th-90th percentile) milliseconds per transfer of each path."""
    parts = []
    for path, name in SMALL_PATHS.items():
        got = sorted(ms[f"{path} {direction}"])
        low, high = got[len(got) // 10], got[-1 - len(got) // 10]
        parts.append(f"{name} {statistics.median(got):.1f} ({low:.1f}-{high:.1f})")
    return f"  {f'{kib} KiB, ms per blob':24} " + "  ".join(parts)


def transfer(mib: int, pairs: int, data: Path | None, rounds: int = SMALL_ROUNDS) -> None:
    """Print put/get GB/s of each path vs raw TCP loopback, paired medians and spreads; then small-blob
    milliseconds per transfer of each path, median (10th-90th percentile) over rounds interleaved."""
    size = mib * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="farm-bench-transfer-", dir=data) as tmp:
        rates, small = run_pairs(size, pairs, Path(tmp), rounds)
    typer.echo(f"blob transfer, {mib} MiB, {pairs} interleaved pairs, coordinator + worker processes on this "
               f"machine ({os.cpu_count()} cores); median (spread); goal >= {GOAL_GBPS:g} GB/s and "
               f">= {GOAL_RATIO:g}x raw TCP")
    for direction, raw in (("put", "tcp_in"), ("get", "tcp_out")):
        typer.echo(f"{direction}:")
        for path, name in PATHS.items():
            typer.echo(_line(name, rates[f"{path} {direction}"], rates[f"{path} {raw}"]))
        for kib, ms in small.items():
            typer.echo(_small_line(kib, ms, direction))
