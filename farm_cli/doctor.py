"""`farm doctor`: what a worker Mac needs, checked one line at a time.

Each check returns (status, message) with status ok / warn / fail / skip; the command prints one line
per check and exits 1 when any check fails, so install scripts and launchd wrappers can gate on it.
Nothing here downloads or changes anything: a pack that is not on this Mac passes only when the
coordinator holds it (the worker copies it from there) and the disk has room for it.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common
from farm_cli.config import local_token
from farm_cli.options import Coordinator, DataDir, RedisUrl, Token
from farm_cli.render_options import spec_option
from protos.auth import NO_TOKEN

Check = tuple[str, str]
MIN_PYTHON = (3, 11)
SKEW_WARN_S = 1.0
MARKS = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-"}


def check_python() -> Check:
    v = sys.version_info
    ok = (v.major, v.minor) >= MIN_PYTHON
    return ("ok" if ok else "fail"), f"Python {v.major}.{v.minor}.{v.micro} ({sys.executable})"


def check_mlx() -> Check:
    """MLX imports, its default device, and the Metal memory size where Metal exists."""
    try:
        import mlx.core as mx
    except ImportError as exc:
        return "fail", f"MLX not importable: {exc}"
    device = str(mx.default_device())
    try:
        info = mx.device_info() if hasattr(mx, "device_info") else {}
    except Exception:  # noqa: BLE001 - no Metal on Linux: device_info may raise or lack fields
        info = {}
    memory = info.get("memory_size") if isinstance(info, dict) else None
    if not memory:
        return (
            "warn",
            f"MLX {mx.__version__} on {device}; no Metal device (CPU only: fine for tests, slow for renders)",
        )
    name = info.get("device_name") or info.get("architecture") or "Metal"
    return "ok", f"MLX {mx.__version__} on {device}: {name}, {int(memory) / 2**30:.0f} GiB unified memory"


def _local_pack_path(pack: str, packs_dir: Path) -> Path | None:
    """The pack's folder: packs_dir/NAME, a path, or the HF cache copy of a repo id (never downloads)."""
    for candidate in (packs_dir / pack, Path(pack).expanduser()):
        if candidate.is_dir():
            return candidate
    if pack.count("/") == 1:
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(pack, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached (or hub missing): report as missing
            return None
    return None


def check_pack(pack: str, packs_dir: Path, farm_packs: Callable[[], list[dict]] | None = None) -> Check:
    """The pack complete on this Mac, or else held by the coordinator (`farm_packs`) with room to copy it."""
    path = _local_pack_path(pack, packs_dir)
    if path is None:
        if farm_packs is not None:
            return _pack_on_coordinator(pack, packs_dir, farm_packs)
        return "fail", f"pack {pack!r} not found in {packs_dir} or the Hugging Face cache"
    try:
        from ltx_engine.loading.loader import PackError
        from ltx_engine.loading.pack import Pack

        opened = Pack(path)
    except PackError as exc:
        return "fail", f"pack {pack!r} incomplete: {exc}"
    from ltx_engine.rules.components import TEXT_ENCODER, missing_line, render_components

    tower = "pack" if opened.has(TEXT_ENCODER) else "separate"  # a separate encoder: check_text_encoder
    lacking = [c for c in render_components({"audio": True, "text_encoder": tower}) if not opened.has(c)]
    if lacking:  # the pack opens, but a text-to-video render with audio would be refused
        return "fail", missing_line(lacking[0], pack)
    size = sum(f.stat().st_size for f in opened.root.rglob("*") if f.is_file())
    return "ok", f"pack {pack!r} complete at {opened.root} ({size / 2**30:.2f} GiB)"


def check_text_encoder(pack: str, packs_dir: Path, farm_packs: Callable[[], list[dict]] | None = None,
                       data: Path | None = None) -> Check:
    """The Gemma a pack without its own tower encodes prompts with (the config's entry for the pack, else
    the MLX port's default) on this Mac, or on the coordinator, which copies it here when needed."""
    from ltx_engine.rules import text_encoders

    path = _local_pack_path(pack, packs_dir)
    if path is None:
        return "skip", f"text encoder: checked once pack {pack!r} is here"
    if (path / "text_encoder" / "config.json").is_file():
        return "ok", f"text encoder: pack {pack!r} carries its own"
    ref = common.text_encoder_choice(pack, None, data) or text_encoders.DEFAULT
    found = text_encoders.find_local(ref, packs_dir)
    if found is not None:
        return "ok", f"text encoder {ref!r} at {found} ({text_encoders.weight_bytes(found) / 1e9:.2f} GB of weights)"
    try:
        shelf = {p["name"] for p in farm_packs()} if farm_packs is not None else set()
    except Exception:  # noqa: BLE001 - the coordinator check reports why
        shelf = set()
    if shelf & set(text_encoders.names(ref)):
        return "ok", f"text encoder {ref!r} not here yet: the coordinator holds it, the worker copies it when needed"
    return "fail", f"text encoder {ref!r} for pack {pack!r} is not on this Mac: fetch it with `{text_encoders.fetch_line(ref)}`"


def _pack_on_coordinator(pack: str, packs_dir: Path, farm_packs: Callable[[], list[dict]]) -> Check:
    where = f"{packs_dir} or the Hugging Face cache"
    try:
        held = {p["name"]: p for p in farm_packs()}
    except Exception as exc:  # noqa: BLE001 - the coordinator check reports why; here only the pack
        return "fail", f"pack {pack!r} not found in {where} (coordinator not asked: {str(exc).splitlines()[0]})"
    if pack not in held:
        return "fail", f"pack {pack!r} not found in {where} nor on the coordinator (farm pack pull REPO there)"
    need = int(held[pack]["bytes"])
    folder = next(p for p in (packs_dir, *packs_dir.parents) if p.exists())
    free = shutil.disk_usage(folder).free
    if free < need:
        return "fail", (f"pack {pack!r} ({need / 1e9:.1f} GB) is on the coordinator but {folder} has only "
                        f"{free / 1e9:.1f} GB free")
    return "ok", (f"pack {pack!r} not here yet: the coordinator holds it ({need / 1e9:.1f} GB), the worker "
                  f"copies it into {packs_dir} when a render needs it")


def farm_packs(address: str, token: str | None) -> Callable[[], list[dict]]:
    """The coordinator's packs, asked when called."""
    from farm_cli.client import FarmClient

    def ask() -> list[dict]:
        with FarmClient(address, token or "", timeout=5.0) as farm:
            return farm.packs()

    return ask


def check_coordinator(address: str, token: str | None) -> Check:
    if not token:
        return (
            "fail",
            NO_TOKEN,
        )
    from farm_cli.client import CoordinatorUnreachable, FarmClient, FarmError

    try:
        with FarmClient(address, token, timeout=5.0) as farm:
            workers = farm.workers()
    except FarmError as exc:
        from farm_cli.session import UNREACHABLE_NEXT

        return "fail", f"coordinator {address}: {exc}{UNREACHABLE_NEXT if isinstance(exc, CoordinatorUnreachable) else ''}"
    return "ok", f"coordinator {address} answers with this token ({len(workers)} workers registered){fleet_sets(workers)}"


def fleet_sets(workers: list[dict]) -> str:
    """The registered workers whose installed set or project version differ from this machine's."""
    from protos import installed

    mine, version = installed.installed_set()["installed"], installed.project_version()
    other_set = [str(w["id"]) for w in workers if (w.get("installed") or {}).get("installed") not in (None, mine)]
    other_version = [str(w["id"]) for w in workers if w.get("project_version") not in (None, "", version)]
    words = [f"{len(other_set)} with another installed set than this machine's {mine} ({', '.join(other_set)})"
             if other_set else "",
             f"{len(other_version)} on another ltx-farm version ({', '.join(other_version)})" if other_version else ""]
    return "".join(f"; {w}" for w in words if w)


def check_installed(lock: Path | None = None) -> Check:
    """This machine's project version and installed set, and whether it matches the checkout's lock."""
    from protos import installed

    lock = lock or installed.LOCK
    found = installed.installed_set(lock)
    head = f"ltx-farm {installed.project_version()}, installed set {found['installed']}"
    if found["lock"] == installed.NO_LOCK:
        return "warn", f"{head}; this checkout has no requirements.lock to compare it with"
    off = installed.off_lock(lock)
    if off:
        more = f" and {len(off) - 3} more" if len(off) > 3 else ""
        return "warn", (f"{head} does not match this checkout's lock {found['lock']}: {'; '.join(off[:3])}{more} "
                        f"(reinstall: {installed.UPGRADE_COMMAND})")
    return "ok", f"{head}: every pin of this checkout's lock {found['lock']} is installed"


def check_clock(dashboard_url: str | None) -> Check:
    """Skew against the coordinator's Redis clock, read from the dashboard's /api/time when reachable."""
    if not dashboard_url:
        return "skip", "clock skew: no dashboard URL"
    try:
        t0 = time.time()
        with urllib.request.urlopen(dashboard_url.rstrip("/") + "/api/time", timeout=3) as resp:
            server_ms = json.loads(resp.read())["ms"]
        t1 = time.time()
    except (OSError, ValueError, KeyError) as exc:
        return "skip", f"clock skew: dashboard {dashboard_url} not reachable ({type(exc).__name__})"
    skew = server_ms / 1000.0 - (t0 + t1) / 2
    status = "ok" if abs(skew) < SKEW_WARN_S else "warn"
    return status, f"clock skew vs coordinator {skew:+.3f} s (round trip {t1 - t0:.3f} s)"


def check_farm_clock(address: str, token: str | None) -> Check:
    """Skew against the clock of the coordinator named by --coordinator (its Redis TIME, over gRPC)."""
    from farm_cli.client import FarmClient, FarmError

    try:
        with FarmClient(address, token or "", timeout=5.0) as farm:
            t0 = time.time()
            server_ms = farm.clock_ms()
            t1 = time.time()
    except FarmError as exc:
        return "skip", f"clock skew: coordinator {address} did not tell its clock ({exc})"
    skew = server_ms / 1000.0 - (t0 + t1) / 2
    status = "ok" if abs(skew) < SKEW_WARN_S else "warn"
    return status, f"clock skew vs coordinator {skew:+.3f} s (round trip {t1 - t0:.3f} s)"


def check_logs(folder: Path) -> Check:
    """Where this machine's farm logs are: coordinator.log (farm coordinator / farm up), worker.log."""
    from protos.logsetup import log_path

    found = [p for p in (log_path(folder, "coordinator"), log_path(folder, "worker")) if p.is_file()]
    if not found:
        return "skip", f"logs: none yet in {folder / 'logs'} (farm coordinator, farm up and farm worker write there)"
    return "ok", "logs: " + ", ".join(f"{p} ({p.stat().st_size / 1024:.0f} KiB)" for p in found)


def check_redis(url: str | None) -> Check:
    """The coordinator's Redis, where this machine names it (--redis-url / FARM_REDIS_URL): a replicated
    set's primary, its replicas and their lag, the sentinels that see the primary."""
    if not url:
        return "skip", "Redis: no --redis-url / FARM_REDIS_URL here (checked on the coordinator's machine)"
    from coordinator.state.redis_server import connect
    from coordinator.state.sentinel import check_redis_url
    from coordinator.state.store import FarmStore

    try:
        check_redis_url(url)
    except ValueError as exc:
        return "fail", str(exc)
    client = connect(url)
    try:
        health = FarmStore(client).redis_health()
    finally:
        client.close()
    if health["mode"] == "down":
        return "fail", health["line"]
    if health["mode"] == "sentinel":
        whole = health["replicas_online"] >= 1 and health["sentinels_seeing"] * 2 > len(health["sentinels"])
        return ("ok" if whole else "warn"), health["line"]
    return "ok", health["line"]


def crash_line(check: Callable[[], Check], exc: Exception) -> str:
    """A check that raised, as one line a person reads: what was checked (not `<lambda>`) and why, a gRPC
    refusal by its details (not its class name), an unreachable coordinator with the next step."""
    import grpc

    name = getattr(check, "__name__", "")
    what = name.removeprefix("check_").replace("_", " ") if name and not name.startswith("<") else "a check"
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "details"):
        why = str(exc.details() or "").splitlines()[0] if exc.details() else "no answer"
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return f"{what}: the coordinator does not answer ({why}): start one with `farm up`"
        return f"{what}: the coordinator refused ({why})"
    return f"{what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def run_checks(checks: list[Callable[[], Check]], echo: Callable[[str], None] = typer.echo) -> int:
    """Run every check (a crash is a failed check), print one line each; 1 when any failed."""
    failed = False
    for check in checks:
        try:
            status, message = check()
        except Exception as exc:  # noqa: BLE001 - a doctor reports, it does not crash
            status, message = "fail", crash_line(check, exc)
        failed |= status == "fail"
        echo(f"{MARKS[status]} {status:<4} {message}")
    return 1 if failed else 0

