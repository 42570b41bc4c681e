"""The `farm` command: a thin shell over the planner, the runner, the coordinator and the workers."""


import sys
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common, config, dashboard, doctor, manage, packs, plan, renders, services
from farm_cli import options as opt
from farm_cli.benches import bench_app
from farm_cli.image_option import ImageCommand
from farm_cli.options import (
    SPEC,
    AutoDuration,
    ComputeDtype,
    Coordinator,
    DataDir,
    DecodeTiles,
    DetailingLora,
    DetailingStrength,
    Exr,
    ExrColorspace,
    FrameRate,
    Frames,
    GeneratedKeyframes,
    Hdr,
    Height,
    Image,
    ImageBinding,
    ImageCrf,
    Lora,
    LoraMode,
    NoAudio,
    Output,
    PackRef,
    Prompt,
    SaveLatents,
    Seed,
    SparseAttention,
    Stage2Sigmas,
    Stage2Tiles,
    TemporalUpscalings,
    TextEncoder,
    TileOverlap,
    Token,
    VideoDecoder,
    Width,
)
from farm_cli.session import fail, one_line

app = typer.Typer(add_completion=False, no_args_is_help=True, help="LTX-2 render farm for Apple Silicon.")
pack_app = typer.Typer(no_args_is_help=True, help="Weight packs.")
token_app = typer.Typer(help="The farm's join token.", no_args_is_help=True)
app.add_typer(pack_app, name="pack")


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


