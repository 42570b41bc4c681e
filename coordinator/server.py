"""The coordinator's one wiring file: a Coordinator owns the scheduler, reducer, notifier, health,
leadership, presence, bulk data channel, retention sweeper and the TLS gRPC server whose servicers
sit over FarmStore, Scheduler and BlobStore; serve() builds and starts one, stop() and
run_coordinator() end and run it.

The servicers (client_servicer.py, worker_servicer.py, blob_servicer.py) only translate between
protobuf and the store's dicts and map errors to status codes; state transitions live in the store's
Lua scripts, policy in the scheduler and planner.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from concurrent import futures
from contextlib import ExitStack
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.api.auth import (
    TOKEN_FILE,
    FollowedSecret,
    JoinToken,
    TokenInterceptor,
    load_or_create_token,
    read_token,
    server_options,
)
from coordinator.api.blob_servicer import FarmBlobsServicer
from coordinator.api.bulk_server import BulkServer, server_context
from coordinator.api.client_servicer import FarmClientServicer, live_fleet
from coordinator.api.guard import Guard
from coordinator.api.packs import FarmPacksServicer, PackShelf, fleet_with_shelf
from coordinator.api.presence import Presence, TransientErrors
from coordinator.api.tls import load_or_create_tls
from coordinator.api.watchhub import WATCH_LIMIT, WatchHub
from coordinator.api.worker_servicer import FarmWorkerServicer
from coordinator.assemble.growing import FilmGrower
from coordinator.dashboard import start_dashboard, stop_dashboard
from coordinator.dashboard.security import login_url
from coordinator.leadership import LEASE_MS as LEADER_LEASE_MS
from coordinator.leadership import LeaderGate, Leadership
from coordinator.notify import Notifier
from coordinator.reduce.reducer import ReducerThread
from coordinator.retention import start_sweeper
from coordinator.scheduler import Scheduler
from coordinator.state import redis_server
from coordinator.state.blobs import BlobStore
from coordinator.state.sentinel import check_redis_url
from coordinator.state.store import FarmStore
from protos import farm_pb2_grpc
from protos.blobwire import add_blob_service
from protos.defaults import COORDINATOR_HOST, COORDINATOR_PORT, DASHBOARD_PORT, LEASE_MS, default_data_dir

log = logging.getLogger(__name__)

BULK_PLAIN_HELP = ("serve the blob data channel as plain TCP, for a trusted wired LAN: blobs stay checked (sha256 "
                   "at both ends, HMAC tickets; the token never crosses it) but their bytes are not encrypted")


class Coordinator:
    """The coordinator's parts and their lifecycle, wired once (as Flamenco's manager main.go): the
    scheduler, the reducer and notifier while it leads, health, leadership, presence, the bulk data
    channel, the retention sweeper and the gRPC server they serve on. Leadership calls lead() and
    stand_by() when the role changes; stop() ends it all. serve() builds and starts one."""

    def __init__(self, store: FarmStore, data_dir: Path, *, lease_ms: int, expiry_interval_s: float,
                 leader_lease_ms: int, packs_dir: Path | None) -> None:
        self.store, self.data_dir = store, data_dir
        self.blobs = BlobStore(data_dir, store)
        self.scheduler = Scheduler(store, self.blobs, data_dir, lease_ms=lease_ms, expiry_interval_s=expiry_interval_s)
        self.health = health.HealthServicer()
        self.leadership = Leadership(store, "", self.lead, self.stand_by, leader_lease_ms)
        self.presence = Presence(store, self.scheduler.wake, self.leadership.is_serving)
        self.shelf = PackShelf(Path(packs_dir) if packs_dir else data_dir / "packs")  # packs workers copy from here
        self.reducer: ReducerThread | None = None  # these two run only while we lead
        self.notifier: Notifier | None = None
        self.films: FilmGrower | None = None  # chunked renders' partial.mp4, while we lead
        self.bulk: BulkServer | None = None
        self.retention_stop = threading.Event()
        self.server: grpc.Server | None = None
        self.rpc_threads: futures.ThreadPoolExecutor | None = None  # the server's handler threads
        self.watch_hub: WatchHub | None = None

    def fleet(self) -> list[dict]:
        """The live workers' capabilities with the packs on our shelf: what the reducer plans a length for."""
        return fleet_with_shelf(live_fleet(self.store), self.shelf)

    def build_server(self, token: str, max_workers: int, watch_limit: int,
                     ping_ms: int | None = None) -> grpc.Server:
        """The gRPC server with every farm service on it (not bound or started yet)."""
        self.rpc_threads = futures.ThreadPoolExecutor(max_workers + watch_limit, thread_name_prefix="farm-rpc")
        server = grpc.server(
            self.rpc_threads,
            interceptors=[TokenInterceptor(token, _token_file(self.data_dir, token)), LeaderGate(self.leadership),
                          Guard(), TransientErrors()],
            options=server_options(ping_ms),
        )
        client_servicer = FarmClientServicer(self.store, self.scheduler, self.shelf, watch_limit=watch_limit)
        farm_pb2_grpc.add_FarmClientServicer_to_server(client_servicer, server)
        self.watch_hub = client_servicer.hub
        farm_pb2_grpc.add_FarmPacksServicer_to_server(FarmPacksServicer(self.shelf, self.store), server)
        bulk = (self.bulk.port, self.bulk.tls is not None) if self.bulk else (0, False)
        farm_pb2_grpc.add_FarmWorkerServicer_to_server(
            FarmWorkerServicer(self.store, self.scheduler, self.presence, bulk=bulk), server)
        blob_servicer = FarmBlobsServicer(self.blobs)
        add_blob_service(server, blob_servicer.PutBlob, blob_servicer.GetBlob)
        set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.server = server
        return server

    def start(self) -> None:
        """Serve: the bound gRPC server and the data channel, one claim of the lease (a lone coordinator
        leads before serve() returns), the leadership loop and the retention sweeper."""
        if self.server is None:
            raise RuntimeError("Coordinator.start() before build_server()")
        self.server.start()
        if self.bulk is not None:
            self.bulk.start()
        self.leadership.claim_once()
        self.leadership.start()
        start_sweeper(self.store, self.data_dir, self.leadership.is_serving, self.store.now_ms, self.retention_stop)

    def lead(self) -> None:
        """This coordinator took the lease: resume what a restarted coordinator resumes, then serve."""
        self.scheduler.start()
        self.reducer = ReducerThread(self.store, self.blobs, self.scheduler, fleet=self.fleet)
        self.reducer.start()
        self.notifier = Notifier(self.store, self.leadership.is_serving)
        self.notifier.start()
        self.films = FilmGrower(self.store, self.blobs, self.data_dir)
        self.films.start()
        set_health(self.health, health_pb2.HealthCheckResponse.SERVING)

    def stand_by(self) -> None:
        """Another coordinator leads now: stop every loop of ours (their writes are fenced anyway)."""
        set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.reducer is not None:
            self.reducer.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.films is not None:
            self.films.stop()
        self.scheduler.stop()

    def stop(self, grace: float = 2.0) -> None:
        """Stop accepting RPCs, let in-flight ones finish, stop the loops, then hand the lease back so a
        standby takes over at once."""
        self.presence.stopping.set()  # streams our shutdown breaks blame no worker
        self.leadership.halt()
        self.health.enter_graceful_shutdown()
        if self.bulk is not None:
            self.bulk.stop()
        if self.server is not None:
            self.server.stop(grace).wait()
        if self.rpc_threads is not None:  # gRPC leaves its pool's idle threads behind otherwise
            self.rpc_threads.shutdown(wait=False)
        if self.watch_hub is not None:
            self.watch_hub.stop()
        if self.reducer is not None:
            self.reducer.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.films is not None:
            self.films.stop()
        self.retention_stop.set()
        self.scheduler.stop()
        self.leadership.release()


