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
Image = Annotated[list[str] | None, typer.Option(  # three values per use: farm_cli/image_option.py
    "--image", help="PATH FRAME STRENGTH, repeatable (keyframes). FRAME: an index, negative from the end, or last.")]
ImageBinding = Annotated[list[str] | None, typer.Option(
    "--image-binding", help="replace | guide | auto, per --image in order (auto: frame 0 replaces, else guide).")]
GeneratedKeyframes = Annotated[int, typer.Option(
    "--num-generated-keyframes", help="LTX-2.5, without DFR: N generated keyframe slots in stage 1.")]
ImageCrf = Annotated[list[int] | None, typer.Option(
    "--image-crf", help="H.264 CRF per --image in order (default 33 on LTX-2.3, 18 on 2.5; 0: none).")]
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
Lora = Annotated[list[str] | None, typer.Option(  # two values each: farm_cli.loras.pair_argv
    "--lora", metavar="SOURCE STRENGTH", help="A LoRA on every DiT stage (repeatable, at most 8): a .safetensors "
    "here, a file name in the pack folder, or a Hugging Face REPO or REPO/FILE; with its strength.")]
LoraMode = Annotated[str, typer.Option(
    "--lora-mode", help="fused: summed into the weights once per worker (fastest); unfused: run-time adapters "
    "(no requantization loss on q8/q4 packs).")]
TextEncoder = Annotated[str | None, typer.Option(
    "--text-encoder", help="Gemma 3 (mlx-lm) repo id or folder for packs without their own "
    "(default: the pack's entry in DATA/config.toml, else mlx-community/gemma-3-12b-it-4bit).")]
# The guided recipes (protos/guidance_spec.py; a knob left out takes the recipe's upstream default).
Pipeline = Annotated[str, typer.Option(
    "--pipeline", help="distilled (8+3 steps, no guidance) | one-stage (dev DiT, full resolution, guided) | "
    "two-stage (guided half-res stage 1, dev + distilled LoRA stage 2) | two-stage-hq (both res_2s).")]
Steps = Annotated[int | None, typer.Option("--steps", help="Guided steps (LTX2 scheduler; default 30, HQ 15).")]
Stage1Steps = Annotated[int | None, typer.Option("--stage1-steps", help="Stage-1 steps (= --steps; two-stage name).")]
Stage2Steps = Annotated[int | None, typer.Option("--stage2-steps", help="Stage-2 steps: the table's last N (1-3).")]
CfgScale = Annotated[float | None, typer.Option("--cfg-scale", help="Video CFG (default 3; 1 = off).")]
StgScale = Annotated[float | None, typer.Option("--stg-scale", help="Video STG (default 1; 0 = off).")]
StgBlocks = Annotated[str | None, typer.Option("--stg-blocks", help="Blocks whose self-attention STG skips (28).")]
Rescale = Annotated[float | None, typer.Option("--rescale", help="Guidance rescale in [0, 1] (default 0.7).")]
ModalityScale = Annotated[float | None, typer.Option("--modality-scale", help="Modality guidance (default 3).")]
AudioCfgScale = Annotated[float | None, typer.Option("--audio-cfg-scale", help="Audio CFG (default 7).")]
AudioStgScale = Annotated[float | None, typer.Option("--audio-stg-scale", help="Audio STG (default 1).")]
AudioRescale = Annotated[float | None, typer.Option("--audio-rescale", help="Audio rescale (default 0.7).")]
AudioModalityScale = Annotated[float | None, typer.Option("--audio-modality-scale", help="Audio modality (3).")]
NegativePrompt = Annotated[str | None, typer.Option(
    "--negative-prompt", help="What the uncond pass steers from (default: upstream's).")]


def guidance_fields(pipeline: str, steps: int | None, cfg_scale: float | None, stg_scale: float | None,
                    stg_blocks: str | None, rescale: float | None, modality_scale: float | None,
                    audio_cfg_scale: float | None, audio_stg_scale: float | None, audio_rescale: float | None,
                    audio_modality_scale: float | None, negative_prompt: str | None) -> dict:
    """The guided recipe's flags as spec fields (None: left out; the spec refuses what does not apply)."""
    return {"pipeline": pipeline, "steps": steps, "cfg_scale": cfg_scale, "stg_scale": stg_scale,
            "stg_blocks": stg_blocks, "rescale": rescale, "modality_scale": modality_scale,
            "audio_cfg_scale": audio_cfg_scale, "audio_stg_scale": audio_stg_scale, "audio_rescale": audio_rescale,
            "audio_modality_scale": audio_modality_scale, "negative_prompt": negative_prompt}


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
# issue #26: per-render forward settings
SparseAttention = Annotated[str | None, typer.Option(
    "--sparse-attention", help="TAUS: sparse stage-2 self-attention, one tau per stage-2 step (e.g. 1.0,1.25,1.5).")]
