"""`farm pack pull` and `farm pack list`: weights onto the farm once, and who holds what.

A pull fetches only the files the chosen render kinds load (the one table in
`ltx_engine.rules.components`), from the Hugging Face hub (resumable, with its progress bar) or from a
local folder. Into `--packs-dir` it stages the pack in `.farm-staging/` and renames it into place
when every file is there, so a later load never sees a half-pulled pack; without `--packs-dir` it
fills the Hugging Face cache. The coordinator serves its packs folder to every worker that lacks a
pack (FarmPacks), so only one Mac downloads from the internet.
"""

import os
import shutil
from pathlib import Path
from typing import Annotated

import typer

from farm_cli.options import Coordinator, Json, Kinds, PacksDir, Token
from farm_cli.render_options import spec_option
from farm_cli.session import fail, one_line

COPY_CHUNK = 8 << 20


def components_for(kinds: str) -> list[str]:
    """The components the render kinds need, e.g. "t2v,i2v" (one line and exit 2 for an unknown kind)."""
    from ltx_engine.rules.components import RENDER_KINDS

    wanted: set[str] = set()
    for kind in (k.strip() for k in kinds.split(",") if k.strip()):
        if kind not in RENDER_KINDS:
            fail(f"unknown render kind {kind!r}: choose from {', '.join(RENDER_KINDS)}")
        wanted.update(RENDER_KINDS[kind])
    if not wanted:
        fail("--kinds is empty")
    return sorted(wanted)


def has_tower(names: list[str]) -> bool:
    """The pack carries its own text encoder: a `text_encoder/` folder (Gemma 3) or 2.5's Gemma 4 file."""
    from ltx_engine.rules.components import TEXT_ENCODER

    return any(n.startswith(f"{TEXT_ENCODER}/") or n == f"{TEXT_ENCODER}.safetensors" for n in names)


def _warn_missing(names: list[str], components: list[str], source: str) -> None:
    """One line per component a kind needs that the source does not have (the pull goes on)."""
    from ltx_engine.rules.components import TEXT_ENCODER, missing_line, resolve_files

    found = set(resolve_files(n for n in names if "/" not in n).found)
    if has_tower(names):
        found.add(TEXT_ENCODER)
    if "transformer" not in found and "transformer_dev" in found:
        found.add("transformer")  # a dev-only pack: dev + distilled LoRA stand in for it
    for component in sorted(set(components) - found):
        typer.echo(f"farm: note: {missing_line(component, source)}", err=True)


def _local_listing(folder: Path) -> list[str]:
    from coordinator.api.packs import pack_files

    return [rel for rel, _ in pack_files(folder)]


