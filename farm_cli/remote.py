"""What the client commands share: a FarmClient, queuing a render, following it, fetching its files."""


from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import typer

from farm_cli import common
from farm_cli.config import local_token
from farm_cli.session import fail, one_line

if TYPE_CHECKING:
    from farm_cli.client import FarmClient


def progress_printer() -> Callable[[dict], None]:
    """A compact one-line-per-event printer for long waits (stderr, so --json stdout stays clean)."""
    from coordinator.plan.length import length_line

    def show(event: dict) -> None:
        etype = event.get("type", "")
        task = str(event.get("task", "")).split(".")[-1]
        progress = event.get("progress") if isinstance(event.get("progress"), dict) else {}
        if etype == "task_progress" and progress.get("step") is not None:
            typer.echo(f"  {task}: step {progress['step']}/{progress.get('total', '?')}", err=True)
        elif etype == "length_chosen":  # an LTX-2.5 render's DurationHead picked its length
            line = length_line(int(event["frames"]), float(event["seconds"]), float(event["frame_rate"]))
            typer.echo(f"  {line}", err=True)
        elif etype in ("task_done", "task_leased", "task_retry", "task_expired", "render_state", "render_failed"):
            extra = event.get("worker") or event.get("state") or event.get("error") or ""
            secs = f" {event['seconds']:.2f}s" if isinstance(event.get("seconds"), float) else ""
            typer.echo(f"  {etype} {task} {extra}{secs}".rstrip(), err=True)

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


def client(coordinator: str, token: str | None) -> FarmClient:
    """A client of the coordinator, with --token-file's token or else this machine's (config.local_token).
    Open it inside session.one_line, which turns its errors into the command's one line."""
    from farm_cli.client import FarmClient

    return FarmClient(coordinator, token or local_token())


def submit_render(spec: dict, pixels: list[np.ndarray], coordinator: str, token: str | None,
                  unreachable: str = "") -> str:
    """Upload the images (one blob each, in order) and queue the render; one line and exit 2 on refusal."""
    from farm_cli.images import with_blobs
    from protos.tensors import encode_tensor

    refuse_local_folder(str(spec.get("pack") or ""))
    with one_line(unreachable=unreachable), client(coordinator, token) as farm:
        if pixels:
            spec = with_blobs(spec, [farm.put_blob(encode_tensor(p)) for p in pixels])
        return farm.submit(spec)


@contextlib.contextmanager
def goes_on(render_id: str, output: Path | None = None, group: str | None = None) -> Iterator[None]:
    """Ctrl-C while following a render (or a batch) stops the following, not the render: one line says
    so and how to get its output later; exit 130 (the shell's code for an interrupt)."""
    try:
        yield
    except KeyboardInterrupt:
        if group:
            typer.echo(f"farm: stopped following group {group}; its renders go on on the farm: `farm ls --group "
                       f"{group}` to see them, `farm fetch {group} -o {output or 'DIR'}` once they are done",
                       err=True)
        else:
            typer.echo(f"farm: stopped following {render_id}; the render goes on on the farm: `farm watch "
                       f"{render_id}` to follow it again, `farm fetch {render_id} -o {output or 'FILE.mp4'}` "
                       f"once it is done, `farm cancel {render_id}` to stop it", err=True)
        raise SystemExit(130) from None


def refuse_local_folder(pack: str) -> None:
    """`--pack /path/to/pack` names a folder on this machine, which the farm's workers cannot read: one
    line with the way to give it to the farm (workers copy what the coordinator's packs folder holds)."""
    if not pack or not Path(pack).expanduser().is_dir() or not any(c in pack for c in ("/", "~", "\\")):
        return
    name = Path(pack).expanduser().resolve().name
    fail(f"--pack {pack} is a folder on this machine, which the farm's workers cannot see: put it in the "
         f"coordinator's packs folder (on that machine: `farm pack pull {pack} --packs-dir ~/.ltx-farm/packs`, "
         f"or copy it to DATA/packs/{name}), then submit with --pack {name}; or render it here with "
         f"`farm render --local --pack {pack}`")