def render(
    prompt: Prompt = "", height: Height = SPEC.height, width: Width = SPEC.width, frames: Frames = None,
    frame_rate: FrameRate = SPEC.frame_rate, seed: Seed = SPEC.seed, pack: PackRef = SPEC.pack, image: Image = None, image_binding: ImageBinding = None, image_crf: ImageCrf = None, num_generated_keyframes: GeneratedKeyframes = 0,
    output: Output = None, save_latents: SaveLatents = None, no_audio: NoAudio = False,
    stage2_tiles: Stage2Tiles = None, tile_overlap: TileOverlap = SPEC.tile_overlap, stage2_sigmas: Stage2Sigmas = None,
    temporal_upscalings: TemporalUpscalings = SPEC.temporal_upscalings, decode_tiles: DecodeTiles = SPEC.decode_tiles, exr: Exr = None,
    local: Annotated[bool, typer.Option("--local", help="Run in this process (the reference).")] = False,
    data: DataDir = None, text_encoder: TextEncoder = None,
    *, coordinator: Coordinator, token: Token = None,
    sparse_attention: SparseAttention = None, compute_dtype: ComputeDtype = None,  # issue #26
    stage1_parallel: opt.Stage1Parallel = None,  # issue #25
    detailing_lora: DetailingLora = None, detailing_strength: DetailingStrength = SPEC.detailing_strength,
    lora: Lora = None, lora_mode: LoraMode = SPEC.lora_mode,
    pipeline: opt.Pipeline = SPEC.pipeline, steps: opt.Steps = None, cfg_scale: opt.CfgScale = None,
    stg_scale: opt.StgScale = None, stg_blocks: opt.StgBlocks = None, rescale: opt.Rescale = None,
    modality_scale: opt.ModalityScale = None, audio_cfg_scale: opt.AudioCfgScale = None,
    audio_stg_scale: opt.AudioStgScale = None, audio_rescale: opt.AudioRescale = None,
    audio_modality_scale: opt.AudioModalityScale = None, negative_prompt: opt.NegativePrompt = None,
    stage1_steps: opt.Stage1Steps = None, stage2_steps: opt.Stage2Steps = None,  # issue #23
    exr_colorspace: ExrColorspace = None, auto_duration: AutoDuration = None, hdr: Hdr = False,
    video_decoder: VideoDecoder = None,  # issue #29
    dfr: opt.Dfr = False, spatial_upscalings: opt.SpatialUpscalings = 1,  # issue #29: DFR base path, epilogue
    audio: opt.Audio = None, audio_start: opt.AudioStart = None,  # issue #24: A2V
) -> None:
    """Render a clip into -o (default render.mp4): on the farm, or with --local in this process with the
    farm's stage graph (the reference for every distributed run)."""
    from farm_cli import loras, media
    from farm_cli.hdr_spec import decoder_fields, dfr_fields, hdr_fields
    from farm_cli.spec import cli_spec

    user_loras, user_media = loras.resolve(lora, lora_mode), media.resolve(audio, audio_start)
    spec, pixels = cli_spec(prompt=prompt, height=height, width=width, frames=frames, frame_rate=frame_rate,
                            seed=seed, pack=pack, image=image, image_binding=image_binding, image_crf=image_crf, num_generated_keyframes=num_generated_keyframes, no_audio=no_audio, stage2_tiles=stage2_tiles,
                            tile_overlap=tile_overlap, stage2_sigmas=stage2_sigmas,
                            temporal_upscalings=temporal_upscalings, decode_tiles=decode_tiles, exr=exr,
                            text_encoder=text_encoder, data=data, detailing_lora=detailing_lora,
                            detailing_strength=detailing_strength, lora_fields=user_loras.fields,
                            guidance=opt.guidance_fields(
        pipeline, steps, cfg_scale, stg_scale, stg_blocks, rescale, modality_scale, audio_cfg_scale,
        audio_stg_scale, audio_rescale, audio_modality_scale, negative_prompt)
        | {"stage1_steps": stage1_steps, "stage2_steps": stage2_steps},
        sparse_attention=sparse_attention, compute_dtype=compute_dtype, stage1_parallel=stage1_parallel,
        hdr_fields=hdr_fields(exr_colorspace, auto_duration, hdr) | decoder_fields(video_decoder),
        dfr_fields=dfr_fields(dfr, spatial_upscalings), media_fields=user_media.fields)
    out = output or Path("render.mp4")
    if not local:
        loras.upload_to(user_loras.files, coordinator, token)
        media.upload_to(user_media.files, coordinator, token)
        from farm_cli.remote import fetch_results, submit_render, wait_for

        render_id = submit_render(spec.to_dict(), pixels, coordinator, token,
                                  unreachable=", or render here with --local")
        typer.echo(render_id)
        render = wait_for(render_id, coordinator, token, output=out)
        if render.get("state") != "done":
            fail(f"render {render_id} {render.get('state')}: {render.get('error') or ''}".strip(), code=1)
        return fetch_results(render, out, save_latents, coordinator, token)
    _render_here(spec, pixels, out, data, save_latents, user_loras.files, user_media.files)


def _render_here(spec, pixels, out: Path, data: Path | None, save_latents: Path | None, lora_files: dict,
                 media_files: dict | None = None) -> None:
    """`farm render --local`: the farm's stage graph in this process (the reference for every farm run)."""
    from coordinator.plan.render import SpecError
    from farm_cli.local import render_local
    from farm_cli.remote import latents_from_outputs, progress_printer
    from ltx_engine.loader import PackError
    from worker.runner import Runner

    runner = Runner(common.data_dir(data) / "packs")
    runner.loras.known.update(lora_files)  # the client's LoRA files, read where they are
    with one_line(SpecError, PackError):
        path, outputs, blobs = render_local(spec, out, runner, pixels, progress_printer(), media=media_files)
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
app.command(cls=ImageCommand)(render)  # --image PATH FRAME STRENGTH, repeatable (farm_cli/image_option.py)
app.command(cls=ImageCommand)(renders.submit)
for command in (renders.watch, renders.status, renders.cancel, renders.fetch, renders.workers,
                renders.requeue, renders.drain, services.coordinator, services.worker, services.up, services.demo,
                doctor.doctor):
    app.command()(command)
app.command("config")(config.show)
app.command("dashboard")(dashboard.dashboard)
for command in (manage.ls, manage.retry, manage.rerun, manage.delete, manage.prune, manage.logs):
    app.command()(command)
app.command(cls=ImageCommand)(plan.plan)
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