def serve(
    store: FarmStore,
    data_dir: Path,
    host: str = COORDINATOR_HOST,
    port: int = 0,
    token: str | None = None,
    *,
    lease_ms: int = LEASE_MS,
    max_workers: int = 256,  # every worker holds a Lease long poll and an Attach stream
    watch_limit: int = WATCH_LIMIT,  # Watch streams, served by threads of their own on top of max_workers
    expiry_interval_s: float = 1.0,
    packs_dir: Path | None = None,
    advertise: str | None = None,
    leader_lease_ms: int = LEADER_LEASE_MS,
    bulk_port: int | None = 0,
    bulk_plain: bool = False,
    ping_ms: int | None = None,
) -> tuple[Coordinator, int]:
    """Start a Coordinator; returns (coordinator, bound port). Call stop(coordinator) to end.
    It serves the farm while it holds the leadership lease, and stands by (answering UNAVAILABLE with
    the leader's address) while another coordinator does; `advertise` is the address it gives out.
    Beside it, the bulk data channel for blobs (coordinator/api/bulk_server.py) on `bulk_port` of the same
    host (0: the OS picks; None: no data channel, blobs go over gRPC), TLS unless `bulk_plain`. `ping_ms`:
    how often the server pings each peer and how long it waits for an answer (auth.server_options)."""
    data_dir = Path(data_dir)
    token = token or load_or_create_token(data_dir)
    coordinator = Coordinator(store, data_dir, lease_ms=lease_ms, expiry_interval_s=expiry_interval_s,
                              leader_lease_ms=leader_lease_ms, packs_dir=packs_dir)
    coordinator.bulk = _bulk_server(coordinator.blobs, data_dir, host, bulk_port, bulk_plain, token,
                                    coordinator.leadership)
    threading.Thread(target=coordinator.shelf.warm, name="pack-hashes", daemon=True).start()
    server = coordinator.build_server(token, max_workers, watch_limit, ping_ms)
    bound = _bind(server, data_dir, host, port)
    if bound == 0:
        if coordinator.bulk is not None:
            coordinator.bulk.stop()
        raise OSError(f"could not bind {host}:{port}")
    wildcard = host in ("0.0.0.0", "::", "")
    coordinator.leadership.address = advertise or f"{socket.gethostname() if wildcard else host}:{bound}"
    coordinator.start()
    log.info("coordinator listening on %s:%d (%s)", host, bound,
             "leading" if coordinator.leadership.leading else "standby")
    return coordinator, bound


