"""The `farm` command: a thin shell over the planner, the runner, the coordinator and the workers."""


import sys
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common
from farm_cli.common import fail

app = typer.Typer(add_completion=False, no_args_is_help=True, help="LTX-2 render farm for Apple Silicon.")
pack_app = typer.Typer(no_args_is_help=True, help="Weight packs.")
app.add_typer(pack_app, name="pack")

Prompt = Annotated[str, typer.Option("-p", "--prompt", help="What to render.")]
Height = Annotated[int, typer.Option("-H", "--height", help="Pixels, multiple of 64.")]
Width = Annotated[int, typer.Option("-W", "--width", help="Pixels, multiple of 64.")]
Frames = Annotated[int | None, typer.Option(
    "-f", "--frames", help="8k+1 frames (default: an LTX-2.5 pack's DurationHead picks it, else 25).")]
FrameRate = Annotated[float, typer.Option("--frame-rate")]
Seed = Annotated[int, typer.Option("--seed")]
PackRef = Annotated[str, typer.Option("--pack", help="Pack name in the packs folder, a path, or a HF repo id.")]
Image = Annotated[tuple[Path, int, float] | None, typer.Option("--image", help="PATH FRAME STRENGTH")]
Output = Annotated[Path | None, typer.Option("-o", "--output")]
SaveLatents = Annotated[Path | None, typer.Option("--save-latents", help="Write each stage's latent here.")]
NoAudio = Annotated[bool, typer.Option("--no-audio")]
DataDir = Annotated[Path | None, typer.Option("--data", help="Farm data folder (default ~/.ltx-farm).")]
Coordinator = Annotated[str, typer.Option("--coordinator", envvar="FARM_COORDINATOR",
                                          help="HOST:PORT, or HOST:PORT,HOST:PORT (leader + standbys).")]


def _token_from_file(path: str | None) -> str | None:
    """--token-file PATH becomes the token it holds (FARM_TOKEN, the keychain, DATA/token are read later)."""
    if not path:
        return None
    from protos.auth import TokenError, resolve_token

    try:
        return resolve_token(Path(path))
    except TokenError as exc:
        common.fail(str(exc))


