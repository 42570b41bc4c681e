"""Service commands: coordinator, worker, up (both on one machine) and demo (a whole render, then exit)."""


import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common
from farm_cli.common import fail
from farm_cli.supervise import Supervisor


def ensure_tiny_pack(data: Path) -> Path:
    """The tiny pack in the data folder's packs/, written once."""
    folder = data / "packs" / "tiny"
    if not (folder / "embedded_config.json").is_file():
        from ltx_engine.tiny_pack import write_tiny_pack

        typer.echo(f"writing tiny pack to {folder}", err=True)
        write_tiny_pack(folder, seed=0)
    return folder


def worker_command(address: str, token: str, packs_dir: Path, worker_id: str, cache_dir: Path,
                   wait_ms: int = 2000) -> list[str]:
    """How a local worker process is started (farm up, demo, and the tests' farms)."""
    return [sys.executable, "-m", "worker.agent", "--coordinator", address, f"--token={token}",
            "--packs-dir", str(packs_dir), "--worker-id", worker_id, "--cache-dir", str(cache_dir),
            "--wait-ms", str(wait_ms)]


@contextlib.contextmanager
def local_farm(data: Path, workers: int, port: int = 0, redis_url: str | None = None,
               log_dir: Path | None = None, dashboard_host: str = "127.0.0.1",
               dashboard_port: int | None = None) -> Iterator[tuple[str, str, list[subprocess.Popen]]]:
    """Embedded Redis (unless redis_url) + coordinator in this process + N worker processes."""
    from coordinator import redis_server
    from coordinator.auth import load_or_create_token
    from coordinator.dashboard import start_dashboard, stop_dashboard
    from coordinator.server import serve, stop
    from coordinator.store import FarmStore

    with contextlib.ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(redis_server.EmbeddedRedis(data / "redis")).url
        store = FarmStore(redis_server.connect(redis_url))
        token = load_or_create_token(data)
        server, bound = serve(store, data, "127.0.0.1", port, token)
        stack.callback(stop, server)
        if dashboard_port is not None:
            dashboard, dash_port = start_dashboard(store, dashboard_host, dashboard_port, token, data_dir=data)
            stack.callback(stop_dashboard, dashboard)
            typer.echo(f"dashboard http://{dashboard_host}:{dash_port}/", err=True)
        address = f"127.0.0.1:{bound}"
        log_dir = log_dir or data / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

        def spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
            with open(log_path, "ab") as log:  # the child keeps its own descriptor
                return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

        commands = [(f"worker-{i + 1}", worker_command(address, token, data / "packs", f"worker-{i + 1}",
                                                       data / f"cache-{i + 1}"), log_dir / f"worker-{i + 1}.log")
                    for i in range(workers)]
        supervisor = Supervisor(commands, spawn)  # restarts a worker that dies, with backoff
        supervisor.start()
        stack.callback(lambda: _stop_processes(supervisor.procs))
        stack.callback(supervisor.halt)
        yield address, token, supervisor.procs


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


def register(app: typer.Typer) -> None:
    """Add the service commands to the `farm` app."""
    from farm_cli.main import DataDir, Output

    Port = Annotated[int, typer.Option("--port")]
    RedisUrl = Annotated[str | None, typer.Option("--redis-url", envvar="FARM_REDIS_URL")]

    DashHost = Annotated[str, typer.Option("--dashboard-host", help="0.0.0.0 opens the dashboard to the LAN.")]
    DashPort = Annotated[int, typer.Option("--dashboard-port")]

    @app.command()
    def coordinator(data: DataDir = None, host: str = typer.Option("127.0.0.1", "--host"),
                    port: Port = common.DEFAULT_PORT, redis_url: RedisUrl = None,
                    dashboard_host: DashHost = "127.0.0.1", dashboard_port: DashPort = common.DEFAULT_DASHBOARD_PORT,
                    packs_dir: Annotated[Path | None, typer.Option("--packs-dir", help="Packs workers copy (default DATA/packs).")] = None,
                    advertise: Annotated[str | None, typer.Option(
                        "--advertise", help="HOST:PORT standbys send workers and clients to while this one leads.")] = None,
                    ) -> None:
        """Run the coordinator (gRPC + Redis + dashboard) until Ctrl-C. Several coordinators on one Redis
        and one shared --data folder elect a leader; the others stand by and take over when it stops."""
        from coordinator.server import run_coordinator

        raise typer.Exit(run_coordinator(common.data_dir(data), host, port, redis_url, packs_dir=packs_dir,
                                         dashboard_host=dashboard_host, dashboard_port=dashboard_port,
                                         advertise=advertise))

    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def worker(ctx: typer.Context) -> None:
        """Run a worker: farm worker --coordinator HOST:PORT [--token T] [--packs-dir DIR]."""
        from worker.agent import main as worker_main

        raise typer.Exit(worker_main(list(ctx.args)))

    @app.command()
    def up(workers: int = typer.Option(2, "--workers"), port: Port = common.DEFAULT_PORT, data: DataDir = None,
           redis_url: RedisUrl = None, dashboard_host: DashHost = "127.0.0.1",
           dashboard_port: DashPort = common.DEFAULT_DASHBOARD_PORT) -> None:
        """Coordinator + N local workers (+ embedded Redis) in the foreground until Ctrl-C."""
        folder = common.data_dir(data)
        ensure_tiny_pack(folder)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        with local_farm(folder, workers, port, redis_url, dashboard_host=dashboard_host,
                        dashboard_port=dashboard_port) as (address, _token, _procs):
            typer.echo(f"farm up: coordinator {address}, {workers} workers; token in {folder / 'token'}")
            while not stop.wait(0.5):
                pass
            typer.echo("farm up: stopping")

    @app.command()
    def demo(output: Output = None, data: DataDir = None, workers: int = typer.Option(2, "--workers")) -> None:
        """Start a farm on this machine, render one clip with the tiny pack, write the mp4, stop."""
        from farm_cli.remote import fetch_results, submit_render, wait_for

        folder = common.data_dir(data)
        ensure_tiny_pack(folder)
        out = output or Path("demo.mp4")
        spec = {"prompt": "a red fox running through fresh snow at dawn", "height": 256, "width": 384,
                "frames": 25, "frame_rate": 24.0, "seed": 1, "pack": "tiny", "audio": True}
        with local_farm(folder, workers) as (address, token, _procs):
            render_id = submit_render(spec, None, address, token)
            typer.echo(f"submitted {render_id} to {address}", err=True)
            render = wait_for(render_id, address, token)
            if render.get("state") != "done":
                fail(f"render {render_id} {render.get('state')}: {render.get('error') or ''}", code=1)
            fetch_results(render, out, None, address, token)
