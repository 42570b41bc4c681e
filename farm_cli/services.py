"""Service commands: coordinator, worker, up (both on one machine) and demo (a whole render, then exit)."""


import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common
from farm_cli.options import DashHost, DashPort, DataDir, Output, Port, RedisUrl
from farm_cli.session import fail
from farm_cli.supervise import Supervisor
from protos.defaults import COORDINATOR_HOST, COORDINATOR_PORT, DASHBOARD_PORT


def ensure_tiny_pack(data: Path, dit: str = "tiny") -> Path:
    """The tiny pack in the data folder's packs/, written once (by `farm up`, `farm demo`, and `farm
    render --local` on a machine that has none), with a line that says what it is: a first clip of
    coloured noise otherwise reads as a broken install. `dit` "bench": the `bench` pack, the tiny pack
    with a DiT that dominates a render (`farm bench scale`'s), in packs/bench."""
    folder = data / "packs" / dit
    if not (folder / "embedded_config.json").is_file():
        from ltx_engine.tiny.tiny_pack import write_tiny_pack

        what = "the tiny pack" if dit == "tiny" else f"the {dit} pack (the tiny pack with a {dit}-size DiT)"
        typer.echo(f"writing {what} to {folder}: seeded weights for trying the farm, so its clips are "
                   "coloured noise (`farm pack pull` fetches real weights)", err=True)
        write_tiny_pack(folder, seed=0, dit=dit)
    return folder


def worker_command(address: str, token_file: Path, packs_dir: Path, worker_id: str, cache_dir: Path,
                   wait_ms: int = 2000) -> list[str]:
    """How a local worker process is started (farm up, demo, and the tests' farms). The token goes by
    its file (mode 0600), never on the command line, where `ps` would show it to every local user."""
    return [sys.executable, "-m", "worker.agent", "--coordinator", address, "--token-file", str(token_file),
            "--packs-dir", str(packs_dir), "--worker-id", worker_id, "--cache-dir", str(cache_dir),
            "--wait-ms", str(wait_ms)]


@contextlib.contextmanager
def local_farm(data: Path, workers: int, port: int = 0, redis_url: str | None = None,
               log_dir: Path | None = None, dashboard_host: str = "127.0.0.1",
               dashboard_port: int | None = None,
               redis_replicas: int = 0) -> Iterator[tuple[str, str, list[subprocess.Popen]]]:
    """Embedded Redis (unless redis_url; with redis_replicas, a primary, that many replicas and three
    sentinels) + coordinator in this process + N worker processes."""
    from coordinator.api.auth import load_or_create_token
    from coordinator.dashboard import start_dashboard, stop_dashboard
    from coordinator.server import serve, stop
    from coordinator.state import redis_server
    from coordinator.state.store import FarmStore

    with contextlib.ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(embedded_redis(data, redis_replicas)).url
            if redis_replicas:
                many = f"{redis_replicas} replica{'s' if redis_replicas != 1 else ''}"
                typer.echo(f"redis: a primary, {many} and 3 sentinels: {redis_url}", err=True)
        store = FarmStore(redis_server.connect(redis_url))
        token = load_or_create_token(data)
        server, bound = serve(store, data, "127.0.0.1", port, token)
        stack.callback(stop, server)
        if dashboard_port is not None:
            dashboard, dash_port = start_dashboard(store, dashboard_host, dashboard_port, token, data_dir=data,
                                                   token_file=data / "token")  # follows `farm token rotate`
            stack.callback(stop_dashboard, dashboard)
            from coordinator.dashboard.security import login_url

            typer.echo(f"dashboard {login_url(dashboard_host, dash_port, token)}  (this link logs in)", err=True)
        address = f"127.0.0.1:{bound}"
        log_dir = log_dir or data / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

        def spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
            with open(log_path, "ab") as log:  # the child keeps its own descriptor
                return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

        commands = [(f"worker-{i + 1}", worker_command(address, data / "token", data / "packs", f"worker-{i + 1}",
                                                       data / f"cache-{i + 1}"), log_dir / f"worker-{i + 1}.log")
                    for i in range(workers)]
        supervisor = Supervisor(commands, spawn)  # restarts a worker that dies, with backoff
        supervisor.start()
        stack.callback(lambda: _stop_processes(supervisor.procs))
        stack.callback(supervisor.halt)
        yield address, token, supervisor.procs


def announce_farm(stack: contextlib.ExitStack, address: str, token: str) -> None:
    """Announce the farm on the LAN (mDNS) for `farm join`, withdrawn when the stack closes."""
    from protos.auth import JoinToken
    from protos.discovery import announce

    host, _, port = address.rpartition(":")
    announcement = announce(host, int(port), JoinToken.parse(token).fingerprint)
    if announcement is not None:
        stack.callback(announcement.close)


