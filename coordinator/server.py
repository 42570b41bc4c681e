"""The coordinator's gRPC front: serve() wires the servicers over FarmStore, Scheduler and BlobStore
into one TLS server; stop() and run_coordinator() end and run it.

The servicers (client_servicer.py, worker_servicer.py, blob_servicer.py) only translate between
protobuf and the store's dicts and map errors to status codes; state transitions live in the store's
Lua scripts, policy in the scheduler and planner.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.auth import (
    SERVER_OPTIONS,
    TOKEN_FILE,
    FollowedSecret,
    JoinToken,
    TokenInterceptor,
    load_or_create_token,
    read_token,
)
from coordinator.blob_servicer import FarmBlobsServicer
from coordinator.bulk_server import BulkServer, server_context
from coordinator.client_servicer import FarmClientServicer, live_fleet
from coordinator.dashboard import start_dashboard, stop_dashboard
from coordinator.guard import Guard
from coordinator.leadership import LEASE_MS as LEADER_LEASE_MS
from coordinator.leadership import LeaderGate, Leadership, lead, set_health, stand_by
from coordinator.packs import FarmPacksServicer, PackShelf, fleet_with_shelf
from coordinator.presence import Presence, TransientErrors
from coordinator.retention import start_sweeper
from coordinator.scheduler import Scheduler
from coordinator.state.blobs import BlobStore
from coordinator.tls import load_or_create_tls
from coordinator.watchhub import WATCH_LIMIT
from coordinator.worker_servicer import FarmWorkerServicer
from protos import farm_pb2_grpc
from protos.blobwire import add_blob_service

log = logging.getLogger(__name__)

BULK_PLAIN_HELP = ("serve the blob data channel as plain TCP, for a trusted wired LAN: blobs stay checked (sha256 "
                   "at both ends, HMAC tickets; the token never crosses it) but their bytes are not encrypted")


def serve(
    store: Any,
    data_dir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    *,
    lease_ms: int = 30_000,
    max_workers: int = 256,  # every worker holds a Lease long poll and an Attach stream
    watch_limit: int = WATCH_LIMIT,  # Watch streams, served by threads of their own on top of max_workers
    expiry_interval_s: float = 1.0,
    packs_dir: Path | None = None,
    advertise: str | None = None,
    leader_lease_ms: int = LEADER_LEASE_MS,
    bulk_port: int | None = 0,
    bulk_plain: bool = False,
) -> tuple[grpc.Server, int]:
    """Start the coordinator's gRPC server; returns (server, bound port). Call stop(server) to end.
    It serves the farm while it holds the leadership lease, and stands by (answering UNAVAILABLE with
    the leader's address) while another coordinator does; `advertise` is the address it gives out.
    Beside it, the bulk data channel for blobs (coordinator/bulk_server.py) on `bulk_port` of the same
    host (0: the OS picks; None: no data channel, blobs go over gRPC), TLS unless `bulk_plain`."""
    data_dir = Path(data_dir)
    token = token or load_or_create_token(data_dir)
    blobs = BlobStore(data_dir, store)
    scheduler = Scheduler(store, blobs, data_dir, lease_ms=lease_ms, expiry_interval_s=expiry_interval_s)
    health_servicer = health.HealthServicer()
    leadership = Leadership(store, "", lambda: lead(server), lambda: stand_by(server), leader_lease_ms)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers + watch_limit, thread_name_prefix="farm-rpc"),
        interceptors=[TokenInterceptor(token, _token_file(data_dir, token)), LeaderGate(leadership), Guard(),
                      TransientErrors()],
        options=SERVER_OPTIONS,
    )
    bulk = _bulk_server(blobs, data_dir, host, bulk_port, bulk_plain, token, leadership)
    shelf = PackShelf(Path(packs_dir) if packs_dir else data_dir / "packs")  # packs workers copy from here
    threading.Thread(target=shelf.warm, name="pack-hashes", daemon=True).start()
    client_servicer = FarmClientServicer(store, scheduler, shelf, watch_limit=watch_limit)
    farm_pb2_grpc.add_FarmClientServicer_to_server(client_servicer, server)
    server.farm_watch_hub = client_servicer.hub  # type: ignore[attr-defined]
    farm_pb2_grpc.add_FarmPacksServicer_to_server(FarmPacksServicer(shelf, store), server)
    presence = Presence(store, scheduler.wake, leadership.is_serving)
    farm_pb2_grpc.add_FarmWorkerServicer_to_server(FarmWorkerServicer(
        store, scheduler, presence, bulk=(bulk.port, bulk.tls is not None) if bulk else (0, False)), server)
    blob_servicer = FarmBlobsServicer(blobs)
    add_blob_service(server, blob_servicer.PutBlob, blob_servicer.GetBlob)
    set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = _bind(server, data_dir, host, port)
    if bound == 0:
        if bulk is not None:
            bulk.stop()
        raise OSError(f"could not bind {host}:{port}")
    leadership.address = advertise or f"{socket.gethostname() if host in ('0.0.0.0', '::', '') else host}:{bound}"
    server.farm_scheduler = scheduler  # type: ignore[attr-defined]
    server.farm_health = health_servicer  # type: ignore[attr-defined]
    server.farm_leadership = leadership  # type: ignore[attr-defined]
    server.farm_presence = presence  # type: ignore[attr-defined]
    server.farm_reducer = None  # type: ignore[attr-defined]
    server.farm_bulk = bulk  # type: ignore[attr-defined]
    server.farm_fleet = lambda: fleet_with_shelf(live_fleet(store), shelf)  # type: ignore[attr-defined]
    server.start()
    if bulk is not None:
        bulk.start()
    leadership.claim_once()  # a lone coordinator leads before serve() returns
    leadership.start()
    server.farm_retention_stop = threading.Event()  # type: ignore[attr-defined]
    start_sweeper(store, data_dir, leadership.is_serving, lambda: _redis_now_ms(store), server.farm_retention_stop)
    log.info("coordinator listening on %s:%d (%s)", host, bound, "leading" if leadership.leading else "standby")
    return server, bound


def _bulk_server(blobs: BlobStore, data_dir: Path, host: str, port: int | None, plain: bool, token: str,
                 leadership: Leadership) -> BulkServer | None:
    """The data channel (not started yet): the current secret as the gRPC interceptor follows it, and
    served only while this coordinator leads."""
    if port is None:
        return None
    return BulkServer(blobs, FollowedSecret(token, _token_file(data_dir, token)).get, leadership.is_serving,
                      lambda: "" if leadership.leader_address == leadership.address else leadership.leader_address,
                      host, port, tls=None if plain else server_context(data_dir))


def _token_file(data_dir: Path, token: str) -> Path | None:
    """DATA/token when it is where this token came from: the server follows it (`farm token rotate`)."""
    path = data_dir / TOKEN_FILE
    try:
        return path if JoinToken.parse(read_token(path)).secret == JoinToken.parse(token).secret else None
    except (OSError, ValueError):
        return None


def _redis_now_ms(store: Any) -> int:
    from coordinator.metrics import redis_now_ms

    return redis_now_ms(store)


def _bind(server: grpc.Server, data_dir: Path, host: str, port: int) -> int:
    """TLS with the farm's certificate (DATA/tls, made on first start); there is no plaintext port."""
    tls = load_or_create_tls(data_dir)
    credentials = grpc.ssl_server_credentials([(tls.server_key_pem, tls.chain_pem)])
    return server.add_secure_port(f"{host}:{port}", credentials)


def stop(server: grpc.Server, grace: float = 2.0) -> None:
    """Stop accepting RPCs, let in-flight ones finish, stop the loops, then hand the lease back so a
    standby takes over at once."""
    presence = getattr(server, "farm_presence", None)
    if presence is not None:
        presence.stopping.set()  # streams our shutdown breaks blame no worker
    leadership = getattr(server, "farm_leadership", None)
    if leadership is not None:
        leadership.halt()
    health_servicer = getattr(server, "farm_health", None)
    if health_servicer is not None:
        health_servicer.enter_graceful_shutdown()
    bulk = getattr(server, "farm_bulk", None)
    if bulk is not None:
        bulk.stop()
    server.stop(grace).wait()
    hub = getattr(server, "farm_watch_hub", None)
    if hub is not None:
        hub.stop()
    reducer = getattr(server, "farm_reducer", None)
    if reducer is not None:
        reducer.stop()
    retention_stop = getattr(server, "farm_retention_stop", None)
    if retention_stop is not None:
        retention_stop.set()
    scheduler = getattr(server, "farm_scheduler", None)
    if scheduler is not None:
        scheduler.stop()
    if leadership is not None:
        leadership.release()


def run_coordinator(
    data_dir: Path, host: str, port: int, redis_url: str | None = None, prefix: str = "farm",
    packs_dir: Path | None = None,
    dashboard_host: str = "127.0.0.1", dashboard_port: int = 8470, advertise: str | None = None,
    bulk_port: int | None = 0, bulk_plain: bool = False,
) -> int:
    """Run until SIGTERM/SIGINT: embedded Redis (unless redis_url), store, server. Coordinators sharing
    one Redis (and one data folder, for the blobs) elect a leader; the others stand by."""
    from contextlib import ExitStack

    from coordinator.state import redis_server
    from coordinator.state.store import FarmStore
    from protos.logsetup import log_path, setup_logging

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(log_path(data_dir, "coordinator"))  # named by `farm doctor`
    with ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(redis_server.EmbeddedRedis(data_dir / "redis")).url
        store = FarmStore(redis_server.connect(redis_url), prefix)
        token = load_or_create_token(data_dir)
        server, bound = serve(store, data_dir, host, port, token, packs_dir=packs_dir, advertise=advertise,
                              bulk_port=bulk_port, bulk_plain=bulk_plain)
        dashboard, dash_port = start_dashboard(store, dashboard_host, dashboard_port, token, data_dir=data_dir,
                                               token_file=_token_file(data_dir, token))  # follows a rotate
        stack.callback(stop_dashboard, dashboard)
        print(f"coordinator on {host}:{bound}; dashboard http://{dashboard_host}:{dash_port}/; "
              f"token in {data_dir / 'token'}", flush=True)
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        done.wait()
        stop(server)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="farm coordinator", description="Run the LTX farm coordinator.")
    parser.add_argument("--data-dir", type=Path, default=Path("farm-data"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50551)
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of the embedded one")
    parser.add_argument("--packs-dir", type=Path, default=None, help="packs workers copy (default DATA/packs)")
    parser.add_argument("--advertise", default=None, help="HOST:PORT a standby sends workers and clients to")
    parser.add_argument("--bulk-port", type=int, default=0, help="blob data channel port (0: any free, -1: none)")
    parser.add_argument("--bulk-plain", action="store_true", help=BULK_PLAIN_HELP)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_coordinator(args.data_dir, args.host, args.port, args.redis_url, packs_dir=args.packs_dir,
                           advertise=args.advertise, bulk_port=None if args.bulk_port < 0 else args.bulk_port,
                           bulk_plain=args.bulk_plain)


if __name__ == "__main__":
    raise SystemExit(main())
