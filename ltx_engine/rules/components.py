"""Which files make each component of a pack, and which components each task and render needs. Pure.

One table serves everyone who asks "what is in this pack" or "what does this render need": the pack
opener (`ltx_engine.loading.pack`) resolves a folder listing through `resolve_files`, the planner refuses a
render whose pack lacks a needed component (`render_components`, `missing_line`), the scheduler
matches a task's `needs` to what a worker holds, and `farm pack pull` turns render kinds into the
exact files to fetch (`pull_files`). What each task kind loads is a fact of the kind
(the farm's `protos/kinds.py`). No mlx import here: the coordinator reads this module.

File names follow mlx-forge's LTX-2.3 recipe and the published `dgrauet/ltx-2.x-mlx*` repos: a
component is one `<stem>.safetensors` or its shards `<stem>-00001-of-00003.safetensors` (with
`<stem>.safetensors.index.json`); transformers may carry a version (`transformer-distilled-1.1`), and
upscalers one in their stem (`spatial_upscaler_x2_v1_1`); of several versions the newest is used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ltx_engine.rules import text_encoders

FORGE = "mlx-forge convert ltx-2.3"


@dataclass(frozen=True)
class Part:
    """A component's file families, preferred first: each a regex over the file stem, where the named
    group `v` (digits joined by `.` or `_`) is a version; `prefix` None means the stem is the prefix."""

    families: tuple[str, ...]
    prefix: str | None
    example: str            # the file a user gets, named in refusals
    get: str                # the command that gets it
    config: bool = False    # the component has its own `<stem>_config.json`


_V = r"(?P<v>\d+(?:[._]\d+)+)"
PARTS: dict[str, Part] = {
    "transformer": Part((rf"transformer-distilled-{_V}", "transformer-distilled", "transformer"), "transformer",
                        "transformer-distilled.safetensors", FORGE),
    "transformer_dev": Part((rf"transformer-dev-{_V}", "transformer-dev"), "transformer",
                            "transformer-dev.safetensors", f"{FORGE} --variant dev"),
    "connector": Part(("connector",), "connector", "connector.safetensors", FORGE),
    # LTX-2.5 packs name their conv VAE `vae_*_conv` (prefix = stem), beside a diffusion decoder `vae_decoder_av`
    "vae_decoder": Part(("vae_decoder", "vae_decoder_conv"), None, "vae_decoder.safetensors", FORGE),
    "vae_encoder": Part(("vae_encoder", "vae_encoder_conv"), None, "vae_encoder.safetensors", FORGE),
    "audio_vae": Part(("audio_vae",), "audio_vae", "audio_vae.safetensors", FORGE),
    "vocoder": Part(("vocoder",), "vocoder", "vocoder.safetensors", FORGE),
    "spatial_upscaler": Part((rf"spatial_upscaler_x2_v{_V}",), None, "spatial_upscaler_x2_v1_1.safetensors",
                             f"{FORGE} --spatial-upscaler x2", config=True),
    "temporal_upscaler": Part((rf"temporal_upscaler_x2_v{_V}",), None, "temporal_upscaler_x2_v1_0.safetensors",
                              f"{FORGE} --temporal-upscaler x2", config=True),
    "duration_head": Part(("duration_head",), "duration_head", "duration_head.safetensors",
                          "hf download dgrauet/ltx-2.5-mlx-q8 duration_head.safetensors"),
    # LTX-2.5's diffusion video decoder (`--video-decoder diffusion`); its architecture is in the file's metadata
    "vae_decoder_av": Part(("vae_decoder_av",), None, "vae_decoder_av.safetensors",
                           "hf download dgrauet/ltx-2.5-mlx-q8 vae_decoder_av.safetensors"),
    "distilled_lora": Part((rf"ltx-[\d.]+-\d+b-distilled-lora-\d+-{_V}", r"ltx-[\d.]+-\d+b-distilled-lora-\d+"),
                           "diffusion_model", "ltx-2.3-22b-distilled-lora-384.safetensors", f"{FORGE} --variant dev"),
    # the SDR-to-HDR IC-LoRA (`--hdr-ic-lora`), a file in the pack folder fused by the HDR stage
    "hdr_lora": Part((rf"ltx-2\.5-\d+b-ic-lora-sdr-to-hdr-{_V}",), "diffusion_model",
                     "ltx-2.5-22b-ic-lora-sdr-to-hdr-1.0.safetensors",
                     "hf download Lightricks/LTX-2.5-22b-IC-LoRA-SDR-To-HDR ltx-2.5-22b-ic-lora-sdr-to-hdr-1.0.safetensors "
                     "--local-dir PACK (a gated repo: accept its licence first)"),
}
DIFFUSION = "diffusion"                # `--video-decoder diffusion`: the decode loads vae_decoder_av
TEXT_ENCODER = "text_encoder"          # a folder (Gemma 3, mlx-lm format); not a weight file of the table
TEXT_ENCODER_GET = ("a Gemma 3 folder (mlx-lm format) as text_encoder/ in the pack (an LTX-2.5 pack: its Gemma 4 tower, "
                    "text_encoder.safetensors + text_encoder_config.json), or `--text-encoder REPO_OR_PATH`")

# Files the farm knows and does not use: read by nobody, never a warning.
METADATA = ("config.json", "embedded_config.json", "quantize_config.json", "split_model.json", "README.md",
            ".gitattributes")
KNOWN_UNUSED = (
    r"spatial_upscaler_x1_5_v\d+_\d+",          # 1.5x spatial upscaler: no farm render uses it
    r"text_encoder",                              # LTX-2.5 Gemma 4 tower
    r".*lora.*",                                  # LoRA files beside the pack (task LoRAs)
)

# Render kinds a user pulls a pack for (`farm pack pull --kinds`): the components their graphs load.
_BASE = (TEXT_ENCODER, "connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder")
RENDER_KINDS: dict[str, tuple[str, ...]] = {
    "t2v": _BASE,
    "i2v": (*_BASE, "vae_encoder"),
    "dfr": (*_BASE, "temporal_upscaler"),
    "diffusion": (*_BASE, "vae_decoder_av"),  # --video-decoder diffusion (LTX-2.5)
    "hdr": (TEXT_ENCODER, "connector", "transformer", "vae_encoder", "vae_decoder", "hdr_lora"),  # --hdr-ic-lora
}

_SHARD = re.compile(r"^(?P<stem>.+?)(?:-(?P<i>\d{5})-of-(?P<n>\d{5}))?\.safetensors$")


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.split(r"[._]", text)) if text else ()


@dataclass(frozen=True)
class Found:
    """The files one component resolves to in a listing: its stem, the shard names in order."""

    component: str
    stem: str
    files: tuple[str, ...]
    rank: tuple = field(default=(), compare=False)

    @property
    def prefix(self) -> str:
        part = PARTS[self.component]
        return self.stem if part.prefix is None else part.prefix

    @property
    def config_file(self) -> str | None:
        return f"{self.stem}_config.json" if PARTS[self.component].config else None


@dataclass
class Layout:
    """A listing resolved: the chosen files of each component, the files skipped (unknown), and the
    known files the farm does not use."""

    found: dict[str, Found]
    unknown: list[str]
    unused: list[str]
    incomplete: list[str] = field(default_factory=list)  # shards of a set with some missing


def _match(stem: str) -> tuple[str, tuple] | None:
    """(component, rank) of a weight-file stem; a lower rank is preferred."""
    for component, part in PARTS.items():
        for family, pattern in enumerate(part.families):
            m = re.fullmatch(pattern, stem)
            if m:
                version = _version(m.groupdict().get("v"))
                return component, (family, tuple(-x for x in version))
    return None


def _complete(shards: list[tuple[int, int, str]]) -> bool:
    """A single file, or shards 1..n of one n, every one present."""
    if len(shards) == 1 and shards[0][1] == 0:
        return True
    counts = {n for _, n, _ in shards}
    return len(counts) == 1 and sorted(i for i, _, _ in shards) == list(range(1, counts.pop() + 1))


def resolve_files(names: Iterable[str]) -> Layout:
    """Resolve the top-level file names of a pack (or a repo listing) into components."""
    stems: dict[str, list[tuple[int, int, str]]] = {}
    unknown, unused = [], []
    for name in sorted(names):
        m = _SHARD.match(name)
        if name in METADATA or name in text_encoders.GEMMA4_FILES or name.endswith(("_config.json", ".safetensors.index.json")):
            unused.append(name)
        elif m and _match(m["stem"]):
            stems.setdefault(m["stem"], []).append((int(m["i"] or 0), int(m["n"] or 0), name))
        elif m and any(re.fullmatch(p, m["stem"]) for p in KNOWN_UNUSED):
            unused.append(name)
        else:
            unknown.append(name)
    found: dict[str, Found] = {}
    incomplete: list[str] = []
    for stem, shards in stems.items():
        component, rank = _match(stem)
        if not _complete(shards):
            incomplete.extend(name for _, _, name in shards)
            continue
        if component not in found or rank < found[component].rank:
            found[component] = Found(component, stem, tuple(n for _, _, n in sorted(shards)), rank)
    return Layout(found, sorted(unknown), unused, sorted(incomplete))


DISTILLED_DITS = ("transformer", "spatial_upscaler")  # the distilled DiT, and the upsample between its stages


def render_components(spec: dict, dits: tuple[str, ...] = DISTILLED_DITS, video: bool = True) -> tuple[str, ...]:
    """The components a render's graph loads: the base two-stage render, the image encoder when an
    image conditions it, the temporal upscaler for DFR rounds, the audio decoders unless audio is off;
    with `video` False (T2A) the text, its DiTs and the audio decoders alone."""
    own_tower = spec.get("text_encoder") in (None, text_encoders.PACK)  # else a separate encoder, matched apart
    out = [TEXT_ENCODER] if own_tower else []
    if not video:
        return (*out, "connector", *dits, "audio_vae", "vocoder")
    if spec.get("hdr_ic_lora"):  # its own graph (coordinator/plan/hdr.py)
        return (*out, *RENDER_KINDS["hdr"][1:])
    out += ["connector", "transformer", "spatial_upscaler", "vae_decoder"]
    out[out.index("transformer"):out.index("spatial_upscaler") + 1] = dits  # the recipe's (`Recipe.dits`)
    if spec.get("images") or spec.get("image"):
        out.append("vae_encoder")
    if str(spec.get("temporal_upscalings") or 0) not in ("0", "0.0"):  # a bad value is refused elsewhere
        out.append("temporal_upscaler")
    if spec.get("audio", True):
        out += ["audio_vae", "vocoder"]
    if spec.get("video_decoder") == DIFFUSION:
        out[out.index("vae_decoder")] = "vae_decoder_av"
    if spec.get("chunked") and spec.get("chunk_carry") != "latent" and "vae_encoder" not in out:  # carried frames
        out.append("vae_encoder")
    if spec.get("source_video"):  # retake/extend: the clip and its own track are encoded
        out += [c for c in ("vae_encoder", "audio_vae") if c not in out]
    if spec.get("audio_input") and "vocoder" in out:  # A2V muxes the source track, decodes none
        out.remove("vocoder")
    return tuple(out)


def task_needs(loads: Iterable[str], params: dict | None = None) -> list[str]:
    """The components a task that loads `loads` needs from its pack (what the scheduler matches to
    workers); a text task needs the pack's own tower only when the spec chose it (else a separate encoder, matched
    by name, or one the worker resolves when no live worker described the pack at submit); a decode with
    `decoder: diffusion` needs the diffusion decoder instead of the conv one."""
    needs = list(loads)
    if (params or {}).get("distilled_lora_strength") is not None:  # the dev DiT + distilled LoRA (dev_distilled.py)
        needs = [c for c in needs if c not in ("transformer", "transformer_dev")] + ["transformer_dev", "distilled_lora"]
    if (params or {}).get("decoder") == DIFFUSION and "vae_decoder" in needs:
        needs[needs.index("vae_decoder")] = "vae_decoder_av"
    if TEXT_ENCODER in needs and (params or {}).get("text_encoder") != text_encoders.PACK:
        needs.remove(TEXT_ENCODER)
    return needs


def get_line(component: str, pack: str) -> str:
    """How a user gets a component: `hf download REPO FILE` for a hub pack, else the mlx-forge command."""
    if component == TEXT_ENCODER:
        return TEXT_ENCODER_GET
    if component == "hdr_lora":  # Lightricks' own repo, whatever the pack
        return PARTS[component].get.replace("PACK", pack)
    example = PARTS[component].example
    if pack.count("/") == 1 and not pack.startswith((".", "/", "~")):
        return f"hf download {pack} {example}"
    return PARTS[component].get


def missing_line(component: str, pack: str) -> str:
    """The one line a render gets when its pack lacks `component`."""
    what = f"{TEXT_ENCODER}/" if component == TEXT_ENCODER else PARTS[component].example
    return f"pack {pack!r} has no {component} ({what}): get it with `{get_line(component, pack)}`"


def pull_files(names: Iterable[str], components: Iterable[str]) -> list[str]:
    """Of a repo's file paths, the ones a pull needs for `components`: each component's chosen files
    (the newest version only) with their index and config, the pack's metadata, and the text
    encoder folder when asked for."""
    names = list(names)
    top = [n for n in names if "/" not in n]
    layout = resolve_files(top)
    wanted = set(components)
    if "transformer" in wanted and "transformer" not in layout.found:  # a dev-only pack: dev + distilled LoRA
        wanted |= {"transformer_dev", "distilled_lora"}
    out = {n for n in top if n in METADATA[:4]}
    for component in wanted & set(layout.found):
        found = layout.found[component]
        out.update(found.files)
        for extra in (found.config_file, f"{found.stem}.safetensors.index.json"):
            if extra in top:
                out.add(extra)
    if TEXT_ENCODER in wanted:
        out.update(n for n in names if n.startswith(f"{TEXT_ENCODER}/"))
        if text_encoders.GEMMA4_WEIGHTS in top:  # an LTX-2.5 tower at the top, with its tokenizer files
            out.update(n for n in top if n in text_encoders.GEMMA4_FILES)
    return sorted(out)