def set_health(health_servicer: health.HealthServicer, status: int) -> None:
    """The same status for the server as a whole and each farm service."""
    for name in ("", "ltxfarm.v1.FarmClient", "ltxfarm.v1.FarmWorker", "ltxfarm.v1.FarmBlobs"):
        health_servicer.set(name, status)


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


def _bind(server: grpc.Server, data_dir: Path, host: str, port: int) -> int:
    """TLS with the farm's certificate (DATA/tls, made on first start); there is no plaintext port."""
    tls = load_or_create_tls(data_dir)
    credentials = grpc.ssl_server_credentials([(tls.server_key_pem, tls.chain_pem)])
    return server.add_secure_port(f"{host}:{port}", credentials)


def stop(coordinator: Coordinator, grace: float = 2.0) -> None:
    """End what serve() started (Coordinator.stop)."""
    coordinator.stop(grace)


def run_coordinator(
    data_dir: Path, host: str, port: int, redis_url: str | None = None, prefix: str = "farm",
    packs_dir: Path | None = None,
    dashboard_host: str = "127.0.0.1", dashboard_port: int = DASHBOARD_PORT, advertise: str | None = None,
    bulk_port: int | None = 0, bulk_plain: bool = False,
) -> int:
    """Run until SIGTERM/SIGINT: embedded Redis (unless redis_url), store, server. Coordinators sharing
    one Redis (and one data folder, for the blobs) elect a leader; the others stand by."""
    from protos.logsetup import log_path, setup_logging

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(log_path(data_dir, "coordinator"))  # named by `farm doctor`
    # Caught before anything starts: a stop that arrives mid-start ends the start in order instead of
    # killing the process with its Redis (in a session of its own) left running, which the next start refuses.
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(redis_server.EmbeddedRedis(data_dir / "redis")).url
        store = FarmStore(redis_server.connect(redis_url), prefix)
        token = load_or_create_token(data_dir)
        coordinator, bound = serve(store, data_dir, host, port, token, packs_dir=packs_dir, advertise=advertise,
                                   bulk_port=bulk_port, bulk_plain=bulk_plain)
        dashboard, dash_port = start_dashboard(store, dashboard_host, dashboard_port, token, data_dir=data_dir,
                                               token_file=_token_file(data_dir, token))  # follows a rotate
        stack.callback(stop_dashboard, dashboard)
        _announce(stack, host, bound, token)
        print(f"coordinator on {host}:{bound}; dashboard {_dashboard_link(dashboard_host, dash_port, token)}; "
              f"token in {data_dir / 'token'}", flush=True)
        done.wait()
        coordinator.stop()
    return 0


def _announce(stack: ExitStack, host: str, port: int, token: str) -> None:
    """Announce this farm on the LAN (mDNS) so `farm join TOKEN` finds it; withdrawn on the way out."""
    from protos.auth import JoinToken
    from protos.discovery import announce

    announcement = announce(host, port, JoinToken.parse(token).fingerprint)
    if announcement is not None:
        stack.callback(announcement.close)


def main(argv: list[str] | None = None) -> int:
    """`python -m coordinator.server`: the same defaults as `farm coordinator` (protos/defaults)."""
    parser = argparse.ArgumentParser(prog="farm coordinator", description="Run the LTX farm coordinator.")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="the farm's data (default $FARM_DATA, else ~/.ltx-farm)")
    parser.add_argument("--host", default=COORDINATOR_HOST)
    parser.add_argument("--port", type=int, default=COORDINATOR_PORT)
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of the embedded one "
                        "(redis://..., or redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER)")
    parser.add_argument("--packs-dir", type=Path, default=None, help="packs workers copy (default DATA/packs)")
    parser.add_argument("--advertise", default=None, help="HOST:PORT a standby sends workers and clients to")
    parser.add_argument("--bulk-port", type=int, default=0, help="blob data channel port (0: any free, -1: none)")
    parser.add_argument("--bulk-plain", action="store_true", help=BULK_PLAIN_HELP)
    args = parser.parse_args(argv)
    if args.redis_url:
        try:
            check_redis_url(args.redis_url)
        except ValueError as exc:
            parser.exit(2, f"farm coordinator: {exc}\n")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_coordinator(args.data_dir or default_data_dir(), args.host, args.port, args.redis_url,
                           packs_dir=args.packs_dir, advertise=args.advertise,
                           bulk_port=None if args.bulk_port < 0 else args.bulk_port, bulk_plain=args.bulk_plain)


if __name__ == "__main__":
    raise SystemExit(main())


def _dashboard_link(host: str, port: int, token: str) -> str:
    """The login link on a terminal (as Jupyter prints it); a log file gets the plain URL instead."""
    link = login_url(host, port, token)
    return link if sys.stdout.isatty() else link.split("?", 1)[0] + " (`farm dashboard` opens it logged in)"
