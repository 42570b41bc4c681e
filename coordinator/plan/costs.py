"""What a task costs: seconds on a reference Mac and peak memory, per task kind, from its params. Pure.

Why: placement (which Mac may hold a task), `farm plan` and every ETA read one model. Seconds are
*reference seconds*: the time on an M4 Pro (20-core GPU) with a full-size q8 LTX pack, float32
compute, as the MLX port measured it (seed 003). A worker's time is reference seconds × its ratio
for the kind: measured online (complete.lua keeps an EWMA of lease-to-done / reference seconds per
worker and kind, and fleet-wide per kind), else 1 / its chip's speed from CHIP_SPEED.

Calibration (seed 003, M4 Pro 48 GB, 2.5 q8, `--distilled`, float32):
- DiT forward: 4,992 stage-2 tokens 29.25 s/step, 9,600 tokens 63.6 s/step; stage 1 1,248 tokens
  7.23 s/step, 2,400 tokens 13.71 s/step. `a·N + b·N²` through the stage-2 points: a = 5.03e-3,
  b = 1.662e-7 (attention equals the linear part at ~30k tokens); +0.6 s per forward for the audio
  stream and AdaLN fits the stage-1 points within 3 %.
- M1 Max (32-core): 139 s per stage-2 step at 17,856 tokens where the model says 143 s → 1.03.
- M2 Pro: no step time in the seed; conv decode 384×576×25 in 2.6 s (→ DECODE_S_PER_VOXEL with the
  chip's assumed 0.75, its GPU-core × clock ratio to the M4 Pro).
- Diffusion decode (`--video-decoder diffusion`, PIPELINES.md row 21, M2 Pro): 384×576×25 in 39.1 s
  (15× the conv decode's 2.6 s) → DIFF_DECODE_S_PER_VOXEL; 512×768×49 peaked at 10.6 GB → ~500 B per
  output pixel·frame over the decoder's weights (2 GB assumed: no file size in the seed).
- Text: +5.5 s to encode one more prompt on the 2.5 pack (M4 Pro) → 6 s per text task.
- Memory: the DiT's peak grows ~0.9 MB per token (53.2 GB at 32,640 tokens, 39.8 GB at 17,856, M1 Max),
  over ~21 GB of q8 transformer weights and runtime; Gemma 3 12B 4-bit maps 7.5 GB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules import step_cache as cache_rule
from protos.kinds import Cost, TaskKind, facts

GB = 2**30
MB = 2**20

# Relative speed to the reference M4 Pro; the first name found in a worker's chip string wins.
CHIP_SPEED: dict[str, float] = {
    "M4 Max": 1.9, "M3 Ultra": 2.6, "M2 Ultra": 2.1, "M4 Pro": 1.0, "M3 Max": 1.6, "M2 Max": 1.2,
    "M1 Ultra": 1.9, "M1 Max": 1.03, "M3 Pro": 0.8, "M2 Pro": 0.75, "M1 Pro": 0.5, "M4": 0.5, "M3": 0.4,
    "M2": 0.35, "M1": 0.3,
}
MEASURED_CHIPS = ("M4 Pro", "M1 Max")  # the others are GPU-core × clock ratios, not seed figures
USABLE_FRACTION = 0.75  # of unified memory a task may use (Metal's recommended working set)

DIT_LINEAR_S = 5.03e-3      # reference seconds per token per forward
DIT_ATTENTION_S = 1.662e-7  # reference seconds per token² per forward
DIT_FORWARD_S = 0.6         # audio stream, AdaLN, per forward
DECODE_S_PER_VOXEL = 3.5e-7  # conv VAE decode, reference seconds per output pixel·frame
DIFF_DECODE_S_PER_VOXEL = 5.3e-6  # the diffusion decoder (vae_decoder_av), per output pixel·frame
DIFF_DECODE_BYTES_PER_VOXEL = 500
UPSAMPLE_S_PER_CELL = 4e-4  # spatial / temporal latent upsampler, per output latent cell
FIXED_S = {"text_encode": 6.0, "enhance_prompt": 20.0, "image_encode": 1.0, "decode_audio": 2.0, "stage_prepare": 0.5,
           "tdp_cut": 0.05, "tdp_step": 0.05, "dfr_stitch": 0.05, "dfr_trim": 0.05, "dfr_epi_window": 0.05,
           "guide_step": 0.1}  # a guided step's combine (+ res_2s' float64 midpoint), on the coordinator

REF_PACK_BYTES = 26 * GB     # a full-size q8 pack: activations scale from it for reduced (test) packs
REAL_PACK_BYTES = 4 * GB     # any real LTX pack (q4 included) has the full width: activations unscaled
WEIGHTS = {"transformer": 21 * GB, "text_encoder": int(9.5 * GB), "connector": int(1.5 * GB),
           "spatial_upscaler": GB, "temporal_upscaler": GB, "vae_decoder": GB, "vae_encoder": GB,
           "audio_vae": GB // 2, "vocoder": GB // 2, "vae_decoder_av": 2 * GB}
DIT_BYTES_PER_TOKEN = int(0.9 * MB)
MUX_S, MUX_S_PER_VOXEL = 0.5, 1e-8  # assembly: ~100 M pixel·frames per second through H.264
LOAD_BYTES_PER_S = 2 * GB  # a cold model: weights read from the SSD into unified memory
DECODE_BYTES_PER_VOXEL = 3 * 4 * 24  # the decode working set per output pixel (plan_decode's factor)
# Which weights a kind loads and how its time grows are facts of the kind (protos.kinds: weighs, cost).


def chip_speed(chip: str | None) -> float:
    """A chip's speed relative to the reference M4 Pro (1.0 for chips the table does not name)."""
    text = str(chip or "")
    return next((speed for name, speed in CHIP_SPEED.items() if name in text), 1.0)


