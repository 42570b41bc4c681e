"""Client commands: submit, watch, status, cancel, fetch, workers — all over the coordinator's gRPC API."""


import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from farm_cli import common
from farm_cli.common import fail

TERMINAL = {"done", "failed", "cancelled"}


def progress_printer() -> Callable[[dict], None]:
    """A compact one-line-per-event printer for long waits (stderr, so --json stdout stays clean)."""
    from coordinator.plan.length import length_line

    def show(event: dict) -> None:
        kind = event.get("type", "")
        task = str(event.get("task", "")).split(".")[-1]
        progress = event.get("progress") if isinstance(event.get("progress"), dict) else {}
        if kind == "task_progress" and progress.get("step") is not None:
            typer.echo(f"  {task}: step {progress['step']}/{progress.get('total', '?')}", err=True)
        elif kind == "length_chosen":  # an LTX-2.5 render's DurationHead picked its length
            line = length_line(int(event["frames"]), float(event["seconds"]), float(event["frame_rate"]))
            typer.echo(f"  {line}", err=True)
        elif kind in ("task_done", "task_leased", "task_retry", "task_expired", "render_state", "render_failed"):
            extra = event.get("worker") or event.get("state") or event.get("error") or ""
            secs = f" {event['seconds']:.2f}s" if isinstance(event.get("seconds"), float) else ""
            typer.echo(f"  {kind} {task} {extra}{secs}".rstrip(), err=True)

    return show


