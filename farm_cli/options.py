"""Every option type the `farm` commands share, written once (as arq's cli.py keeps its options together).

Why one module: a flag that means the same thing on several commands (--coordinator, --token-file,
--json, the render flags) must read the same everywhere, and its default is part of it: --coordinator
defaults to protos.defaults.COORDINATOR_ADDRESS here, so a command takes `coordinator: Coordinator`
without restating the address (it is keyword-only where earlier parameters have defaults).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from farm_cli.session import one_line
from protos.defaults import COORDINATOR_ADDRESS
from protos.spec import RenderSpec

SPEC = RenderSpec()  # the render flags' defaults are the spec record's one table (render, submit, plan)


class _Default(str):
    """A default a typer alias can carry: typer forbids a value inside Annotated but takes a factory;
    click calls this one for the value and, it being the string itself, prints it in --help as a
    plain value would be (`[default: HOST:PORT]`, not `(dynamic)`)."""

    def __call__(self) -> str:
        return str(self)


def _token_from_file(path: str | None) -> str | None:
    """--token-file PATH becomes the token it holds (FARM_TOKEN, the keychain, DATA/token are read later)."""
    if not path:
        return None
    from protos.auth import TokenError, resolve_token

    with one_line(TokenError):
        return resolve_token(Path(path))


Coordinator = Annotated[str, typer.Option(
    "--coordinator", envvar="FARM_COORDINATOR", default_factory=_Default(COORDINATOR_ADDRESS),
    help="HOST:PORT, or HOST:PORT,HOST:PORT (leader + standbys).")]
Token = Annotated[str | None, typer.Option(
    "--token-file", callback=_token_from_file, metavar="PATH",
    help="A copy of the coordinator's DATA/token (else FARM_TOKEN, FARM_TOKEN_FILE, the macOS keychain, DATA/token).")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DataDir = Annotated[Path | None, typer.Option("--data", help="Farm data folder (default ~/.ltx-farm).")]

# What to render (render, submit, plan).
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
FleetFile = Annotated[Path | None, typer.Option(
    "--fleet", help="A described fleet (JSON/TOML: workers with name, chip, memory_gb, count) instead of the live one.")]

# Services (coordinator, up).
Port = Annotated[int, typer.Option("--port")]
RedisUrl = Annotated[str | None, typer.Option(
    "--redis-url", envvar="FARM_REDIS_URL",
    help="An external Redis: redis://HOST:PORT, or a replicated set by its sentinels, "
         "redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER (valkey+sentinel:// too).")]
DashHost = Annotated[str, typer.Option("--dashboard-host", help="0.0.0.0 opens the dashboard to the LAN.")]
DashPort = Annotated[int, typer.Option("--dashboard-port")]

# Packs (pack pull).
Kinds = Annotated[str, typer.Option("--kinds", help="Render kinds to fetch for: t2v, i2v, dfr (comma-separated).")]
PacksDir = Annotated[Path | None, typer.Option("--packs-dir", help="Pull into DIR/NAME (default: the HF cache).")]
# issue #29: the EXR frames' colourspace, the duration head's length range
ExrColorspace = Annotated[str | None, typer.Option(
    "--exr-colorspace", help="srgb-linear (default) | acescg | acescct: the colourspace of --exr frames.")]
AutoDuration = Annotated[str | None, typer.Option(
    "--auto-duration", metavar="MIN:MAX", help="LTX-2.5 without -f: the seconds the duration head's pick is kept in.")]
Hdr = Annotated[bool, typer.Option("--hdr", help="Also write an HLG 10-bit HEVC master (OUTPUT.hlg.mp4).")]
