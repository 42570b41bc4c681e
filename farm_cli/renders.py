"""The client commands: submit, watch, status, cancel, fetch, workers, requeue, drain — each a function
over the coordinator's gRPC API, registered by farm_cli.main."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from farm_cli.options import Coordinator, Json, Output, SaveLatents, Token
from farm_cli.remote import client, desktop_notice, fetch_results, submit_render, wait_for, watch_live
from farm_cli.render_options import asked_render, render_options, spec_option
from farm_cli.session import fail, one_line

Partial = Annotated[bool, typer.Option(
    "--partial", help="A --chunked render still running: its finished windows so far, as a playable mp4 "
    "(video only; the clip's sound comes with the whole render).")]
ExrFolder = spec_option("exr")  # farm fetch --exr: the render flag's folder, here for a fetch


@render_options
def submit(output: Output = None, save_latents: SaveLatents = None,
           *, coordinator: Coordinator, token: Token = None,
           wait: bool = typer.Option(False, "--wait", help="Follow the render and fetch its output."),
           as_json: Json = False,
           seeds: Annotated[str | None, typer.Option(
               "--seeds", help="A batch: one render per seed (1-8, 1,3,5).")] = None,
           prompts_file: Annotated[Path | None, typer.Option(
               "--prompts-file", help="A batch: one render per line (times --seeds).")] = None,
           **asked) -> None:
    """Queue a render on the farm (or a batch: --seeds / --prompts-file make one group of renders)."""
    render_asked = asked_render(asked)  # --priority and --notify too (protos/spec.py)
    spec, pixels = render_asked.spec.to_dict(), render_asked.pixels
    render_asked.upload_to(coordinator, token)
    if seeds or prompts_file:
        from farm_cli.manage import batch_specs, submit_batch

        submit_batch(batch_specs(spec, seeds, prompts_file), pixels, coordinator, token, wait, output, as_json)
        return
    render_id = submit_render(spec, pixels, coordinator, token)
    typer.echo(json.dumps({"render_id": render_id}) if as_json else render_id)
    if wait or output or save_latents:
        _follow(render_id, coordinator, token, output, save_latents, as_json)


def _follow(render_id: str, coordinator: str, token: str | None, output: Path | None,
            save_latents: Path | None, as_json: bool) -> None:
    """`submit --wait/-o`: wait for the render, fetch what was asked, exit non-zero unless it is done."""
    render = wait_for(render_id, coordinator, token, quiet=as_json, output=output)
    desktop_notice(render)
    if render.get("state") != "done":
        fail(f"render {render_id} {render.get('state')}: {render.get('error') or ''}".strip(), code=1)
    fetch_results(render, output, save_latents, coordinator, token)


def watch(render_id: str, *, coordinator: Coordinator, token: Token = None) -> None:
    """Follow a render live (stages, tile grid, workers, ETA); exits non-zero unless it is done."""
    render = watch_live(render_id, coordinator, token) if sys.stdout.isatty() else wait_for(render_id, coordinator, token)
    typer.echo(f"{render_id} {render.get('state')} {render.get('error') or ''}".rstrip())
    if render.get("state") == "done" and render.get("output"):  # where it is, and how to get it here
        typer.echo(f"output {render['output']} on the coordinator; here: farm fetch {render_id} -o {render_id}.mp4")
    raise typer.Exit(0 if render.get("state") == "done" else 1)


def status(render_id: str = typer.Argument(None), *, coordinator: Coordinator,
           token: Token = None, as_json: Json = False) -> None:
    """One render's record; without an id, the renders as `farm ls` lists them (one list view, one header)."""
    from protos.states import TERMINAL

    if not render_id:
        from farm_cli.manage import ls

        return ls(coordinator=coordinator, token=token, as_json=as_json)
    with one_line(code=1), client(coordinator, token) as farm:
        data = farm.get(render_id)
        workers = farm.workers() if data.get("state") not in TERMINAL else []
        enhanced = enhanced_prompt(farm, data)
    if enhanced:
        data["enhanced_prompt"] = enhanced
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from farm_cli.views import pack_copies, render_details

    # a render waiting on its pack: the copies under way, with their progress
    for line in render_details(data, enhanced) + pack_copies(str((data.get("spec") or {}).get("pack") or ""), workers):
        typer.echo(line)