def embedded_redis(data: Path, replicas: int = 0) -> contextlib.AbstractContextManager:
    """The farm's own Redis in DATA: one server, or with replicas a replicated set with sentinels."""
    if replicas:
        from coordinator.state.replicated import ReplicatedRedis

        return ReplicatedRedis(data, replicas, revive=True)  # a member that dies is started again
    from coordinator.state import redis_server

    return redis_server.EmbeddedRedis(data / "redis")


def check_redis_options(redis_url: str | None, replicas: int = 0) -> None:
    """One line, exit 2, for a Redis URL no client could use or a replica count that makes no sense."""
    from coordinator.state.sentinel import check_redis_url

    if replicas < 0:
        fail(f"--redis-replicas {replicas}: give 0 (one server) or more")
    if replicas and redis_url:
        fail("--redis-replicas starts the farm's own replicated Redis: leave out --redis-url (FARM_REDIS_URL)")
    if redis_url:
        try:
            check_redis_url(redis_url)
        except ValueError as exc:
            fail(str(exc))


def _port_free(host: str, port: int) -> bool:
    """Whether our server could bind it: SO_REUSEADDR as gRPC's own listener, so the TIME_WAIT
    connections a crashed coordinator leaves do not refuse its restart; a live listener still does."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(host: str, port: int, dashboard_host: str, dashboard_port: int | None) -> None:
    """One line, exit 1, when a port we are about to serve on is taken (often a `farm up` left running)."""
    for what, flag, h, p in (("port", "--port", host, port), ("dashboard port", "--dashboard-port",
                                                             dashboard_host, dashboard_port)):
        if p and not _port_free(h, p):
            fail(f"{what} {p} on {h} is in use (another `farm up` or coordinator?): stop it or pick {flag}", code=2)


def enter_or_fail(stack: contextlib.ExitStack, services: contextlib.AbstractContextManager):
    """Start services inside stack; a start that fails (Redis of this data folder already running, a port
    taken meanwhile) is one line and exit 1, not a traceback."""
    try:
        return stack.enter_context(services)
    except (OSError, RuntimeError) as exc:
        fail(f"cannot start: {_startup_reason(exc)}", code=1)


def _startup_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).split("; set GRPC_VERBOSITY")[0]
    if "already answers" in text:
        text += " (another `farm up` or coordinator uses this data folder)"
    return text


def _stop_processes(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 10
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def coordinator(data: DataDir = None, host: str = typer.Option(COORDINATOR_HOST, "--host"),
                port: Port = COORDINATOR_PORT, redis_url: RedisUrl = None,
                dashboard_host: DashHost = "127.0.0.1", dashboard_port: DashPort = DASHBOARD_PORT,
                packs_dir: Annotated[Path | None, typer.Option("--packs-dir", help="Packs workers copy (default DATA/packs).")] = None,
                advertise: Annotated[str | None, typer.Option(
                    "--advertise", help="HOST:PORT standbys send workers and clients to while this one leads.")] = None,
                bulk_port: Annotated[int, typer.Option(
                    "--bulk-port", help="Port of the blob data channel beside gRPC (0: any free port, "
                                        "-1: none, blobs go over gRPC).")] = 0,
                bulk_plain: Annotated[bool, typer.Option("--bulk-plain", help=(
                    "Serve the blob data channel as plain TCP, for a trusted wired LAN: blobs stay checked "
                    "(sha256 at both ends, HMAC tickets; the token never crosses it) but their bytes are "
                    "not encrypted. Default: TLS with the coordinator's certificate."))] = False,
                ) -> None:
    """Run the coordinator (gRPC + Redis + dashboard) until Ctrl-C. Several coordinators on one Redis
    and one shared --data folder elect a leader; the others stand by and take over when it stops."""
    from coordinator.server import run_coordinator

    check_redis_options(redis_url)
    check_ports(host, port, dashboard_host, dashboard_port)
    try:
        code = run_coordinator(common.data_dir(data), host, port, redis_url, packs_dir=packs_dir,
                               dashboard_host=dashboard_host, dashboard_port=dashboard_port, advertise=advertise,
                               bulk_port=None if bulk_port < 0 else bulk_port, bulk_plain=bulk_plain)
    except (OSError, RuntimeError) as exc:
        fail(f"cannot start: {_startup_reason(exc)}", code=1)
    raise typer.Exit(code)


def worker(
    coordinator: Annotated[str | None, typer.Option(
        "--coordinator", envvar="FARM_COORDINATOR", help="HOST:PORT, or a list: leader + standbys.")] = None,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="A copy of the coordinator's DATA/token (else FARM_TOKEN, FARM_TOKEN_FILE, "
                             "the macOS keychain).")] = None,
    worker_id: Annotated[str | None, typer.Option("--worker-id", help="Default: this host's name.")] = None,
    packs_dir: Annotated[Path | None, typer.Option("--packs-dir", help="Where packs live on this Mac.")] = None,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Blob cache folder.")] = None,
    wait_ms: Annotated[int, typer.Option("--wait-ms", help="Long-poll for a lease this long.")] = 10_000,
    max_tasks: Annotated[int | None, typer.Option("--max-tasks", help="Exit after this many tasks.")] = None,
    pack_max_mbps: Annotated[float | None, typer.Option(
        "--pack-max-mbps", help="Cap copying packs from the coordinator at this many MB/s.")] = None,
    drain: Annotated[bool, typer.Option(
        "--drain", help="Ask the running worker with this id to finish its task, take no more and exit.")] = False,
    throttle: Annotated[float, typer.Option(
        "--throttle", help="Run each task FACTOR times as long as its compute (>= 1): share this Mac.")] = 1.0,
) -> None:
    """Run this Mac's worker: lease tasks from the coordinator and run them until Ctrl-C."""
    from worker.cli import run_worker, worker_token

    if not coordinator:
        fail("give --coordinator HOST:PORT[,HOST:PORT...] or FARM_COORDINATOR")
    try:
        resolved = worker_token(token_file)
    except SystemExit as exc:
        fail(str(exc).removeprefix("farm worker: "))
    from protos.logsetup import log_path

    log_file = None if drain else log_path(common.data_dir(), "worker")  # named by `farm doctor`
    raise typer.Exit(run_worker(coordinator, resolved, packs_dir, worker_id, cache_dir, wait_ms, max_tasks,
                                pack_max_mbps, drain, log_file=log_file, throttle=throttle,
                                token_file=token_file))


