"""The render spec: what a render asks for, as one frozen record with one table of defaults.

Why here: the spec crosses the CLI → coordinator boundary (`farm render / submit / plan` build it,
the gRPC Submit builds it again from the JSON it receives), so it lives in the contract, which both
sides import. It is built and validated once where it enters (`RenderSpec.from_dict`): types and
ranges are checked, unknown fields refused in one line, numbers typed. Nothing rewrites it later;
what the planner decides (the chosen length, tiles, the text encoder) is a separate record
(`coordinator.plan.resolved.Resolved`).

What a value means for a render (multiples of 64, 8k+1 frames, packs the fleet holds) stays in the
planner, which only ever sees specs built here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from protos.fields import SpecError, integer, number, text
from protos.fields import parse_object as _parse_object
from protos.flags import (
    ASKED,
    GIVEN,
    GUIDANCE,
    SUBMIT,
    given,
    negated,
    numbers,
    opt,
    seconds_range,
    spec_field,
    url,
)
from protos.guidance_spec import GUIDANCE_FIELDS as G
from protos.media_spec import MEDIA_FIELDS as M
from protos.media_spec import (
    MEDIA_RECORDS,
    AudioInput,
    ControlVideo,
    Extend,
    HdrIcLora,
    IcLora,
    Retake,
    SourceVideo,
)
from protos.relay_spec import Segment, segment_flags
from protos.relay_spec import epsilon as relay_epsilon_rule
from protos.relay_spec import segments as relay_segments
from protos.sp_spec import stage1_parallel
from protos.spec_rules import (  # noqa: F401 - the contract's names, imported from here by both sides
    IMAGE_BINDINGS,
    IMAGE_KEYS,
    LORA_MODES,
    MAX_CRF,
    MAX_IMAGES,
    MAX_LORA_STRENGTH,
    MAX_LORAS,
    VIDEO_DECODERS,
    ImageCondition,
    LoraRef,
    Rule,
    boolean,
    exr,
    images,
    lora_mode,
    loras,
    scalar,
    sigmas,
    step_cache,
    taus,
    text_encoder,
    video_decoder,
)
from protos.spec_rules import seconds_range as seconds_range_rule

MAX_SPEC_BYTES = 256 * 1024
MAX_PROMPT_CHARS = 20_000
MAX_SEED = 2**63 - 1
MAX_FRAME_RATE = 240.0
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # no ':' (key separator), no spaces, bounded
JsonValue = str | int | float | bool | None | list | dict


def parse_object(text: str, what: str, max_bytes: int = MAX_SPEC_BYTES) -> dict:
    """A JSON object of bounded size and depth (a spec's bound by default), or SpecError."""
    return _parse_object(text, what, max_bytes)


PACK_NAME = re.compile(r"[^\s:][^\x00-\x1f]*")
FRAMES_HELP = "8k+1 frames (default: an LTX-2.5 pack's DurationHead picks it, else 25)."
MEDIA = "media"  # --audio and the clips: files read and hashed on the client


def absolute(path: Path) -> str:
    """--exr FOLDER, resolved against the user's folder (sent as given it would land in the coordinator's)."""
    return str(Path(path).expanduser().resolve())


@dataclass(frozen=True, slots=True)
class RenderSpec:
    """What a render asks for. The field defaults are the one table of defaults; each field's metadata is
    its rule and its flags (protos/flags.py), in the order `--help` lists them and the render hash keeps."""

    prompt: str = spec_field("", text(MAX_PROMPT_CHARS), opt("-p", "--prompt", help="What to render."))
    height: int = spec_field(256, integer(1, 1 << 16), opt("-H", "--height", help="Pixels, multiple of 64."))
    width: int = spec_field(384, integer(1, 1 << 16), opt("-W", "--width", help="Pixels, multiple of 64."))
    frames: int | None = spec_field(None, integer(1, 1 << 16), opt("-f", "--frames", help=FRAMES_HELP))
    frame_rate: float = spec_field(24.0, number(0.0, MAX_FRAME_RATE, open_low=True), opt("--frame-rate"))
    seed: int = spec_field(1, integer(0, MAX_SEED), opt("--seed"))
    pack: str = spec_field("tiny", text(256, pattern=PACK_NAME), opt(
        "--pack", help="Pack name in the packs folder, a path, or a HF repo id."))
    images: tuple[ImageCondition, ...] = spec_field((), images, opt(  # three values per use: multi_option.py
        "--image", type=list[str] | None, default=None,
        help="PATH FRAME STRENGTH, repeatable (keyframes). FRAME: an index, negative from the end, or last."), opt(
        "--image-binding", type=list[str] | None, default=None,
        help="replace | guide | auto, per --image in order (auto: frame 0 replaces, else guide)."), opt(
        "--image-crf", type=list[int] | None, default=None,
        help="H.264 CRF per --image in order (default 33 on LTX-2.3, 18 on 2.5; 0: none)."), client="images")
    num_generated_keyframes: int = spec_field(0, integer(0, MAX_IMAGES), opt(
        "--num-generated-keyframes", help="LTX-2.5, without DFR: N generated keyframe slots in stage 1."))
    audio: bool = spec_field(True, boolean, opt("--no-audio", type=bool, default=False, parse=negated))
    stage2_tiles: str | None = spec_field(None, text(32), opt(  # "auto" | "HxW" | "FxHxW": tiled data parallel
        "--stage2-tiles", help="auto | HxW | FxHxW: tiled stage 2."))
    tile_overlap: int = spec_field(5, integer(0, 64), opt("--tile-overlap", help="Stage-2 tile overlap in latent cells."))
    stage2_sigmas: tuple[float, ...] | None = spec_field(None, sigmas, opt(
        "--stage2-sigmas", help="Comma-separated, ending in 0.", parse=numbers("--stage2-sigmas", "numbers")))
    temporal_upscalings: int = spec_field(0, integer(0, 4), opt(  # DFR rounds (LTX-2.5 packs)
        "--temporal-upscalings", help="DFR temporal rounds: 0, 1 or 2."))
    decode_tiles: str = spec_field("auto", text(64), opt("--decode-tiles", help="auto | off | F,H,W (pixels)."))
    exr: str | bool | None = spec_field(None, exr, opt(  # a folder (on the machine that assembles) or a yes
        "--exr", type=Path | None, help="Also write EXR frames into this folder.", parse=absolute))
    text_encoder: str | None = spec_field(None, text_encoder, opt(  # "pack", a repo id or a folder
        "--text-encoder", help="Gemma 3 (mlx-lm) repo id or folder for packs without their own "
        "(default: the pack's entry in DATA/config.toml, else mlx-community/gemma-3-12b-it-4bit)."), client="text_encoder")
    enhance_prompt: bool | None = spec_field(None, boolean, opt(  # None: the prompt as given
        "--enhance-prompt", type=bool, default=False, help="Rewrite the prompt with the text encoder's Gemma 3 first (upstream's system "
        "prompts; greedy, so one prompt gives one enhanced prompt).", parse=given))
    detailing_lora: str | None = spec_field(None, scalar, opt(  # fused into stage 2's DiT
        "--detailing-lora", help="DFR: an IC-LoRA .safetensors in the pack folder, fused into stage 2."),
        client="detailing")
    detailing_strength: float = spec_field(0.5, number(0.0, 4.0), opt(
        "--detailing-strength", help="The detailing LoRA's strength."), client="detailing")
    loras: tuple[LoraRef, ...] = spec_field((), loras, opt(  # two values each: farm_cli.loras.pair_argv
        "--lora", type=list[str] | None, default=None, metavar="SOURCE STRENGTH",
        help="A LoRA on every DiT stage (repeatable, at most 8): a .safetensors here, a file name in the pack "
        "folder, or a Hugging Face REPO or REPO/FILE; with its strength."), client="loras")
    lora_mode: str = spec_field("fused", lora_mode, opt(
        "--lora-mode", help="fused: summed into the weights once per worker (fastest); unfused: run-time adapters "
        "(no requantization loss on q8/q4 packs)."))
    # The recipe and its guidance (protos/guidance_spec.py); None = the recipe's upstream default.
    pipeline: str = spec_field("distilled", G["pipeline"], opt(
        "--pipeline", help="distilled (8+3 steps, no guidance) | one-stage (dev DiT, full resolution, guided) | "
        "two-stage (guided half-res stage 1, dev + distilled LoRA stage 2) | two-stage-hq (both res_2s) | "
        "t2a (text-to-audio: the audio track alone, guided, to a .wav or .m4a)."),
        group=GUIDANCE)
    steps: int | None = spec_field(None, G["steps"], opt(
        "--steps", help="Guided steps (LTX2 scheduler; default 30, HQ 15)."), group=GUIDANCE)
    stage1_steps: int | None = spec_field(None, G["stage1_steps"], opt(  # must agree with steps
        "--stage1-steps", help="Stage-1 steps (= --steps; two-stage name)."), group=GUIDANCE)
    stage2_steps: int | None = spec_field(None, G["stage2_steps"], opt(
        "--stage2-steps", help="Stage-2 steps: the table's last N (1-3)."), group=GUIDANCE)
    cfg_scale: float | None = spec_field(None, G["cfg_scale"], opt(
        "--cfg-scale", help="Video CFG (default 3; 1 = off)."), group=GUIDANCE)
    stg_scale: float | None = spec_field(None, G["stg_scale"], opt(
        "--stg-scale", help="Video STG (default 1; 0 = off)."), group=GUIDANCE)
    stg_blocks: tuple[int, ...] | None = spec_field(None, G["stg_blocks"], opt(  # "28,29": the rule reads it
        "--stg-blocks", help="Blocks whose self-attention STG skips (28)."), group=GUIDANCE)
    modality_blocks: tuple[int, ...] | None = spec_field(None, G["modality_blocks"], opt(  # None: every block
        "--modality-blocks", help="Blocks whose audio<->video cross-attentions the modality pass skips "
        "(default: every block, as upstream)."), group=GUIDANCE)
    rescale: float | None = spec_field(None, G["rescale"], opt(
        "--rescale", help="Guidance rescale in [0, 1] (default 0.7)."), group=GUIDANCE)
    modality_scale: float | None = spec_field(None, G["modality_scale"], opt(
        "--modality-scale", help="Modality guidance (default 3)."), group=GUIDANCE)
    audio_cfg_scale: float | None = spec_field(None, G["audio_cfg_scale"], opt(
        "--audio-cfg-scale", help="Audio CFG (default 7)."), group=GUIDANCE)
    audio_stg_scale: float | None = spec_field(None, G["audio_stg_scale"], opt(
        "--audio-stg-scale", help="Audio STG (default 1)."), group=GUIDANCE)
    audio_rescale: float | None = spec_field(None, G["audio_rescale"], opt(
        "--audio-rescale", help="Audio rescale (default 0.7)."), group=GUIDANCE)
    audio_modality_scale: float | None = spec_field(None, G["audio_modality_scale"], opt(
        "--audio-modality-scale", help="Audio modality (3)."), group=GUIDANCE)
    negative_prompt: str | None = spec_field(None, G["negative_prompt"], opt(  # None: upstream's
        "--negative-prompt", help="What the uncond pass steers from (default: upstream's)."), group=GUIDANCE)
    skip_step: int | None = spec_field(None, G["skip_step"], opt(
        "--skip-step", "--video-skip-step", help="Guide every N+1-th step only; the others reuse the last guided "
        "x0 (upstream's skip_step; default 0 = every step)."), group=GUIDANCE)
    audio_skip_step: int | None = spec_field(None, G["audio_skip_step"], opt(
        "--audio-skip-step", help="Audio's skip step (default 0); a step one modality skips runs the other's "
        "passes with it frozen, as upstream."),
        group=GUIDANCE)
    apg_eta: float | None = spec_field(None, G["apg_eta"], opt(
        "--apg-eta", help="CFG as APG (ltx-core's LtxAPGGuider): the weight of the delta's part along cond "
        "(1 keeps it, 0 drops it)."), group=GUIDANCE)
    apg_norm_threshold: float | None = spec_field(None, G["apg_norm_threshold"], opt(
        "--apg-norm-threshold", help="APG: clip the CFG delta's norm to this (default 0 = no clip)."),
        group=GUIDANCE)
    guidance_schedule: tuple | None = spec_field(None, G["guidance_schedule"], opt(  # None: one guider for every sigma
        "--guidance-schedule", help="Guidance by sigma (ltx-core's MultiModalGuiderFactory): bins SIGMA:key=value,... "
        "separated by ';', each overriding the scales and skip steps for sigmas up to SIGMA (above every bound: the "
        "largest bin), e.g. 1.0:cfg_scale=4;0.5:cfg_scale=2."), group=GUIDANCE)
    sparse_attention: tuple[float, ...] | None = spec_field(None, taus, opt(  # None: dense
        "--sparse-attention", help="TAUS: sparse stage-2 self-attention, one tau per stage-2 step (e.g. 1.0,1.25,1.5).",
        parse=numbers("--sparse-attention", "taus, e.g. 1.0,1.25,1.5")))
    compute_dtype: str | None = spec_field(None, text(32), opt(  # None: float32 (dtype names: the planner)
        "--compute-dtype", help="float16 | bfloat16: the DiT's attention and feed-forward in it (default float32).",
        parse=given))
    step_cache: float | None = spec_field(None, step_cache, opt(  # None: every forward runs its blocks
        "--step-cache", metavar="THRESH", help="Step caching (TeaCache, as the MLX port): a step whose first block's "
        "input changed less than THRESH (accumulated, rescaled) reuses the last computed step's block residual. "
        "0.5 conservative, 1.0 faster."))
    exr_colorspace: str | None = spec_field(None, text(32), opt(  # ltx_engine/rules/color.py
        "--exr-colorspace", help="srgb-linear (default) | acescg | acescct: the colourspace of --exr frames.",
        parse=given))
    auto_duration: tuple[float, float] | None = spec_field(None, seconds_range_rule, opt(
        "--auto-duration", metavar="MIN:MAX", help="LTX-2.5 without -f: the seconds the duration head's pick is kept in.",
        parse=seconds_range))
    hdr: bool = spec_field(False, boolean, opt(  # the decode's HLG master too
        "--hdr", help="Also write an HLG 10-bit HEVC master (OUTPUT.hlg.mp4).", parse=given))
    video_decoder: str | None = spec_field(None, video_decoder, opt(  # conv (None) | LTX-2.5's vae_decoder_av
        "--video-decoder", help="conv (default) | diffusion: LTX-2.5's diffusion decoder (vae_decoder_av), sharper, "
        "~15x the time.", parse=given))
    dfr: bool = spec_field(False, boolean, opt(
        "--dfr", help="LTX-2.5 DFR even at 0 temporal rounds (canvas, keyframe slots).", parse=given))
    spatial_upscalings: int = spec_field(1, integer(1, 2), opt(
        "--spatial-upscalings", help="DFR: 1, or 2 (stages at half size, then the per-window spatial epilogue)."))
    audio_input: AudioInput | None = spec_field(None, M["audio_input"], opt(  # A2V: the track is frozen
        "--audio", type=Path | None,
        help="A2V: an audio file (wav, mp3, m4a, flac...) the video is generated to; the output keeps it."), opt(
        "--audio-start", type=float | None, help="Seconds into --audio where the clip starts (default 0)."),
        client=MEDIA)
    source_video: SourceVideo | None = spec_field(None, M["source_video"])  # the clip --retake/--extend encode
    encode_tiles: str | None = spec_field(None, M["encode_tiles"], opt(
        "--encode-tiles", help="A clip's tiled encode: F,S (tile frames, tile pixels), auto or off (default auto).",
        parse=given))
    control_video: ControlVideo | None = spec_field(None, M["control_video"], opt(  # reference tokens in stage 1
        "--control-video", type=tuple[Path, float] | None, metavar="FILE STRENGTH",
        help="IC-LoRA control: a depth / pose / edge clip (at least the render's frames) stage 1 follows, with its "
        "conditioning strength in [0, 1]; needs --ic-lora."), opt(
        "--control-attention", type=float | None,
        help="The control's attention strength in [0, 1] (default 1: full attention)."), opt(
        "--control-stage2", type=bool, default=False,
        help="The control in stage 2 too: re-encoded at full size, the IC-LoRA fused there (the MLX port's "
        "control-aware refine)."), opt(
        "--control-mask", type=Path | None,
        help="A grey mask clip (at least the render's frames): per region, how much the generated tokens attend "
        "to the control (white 1, black 0), times --control-attention (upstream's --conditioning-attention-mask)."),
        client=MEDIA)
    control_mask: SourceVideo | None = spec_field(None, M["control_mask"])  # the mask clip --control-mask uploads
    ic_lora: IcLora | None = spec_field(None, M["ic_lora"], opt(  # stage 1 (control) or both stages (Dub-It)
        "--ic-lora", type=tuple[Path, float] | None, metavar="FILE STRENGTH",
        help="The IC-LoRA .safetensors (here; its metadata names its reference_downscale_factor) fused into "
        "stage 1 for --control-video, into both stages for --dub."), client=MEDIA)
    dub_video: ControlVideo | None = spec_field(None, M["dub_video"], opt(  # Dub-It's reference (and its audio)
        "--dub", type=Path | None,
        help="Dub-It: a video (picture and audio) to re-voice to the prompt; needs --ic-lora (the Dub-It LoRA)."),
        client=MEDIA)
    retake: Retake | None = spec_field(None, M["retake"], opt(  # regenerate [start, end) s of source_video
        "--retake", type=Path | None,
        help="Retake: a source video whose --start..--end window is regenerated; the rest is kept."), opt(
        "--start", type=float | None, help="Retake: the window's start, seconds into the clip."), opt(
        "--end", type=float | None, help="Retake: the window's end (exclusive), seconds."), opt(
        "--no-regen-audio", type=bool, default=False, help="Retake: keep all the clip's audio."), client=MEDIA)
    extend: Extend | None = spec_field(None, M["extend"], opt(  # ... or add N latent frames after / before it
        "--extend", type=Path | None,
        help="Extend: a source video (8k+1 frames, -f of them taken) continued by --extend-frames."), opt(
        "--extend-frames", type=int | None, help="Extend: latent frames to add (8 pixel frames each)."), opt(
        "--direction", type=str | None, help="Extend: after (default) | before the clip."), client=MEDIA)
    hdr_ic_lora: HdrIcLora | None = spec_field(None, M["hdr_ic_lora"], opt(  # coordinator/plan/hdr.py
        "--hdr-ic-lora", type=Path | None, metavar="CLIP",
        help="LTX-2.5: an SDR clip rendered to HDR with the pack's SDR-to-HDR IC-LoRA: OUTPUT.hlg.mp4 (HLG 10-bit) "
        "and, with --exr, ACEScg EXR frames (-p is the scene)."), opt(
        "--no-keyframes", type=bool, default=False, help="--hdr-ic-lora: no keyframe slots at the DFR seams."), opt(
        "--input-colorspace", type=str | None,
        help="--hdr-ic-lora: srgb_gamma (default, display-encoded) | srgb (codes taken as linear)."), client=MEDIA)
    segments: tuple[Segment, ...] = spec_field((), relay_segments, opt(  # two values per use: multi_option.py
        "--segment", type=list[str] | None, default=None, metavar="TEXT SECONDS", parse=segment_flags,
        help="A prompt per moment (Prompt Relay): TEXT speaks for the next SECONDS of the clip; repeatable, back to "
        "back from the start; -p holds everywhere."))
    relay_epsilon: float | None = spec_field(None, relay_epsilon_rule, opt(  # None: the port's 1e-3
        "--relay-epsilon", type=float | None, help="Prompt Relay's falloff in (0, 1): smaller is sharper (default 0.001)."))
    relay_strength: float | None = spec_field(None, number(0.0, 100.0), opt(  # None: the port's 1
        "--relay-strength", type=float | None, help="Prompt Relay's penalty multiplier (default 1)."))
    stage1_parallel: str = spec_field("auto", stage1_parallel, opt(  # protos/sp_spec.py
        "--stage1-parallel", type=str | None, default=None,
        help="auto (default) | K: stage 1 on up to K workers at once (1 = off; at most 8)."))
    any_class: bool = spec_field(False, boolean, opt(  # lease.lua / gang.lua: one class per step and gang unless set
        "--any-class", help="Deal a step's tiles and a gang's ranks to workers of any determinism class "
        "(faster on a mixed fleet; the bits then depend on which Macs took which tiles)."))
    # A clip longer than one window, in overlapping windows (coordinator/plan/chunks.py); None: the defaults
    chunked: bool | None = spec_field(None, boolean, opt(
        "--chunked", type=bool, default=False, help="Render -f frames in windows, each conditioned on the last "
        "frames of the one before, seams crossfaded (upstream's chunks).", parse=given), group=GIVEN)
    chunk_pixel_frames: int | None = spec_field(None, integer(9, 1 << 16), opt(
        "--chunk-pixel-frames", help="--chunked: frames per window, 8k+1 (default 97)."), group=GIVEN)
    chunk_carry_frames: int | None = spec_field(None, integer(1, 1 << 16), opt(
        "--chunk-carry-frames", help="--chunked: the previous window's last frames each window is conditioned "
        "on, 8k+1 (default 25)."), group=GIVEN)
    chunk_blend_frames: int | None = spec_field(None, integer(0, 1 << 16), opt(
        "--chunk-blend-frames", help="--chunked: frames crossfaded at each seam, at the end of the carried "
        "frames (default 8)."), group=GIVEN)
    chunk_carry: str | None = spec_field(None, text(16), opt(
        "--chunk-carry", help="--chunked: decoded (default, upstream's: the frames re-encoded) | latent (ours: the "
        "stage latents carried, so the next window starts before this one decodes)."), group=GIVEN)
    submitter: str | None = spec_field(None, text(256), group=SUBMIT)
    priority: int | None = spec_field(None, integer(-1_000_000, 1_000_000), opt(
        "--priority", type=int, default=0, help="Higher renders lease first.", commands=("submit",)), group=SUBMIT)
    group: str | None = spec_field(None, text(128, pattern=ID), group=SUBMIT)
    notify: str | None = spec_field(None, text(2048, pattern=re.compile(r"https?://\S+")), opt(
        "--notify", type=str | None, help="POST JSON to this http(s) URL when the render ends.", parse=url,
        commands=("submit",)), group=SUBMIT)

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> RenderSpec:
        """The spec a client sent, checked field by field (None = the default); unknown fields refused."""
        raw = _legacy_image(raw)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names - set(RESOLVED_ONLY))
        if unknown:
            raise SpecError(f"unknown spec field {str(unknown[0])[:60]!r}")
        typed = {key: SPEC_FIELDS.get(key, scalar)(key, value) for key, value in raw.items()
                 if value is not None and key in names}
        return cls(**typed)

    def to_dict(self) -> dict[str, JsonValue]:
        """The JSON form: every asked field (None where left out), the submit fields only when given."""
        out: dict[str, JsonValue] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name in SUBMIT_FIELDS or f.name in GIVEN_FIELDS) and value is None:
                continue
            out[f.name] = json_value(value)
        return out