def _cells(params: Mapping) -> int:
    """Latent cells of a task's video: its tile or window, else the (height, width, frames) it samples."""
    if params.get("cells"):  # a guidance pass: the stage's latent cells, as its planner counted them
        return int(params["cells"])
    tile = params.get("tile") or params.get("latent")
    if isinstance(tile, Mapping) and tile:
        return math.prod(max(0, int(e) - int(s)) for s, e in tile.values())
    shape = ((params.get("expect") or {}).get("latent") or {}).get("shape") or []
    if len(shape) == 5 and all(d > 0 for d in shape[2:]):  # a DFR tile: its window of the canvas
        return math.prod(shape[2:])
    h, w, f = params.get("height"), params.get("width"), params.get("frames")
    if not (h and w and f):
        return 0
    return ((int(f) - 1) // 8 + 1) * (int(h) // 32) * (int(w) // 32)


def cells(params: Mapping) -> int:
    """A task's latent cells (video tokens of a DiT task), as the seconds and peaks count them."""
    return _cells(params)


def dit_forward_s(tokens: int) -> float:
    """Reference seconds of one DiT forward over `tokens` video tokens (linear + attention term)."""
    return DIT_LINEAR_S * tokens + DIT_ATTENTION_S * tokens * tokens + DIT_FORWARD_S


def _forwards(kind: str, params: Mapping) -> float:
    """Forwards that run their block stack: fewer under the step cache (`step_cache.expected_forwards`)."""
    thresh = params.get(cache_rule.PARAM)
    if facts(kind).cost == Cost.FORWARD:
        return cache_rule.expected_forwards(thresh, int(params.get(cache_rule.STEPS_PARAM) or 1),
                                            int(params.get(cache_rule.STEP_PARAM) or 0))
    sigmas = params.get("sigmas") or ()
    return cache_rule.expected_forwards(thresh, max(1, len(sigmas) - 1) if kind != TaskKind.DFR_TILE or sigmas else 4)


def reference_seconds(kind: str, params: Mapping) -> float:
    """Seconds the task takes on the reference Mac (see the module's calibration)."""
    cost = facts(kind).cost
    if cost in (Cost.FORWARD, Cost.STEPS):
        return _forwards(kind, params) * dit_forward_s(_cells(params))
    if cost == Cost.DECODE:
        per_voxel = DIFF_DECODE_S_PER_VOXEL if _diffusion(params) else DECODE_S_PER_VOXEL
        return per_voxel * _decode_voxels(params) + 0.2
    if cost == Cost.KEYFRAME:  # one frame decoded, then encoded again (an image encode)
        return DECODE_S_PER_VOXEL * int(params["height"]) * int(params["width"]) + FIXED_S["image_encode"]
    if cost == Cost.UPSAMPLE:
        shape = ((params.get("expect") or {}).get("latent") or {}).get("shape") or []
        cells = math.prod(d for d in shape[2:] if d > 0) if len(shape) == 5 else 0
        return UPSAMPLE_S_PER_CELL * cells + 0.3
    return FIXED_S.get(kind, 0.5)


def _diffusion(params: Mapping) -> bool:
    return params.get("decoder") == "diffusion"


def _decode_voxels(params: Mapping) -> int:
    """Output pixels × frames of a decode task, from its expected output shape."""
    out = (params.get("expect") or {}).get("pixels") or (params.get("expect") or {}).get("frames") or {}
    return math.prod(d for d in (out.get("shape") or []) if d > 0) // 3  # RGB: per pixel·frame


def activation_scale(pack_bytes: int | None) -> float:
    """How a pack's activations compare with a full-size one's: 1 for every real pack; reduced packs
    (the tiny test pack) by their weight bytes."""
    if not pack_bytes or pack_bytes >= REAL_PACK_BYTES:
        return 1.0
    return pack_bytes / REF_PACK_BYTES


def peak_bytes(kind: str, params: Mapping, pack_bytes: int | None = None) -> int:
    """A task's predicted peak memory: the weights it loads plus its activations. `pack_bytes`: the
    pack's safetensors bytes as its holders report them (None: a full-size q8 pack)."""
    scale = (pack_bytes / REF_PACK_BYTES) if pack_bytes else 1.0
    kind_facts = facts(kind)
    loads = ("vae_decoder_av",) if _diffusion(params) else kind_facts.weighs
    weights = sum(WEIGHTS.get(c, 0) for c in loads) * scale
    act = activation_scale(pack_bytes)
    if kind_facts.runs_dit:
        act *= DIT_BYTES_PER_TOKEN * _cells(params)
    elif kind_facts.cost == Cost.DECODE:
        act *= (DIFF_DECODE_BYTES_PER_VOXEL if _diffusion(params) else DECODE_BYTES_PER_VOXEL) * _decode_voxels(params)
    else:
        act *= 256 * MB
    return int(weights + act)


# Block streaming (`ltx_engine.loading.streaming`): a worker whose memory cannot hold a DiT task's resident
# peak runs it with the non-block weights resident and two blocks at a time (the bound one and the
# prefetched next), ~5 % slower (the MLX port's `--low-ram`: q8 distilled 10-12 GB -> 2.76 GB).
DIT_BLOCKS = 48               # blocks of every full-size LTX-2.x DiT
NONBLOCK_FRACTION = 0.02      # patchify, AdaLN, output projection: bf16, beside the (q8) blocks
STREAM_BLOCKS_RESIDENT = 2
STREAM_TIME_FACTOR = 1.05


def stream_peak_bytes(kind: str, params: Mapping, pack_bytes: int | None = None) -> int:
    """A DiT task's predicted peak when streamed: its resident peak less the transformer blocks that
    are not resident (all but STREAM_BLOCKS_RESIDENT); a non-DiT kind's resident peak."""
    peak = peak_bytes(kind, params, pack_bytes)
    if not facts(kind).runs_dit:
        return peak
    scale = (pack_bytes / REF_PACK_BYTES) if pack_bytes else 1.0
    blocks = WEIGHTS["transformer"] * scale * (1 - NONBLOCK_FRACTION)
    return int(peak - blocks * (1 - STREAM_BLOCKS_RESIDENT / DIT_BLOCKS))


def streams_on(memory_bytes: int, params: Mapping) -> bool:
    """Whether a worker of `memory_bytes` runs a task streamed: its resident peak does not fit, its
    streamed one does (lease.lua's rule; the worker's own choice is the first half)."""
    need, stream = int(params.get("min_memory_bytes") or 0), int(params.get("min_memory_stream_bytes") or 0)
    return bool(memory_bytes and need > memory_bytes and stream and stream <= memory_bytes)


def load_seconds(kind: str, pack_bytes: int | None = None) -> float:
    """Seconds to load a kind's models cold, before any worker measured it (then its own EWMA wins)."""
    scale = (pack_bytes / REF_PACK_BYTES) if pack_bytes else 1.0
    return sum(WEIGHTS.get(c, 0) for c in facts(kind).weighs) * scale / LOAD_BYTES_PER_S


# Fusing a user LoRA set into a cold DiT (ltx_engine.lora.lora.fuse_loras): read and sum each LoRA's factors
# (float32 B @ A per targeted weight), then dequantize, add and requantize each targeted weight once.
# Reference seconds on a full-size q8 pack (estimates scaled by the pack's size, not yet measured on an
# M4 Pro): LORA_READ_S per LoRA, LORA_REQUANTIZE_S once per set; unfused adapters only read the factors.
LORA_READ_S, LORA_REQUANTIZE_S = 1.5, 6.0


def lora_fuse_seconds(params: Mapping, pack_bytes: int | None = None) -> float:
    """Seconds a cold DiT task spends on its LoRA set before its first forward (0 without one)."""
    loras = params.get("loras") or ()
    if not loras:
        return 0.0
    scale = (pack_bytes / REF_PACK_BYTES) if pack_bytes else 1.0
    fixed = LORA_REQUANTIZE_S if params.get("lora_mode", "fused") == "fused" else 0.0
    return (fixed + LORA_READ_S * len(loras)) * scale


def min_memory_bytes(peak: int) -> int:
    """The smallest unified memory whose usable part holds `peak`."""
    return math.ceil(peak / USABLE_FRACTION)


def assemble_seconds(spec: RenderPlan) -> float:
    """Reference seconds of the coordinator's assembly (blend, H.264 + AAC mux) after the last task."""
    frames = spec.output_frames or spec.frames or 0
    return MUX_S + MUX_S_PER_VOXEL * frames * spec.height * spec.width


def annotate(tasks: list[dict], spec: RenderPlan) -> None:
    """Write each task's reference seconds (`cost_s`, `load_s`) and, for worker tasks when the fleet
    described the pack's size, its peak (`peak_bytes`) and the memory a worker needs to be leased it
    (`min_memory_bytes`, which lease.lua compares with the worker's `memory_bytes`), and for DiT kinds
    the same two when streamed (`stream_peak_bytes`, `min_memory_stream_bytes`). The assembly's
    (`assemble_s`, which set_render_state.lua measures against) is in the resolved plan, not here."""
    pack_bytes = spec.pack_bytes
    for t in tasks:
        params, kind_facts = t["params"], facts(t["kind"])
        params["cost_s"] = round(reference_seconds(t["kind"], params), 4)
        fuse = lora_fuse_seconds(params, pack_bytes) if kind_facts.runs_dit else 0.0  # the DiT's, not the connector's
        params["load_s"] = round(load_seconds(t["kind"], pack_bytes) + fuse, 4)
        if pack_bytes and t.get("capability") == "mlx":
            params["peak_bytes"] = peak = peak_bytes(t["kind"], params, pack_bytes)
            params["min_memory_bytes"] = min_memory_bytes(peak)
            # The smaller Macs may take it streamed (stream_peak_bytes), its LoRAs fused or unfused.
            if kind_facts.streams:  # HDR: never streamed
                params["stream_peak_bytes"] = stream = stream_peak_bytes(t["kind"], params, pack_bytes)
                params["min_memory_stream_bytes"] = min_memory_bytes(stream)


def worker_seconds(cost_s: float, kind: str, ratios: Mapping[str, float], chip: str | None = None) -> float:
    """Predicted seconds of a task on one worker: its measured ratio for the kind, else the median of
    its other kinds' ratios, else its chip's speed."""
    if kind in ratios:
        return cost_s * ratios[kind]
    if ratios:
        return cost_s * median(list(ratios.values()))
    return cost_s / chip_speed(chip)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fill_ratios(measured: Mapping[str, Mapping[str, float]], rounds: int = 20) -> dict[str, dict[str, float]]:
    """Each worker's ratio for every kind any worker measured: its own where it has one, else the
    kind's baseline × the worker's speed factor, fitted as ratio ≈ factor(worker) × baseline(kind) in
    log space (factors' geometric mean 1), so a slow Mac stays slow on a kind it never ran."""
    logs = {w: {k: math.log(v) for k, v in r.items() if v > 0} for w, r in measured.items()}
    kinds = {k for r in logs.values() for k in r}
    factor = {w: 0.0 for w in logs}
    base = {k: 0.0 for k in kinds}
    for _ in range(rounds):
        base = {k: _mean([r[k] - factor[w] for w, r in logs.items() if k in r]) for k in kinds}
        factor = {w: _mean([v - base[k] for k, v in r.items()]) for w, r in logs.items()}
        shift = _mean([f for w, f in factor.items() if logs[w]])
        factor = {w: (f - shift) if logs[w] else 0.0 for w, f in factor.items()}
        base = {k: b + shift for k, b in base.items()}
    return {w: {**{k: math.exp(base[k] + factor[w]) for k in kinds}, **r} for w, r in measured.items()}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