def latents_from_outputs(outputs: dict[str, dict[str, str]], render_id: str,
                         fetch: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """The stage latents `--save-latents` writes, looked up in a render's task outputs."""
    from coordinator.plan.render import stage_latent_outputs

    found = {}
    for stem, (suffix, output) in stage_latent_outputs().items():
        sha = outputs.get(f"{render_id}.{suffix}", {}).get(output)
        if sha:
            found[stem] = fetch(sha)
    return found


def client(coordinator: str, token: str | None):
    from farm_cli.client import FarmClient

    return FarmClient(coordinator, token or local_token())


def local_token(data: Path | None = None) -> str:
    """This machine's farm token when no --token-file was given: FARM_TOKEN, FARM_TOKEN_FILE, the macOS
    keychain, the config's token_file, DATA/token (protos.auth.resolve_token); '' when none has one."""
    from farm_cli.config import value
    from protos.auth import TokenError, resolve_token

    configured = value("token_file")
    fallback = (Path(configured),) if configured else ()
    try:
        return resolve_token(None, fallback_files=(*fallback, common.data_dir(data) / "token"))
    except TokenError as exc:
        fail(str(exc))


def submit_render(spec: dict, pixels: np.ndarray | None, coordinator: str, token: str | None) -> str:
    """Upload the image (if any) and queue the render; one line and exit 2 on refusal."""
    from farm_cli.client import FarmError
    from protos.tensors import encode_tensor

    try:
        with client(coordinator, token) as farm:
            if pixels is not None:
                spec["image"]["blob"] = farm.put_blob(encode_tensor(pixels))
            return farm.submit(spec)
    except FarmError as exc:
        fail(str(exc))


def wait_for(render_id: str, coordinator: str, token: str | None, quiet: bool = False) -> dict:
    """Follow the render's events until it ends, through coordinator outages; returns its final record."""
    from farm_cli.client import FarmError
    from farm_cli.follow import Outage, follow_events, ride

    show = progress_printer()
    outage = Outage()
    try:
        with client(coordinator, token) as farm:
            get = lambda: ride(lambda: farm.get(render_id), outage)  # noqa: E731
            if not quiet and sys.stderr.isatty():  # a person is watching: the live view with bars
                from rich.console import Console

                from farm_cli.watch_view import watch_render

                return watch_render(follow_events(farm, render_id, outage), get, Console(stderr=True))
            for event in follow_events(farm, render_id, outage):
                if not quiet:
                    show(event)
            return get()
    except FarmError as exc:
        fail(str(exc), code=1)


def watch_live(render_id: str, coordinator: str, token: str | None) -> dict:
    """The rich live view of a render until it ends, through coordinator outages."""
    from farm_cli.client import FarmError
    from farm_cli.follow import Outage, follow_events, ride
    from farm_cli.watch_view import watch_render

    outage = Outage()
    try:
        with client(coordinator, token) as farm:
            return watch_render(follow_events(farm, render_id, outage),
                                lambda: ride(lambda: farm.get(render_id), outage))
    except FarmError as exc:
        fail(str(exc), code=1)


def desktop_notice(render: dict) -> None:
    """On a Mac, a Notification Center banner when `submit --wait` ends (people switch windows)."""
    import shutil
    import subprocess

    if sys.platform != "darwin" or not shutil.which("osascript"):
        return
    text = json.dumps(f"{render.get('id')} {render.get('state')}")  # a quoted AppleScript string
    subprocess.run(["osascript", "-e", f'display notification {text} with title "LTX farm"'],
                   capture_output=True, timeout=10, check=False)


def fetch_results(render: dict, output: Path | None, save_latents: Path | None, coordinator: str,
                  token: str | None, exr: Path | None = None) -> None:
    """The render's files onto this machine: the mp4 to output, its EXR frames to exr (default: the
    folder its spec asked for, which this CLI resolved here at submit), latents to save_latents."""
    from farm_cli.client import FarmError
    from farm_cli.follow import Outage, ride
    from protos.tensors import decode_tensor

    try:
        with client(coordinator, token) as farm:
            if output:
                ride(lambda: farm.fetch_output(render["id"], output), Outage())
                typer.echo(f"wrote {output}")
            exr = exr or ((render.get("spec") or {}).get("exr") if isinstance(render.get("spec"), dict) else None)
            if exr:
                count = ride(lambda: farm.fetch_exr(render["id"], Path(exr)), Outage())
                typer.echo(f"wrote {count} EXR frames to {exr}")
            if save_latents:
                outputs = {t["id"]: t.get("outputs") or {} for t in render.get("tasks", [])}
                arrays = latents_from_outputs(outputs, render["id"], lambda sha: decode_tensor(farm.get_blob(sha)))
                common.save_latents(save_latents, arrays)
    except FarmError as exc:
        fail(str(exc), code=1)


def register(app: typer.Typer) -> None:
    """Add the client commands to the `farm` app."""
    from farm_cli.main import (
        Coordinator,
        DecodeTiles,
        DetailingLora,
        DetailingStrength,
        Exr,
        FrameRate,
        Frames,
        Height,
        Image,
        Json,
        NoAudio,
        Output,
        PackRef,
        Prompt,
        SaveLatents,
        Seed,
        Stage2Sigmas,
        Stage2Tiles,
        TemporalUpscalings,
        TextEncoder,
        TileOverlap,
        Token,
        Width,
    )

    @app.command()
    def submit(prompt: Prompt = "", height: Height = 256, width: Width = 384, frames: Frames = None,
               frame_rate: FrameRate = 24.0, seed: Seed = 1, pack: PackRef = "tiny", image: Image = None,
               output: Output = None, save_latents: SaveLatents = None, no_audio: NoAudio = False,
               stage2_tiles: Stage2Tiles = None, tile_overlap: TileOverlap = 5, stage2_sigmas: Stage2Sigmas = None,
               temporal_upscalings: TemporalUpscalings = 0, decode_tiles: DecodeTiles = "auto", exr: Exr = None,
               coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}", token: Token = None,
               wait: bool = typer.Option(False, "--wait", help="Follow the render and fetch its output."),
               priority: int = typer.Option(0, "--priority", help="Higher renders lease first."),
               text_encoder: TextEncoder = None, as_json: Json = False,
               seeds: Annotated[str | None, typer.Option(
                   "--seeds", help="A batch: one render per seed (1-8, 1,3,5).")] = None,
               prompts_file: Annotated[Path | None, typer.Option(
                   "--prompts-file", help="A batch: one render per line (times --seeds).")] = None,
               notify: Annotated[str | None, typer.Option(
                   "--notify", help="POST JSON to this http(s) URL when the render ends.")] = None,
               detailing_lora: DetailingLora = None, detailing_strength: DetailingStrength = 0.5,
               ) -> None:
        """Queue a render on the farm (or a batch: --seeds / --prompts-file make one group of renders)."""
        from farm_cli.spec import cli_spec

        typed, pixels = cli_spec(prompt=prompt, height=height, width=width, frames=frames, frame_rate=frame_rate,
                                 seed=seed, pack=pack, image=image, no_audio=no_audio, stage2_tiles=stage2_tiles,
                                 tile_overlap=tile_overlap, stage2_sigmas=stage2_sigmas,
                                 temporal_upscalings=temporal_upscalings, decode_tiles=decode_tiles, exr=exr,
                                 text_encoder=text_encoder, detailing_lora=detailing_lora,
                                 detailing_strength=detailing_strength, priority=priority, notify=notify)
        spec = typed.to_dict()
        if seeds or prompts_file:
            from farm_cli.manage import batch_specs, submit_batch

            submit_batch(batch_specs(spec, seeds, prompts_file), pixels, coordinator, token, wait, output, as_json)
            return
        render_id = submit_render(spec, pixels, coordinator, token)
        typer.echo(json.dumps({"render_id": render_id}) if as_json else render_id)
        if not (wait or output or save_latents):
            return
        render = wait_for(render_id, coordinator, token, quiet=as_json)
        desktop_notice(render)
        if render.get("state") != "done":
            fail(f"render {render_id} {render.get('state')}: {render.get('error') or ''}".strip(), code=1)
        fetch_results(render, output, save_latents, coordinator, token)

    @app.command()
    def watch(render_id: str, coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}", token: Token = None) -> None:
        """Follow a render live (stages, tile grid, workers, ETA); exits non-zero unless it is done."""
        render = watch_live(render_id, coordinator, token) if sys.stdout.isatty() else wait_for(render_id, coordinator, token)
        typer.echo(f"{render_id} {render.get('state')} {render.get('error') or ''}".rstrip())
        raise typer.Exit(0 if render.get("state") == "done" else 1)

    @app.command()
    def status(render_id: str = typer.Argument(None), coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}",
               token: Token = None, as_json: Json = False) -> None:
        """One render's record, or the list of renders."""
        from farm_cli.client import FarmError

        try:
            with client(coordinator, token) as farm:
                data = farm.get(render_id) if render_id else farm.list()
        except FarmError as exc:
            fail(str(exc), code=1)
        if as_json:
            typer.echo(json.dumps(data, indent=2))
            return
        from farm_cli.views import render_details, render_row

        for line in render_details(data) if render_id else [render_row(r) for r in data]:
            typer.echo(line)

    @app.command()
    def cancel(render_id: str, coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}", token: Token = None) -> None:
        """Cancel a render; running tasks stop at their next heartbeat."""
        from farm_cli.client import FarmError

        try:
            with client(coordinator, token) as farm:
                state = "now" if farm.cancel(render_id) else farm.get(render_id).get("state")
        except FarmError as exc:
            fail(str(exc), code=1)
        if state not in ("now", "cancelled"):
            fail(f"render {render_id} is {state}: nothing to cancel", code=1)
        typer.echo(f"{render_id} {'cancelled' if state == 'now' else 'already cancelled'}")

    @app.command()
    def fetch(render_id: str, output: Output = None, coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}",
              token: Token = None, exr: Exr = None) -> None:
        """Download a finished render's mp4, or every finished render of a batch (GROUP id) into -o DIR."""
        from farm_cli.config import value

        folder = Path(value("output_dir") or ".").expanduser()
        if render_id.startswith("g"):
            from farm_cli.manage import fetch_group

            fetch_group(render_id, output or folder / render_id, coordinator, token)
            return
        fetch_results({"id": render_id}, output or folder / f"{render_id}.mp4", None, coordinator, token, exr)

    @app.command()
    def workers(coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}", token: Token = None,
                as_json: Json = False) -> None:
        """The registered workers."""
        from farm_cli.client import FarmError

        try:
            with client(coordinator, token) as farm:
                rows = farm.workers()
        except FarmError as exc:
            fail(str(exc), code=1)
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        for w in rows:  # the dashboard's rows: same states (idle, busy, lost, draining, drained), same blocklists
            blocked = f"  blocklisted for {', '.join(w['blocklisted_for'])}" if w.get("blocklisted_for") else ""
            typer.echo(f"{w.get('id')}  {w.get('state', '?'):<8} {w.get('chip', '')}{blocked}")

    @app.command()
    def requeue(render_id: str, task: str = typer.Option("", "--task", help="Also take this leased task back."),
                coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}", token: Token = None) -> None:
        """Give the workers blocklisted for a render another chance (and requeue a leased task)."""
        from farm_cli.client import FarmError

        try:
            with client(coordinator, token) as farm:
                cleared, requeued = farm.requeue(render_id, task)
        except FarmError as exc:
            fail(str(exc), code=1)
        typer.echo(f"{render_id}: blocklist {'cleared' if cleared else 'was empty'}"
                   + (f"; {task} {'requeued' if requeued else 'not leased'}" if task else ""))

    @app.command()
    def drain(worker_id: str, coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}", token: Token = None) -> None:
        """Let a worker finish its current task, give it no more, and have it exit."""
        from farm_cli.client import FarmError

        try:
            with client(coordinator, token) as farm:
                found = farm.drain(worker_id)
        except FarmError as exc:
            fail(str(exc), code=1)
        if not found:
            fail(f"no worker {worker_id}", code=1)
        typer.echo(f"{worker_id} draining")