def up(workers: int = typer.Option(2, "--workers"), port: Port = COORDINATOR_PORT, data: DataDir = None,
       redis_url: RedisUrl = None, dashboard_host: DashHost = "127.0.0.1",
       dashboard_port: DashPort = DASHBOARD_PORT,
       redis_replicas: Annotated[int, typer.Option(
           "--redis-replicas", help="Run the embedded Redis as a primary, N replicas and 3 sentinels on "
                                    "127.0.0.1 (data under DATA); the coordinator follows a failover.")] = 0,
       ) -> None:
    """Coordinator + N local workers (+ embedded Redis) in the foreground until Ctrl-C."""
    folder = common.data_dir(data)
    check_redis_options(redis_url, redis_replicas)
    check_ports("127.0.0.1", port, dashboard_host, dashboard_port)
    from protos.logsetup import log_path, setup_logging

    setup_logging(log_path(folder, "coordinator"))  # the coordinator runs in this process
    ensure_tiny_pack(folder)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with contextlib.ExitStack() as stack:
        address, _token, _procs = enter_or_fail(stack, local_farm(
            folder, workers, port, redis_url, dashboard_host=dashboard_host, dashboard_port=dashboard_port,
            redis_replicas=redis_replicas))
        announce_farm(stack, address, _token)
        typer.echo(f"farm up: coordinator {address}, {workers} workers; token in {folder / 'token'}")
        while not stop.wait(0.5):
            pass
        typer.echo("farm up: stopping")


def demo(output: Output = None, data: DataDir = None, workers: int = typer.Option(2, "--workers")) -> None:
    """Start a farm on this machine, render one clip with the tiny pack, write the mp4, stop."""
    from farm_cli.remote import fetch_results, submit_render, wait_for

    folder = common.data_dir(data)
    ensure_tiny_pack(folder)
    out = output or Path("demo.mp4")
    spec = {"prompt": "a red fox running through fresh snow at dawn", "height": 256, "width": 384,
            "frames": 25, "frame_rate": 24.0, "seed": 1, "pack": "tiny", "audio": True}
    with contextlib.ExitStack() as stack:
        address, token, _procs = enter_or_fail(stack, local_farm(folder, workers))
        render_id = submit_render(spec, None, address, token)
        typer.echo(f"submitted {render_id} to {address}", err=True)
        render = wait_for(render_id, address, token)
        if render.get("state") != "done":
            fail(f"render {render_id} {render.get('state')}: {render.get('error') or ''}", code=1)
        fetch_results(render, out, None, address, token)