DoctorPack = spec_option("pack", help="Pack name, folder or HF repo id.")  # the render flag's pack


def doctor(
    pack: DoctorPack = "tiny",
    *,
    coordinator: Coordinator,
    token: Token = None,
    dashboard: Annotated[
        str | None, typer.Option("--dashboard", help="Dashboard URL for clock skew.")
    ] = None,
    data: DataDir = None,
    redis_url: RedisUrl = None,
) -> None:
    """Check this machine for a worker: Python, MLX, installed set against the lock, pack and its text encoder,
    coordinator and token (and the fleet's installed sets), clock skew."""
    folder = common.data_dir(data)
    token = token or local_token(data) or None
    code = run_checks(
        [
            check_python,
            check_mlx,
            check_installed,
            lambda: check_pack(pack, folder / "packs", farm_packs(coordinator, token)),
            lambda: check_text_encoder(pack, folder / "packs", farm_packs(coordinator, token), data),
            lambda: check_coordinator(coordinator, token),
            (lambda: check_clock(dashboard)) if dashboard else (lambda: check_farm_clock(coordinator, token)),
            lambda: check_logs(folder),
            *([lambda: check_redis(redis_url)] if redis_url else []),  # on the coordinator's machine
        ]
    )
    raise typer.Exit(code)
