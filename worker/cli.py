"""`farm worker` / `python -m worker.agent`: flags, the join token, signals, then the agent's loop.

Its own module (the size rule): the entry only builds an Agent and wires SIGTERM/SIGINT (stop) and
SIGUSR1 (drain) to it; worker/agent/__main__.py runs `main` from here when started as a module.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

from protos.auth import NO_TOKEN, TOKEN_ON_ARGV, TokenError, resolve_token
from worker import quiet
from worker.agent import Agent
from worker.connection import default_worker_id, request_drain


def load_runner(packs_dir: Path | None, throttle: float = 1.0) -> Any:
    """The real worker.runner.Runner over packs_dir (imported late: it loads MLX)."""
    from worker.runner import Runner

    return Runner(packs_dir, throttle=throttle)


def worker_token(token_file: Path | None) -> str:
    """--token-file, else FARM_TOKEN, FARM_TOKEN_FILE or the macOS keychain (protos.auth.resolve_token);
    one line naming them when none has a token. Never the command line, which `ps` shows."""
    try:
        token = resolve_token(token_file)
    except TokenError as exc:
        raise SystemExit(f"farm worker: {exc}") from None
    if not token:
        raise SystemExit(f"farm worker: {NO_TOKEN}")
    return token


def run_worker(coordinator: str, token: str, packs_dir: Path | None = None, worker_id: str | None = None,
               cache_dir: Path | None = None, wait_ms: int = 10_000, max_tasks: int | None = None,
               pack_max_mbps: float | None = None, drain: bool = False, log_file: Path | None = None,
               throttle: float = 1.0, token_file: Path | None = None) -> int:
    """Run this Mac's worker until stopped (or, with drain, ask the running one to finish and exit): what
    `farm worker` and `python -m worker.agent` both call. Logs go to stderr and log_file when given."""
    from protos.logsetup import setup_logging

    setup_logging(log_file)
    if drain:
        return request_drain(coordinator, token, worker_id or default_worker_id())
    agent = Agent(coordinator, token, load_runner(packs_dir, throttle), worker_id=worker_id, cache_dir=cache_dir,
                  wait_ms=wait_ms, pack_max_bytes_per_s=pack_max_mbps * 1e6 if pack_max_mbps else None,
                  token_file=token_file)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    signal.signal(signal.SIGUSR1, lambda *_: agent.drain())
    quiet.freeze_startup_heap()
    return agent.run(max_tasks=max_tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="farm worker", description="Run a farm worker on this Mac.")
    parser.add_argument("--coordinator", default=os.environ.get("FARM_COORDINATOR"),
                        help="HOST:PORT of the coordinator, or a comma-separated list (leader + standbys)")
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: `ps` would show it
    parser.add_argument("--token-file", type=Path, default=None)
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--packs-dir", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--wait-ms", type=int, default=10_000)
    parser.add_argument("--max-tasks", type=int, default=None)
    parser.add_argument("--pack-max-mbps", type=float, default=None,
                        help="cap copying packs from the coordinator at this many MB/s (default: no cap)")
    parser.add_argument("--throttle", type=float, default=1.0,
                        help="run each task FACTOR times as long as its compute (>= 1): share this Mac with people")
    parser.add_argument("--drain", action="store_true",
                        help="ask the running worker with this id to finish its task, take no more and exit")
    args = parser.parse_args(argv)
    if args.token is not None:
        parser.exit(2, f"farm worker: {TOKEN_ON_ARGV}\n")
    if not args.coordinator:
        parser.error("give --coordinator HOST:PORT[,HOST:PORT...] or FARM_COORDINATOR")
    return run_worker(args.coordinator, worker_token(args.token_file), args.packs_dir, args.worker_id,
                      args.cache_dir, args.wait_ms, args.max_tasks, args.pack_max_mbps, args.drain,
                      throttle=args.throttle, token_file=args.token_file)
