"""A real farm for tests: throwaway Redis, the coordinator's gRPC server in-process, worker subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from farm_cli.bench.failover import wait_for
from farm_cli.client import FarmClient
from farm_cli.remote import latents_from_outputs
from farm_cli.services import worker_command
from protos.tensors import decode_tensor

ROOT = Path(__file__).resolve().parents[2]


def start_worker(address: str, token: str, packs: Path, name: str, data: Path) -> subprocess.Popen:
    cmd = worker_command(address, token_file(data, name, token), packs, name, data / f"cache-{name}", wait_ms=500)
    log = open(data / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until it exits
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def join_token(data: Path, secret: str) -> str:
    """The join token of the farm whose data folder is `data`, with `secret` (serve(token=secret))."""
    from coordinator.api.tls import load_or_create_tls
    from protos.auth import JoinToken

    return str(JoinToken(load_or_create_tls(data).fingerprint, secret))


def token_file(data: Path, name: str, token: str) -> Path:
    """A 0600 file holding `token` for a worker process (workers take tokens from files, not argv)."""
    path = data / f"{name}.token"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return path


@contextlib.contextmanager
def farm(store, data: Path, packs: Path, workers: int, lease_ms: int = 30_000,
         shelf: Path | None = None) -> Iterator[tuple[FarmClient, list]]:
    """A coordinator and `workers` worker processes; `shelf`: the packs the coordinator itself holds (as
    `farm up` keeps them), read at submit for the pack's facts."""
    from coordinator.api.auth import load_or_create_token
    from coordinator.server import serve, stop

    token = load_or_create_token(data)
    server, port = serve(store, data, "127.0.0.1", 0, token, lease_ms=lease_ms, expiry_interval_s=0.2,
                         packs_dir=shelf)
    address = f"127.0.0.1:{port}"
    procs = {f"w{i + 1}": start_worker(address, token, packs, f"w{i + 1}", data) for i in range(workers)}
    client = FarmClient(address, token, timeout=30)
    try:
        yield client, procs
    finally:
        client.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        stop(server)


def wait_done(client: FarmClient, render_id: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    for _event in client.watch(render_id, timeout=timeout):
        if time.monotonic() > deadline:
            break
    render = client.get(render_id)
    assert render["state"] == "done", (render.get("state"), render.get("error"), dump_logs(render))
    return render


def dump_logs(render: dict) -> str:
    return render.get("error") or ""


def farm_results(client: FarmClient, render: dict) -> dict[str, np.ndarray]:
    """Stage latents and decoded frames of a finished farm render."""
    outputs = {t["id"]: t.get("outputs") or {} for t in render["tasks"]}
    fetch = lambda sha: decode_tensor(client.get_blob(sha))  # noqa: E731
    arrays = latents_from_outputs(outputs, render["id"], fetch)
    arrays["frames"] = fetch(outputs[f"{render['id']}.decode"]["frames"])
    return arrays


def local_results(outputs: dict, blobs) -> dict[str, np.ndarray]:
    arrays = latents_from_outputs(outputs, "local", blobs.get)
    arrays["frames"] = blobs.get(outputs["local.decode"]["frames"])
    return arrays


def assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name], b[name]), f"{name} differs: max {np.abs(a[name] - b[name]).max()}"


def clean(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def wait_until(check, timeout: float, what: str, poll: float = 0.1):
    """check()'s first truthy value within timeout seconds (`farm_cli.bench.failover.wait_for`); else an
    AssertionError naming what."""
    found = wait_for(check, timeout, poll)
    if not found:
        raise AssertionError(f"not within {timeout} s: {what}")
    return found


class ModuleFarm:
    """One coordinator for the module; `workers(n)` starts more worker processes as tests ask for them."""

    def __init__(self, client, procs: dict, data, packs):
        self.client, self.procs, self.data, self.packs = client, procs, data, packs

    def start(self, name: str, *extra: str) -> subprocess.Popen:
        from coordinator.api.auth import load_or_create_token

        token = load_or_create_token(self.data)
        cmd = worker_command(
            str(self.client.endpoints),
            token_file(self.data, name, token),
            self.packs,
            name,
            self.data / f"cache-{name}",
            wait_ms=500,
        )
        log = open(self.data / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until it exits
        self.procs[name] = subprocess.Popen(
            [*cmd, *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        return self.procs[name]

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        proc.wait(timeout=20)

    def workers(self, n: int) -> None:
        for i in range(1, n + 1):
            if f"w{i}" not in self.procs:
                self.start(f"w{i}")


@contextlib.contextmanager
def shelf_farm(store, data: Path, packs: Path) -> Iterator[ModuleFarm]:
    """A module's coordinator holding `packs` on its shelf (as `farm up` keeps them) and no worker yet:
    each test starts the workers it needs."""
    with farm(store, data, packs, workers=0, shelf=packs) as (client, procs):
        yield ModuleFarm(client, procs, data, packs)


def local_references(runner, mktemp, spec_of) -> Callable[[str], dict[str, np.ndarray]]:
    """`farm render --local` results by name, each rendered once with one warm Runner: `spec_of(name)` is
    the name's spec, `mktemp(name)` a fresh folder (tmp_path_factory.mktemp)."""
    from farm_cli.local import render_local

    done: dict[str, dict[str, np.ndarray]] = {}

    def local(name: str) -> dict[str, np.ndarray]:
        if name not in done:
            _, outputs, blobs = render_local(spec_of(name), mktemp("local") / "local.mp4", runner)
            done[name] = local_results(outputs, blobs)
        return done[name]

    return local
