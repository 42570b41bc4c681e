"""Where the installed reference (ltx-core 1.0.0) and current upstream (ltx-core 1.2.0) disagree.

The parity tests run against `ltx-core==1.0.0` from the package index, but the engine follows 1.2.0
(`Lightricks/LTX-2` main), the reference the released checkpoints are served with. Each rule that
changed between them is written here once, from reading upstream, and applied to a 1.0.0 module.
"""

from __future__ import annotations

import itertools
import types
from dataclasses import replace

import torch
from ltx_core.model.transformer.transformer_args import MultiModalTransformerArgsPreprocessor


def _prepare_1_2_0(self: MultiModalTransformerArgsPreprocessor, modality, cross_modality=None):
    """`MultiModalTransformerArgsPreprocessor.prepare` of ltx-core 1.2.0 (transformer_args.py).

    1.0.0 fed the OTHER modality's sigma to both audio<->video cross-attention AdaLNs. In 1.2.0
    (`_prepare_cross_attention_timestep`) the scale/shift AdaLN reads the modality's OWN per-token
    timesteps x `timestep_scale_multiplier`, while the gate still reads the other modality's sigma x
    `av_ca_timestep_scale_multiplier`. Everything else (RoPE, checks) is unchanged from 1.0.0.
    """
    args = self.simple_preprocessor.prepare(modality)
    if cross_modality is None:
        return args
    if cross_modality.sigma.numel() > 1:
        if cross_modality.sigma.shape[0] != modality.timesteps.shape[0]:
            raise ValueError("Cross modality sigma must have the same batch size as the modality")
        if cross_modality.sigma.ndim != 1:
            raise ValueError("Cross modality sigma must be a 1D tensor")
    pre = self.simple_preprocessor
    cross_pe = pre._prepare_positional_embeddings(
        positions=modality.positions[:, 0:1, :],
        inner_dim=self.audio_cross_attention_dim,
        max_pos=[self.cross_pe_max_pos],
        use_middle_indices_grid=True,
        num_attention_heads=pre.num_attention_heads,
        x_dtype=modality.latent.dtype,
    )
    mult = pre.timestep_scale_multiplier
    batch, dtype = args.x.shape[0], modality.latent.dtype
    scale_shift, _ = self.cross_scale_shift_adaln((modality.timesteps * mult).flatten(), hidden_dtype=dtype)
    av_ca_factor = self.av_ca_timestep_scale_multiplier / mult
    gate, _ = self.cross_gate_adaln((cross_modality.sigma * mult * av_ca_factor).flatten(), hidden_dtype=dtype)
    return replace(
        args,
        cross_positional_embeddings=cross_pe,
        cross_scale_shift_timestep=scale_shift.view(batch, -1, scale_shift.shape[-1]),
        cross_gate_timestep=gate.view(batch, -1, gate.shape[-1]),
    )


def follow_ltx_core_1_2_0(model: torch.nn.Module) -> torch.nn.Module:
    """Give a 1.0.0 `LTXModel` (in place) the 1.2.0 cross-attention AdaLN timestep rule; returns it.

    Only the instance's two preprocessors change, so an unpatched 1.0.0 model built elsewhere keeps
    the 1.0.0 rule (the tests compare the two to show a case really tells them apart).
    """
    for name in ("video_args_preprocessor", "audio_args_preprocessor"):
        pre = getattr(model, name, None)
        if isinstance(pre, MultiModalTransformerArgsPreprocessor):
            pre.prepare = types.MethodType(_prepare_1_2_0, pre)
    return model


# ---------------------------------------------------------------- LTX-2.5 text path (upstream main)
# ltx-core 1.0.0 has no Gemma 4 path; these are main's `text_encoders/gemma` rules, written from reading it.


def gemma_tokenize_main(tokenizer, text: str, max_length: int) -> tuple[list[int], list[int]]:
    """`LTXGemmaTokenizer.tokenize_with_weights` (tokenizer.py, main): strip, tokenize unpadded with
    truncation, prepend `<bos>` when the tokenizer did not (Gemma 4 does not), cut to max_length, then
    left-pad to max_length. Returns (ids, attention mask)."""
    text = text.strip()
    ids = tokenizer(text, padding=False, truncation=True, max_length=max_length)["input_ids"]
    if not ids or ids[0] != tokenizer.bos_token_id:
        ids = [tokenizer.bos_token_id, *ids][:max_length]
    tokenizer.padding_side = "left"
    padded = tokenizer.pad({"input_ids": [ids]}, padding="max_length", max_length=max_length,
                           return_attention_mask=True)
    return list(padded["input_ids"][0]), list(padded["attention_mask"][0])