def _legacy_image(raw: Mapping[str, object]) -> Mapping[str, object]:
    """An older client's single `image` object, as the first of `images` (mapped once, here)."""
    if "image" not in raw:
        return raw
    out = {k: v for k, v in raw.items() if k != "image"}
    if raw["image"] is not None:
        out["images"] = [raw["image"], *(raw.get("images") or [])]
    return out


def json_value(value: object) -> JsonValue:
    """A spec field as JSON holds it (an image as its object, sigmas as a list)."""
    if isinstance(value, (ImageCondition, LoraRef, Segment, *MEDIA_RECORDS)):
        return value.to_dict()
    if isinstance(value, tuple):
        return [json_value(v) for v in value]
    return value if isinstance(value, str | int | float | bool | list | dict) else None


def spec_field_names() -> tuple[str, ...]:
    """The fields a submit may carry (what `farm retry` sends again out of a recorded spec)."""
    return tuple(f.name for f in fields(RenderSpec))


SPEC_FIELDS: dict[str, Rule] = {f.name: f.metadata["rule"] for f in fields(RenderSpec) if f.metadata.get("rule")}
ASKED_FIELDS = tuple(f.name for f in fields(RenderSpec) if f.metadata.get("group") == ASKED)
SUBMIT_FIELDS = tuple(f.name for f in fields(RenderSpec) if f.metadata.get("group") == SUBMIT)  # stored only when given
GIVEN_FIELDS = tuple(f.name for f in fields(RenderSpec) if f.metadata.get("group") == GIVEN)  # asked, stored when given
RESOLVED_ONLY = ("generation", "predicted_seconds")  # accepted (older clients send them back) and dropped