ComputeDtype = Annotated[str | None, typer.Option(
    "--compute-dtype", help="float16 | bfloat16: the DiT's attention and feed-forward in it (default float32).")]

# issue #25: sequence-parallel stage 1 over several Macs
Stage1Parallel = Annotated[str | None, typer.Option(
    "--stage1-parallel", help="auto (default) | K: stage 1 on up to K workers at once (1 = off; at most 8).")]

# issue #29: the EXR frames' colourspace, the duration head's length range
ExrColorspace = Annotated[str | None, typer.Option(
    "--exr-colorspace", help="srgb-linear (default) | acescg | acescct: the colourspace of --exr frames.")]
AutoDuration = Annotated[str | None, typer.Option(
    "--auto-duration", metavar="MIN:MAX", help="LTX-2.5 without -f: the seconds the duration head's pick is kept in.")]
Hdr = Annotated[bool, typer.Option("--hdr", help="Also write an HLG 10-bit HEVC master (OUTPUT.hlg.mp4).")]
VideoDecoder = Annotated[str | None, typer.Option(  # issue #29
    "--video-decoder", help="conv (default) | diffusion: LTX-2.5's diffusion decoder (vae_decoder_av), sharper, ~15x the time.")]
Dfr = Annotated[bool, typer.Option("--dfr", help="LTX-2.5 DFR even at 0 temporal rounds (canvas, keyframe slots).")]
SpatialUpscalings = Annotated[int, typer.Option(
    "--spatial-upscalings", help="DFR: 1, or 2 (stages at half size, then the per-window spatial epilogue).")]
Audio = Annotated[Path | None, typer.Option(  # issue #24: A2V (farm_cli/media.py)
    "--audio", help="A2V: an audio file (wav, mp3, m4a, flac...) the video is generated to; the output keeps it.")]
AudioStart = Annotated[float | None, typer.Option(
    "--audio-start", help="Seconds into --audio where the clip starts (default 0).")]
ControlVideoOpt = Annotated[tuple[Path, float] | None, typer.Option(  # issue #24: IC-LoRA control
    "--control-video", metavar="FILE STRENGTH", help="IC-LoRA control: a depth / pose / edge clip (at least the "
    "render's frames) stage 1 follows, with its conditioning strength in [0, 1]; needs --ic-lora.")]
ControlAttention = Annotated[float | None, typer.Option(
    "--control-attention", help="The control's attention strength in [0, 1] (default 1: full attention).")]
IcLoraOpt = Annotated[tuple[Path, float] | None, typer.Option(
    "--ic-lora", metavar="FILE STRENGTH", help="The IC-LoRA .safetensors (here; its metadata names its "
    "reference_downscale_factor) fused into stage 1 for --control-video, into both stages for --dub.")]
EncodeTiles = Annotated[str | None, typer.Option(
    "--encode-tiles", help="A clip's tiled encode: F,S (tile frames, tile pixels), auto or off (default auto).")]
Dub = Annotated[Path | None, typer.Option(
    "--dub", help="Dub-It: a video (picture and audio) to re-voice to the prompt; needs --ic-lora (the Dub-It LoRA).")]
# issue #24 retake/extend: a source clip's window regenerated, or frames added (farm_cli/media.py)
Retake = Annotated[Path | None, typer.Option(
    "--retake", help="Retake: a source video whose --start..--end window is regenerated; the rest is kept.")]
Start = Annotated[float | None, typer.Option("--start", help="Retake: the window's start, seconds into the clip.")]
End = Annotated[float | None, typer.Option("--end", help="Retake: the window's end (exclusive), seconds.")]
NoRegenAudio = Annotated[bool, typer.Option("--no-regen-audio", help="Retake: keep all the clip's audio.")]
Extend = Annotated[Path | None, typer.Option(
    "--extend", help="Extend: a source video (8k+1 frames, -f of them taken) continued by --extend-frames.")]
ExtendFrames = Annotated[int | None, typer.Option(
    "--extend-frames", help="Extend: latent frames to add (8 pixel frames each).")]
Direction = Annotated[str | None, typer.Option("--direction", help="Extend: after (default) | before the clip.")]
HdrIcLora = Annotated[Path | None, typer.Option(  # issue #29: the HDR IC-LoRA render (farm_cli/media.py)
    "--hdr-ic-lora", metavar="CLIP", help="LTX-2.5: an SDR clip rendered to HDR with the pack's SDR-to-HDR IC-LoRA: "
    "OUTPUT.hlg.mp4 (HLG 10-bit) and, with --exr, ACEScg EXR frames (-p is the scene).")]
NoKeyframes = Annotated[bool, typer.Option("--no-keyframes", help="--hdr-ic-lora: no keyframe slots at the DFR seams.")]
InputColorspace = Annotated[str | None, typer.Option(
    "--input-colorspace", help="--hdr-ic-lora: srgb_gamma (default, display-encoded) | srgb (codes taken as linear).")]