def wait_for(render_id: str, coordinator: str, token: str | None, quiet: bool = False,
             output: Path | None = None, group: str | None = None) -> dict:
    """Follow the render's events until it ends, through coordinator outages; returns its final record."""
    from farm_cli.follow import Outage, follow_events, ride

    show = progress_printer()
    outage = Outage()
    with goes_on(render_id, output, group), one_line(code=1), client(coordinator, token) as farm:
        get = lambda: ride(lambda: farm.get(render_id), outage)  # noqa: E731
        if not quiet and sys.stderr.isatty():  # a person is watching: the live view with bars
            from rich.console import Console

            from farm_cli.watch_view import watch_render

            return watch_render(follow_events(farm, render_id, outage), get, Console(stderr=True))
        for event in follow_events(farm, render_id, outage):
            if not quiet:
                show(event)
        return get()


def watch_live(render_id: str, coordinator: str, token: str | None) -> dict:
    """The rich live view of a render until it ends, through coordinator outages."""
    from farm_cli.follow import Outage, follow_events, ride
    from farm_cli.watch_view import watch_render

    outage = Outage()
    with goes_on(render_id), one_line(code=1), client(coordinator, token) as farm:
        return watch_render(follow_events(farm, render_id, outage), lambda: ride(lambda: farm.get(render_id), outage))


def desktop_notice(render: dict) -> None:
    """On a Mac, a Notification Center banner when `submit --wait` ends (people switch windows)."""
    import shutil
    import subprocess

    if sys.platform != "darwin" or not shutil.which("osascript"):
        return
    text = json.dumps(f"{render.get('id')} {render.get('state')}")  # a quoted AppleScript string
    subprocess.run(["osascript", "-e", f'display notification {text} with title "LTX farm"'],
                   capture_output=True, timeout=10, check=False)


def fetch_partial(render_id: str, output: Path, coordinator: str, token: str | None) -> None:
    """`farm fetch --partial`: a chunked render's growing film (its finished windows) before it ends, the
    render's mp4 once it is done."""
    from farm_cli.follow import Outage, ride

    with one_line(code=1), client(coordinator, token) as farm:
        ride(lambda: farm.fetch_output(render_id, output, file="partial.mp4"), Outage())
    typer.echo(f"wrote {output}")


def fetch_results(render: dict, output: Path | None, save_latents: Path | None, coordinator: str,
                  token: str | None, exr: Path | None = None) -> None:
    """The render's files onto this machine: the mp4 to output, its EXR frames to exr (default: the
    folder its spec asked for, which this CLI resolved here at submit), latents to save_latents."""
    from coordinator.assemble.audio_file import M4A_FILE
    from farm_cli.follow import Outage, ride
    from protos.tensors import decode_tensor

    with one_line(code=1), client(coordinator, token) as farm:
        if output:
            file = M4A_FILE if Path(output).suffix.lower() == ".m4a" else ""  # a T2A render's AAC file
            ride(lambda: farm.fetch_output(render["id"], output, file=file), Outage())
            typer.echo(f"wrote {output}")
            if (render.get("spec") or {}).get("hdr"):  # the HLG master beside it
                from coordinator.assemble.hdr_master import HLG_FILE, hlg_path

                master = ride(lambda: farm.fetch_output(render["id"], hlg_path(output), file=HLG_FILE), Outage())
                typer.echo(f"wrote {master}")
        exr = exr or ((render.get("spec") or {}).get("exr") if isinstance(render.get("spec"), dict) else None)
        if exr:
            count = ride(lambda: farm.fetch_exr(render["id"], Path(exr)), Outage())
            typer.echo(f"wrote {count} EXR frames to {exr}")
        if save_latents:
            outputs = {t["id"]: t.get("outputs") or {} for t in render.get("tasks", [])}
            arrays = latents_from_outputs(outputs, render["id"], lambda sha: decode_tensor(farm.get_blob(sha)))
            common.save_latents(save_latents, arrays)