def connector_inputs_main(features: torch.Tensor, mask: torch.Tensor, registers: torch.Tensor) -> torch.Tensor:
    """What main's `EmbeddingsProcessor.create_embeddings` + `_replace_padded_with_learnable_registers`
    hand the connector blocks: valid tokens stably first (`_compute_right_pad_order`), then the tiled
    learnable registers at the padded positions. `mask` (B, S) binary."""
    order = torch.argsort(mask.to(torch.int32), dim=-1, descending=True, stable=True)
    features = torch.gather(features, 1, order.unsqueeze(-1).expand_as(features))
    valid = torch.gather(mask, 1, order).unsqueeze(-1).to(features.dtype)
    tiled = registers.repeat(features.shape[1] // registers.shape[0], 1).to(features.dtype).unsqueeze(0)
    return valid * features + (1 - valid) * tiled


def without_ff_bias(connector: torch.nn.Module) -> torch.nn.Module:
    """Main's `connector_ff_bias=False` (LTX-2.5) on a 1.0.0 `Embeddings1DConnector`: its blocks'
    feed-forward Linears without bias are the 1.0.0 ones with the biases held at zero."""
    with torch.no_grad():
        for name, param in connector.named_parameters():
            if ".ff." in name and name.endswith(".bias"):
                param.zero_()
    return connector


# ---------------------------------------------------------------- guidance (ltx-core main / 1.2.0)


def multimodal_calculate_main(guider, cond: torch.Tensor, uncond, perturbed, isolated) -> torch.Tensor:
    """`MultiModalGuider.calculate` as main has it, before its final cast back to the model dtype.

    1.0.0 combines the passes in the model's dtype (bf16 on real runs): `cond - perturbed` and the
    std ratio of the rescale lose most of their bits to cancellation there. Main upcasts every pass
    to float32 first, combines, and casts the result back (`pred.to(dtype)`). The engine's combine is
    float32 throughout and its sampler steps in float32, so it keeps the float32 result; the math and
    its order are 1.0.0's (held by the float32 parity tests), only the dtype rule is main's.
    """
    def f32(t):
        return t.float() if isinstance(t, torch.Tensor) else t

    return guider.calculate(f32(cond), f32(uncond), f32(perturbed), f32(isolated))


# ---------------------------------------------------------------- samplers on LTX-2.5 (upstream after 1.2.0)

# 1.2.0: the distilled pipeline's stage 1 on LTX-2.5 ran ancestral Euler (eta 1, re-noise seed + 10000); its
# stage 2, and DFR's stages 1 and 2, ran plain Euler. Upstream v1.4+ (`distilled.py` `_sampler_kwargs` /
# `ancestral_sampler_kwargs`, `dfr_pipeline.py` the same) samples EVERY pass of an LTX-2.5 pipeline
# ancestrally, each pass from its own offset "so no two of them inject the same noise"; the MLX port
# follows it (`ANCESTRAL_STAGE_2_NOISE_SEED_OFFSET = 20000`). 1.0.0 has no ancestral stepper at all, so the
# step is the oracle of test_sampling_parity; the loop is `euler_ancestral_denoising_loop`'s order written
# out below. Why follow it: it is what the 2.5 distilled checkpoint was trained to be sampled with.
ANCESTRAL_ETA = 1.0
STAGE_NOISE_SEED_OFFSETS = {"stage1": 10000, "stage2": 20000}


def ancestral_sampler_main(generation: str, stage: str) -> tuple[str, int] | None:
    """(sampler, re-noise seed offset) of a distilled pass on `generation` as upstream main picks it;
    None where main samples plain Euler (every pass below LTX-2.5)."""
    if tuple(int(x) for x in generation.split(".")[:2]) < (2, 5):
        return None
    return "euler_ancestral", STAGE_NOISE_SEED_OFFSETS[stage]


def ancestral_loop_step_main(sample, denoised, clean, mask, sigmas, step_index, noise, stepper):
    """One step of main's `euler_ancestral_denoising_loop`: x0 blended toward the clean conditioning
    (`denoised * mask + clean * (1 - mask)`), the ancestral step, and (not the last step) the blend
    applied again to its output, so conditioning tokens stay clean."""
    x0 = denoised * mask + clean * (1 - mask)
    out = stepper.step(sample, x0, sigmas, step_index, noise=noise)
    if float(sigmas[step_index + 1]) != 0:
        out = out * mask + clean * (1 - mask)
    return out


def temporal_region_mask(state, tools, start_time: float, end_time: float, fps: float):
    """`TemporalRegionMask.apply_to` of ltx-pipelines 1.0.0 (retake.py; later ltx-core's
    conditioning/types/temporal_region_mask.py, the same rule). ltx-pipelines is not installed (its
    `__init__` imports every pipeline), so the rule is written here on ltx-core 1.0.0's own patchifier
    bounds and `get_pixel_coords`: mask 1 where a token's [t_start, t_end) seconds overlap [start, end)."""
    from ltx_core.components.patchifiers import get_pixel_coords

    coords = tools.patchifier.get_patch_grid_bounds(tools.target_shape, device=state.denoise_mask.device)
    if coords.shape[1] == 1:  # audio: the patchifier's bounds are seconds already
        t_start, t_end = coords[:, 0, :, 0], coords[:, 0, :, 1]
    else:
        pixel = get_pixel_coords(coords, tools.scale_factors, causal_fix=tools.causal_fix)
        t_start, t_end = (pixel[0, 0] / fps).unbind(dim=-1)
    in_region = (t_end > start_time) & (t_start < end_time)
    out = state.clone()
    out.denoise_mask.copy_(in_region.to(out.denoise_mask.dtype).reshape(out.denoise_mask.shape))
    return out


def downsample_mask_to_latent(mask: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
    """`ICLoraPipeline._downsample_mask_to_latent` of ltx-pipelines 1.0.0 (ic_lora.py; not installed, see
    `temporal_region_mask`), moved unchanged to `iclora_utils.downsample_mask_video_to_latent` (commit
    7df34df, 1.2.0; `--control-mask` follows it): a (B, 1, F, H, W) [0, 1] mask area-pooled to the latent's h x w, the first
    frame kept, each later group of (F - 1) / (f - 1) frames averaged, flattened (B, f*h*w)."""
    from einops import rearrange

    b, f_pix = mask.shape[0], mask.shape[2]
    down = torch.nn.functional.interpolate(rearrange(mask, "b 1 f h w -> (b f) 1 h w"), size=(height, width), mode="area")
    down = rearrange(down, "(b f) 1 h w -> b 1 f h w", b=b)
    first = down[:, :, :1]
    if f_pix > 1 and frames > 1:
        rest = rearrange(down[:, :, 1:], "b 1 (f t) h w -> b 1 f t h w", t=(f_pix - 1) // (frames - 1)).mean(dim=3)
        first = torch.cat([first, rest], dim=2)
    return rearrange(first, "b 1 f h w -> b (f h w)")


# ---------------------------------------------------------------- dev two-stage recipes' stage 2 (ltx-pipelines)
# Read from Lightricks/LTX-2: `ti2vid_two_stages.py` at 1.0.0 (4dbd99e) and main (1.2.0), and
# `ti2vid_two_stages_hq.py` at its first version (d230aec, still 1.0.0) and main. No code to patch: the
# farm's planner follows main, and tests/parity/test_stage2_rules.py holds its plan to these.

STAGE2_AUDIO_1_0_0 = "re-noised at the first stage-2 sigma, denoised with the video, stage 2's audio decoded"
STAGE2_AUDIO_MAIN = "re-noised at the first stage-2 sigma, denoised with the video, discarded: stage 1's decoded"
"""Main's `video_state, _ = self.stage_2(...)` ("Stage 2 refines video only; discard its audio"): the
stage-2 audio still feeds the video's audio->video cross-attention at every step, so it is denoised, but
the render's audio is stage 1's, which saw the whole clip (the multi-GPU path's stage 2 sees tiles).
1.0.0 decoded `audio_state` from stage 2. The MLX port cites a later upstream (v1.4.0 `freeze_audio=True`)
that freezes it; that code is not readable here, so the farm follows main's 1.2.0."""

STAGE2_LORAS_1_0_0_HQ = ("user LoRAs", "distilled@stage-1 strength", "user LoRAs", "distilled@stage-2 strength")
STAGE2_LORAS_MAIN = ("user LoRAs", "distilled@stage-2 strength")
"""HQ's first version built stage 2 as `stage_1_model_ledger.with_loras((*loras, distilled_stage_2))`, and
`with_loras` appends: the user's LoRAs twice and both distilled strengths (0.25 + 0.5). Main builds each
stage from the dev checkpoint with `(*loras, distilled_lora_stage_N)`: stage 1 at 0.25, stage 2 at 0.5
(two-stage: stage 1 the user's LoRAs alone, stage 2 `(*loras, *distilled_lora)` at its given strength, 1)."""


def stage2_audio_main(stage1_audio, stage2_audio):
    """The audio latent main decodes after a two-stage render: stage 1's (1.0.0: `stage2_audio`)."""
    del stage2_audio
    return stage1_audio


# ---------------------------------------------------------------- conditioning and noiser (ltx-core 1.1.6, f4b06fb)
# 1.0.0's conditioning items wrote the image into the noisy `latent` as well as `clean_latent`, and its
# `GaussianNoiser` blended noise into `latent` by sigma x mask. Since 1.1.6 (commit f4b06fb,
# conditioning/types/latent_cond.py, keyframe_cond.py, reference_video_cond.py, components/noisers.py)
# a replaced frame (`VideoConditionByLatentIndex`) leaves `latent` as it was, an appended one (keyframe,
# IC-LoRA reference, reference audio) appends zeros there, and the noiser lerps: first from the token's
# own latent toward the noise by sigma, then from the clean value toward that by the mask. Both agree at
# strength 1 (mask 0) or sigma 1; a stage that starts below sigma 1 (distilled stage 2 at 0.909) with an
# image below strength 1 starts its conditioned tokens from the stage's latent rather than the image.
# Why follow it: it is the rule upstream's released pipelines run (and the MLX port with them).


def conditioned_1_1_6(item, state, tools):
    """`item.apply_to(state, tools)` of a 1.0.0 conditioning item (or the attention-strength wrapper
    around one) under 1.1.6's latent rule: the tokens it had keep `state.latent`, the ones it appends
    get zeros; clean values, mask, positions and attention mask stay as 1.0.0 sets them."""
    out = item.apply_to(state, tools)
    kept = state.latent.shape[1]
    return replace(out, latent=torch.cat([state.latent, torch.zeros_like(out.latent[:, kept:])], dim=1))


def gaussian_noiser_1_1_6(state, noise: torch.Tensor, noise_scale: float):
    """`GaussianNoiser.__call__` of 1.1.6 with its drawn noise given: lerp(clean, lerp(latent, noise,
    scale), mask) in float32, cast back to the latent's dtype."""
    latent = torch.lerp(state.latent.float(), noise.float(), noise_scale)
    latent = torch.lerp(state.clean_latent.float(), latent, state.denoise_mask)
    return replace(state, latent=latent.to(state.latent.dtype))


# ---------------------------------------------------------------- tiled video encode (ltx-core 1.2.0, 2362161)
# 1.0.0's `prepare_tiles_for_encoding` split the video in pixels (time: each tile but the last one frame
# longer) and dropped a tile's spoiled edge latents with 0/1 masks, raising small overlaps to 16 frames /
# 64 px. 1.2.0 (commit 2362161; CHANGELOG "size-, count-, and automatic-tiling APIs"; model/video_vae/
# video_vae.py and ltx_core/tiling.py) splits the LATENT grid, by size (`TileSizeConfig`, pixel sizes
# floor-divided by the VAE factors, tile at least max(2, overlap + 1) cells) or by count (`TileCountConfig`,
# `split_by_count`), time causally (`split_temporal_causal`: tiles after the first start one cell earlier,
# left ramp + 1); maps cells [b, e) to pixels [8b, 1 + 8(e - 1)) and [32b, 32e); weights each latent tile by
# trapezoid masks (`compute_trapezoidal_mask_1d`, time's left ramp from 0) and divides by their sum unless
# the masks partition unity axis by axis (`masks_are_complementary`, atol 1e-5). Overlaps below 16 frames /
# 64 px are refused (`_validate_overlap`). ltx-core 1.0.0 has none of it, so it is written here in torch.


def trapezoid_1_2_0(length: int, left: int, right: int, left_from_zero: bool) -> torch.Tensor:
    """`compute_trapezoidal_mask_1d`: linspace fade-in (from 0 for causal time) and fade-out."""
    left, right = max(0, min(left, length)), max(0, min(right, length))
    mask = torch.ones(length)
    if left > 0:
        fade = torch.linspace(0.0, 1.0, left + 1 if left_from_zero else left + 2)[:-1]
        mask[:left] *= fade if left_from_zero else fade[1:]
    if right > 0:
        mask[-right:] *= torch.linspace(1.0, 0.0, right + 2)[1:-1]
    return mask.clamp_(0, 1)


def _split_by_size_1_2_0(size: int, overlap: int, length: int) -> list[tuple[int, int, int, int]]:
    if length <= size:
        return [(0, length, 0, 0)]
    amount = (length + size - 2 * overlap - 1) // (size - overlap)
    starts = [i * (size - overlap) for i in range(amount)]
    return [(s, length if i == amount - 1 else s + size, 0 if i == 0 else overlap, 0 if i == amount - 1 else overlap)
            for i, s in enumerate(starts)]


def _split_by_count_1_2_0(n: int, overlap: int, length: int) -> list[tuple[int, int, int, int]]:
    if n > length:
        raise ValueError(f"num_tiles ({n}) exceeds dim_size ({length})")
    if n == 1:
        return [(0, length, 0, 0)]
    total = length + overlap * (n - 1)
    size, rem = total // n, total % n
    if size <= overlap:
        raise ValueError("split_by_count produced size <= overlap")
    base = _split_by_size_1_2_0(size, overlap, length - rem)
    return [(s + min(i, rem), e + min(i, rem) + (1 if i < rem else 0), lr, rr) for i, (s, e, lr, rr) in enumerate(base)]


def encode_tiles_1_2_0(frames: int, height: int, width: int, axes) -> list[tuple[tuple[slice, ...], tuple[slice, ...], tuple]]:
    """`prepare_tiles_for_encoding` of 1.2.0 on a cropped video: (pixel slices, latent slices, 1-D
    masks) per tile, t slowest. `axes` per (t, h, w): None (untiled), ("size", pixels, overlap pixels)
    or ("count", tiles, overlap cells)."""
    grid = ((frames - 1) // 8 + 1, height // 32, width // 32)
    per_axis = []
    for axis, (spec, length, factor) in enumerate(zip(axes, grid, (8, 32, 32), strict=True)):
        if spec is None:
            ivs = [(0, length, 0, 0)]
        elif spec[0] == "size":
            cells = spec[2] // factor
            ivs = _split_by_size_1_2_0(max(2, cells + 1, spec[1] // factor), cells, length)
        else:
            ivs = _split_by_count_1_2_0(spec[1], spec[2], length)
        if axis == 0 and len(ivs) > 1:  # causal time: later tiles one cell earlier, left ramp + 1
            ivs = ivs[:1] + [(s - 1, e, lr + 1, rr) for s, e, lr, rr in ivs[1:]]
        per_axis.append(ivs)
    tiles = []
    for t, h, w in itertools.product(*per_axis):
        pixels = (slice(t[0] * 8, 1 + (t[1] - 1) * 8), slice(h[0] * 32, h[1] * 32), slice(w[0] * 32, w[1] * 32))
        latents = tuple(slice(iv[0], iv[1]) for iv in (t, h, w))
        masks = tuple(trapezoid_1_2_0(iv[1] - iv[0], iv[2], iv[3], i == 0) for i, iv in enumerate((t, h, w)))
        tiles.append((pixels, latents, masks))
    return tiles


def tiled_encode_blend_1_2_0(tiles, latents, shape) -> torch.Tensor:
    """`VideoEncoder.tiled_encode`'s accumulation: latent x masks summed (axis by axis, float32), divided
    by the summed masks (clamped at 1e-8) unless `masks_are_complementary`."""
    out, weight = torch.zeros(shape), torch.zeros(shape)
    for (_, latent_cut, masks), latent in zip(tiles, latents, strict=True):
        where = (slice(None), slice(None), *latent_cut)
        t, h, w = masks
        out[where] += latent * t.view(-1, 1, 1) * h.view(1, -1, 1) * w.view(1, 1, -1)
        weight[where] += torch.ones_like(latent) * t.view(-1, 1, 1) * h.view(1, -1, 1) * w.view(1, 1, -1)
    for axis, length in enumerate(shape[2:]):
        acc, seen = torch.zeros(length), set()
        for _, latent_cut, masks in tiles:
            key = (latent_cut[axis].start, latent_cut[axis].stop)
            if key not in seen:
                seen.add(key)
                acc[latent_cut[axis]] += masks[axis]
        if not torch.allclose(acc, torch.ones(length), atol=1e-5, rtol=0.0):
            return out / weight.clamp(min=1e-8)
    return out


# ---------------------------------------------------------------- samplers' steps (ltx-core 1.2.0)
# `LinearQuadraticScheduler` and `BetaScheduler` are unchanged from 1.0.0 (held against it directly).
# 1.2.0's `Res2sDiffusionStep.step` takes `eta` (1.0.0 fixed sigma_up = 0.5 sigma_next) and the res_2s
# loop passes it to the main steps only, the substeps keeping 0.5 ("for compatibility with original
# implementation"). 1.2.0 adds `EulerCfgPpDiffusionStep` (CFG++, arXiv 2406.08070), absent from 1.0.0.
# Why follow them: the samplers upstream's guided pipelines offer, so a user can pick the same one.


def res2s_step_1_2_0(sample, denoised, sigmas, step_index, noise, eta: float = 0.5):
    """1.2.0's `Res2sDiffusionStep.step` with its `eta`, on 1.0.0's own `get_sde_coeff`."""
    from ltx_core.components.diffusion_steps import Res2sDiffusionStep

    sigma, sigma_next = sigmas[step_index], sigmas[step_index + 1]
    alpha_ratio, sigma_down, sigma_up = Res2sDiffusionStep.get_sde_coeff(sigma_next, sigma_up=sigma_next * eta)
    if torch.any(sigma_up == 0) or torch.any(sigma_next == 0):
        return denoised
    eps_next = (sample - denoised) / (sigma - sigma_next)
    return (alpha_ratio * (sample - sigma * eps_next + sigma_down * eps_next) + sigma_up * noise).to(denoised.dtype)


def euler_cfg_pp_step_1_2_0(sample, cond, uncond, sigmas, step_index, eta=1.0, noise=None, s_noise=1.0):
    """1.2.0's `EulerCfgPpDiffusionStep.step`: the ODE direction from the unconditioned x0, the DDIM
    ancestral split (`_get_ancestral_step`) in sigma / alpha, the landing on the conditioned x0."""
    eps = torch.finfo(torch.float32).eps
    s, t = sigmas[step_index].to(torch.float32), sigmas[step_index + 1].to(torch.float32)
    a_s, a_t = (1.0 - s).clamp(min=eps), (1.0 - t).clamp(min=eps)
    d = (sample.float() - a_s * uncond.float()) / s
    s_from, s_to = s / a_s, t / a_t
    if eta:
        variance = s_to**2 * (s_from**2 - s_to**2).clamp(min=0) / s_from**2
        up = (eta * variance**0.5).clamp(max=s_to)
        down = (s_to**2 - up**2).clamp(min=0) ** 0.5
    else:
        down, up = s_to, torch.zeros_like(s_to)
    x_next = a_t * cond.float() + (a_t * down) * d
    if noise is not None and eta > 0 and s_noise > 0:
        x_next = x_next + a_t * noise.float() * s_noise * up
    return x_next.to(sample.dtype)


# ---------------------------------------------------------------- LoRA fusion's dtype (ltx-core 1.2.0, 63fd9a4)
# 1.0.0's `apply_loras` made each `(B * strength) @ A` in the target weight's dtype (bf16 for a bf16 DiT) and
# added it there. 1.2.0 (`loader/fuse_loras.py`: `FuseRule`, `device_fuse_rule`, `aggregate_lora_products`)
# keeps the bf16 aggregation on CPU and CUDA, but on Apple's MPS aggregates the products in float32 ("fp32
# sidesteps the bf16-on-MPS numerical unreliability"), adds the weight to the float32 sum and casts the
# result back to the weight's dtype. The farm fuses by the MPS rule on every backend: it is upstream's rule
# for the Macs the farm runs on, and one rule for every worker keeps a mixed fleet's fused weights equal.


def fuse_lora_1_2_0(weight: torch.Tensor, loras: list[tuple[torch.Tensor, torch.Tensor, float]],
                    device_type: str) -> torch.Tensor:
    """`fuse_lora_weights` of 1.2.0 for one weight on `device_type` ("mps": float32 aggregation; "cpu" /
    "cuda": bf16), `loras` as (A, B, strength) in set order; the fused weight in the weight's dtype."""
    dtype = torch.float32 if device_type == "mps" else torch.bfloat16
    aggregated = None
    for a, b, strength in loras:
        a, b = a.to(dtype), b.to(dtype)
        if aggregated is None:
            aggregated = torch.matmul(b * strength, a).to(dtype=dtype)
        else:
            aggregated.addmm_(b, a, alpha=strength)
    aggregated.add_(weight)
    return aggregated.to(dtype=weight.dtype)