def enhanced_prompt(farm, render: dict) -> str | None:
    """The prompt `--enhance-prompt` had the encoder's Gemma write (what the text task encoded), once its
    task is done; None before, or without the flag."""
    from protos.kinds import TaskKind
    from protos.tensors import decode_tensor, prompt_text

    for task in render.get("tasks") or []:
        sha = (task.get("outputs") or {}).get("prompt")
        if task.get("kind") == TaskKind.ENHANCE_PROMPT and sha:
            return prompt_text(decode_tensor(farm.get_blob(sha)))
    return None


def cancel(render_id: str, *, coordinator: Coordinator, token: Token = None) -> None:
    """Cancel a render; running tasks stop at their next heartbeat."""
    with one_line(code=1), client(coordinator, token) as farm:
        state = "now" if farm.cancel(render_id) else farm.get(render_id).get("state")
    if state not in ("now", "cancelled"):
        fail(f"render {render_id} is {state}: nothing to cancel", code=1)
    typer.echo(f"{render_id} {'cancelled' if state == 'now' else 'already cancelled'}")


def fetch(render_id: str, output: Output = None, *, coordinator: Coordinator,
          token: Token = None, exr: ExrFolder = None, partial: Partial = False) -> None:
    """Download a finished render's mp4, or every finished render of a batch (GROUP id) into -o DIR."""
    from farm_cli.config import value

    folder = Path(value("output_dir") or ".").expanduser()
    if output is None:  # the configured folder (FARM_OUTPUT_DIR) is made, as a batch's folder is
        folder.mkdir(parents=True, exist_ok=True)
    if partial:
        from farm_cli.remote import fetch_partial

        fetch_partial(render_id, output or folder / f"{render_id}.partial.mp4", coordinator, token)
        return
    if render_id.startswith("g"):
        from farm_cli.manage import fetch_group

        fetch_group(render_id, output or folder / render_id, coordinator, token)
        return
    fetch_results({"id": render_id}, output or folder / f"{render_id}.mp4", None, coordinator, token, exr)


def workers(*, coordinator: Coordinator, token: Token = None,
            as_json: Json = False) -> None:
    """The registered workers."""
    with one_line(code=1), client(coordinator, token) as farm:
        rows = farm.workers()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from farm_cli.views import worker_rows

    if not rows:
        typer.echo("no workers registered: start one with `farm worker --coordinator HOST:8471` (or `farm up`)")
        return
    for line in worker_rows(rows):  # the dashboard's rows: same states (idle, busy, lost, draining, drained)
        typer.echo(line)


def requeue(render_id: str, task: str = typer.Option("", "--task", help="Also take this leased task back."),
            *, coordinator: Coordinator, token: Token = None) -> None:
    """Give the workers blocklisted for a render another chance (and requeue a leased task)."""
    with one_line(code=1), client(coordinator, token) as farm:
        cleared, requeued = farm.requeue(render_id, task)
    typer.echo(f"{render_id}: blocklist {'cleared' if cleared else 'was empty'}"
               + (f"; {task} {'requeued' if requeued else 'not leased'}" if task else ""))


def drain(worker_id: str, *, coordinator: Coordinator, token: Token = None) -> None:
    """Let a worker finish its current task, give it no more, and have it exit."""
    with one_line(code=1), client(coordinator, token) as farm:
        found = farm.drain(worker_id)
    if not found:
        fail(f"no worker {worker_id}", code=1)
    typer.echo(f"{worker_id} draining")