Token = Annotated[str | None, typer.Option(
    "--token-file", callback=_token_from_file, metavar="PATH",
    help="A copy of the coordinator's DATA/token (else FARM_TOKEN, FARM_TOKEN_FILE, the macOS keychain, DATA/token).")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Stage2Tiles = Annotated[str | None, typer.Option("--stage2-tiles", help="auto | HxW | FxHxW: tiled stage 2.")]
TileOverlap = Annotated[int, typer.Option("--tile-overlap", help="Stage-2 tile overlap in latent cells.")]
Stage2Sigmas = Annotated[str | None, typer.Option("--stage2-sigmas", help="Comma-separated, ending in 0.")]
TemporalUpscalings = Annotated[int, typer.Option("--temporal-upscalings", help="DFR temporal rounds: 0, 1 or 2.")]
DecodeTiles = Annotated[str, typer.Option("--decode-tiles", help="auto | off | F,H,W (pixels).")]
Exr = Annotated[Path | None, typer.Option("--exr", help="Also write EXR frames into this folder.")]
DetailingLora = Annotated[str | None, typer.Option(
    "--detailing-lora", help="DFR: an IC-LoRA .safetensors in the pack folder, fused into stage 2.")]
DetailingStrength = Annotated[float, typer.Option("--detailing-strength", help="The detailing LoRA's strength.")]
TextEncoder = Annotated[str | None, typer.Option(
    "--text-encoder", help="Gemma 3 (mlx-lm) repo id or folder for packs without their own "
    "(default: the pack's entry in DATA/config.toml, else mlx-community/gemma-3-12b-it-4bit).")]


@pack_app.command("tiny")
def pack_tiny(folder: Path, seed: Annotated[int, typer.Option("--seed")] = 0,
              bits: Annotated[int | None, typer.Option("--bits", help="8 or 4: quantize the DiT blocks.")] = None,
              variant: Annotated[str, typer.Option("--variant", help="2.3, or 2.5 (DFR-capable DiT).")] = "2.3",
              layout: Annotated[str, typer.Option("--layout", help="standard, legacy, versioned, sharded, dev-only, "
                                                  "hf-cache, published-2.3, minimal or extras.")] = "standard",
              ) -> None:
    """Write the tiny pack: the real pack layout at tiny sizes with seeded weights."""
    from ltx_engine.tiny_layouts import LAYOUTS
    from ltx_engine.tiny_pack import VARIANTS, write_tiny_pack

    if bits not in (None, 4, 8):
        fail("--bits must be 8 or 4")
    if variant not in VARIANTS:
        fail(f"--variant must be one of {', '.join(VARIANTS)}")
    if layout not in LAYOUTS:
        fail(f"--layout must be one of {', '.join(LAYOUTS)}")
    path = write_tiny_pack(folder, seed=seed, bits=bits, variant=variant, layout=layout)
    typer.echo(f"wrote tiny pack {path}")


@app.command()
def render(
    prompt: Prompt = "", height: Height = 256, width: Width = 384, frames: Frames = None,
    frame_rate: FrameRate = 24.0, seed: Seed = 1, pack: PackRef = "tiny", image: Image = None,
    output: Output = None, save_latents: SaveLatents = None, no_audio: NoAudio = False,
    stage2_tiles: Stage2Tiles = None, tile_overlap: TileOverlap = 5, stage2_sigmas: Stage2Sigmas = None,
    temporal_upscalings: TemporalUpscalings = 0, decode_tiles: DecodeTiles = "auto", exr: Exr = None,
    local: Annotated[bool, typer.Option("--local", help="Run in this process (the reference).")] = False,
    data: DataDir = None, text_encoder: TextEncoder = None,
    coordinator: Coordinator = f"127.0.0.1:{common.DEFAULT_PORT}", token: Token = None,
    detailing_lora: DetailingLora = None, detailing_strength: DetailingStrength = 0.5,
) -> None:
    """Render a clip into -o (default render.mp4): on the farm, or with --local in this process with the
    farm's stage graph (the reference for every distributed run)."""
    from farm_cli.spec import cli_spec

    spec, pixels = cli_spec(prompt=prompt, height=height, width=width, frames=frames, frame_rate=frame_rate,
                            seed=seed, pack=pack, image=image, no_audio=no_audio, stage2_tiles=stage2_tiles,
                            tile_overlap=tile_overlap, stage2_sigmas=stage2_sigmas,
                            temporal_upscalings=temporal_upscalings, decode_tiles=decode_tiles, exr=exr,
                            text_encoder=text_encoder, data=data, detailing_lora=detailing_lora,
                            detailing_strength=detailing_strength)
    if not local:
        from farm_cli.remote import fetch_results, submit_render, wait_for

        render_id = submit_render(spec.to_dict(), pixels, coordinator, token)
        typer.echo(render_id)
        render = wait_for(render_id, coordinator, token)
        if render.get("state") != "done":
            fail(f"render {render_id} {render.get('state')}: {render.get('error') or ''}".strip(), code=1)
        fetch_results(render, output or Path("render.mp4"), save_latents, coordinator, token)
        return
    from coordinator.plan.render import SpecError
    from farm_cli.local import render_local
    from farm_cli.remote import latents_from_outputs, progress_printer
    from ltx_engine.loader import PackError
    from worker.runner import Runner

    out = output or Path("render.mp4")
    folder = common.data_dir(data) / "packs"
    try:
        path, outputs, blobs = render_local(spec, out, Runner(folder), pixels, progress_printer())
    except (SpecError, PackError) as exc:
        fail(str(exc))
    if save_latents:
        common.save_latents(save_latents, latents_from_outputs(outputs, "local", blobs.get))
    typer.echo(f"wrote {path}")


def refuse_token_argv(argv: list[str]) -> None:
    """`--token SECRET` would show the secret in `ps` to every user here: refused before anything runs."""
    from protos.auth import TOKEN_ON_ARGV

    if any(arg == "--token" or arg.startswith("--token=") for arg in argv):
        typer.echo(f"farm: {TOKEN_ON_ARGV}", err=True)
        raise SystemExit(2)


def main() -> None:
    from farm_cli import bench, config, doctor, manage, packs, plan, remote, services

    refuse_token_argv(sys.argv[1:])
    remote.register(app)
    services.register(app)
    doctor.register(app)
    bench.register(app)
    packs.register(pack_app)
    config.register(app)
    manage.register(app)
    plan.register(app)
    try:  # DATA/config.toml and FARM_* settings become the commands' defaults
        defaults = config.default_map(typer.main.get_command(app))
    except typer.Exit as exc:  # a broken config file: its one line is printed
        raise SystemExit(exc.exit_code) from None
    app(default_map=defaults)
