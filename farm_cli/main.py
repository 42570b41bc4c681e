"""The `farm` command: a thin shell over the planner, the runner, the coordinator and the workers."""


import sys
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common, config, dashboard, doctor, join, manage, packs, plan, recipes, renders, services
from farm_cli.benches import bench_app
from farm_cli.multi_option import MultiValueCommand
from farm_cli.options import Coordinator, DataDir, Output, SaveLatents, Token
from farm_cli.render_options import asked_render, render_options
from farm_cli.session import fail, one_line
from farm_cli.spec import AskedRender

app = typer.Typer(add_completion=False, no_args_is_help=True, help="LTX-2 render farm for Apple Silicon.")
pack_app = typer.Typer(no_args_is_help=True, help="Weight packs.")
token_app = typer.Typer(help="The farm's join token.", no_args_is_help=True)
app.add_typer(pack_app, name="pack")


def pack_tiny(folder: Path, seed: Annotated[int, typer.Option("--seed")] = 0,
              bits: Annotated[int | None, typer.Option("--bits", help="8 or 4: quantize the DiT blocks.")] = None,
              variant: Annotated[str, typer.Option("--variant", help="2.3, or 2.5 (DFR-capable DiT).")] = "2.3",
              layout: Annotated[str, typer.Option("--layout", help="standard, legacy, versioned, sharded, dev-only, "
                                                  "hf-cache, published-2.3, minimal or extras.")] = "standard",
              dit: Annotated[str, typer.Option("--dit", help="The video DiT's size: tiny, or bench (wide and deep "
                                               "enough to be the bulk of a render, as on a real pack).")] = "tiny",
              ) -> None:
    """Write the tiny pack: the real pack layout at tiny sizes with seeded weights."""
    from ltx_engine.tiny.tiny_layouts import LAYOUTS
    from ltx_engine.tiny.tiny_pack import DIT_SIZES, VARIANTS, write_tiny_pack

    if bits not in (None, 4, 8):
        fail("--bits must be 8 or 4")
    if variant not in VARIANTS:
        fail(f"--variant must be one of {', '.join(VARIANTS)}")
    if layout not in LAYOUTS:
        fail(f"--layout must be one of {', '.join(LAYOUTS)}")
    if dit not in DIT_SIZES:
        fail(f"--dit must be one of {', '.join(DIT_SIZES)}")
    path = write_tiny_pack(folder, seed=seed, bits=bits, variant=variant, layout=layout, dit=dit)
    typer.echo(f"wrote tiny pack {path}")


@render_options
def render(
    output: Output = None, save_latents: SaveLatents = None,
    local: Annotated[bool, typer.Option("--local", help="Run in this process (the reference).")] = False,
    data: DataDir = None, *, coordinator: Coordinator, token: Token = None, **asked,
) -> None:
    """Render a clip into -o (default render.mp4): on the farm, or with --local in this process with the
    farm's stage graph (the reference for every distributed run)."""
    render_asked = asked_render(asked, data=data)
    out = _render_output(render_asked, output)
    if not local:
        render_asked.upload_to(coordinator, token)
        from farm_cli.remote import fetch_results, submit_render, wait_for

        render_id = submit_render(render_asked.spec.to_dict(), render_asked.pixels, coordinator, token,
                                  unreachable=", or render here with --local")
        typer.echo(render_id)
        render = wait_for(render_id, coordinator, token, output=out)
        if render.get("state") != "done":
            fail(f"render {render_id} {render.get('state')}: {render.get('error') or ''}".strip(), code=1)
        return fetch_results(render, out, save_latents, coordinator, token)
    _render_here(render_asked, out, data, save_latents)