def _copy_file(src: Path, dest: Path, bar) -> None:
    """Copy through `<dest>.part`, renamed when whole; a failed copy leaves no `.part` behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        with open(src, "rb") as fin, open(part, "wb") as fout:
            while data := fin.read(COPY_CHUNK):
                fout.write(data)
                bar.update(len(data))
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def pull_local(source: Path, files: list[str], target: Path) -> None:
    """Copy the chosen files of a local pack folder (files already there with the same size are kept)."""
    from tqdm.auto import tqdm

    todo = [f for f in files if not ((target / f).is_file() and (target / f).stat().st_size == (source / f).stat().st_size)]
    total = sum((source / f).stat().st_size for f in todo)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"copying {len(todo)} files") as bar:
        for rel in todo:
            _copy_file(source / rel, target / rel, bar)


def hub_listing(repo: str, revision: str | None) -> list[str]:
    from huggingface_hub import HfApi

    return list(HfApi().list_repo_files(repo, revision=revision))


def pull_hub(repo: str, files: list[str], target: Path | None, revision: str | None) -> Path:
    """snapshot_download of exactly `files` (resumable; its own progress bar) into target or the HF cache."""
    from huggingface_hub import snapshot_download

    path = snapshot_download(repo, revision=revision, allow_patterns=files,
                             local_dir=str(target) if target is not None else None)
    return Path(path)


def pull(source: str, kinds: str, packs_dir: Path | None, name: str | None, revision: str | None,
         text_encoder: str | None = None) -> list[tuple[str, Path]]:
    """Fetch what `kinds` need from a hub repo or a local folder, and for a pack without its own text
    encoder the Gemma checkpoint its prompts need (`text_encoder`, else the MLX port's default); a
    source that is itself such a checkpoint is fetched alone. Returns (what, folder) pulled."""
    from ltx_engine.rules import text_encoders
    from ltx_engine.rules.components import TEXT_ENCODER, pull_files

    components = components_for(kinds)
    local = Path(source).expanduser()
    names = _local_listing(local) if local.is_dir() else hub_listing(source, revision)
    if text_encoders.is_encoder_listing(names):  # `farm pack pull mlx-community/gemma-3-12b-it-4bit`
        return [(f"text encoder {source}", _fetch(source, local, text_encoders.pull_files(names), packs_dir, name,
                                                  revision))]
    files = pull_files(names, components)
    encoder = None
    if TEXT_ENCODER in components and not has_tower(names):
        encoder = text_encoder or text_encoders.DEFAULT
        components = [c for c in components if c != TEXT_ENCODER]
    _warn_missing(names, components, source)
    if not files:
        fail(f"{source}: no pack files to pull for {kinds}")
    pulled = [(f"{source} ({kinds})", _fetch(source, local, files, packs_dir, name, revision))]
    return pulled + ([] if encoder is None else pull(encoder, "t2v", packs_dir, None, None))


def _fetch(source: str, local: Path, files: list[str], packs_dir: Path | None, name: str | None,
           revision: str | None) -> Path:
    """`files` of a hub repo or a local folder into packs_dir/NAME (staged), or into the HF cache."""
    if packs_dir is None and local.is_dir():
        fail("a local source needs --packs-dir (where the copy goes)")
    if packs_dir is None:
        return pull_hub(source, files, None, revision)
    if local.is_dir():
        return _pull_into(packs_dir, name or local.name, lambda target: pull_local(local, files, target))
    return _pull_into(packs_dir, name or source.rstrip("/").split("/")[-1],
                      lambda target: pull_hub(source, files, target, revision))


def _pull_into(packs_dir: Path, name: str, fetch) -> Path:
    """Into an existing pack folder directly (each file lands whole); a new pack is staged, then renamed."""
    from protos.packpaths import STAGING, check_pack_name

    final = packs_dir / check_pack_name(name)
    if final.is_dir():
        fetch(final)
        return final
    staging = packs_dir / STAGING / name
    staging.mkdir(parents=True, exist_ok=True)
    fetch(staging)
    hub_cache = staging / ".cache"  # huggingface_hub's resume metadata for a local_dir
    if hub_cache.is_dir():
        shutil.rmtree(hub_cache, ignore_errors=True)
    os.rename(staging, final)
    return final


PulledEncoder = spec_option("text_encoder", help="Gemma 3 repo or folder to fetch with a pack that has none "
                            "(default mlx-community/gemma-3-12b-it-4bit).")  # the render flag's encoder


def pack_pull(source: Annotated[str, typer.Argument(help="A Hugging Face repo id or a local pack folder.")],
              kinds: Kinds = "t2v", packs_dir: PacksDir = None,
              name: Annotated[str | None, typer.Option("--name", help="Pack name in --packs-dir.")] = None,
              revision: Annotated[str | None, typer.Option("--revision")] = None,
              text_encoder: PulledEncoder = None) -> None:
    """Fetch only the files the chosen render kinds need (and the text encoder a pack without its own
    needs); resumable; workers then copy them from the farm."""
    from worker.packsync import disk_full_message

    try:
        pulled = pull(source, kinds, packs_dir.expanduser() if packs_dir else None, name, revision, text_encoder)
    except typer.Exit:
        raise
    except OSError as exc:
        full = disk_full_message(exc, str(getattr(exc, "filename", None) or packs_dir or "the HF cache"))
        fail(full or f"pull of {source} failed: {exc}", code=1)
    except ValueError as exc:
        fail(str(exc).splitlines()[0])
    except Exception as exc:  # noqa: BLE001 - hub errors (not found, gated, offline) as one line
        fail(f"pull of {source} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", code=1)
    for what, path in pulled:
        typer.echo(f"pulled {what} into {path}")
    ref = Path(pulled[0][1]).name if packs_dir else source  # what --pack names it by
    typer.echo(f"render with it: --pack {ref}, or make it the default: pack = \"{ref}\" in "
               "DATA/config.toml (or FARM_PACK); the default never changes by itself")


def pack_list(*, coordinator: Coordinator, token: Token = None, as_json: Json = False) -> None:
    """Which packs the coordinator holds, and which worker holds which pack and components."""
    import json

    from farm_cli.remote import client

    with one_line(code=1), client(coordinator, token) as farm:
        shelf, workers = farm.packs(), farm.workers()
    rows, encoders = pack_rows(shelf, workers), encoder_rows(workers)
    if as_json:
        typer.echo(json.dumps({"coordinator": shelf, "workers": rows, "text_encoders": encoders}, indent=2))
        return
    for line in format_rows(shelf, rows):
        typer.echo(line)
    for row in encoders:
        typer.echo(f"{row['worker']}  text encoder {row['text_encoder']}  {row['bytes'] / 1e9:.2f} GB")


def pack_rows(shelf: list[dict], workers: list[dict]) -> list[dict]:
    """One row per (worker, pack): components held, or the copy in progress."""
    rows = []
    for w in workers:
        held = w.get("packs")  # the dashboard's row: {pack: components}; a raw record keeps them in "info"
        if not isinstance(held, dict):
            info = w.get("info") or {}
            held = {p: (info.get("pack_components") or {}).get(p) for p in info.get("packs") or []}
        sync = w.get("pack_sync") or {}
        for pack in sorted(set(held) | set(sync)):
            row = {"worker": w.get("id"), "pack": pack, "components": held.get(pack)}
            if pack in sync and (sync[pack].get("state") != "done" or pack not in held):
                row["copy"] = {k: sync[pack].get(k) for k in ("state", "bytes", "total", "error")}
            rows.append(row)
    return rows


def encoder_rows(workers: list[dict]) -> list[dict]:
    """One row per (worker, text encoder name) with its weight bytes; a folder's absolute path is left
    out where the worker also lists it by its name in the packs folder."""
    rows = []
    for w in workers:
        held = w.get("text_encoders")
        if not isinstance(held, dict):
            held = (w.get("info") or {}).get("text_encoders") or {}
        names = {n for n in held if not n.startswith("/")}
        for name in sorted(held):
            if not (name.startswith("/") and Path(name).name in names):
                rows.append({"worker": w.get("id"), "text_encoder": name, "bytes": int(held[name] or 0)})
    return rows


def format_rows(shelf: list[dict], rows: list[dict]) -> list[str]:
    lines = [f"coordinator  {p['name']}  {p['files']} files, {p['bytes'] / 1e9:.2f} GB" for p in shelf]
    for row in rows:
        what = ", ".join(row["components"]) if row["components"] else ""
        if row.get("copy"):
            c = row["copy"]
            done, total = int(c.get("bytes") or 0), int(c.get("total") or 0)
            what = f"{c['state']} {done / 1e9:.2f}/{total / 1e9:.2f} GB ({100 * done // max(1, total)}%)"
            what += f": {c['error']}" if c.get("error") else ""
        lines.append(f"{row['worker']}  {row['pack']}  {what}")
    return lines or ["no packs on the coordinator or any worker"]