def _render_output(asked: AskedRender, output: Path | None) -> Path:
    """-o, else render.mp4 (render.wav for an audio-only recipe, T2A, whose file is a WAV or an M4A by
    -o's suffix: another suffix is refused before anything runs or is queued)."""
    from coordinator.assemble.audio_file import AUDIO_FILES
    from coordinator.plan.recipes import recipe_for
    from coordinator.plan.resolved import RenderPlan

    if recipe_for(RenderPlan(asked.spec)).video:
        return output or Path("render.mp4")
    out = output or Path("render.wav")
    if out.suffix.lower() not in AUDIO_FILES:
        fail(f"-o {out}: --pipeline t2a writes the audio track as a WAV (16-bit PCM) or an M4A (AAC): "
             "give -o NAME.wav or NAME.m4a")
    return out


def _render_here(asked: AskedRender, out: Path, data: Path | None, save_latents: Path | None) -> None:
    """`farm render --local`: the farm's stage graph in this process (the reference for every farm run)."""
    from coordinator.plan.render import SpecError
    from farm_cli.local import render_local
    from farm_cli.remote import latents_from_outputs, progress_printer
    from ltx_engine.loading.loader import PackError
    from ltx_engine.rules.hdr_lora import HdrRefusal
    from worker.runner import Runner

    folder = common.data_dir(data)
    runner = Runner(folder / "packs")
    runner.loras.known.update(asked.lora_files | asked.media_files)  # the client's LoRA (and --ic-lora) files, where they are

    def run() -> tuple:
        return render_local(asked.spec, out, runner, asked.pixels, progress_printer(), media=asked.media_files)

    with one_line(SpecError, PackError, HdrRefusal):  # an HDR LoRA file with the wrong metadata too
        try:
            path, outputs, blobs = run()
        except PackError:  # the spec is checked before its pack is opened: bad input is refused first
            if asked.spec.pack != "tiny" or (folder / "packs" / "tiny").exists():
                raise
            from farm_cli.services import ensure_tiny_pack

            ensure_tiny_pack(folder)  # a fresh machine: the tiny pack, as `farm up` writes it
            path, outputs, blobs = run()
    if save_latents:
        common.save_latents(save_latents, latents_from_outputs(outputs, "local", blobs.get))
    typer.echo(f"wrote {path}")


def refuse_token_argv(argv: list[str]) -> None:
    """`--token SECRET` would show the secret in `ps` to every user here: refused before anything runs."""
    from protos.auth import TOKEN_ON_ARGV

    if any(arg == "--token" or arg.startswith("--token=") for arg in argv):
        typer.echo(f"farm: {TOKEN_ON_ARGV}", err=True)
        raise SystemExit(2)


# The commands, in the order `farm --help` lists them (sub-apps after the commands, as typer does).
app.command(cls=MultiValueCommand)(render)  # --image, --segment: several values per use (farm_cli/multi_option.py)
app.command(cls=MultiValueCommand)(renders.submit)
for command in (renders.watch, renders.status, renders.cancel, renders.fetch, renders.workers,
                renders.requeue, renders.drain, services.coordinator, services.worker, services.up, services.demo,
                doctor.doctor, join.join):
    app.command()(command)
app.command("config")(config.show)
app.command("dashboard")(dashboard.dashboard)
for command in (manage.ls, manage.retry, manage.rerun, manage.delete, manage.prune, manage.logs):
    app.command()(command)
app.command(cls=MultiValueCommand)(plan.plan)
app.command("recipes")(recipes.recipes)
pack_app.command("tiny")(pack_tiny)
pack_app.command("pull")(packs.pack_pull)
pack_app.command("list")(packs.pack_list)
app.add_typer(bench_app, name="bench")
app.add_typer(token_app, name="token")
token_app.command("rotate")(manage.token_rotate)


def main() -> None:
    """The `farm` entry point: refuse a token on argv, read the settings file's defaults, run the app."""
    refuse_token_argv(sys.argv[1:])
    from farm_cli.loras import pair_argv

    sys.argv[1:] = pair_argv(sys.argv[1:])  # `--lora SOURCE STRENGTH`: two values, which typer options cannot take
    try:  # DATA/config.toml and FARM_* settings become the commands' defaults
        defaults = config.default_map(typer.main.get_command(app))
    except typer.Exit as exc:  # a broken config file: its one line is printed
        raise SystemExit(exc.exit_code) from None
    app(default_map=defaults)
