"""`farm pack tiny`: a pack with the real files, key names and configs at tiny sizes, seeded weights.

The models are built from the tiny configs by the same classes that load real packs, their weights are
drawn from one seeded generator, written under the real component prefixes, and read back by the
same strict loader. q8 / q4 variants quantize the Linear layers inside the transformer blocks only,
as mlx-forge does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ltx_engine.loading.loader import quantize_weights
from ltx_engine.loading.model_classes import model_class
from ltx_engine.rules.components import PARTS
from ltx_engine.tiny import tiny_hdr_lora  # the tiny HDR IC-LoRA of a 2.5 pack

TINY_GEMMA_LAYERS_KEY = "num_hidden_layers"
FIXED_BUFFERS = ("basis", "window", "filter", "mel_")


VARIANTS = ("2.3", "2.5")
# What an LTX-2.5 transformer config changes against 2.3 (the reference configurator's keys): no video
# FF biases and the learned keyframe marker that generated keyframe slots (DFR) need.
LTX25_TRANSFORMER = {"ff_bias": False, "audio_ff_bias": True, "use_keyframes_abs_pos_embedding": True}
LTX25_CONNECTOR = {"connector_ff_bias": False}  # the 2.5 connectors' feed-forwards have no biases
TINY_DURATION_HEAD = {"pooler_hidden_dim": 32, "num_queries": 1, "num_pooler_heads": 4, "mlp_hidden": 32}
TINY_DURATION_LOG_SECONDS = 0.75  # the tiny head's output bias: exp(0.75) ~ 2.1 s, 49 frames at 24 fps

# The video DiT's size (heads x head width, depth); everything else in the pack stays tiny. "tiny" is the
# tiny pack's; "bench" is wide and deep enough that the DiT is the bulk of a render on a CPU core (as on
# a real pack), so `farm bench scale` measures the stages that scale, with the same files, loader and
# stage graph. Every block Linear input width stays a multiple of 32 (q8 / q4 quantize all of them).
DIT_SIZES = {"tiny": {"num_attention_heads": 2, "attention_head_dim": 32, "num_layers": 2},
             "bench": {"num_attention_heads": 4, "attention_head_dim": 64, "num_layers": 8}}


def tiny_embedded_config(variant: str = "2.3", dit: str = "tiny") -> dict:
    """The embedded (reference) config of the tiny pack: every model size comes from here; `dit` picks
    the video DiT's size (DIT_SIZES)."""
    from ltx_engine.models import audio_vae, connector_config, transformer, video_vae, vocoder
    from ltx_engine.models.text_encoder import tiny_gemma_config

    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny pack variant {variant!r} (one of {', '.join(VARIANTS)})")
    if dit not in DIT_SIZES:
        raise ValueError(f"unknown tiny pack DiT size {dit!r} (one of {', '.join(DIT_SIZES)})")
    cfg: dict = {"transformer": transformer.tiny_config() | DIT_SIZES[dit], "vae": video_vae.tiny_config()}
    if variant == "2.5":
        cfg["transformer"].update(LTX25_TRANSFORMER | LTX25_CONNECTOR)
        cfg["duration_head"] = dict(TINY_DURATION_HEAD)
    cfg.update(audio_vae.tiny_config())
    cfg.update(vocoder.tiny_config())
    gemma = tiny_gemma_config()
    tcfg = cfg["transformer"]
    video_dim = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
    audio_dim = tcfg["audio_num_attention_heads"] * tcfg["audio_attention_head_dim"]
    tcfg["cross_attention_dim"] = video_dim  # the text context comes through the connector at the video width
    conn = connector_config.tiny_connector_config(gemma["hidden_size"], gemma[TINY_GEMMA_LAYERS_KEY], video_dim, audio_dim,
                                                  heads=tcfg["num_attention_heads"])
    tcfg.update(conn)
    return cfg


def _seeded_like(params: dict[str, mx.array], seed: int) -> dict[str, mx.array]:
    """Replace every parameter with a seeded draw of a sensible scale (fan-in for matrices)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in sorted(params.items()):
        shape = tuple(value.shape)
        leaf = name.rsplit(".", 1)[-1]
        if any(word in name for word in FIXED_BUFFERS):  # analysis bases and filters keep their values
            out[name] = value
            continue
        if "std" in leaf:
            arr = 1.0 + 0.1 * np.abs(rng.standard_normal(shape))
        elif "mean" in leaf or leaf == "bias" or leaf.endswith("_bias"):
            arr = 0.02 * rng.standard_normal(shape)
        elif len(shape) <= 1:  # norm scales and small tables
            arr = (1.0 if "norm" in name or leaf in ("weight", "gamma") else 0.0) + 0.05 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            arr = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
        out[name] = mx.array(arr.astype(np.float32))
    return out


def _build(component: str, cfg: dict, upsampler_cfg: dict | None) -> tuple[nn.Module, callable]:
    """The model of a component at the tiny config (the class a real pack loads into) and its
    model → pack key transform (identity where the pack keeps the model's names)."""
    cls = model_class(component)
    model = cls.from_config(upsampler_cfg if upsampler_cfg is not None else cfg)
    return model, getattr(cls, "model_to_pack", lambda weights: weights)

def tiny_dit(seed: int = 0, dtype: mx.Dtype = mx.bfloat16) -> nn.Module:
    """The tiny pack's DiT as `write_tiny_pack(seed=seed)` writes it (its seeded weights, in `dtype`),
    built in memory: what the worker's determinism fingerprint runs (ltx_engine/fingerprint.py)."""
    model, _ = _build("transformer", tiny_embedded_config(), None)
    model.update(tree_unflatten(list(_seeded_like(dict(tree_flatten(model.parameters())), seed * 100).items())))
    model.set_dtype(dtype)
    return model


def standard_stem(component: str) -> str:
    """The file stem the standard layout (mlx-forge's current names) gives a component."""
    return PARTS[component].example.removesuffix(".safetensors")


def _write_component(folder: Path, component: str, weights: dict[str, mx.array], dtype: mx.Dtype) -> None:
    stem = standard_stem(component)
    prefix = PARTS[component].prefix or stem
    cast = {
        f"{prefix}.{k}": (v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v)
        for k, v in weights.items()
    }
    mx.eval(cast)
    mx.save_safetensors(str(folder / f"{stem}.safetensors"), cast, metadata={"format": "mlx"})


TINY_COMPONENTS = ("transformer", "connector", "vae_decoder", "vae_encoder", "audio_vae", "vocoder",
                   "spatial_upscaler", "temporal_upscaler")


def write_tiny_pack(folder: str | Path, seed: int = 0, bits: int | None = None, group_size: int = 32,
                    dtype: mx.Dtype = mx.bfloat16, variant: str = "2.3", layout: str = "standard",
                    dit: str = "tiny") -> Path:
    """Write the tiny pack into `folder` (replacing what is there); `bits` 8 or 4 quantizes the DiT.

    `variant` "2.5" gives the LTX-2.5 DiT layout (keyframe marker, bias-free video FF) that DFR needs,
    the 2.5 connector (bias-free FF, no projection) and a tiny Gemma 4 tower in the real layout. `layout` rearranges the
    files as another real pack holds them (`ltx_engine.tiny.tiny_layouts.LAYOUTS`); the path returned is
    the pack to open (for `hf-cache`, the snapshot folder inside the cache). `dit` sizes the video DiT
    (DIT_SIZES: "bench" for a DiT that dominates a render); the other components stay tiny."""
    from ltx_engine.tiny.tiny_layouts import LAYOUTS

    if layout not in LAYOUTS:
        raise ValueError(f"unknown tiny pack layout {layout!r} (one of {', '.join(LAYOUTS)})")
    from ltx_engine.models import upsampler
    from ltx_engine.models.text_encoder import write_tiny_text_encoder

    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    cfg = tiny_embedded_config(variant, dit)
    up_cfgs = {"spatial_upscaler": upsampler.tiny_spatial_config(), "temporal_upscaler": upsampler.tiny_temporal_config()}
    components = TINY_COMPONENTS + (("duration_head",) if variant == "2.5" else ())
    for index, component in enumerate(components):
        model, to_pack = _build(component, cfg, up_cfgs.get(component))
        model.update(tree_unflatten(list(_seeded_like(dict(tree_flatten(model.parameters())), seed * 100 + index).items())))
        if component == "duration_head":  # ~2 s from any prompt: a picked length differs from the 25-frame default
            model.mlp_out.bias = mx.full((1,), TINY_DURATION_LOG_SECONDS)
        if component == "transformer" and bits:
            from ltx_engine.models.transformer import quantizable

            model.apply(lambda x: x.astype(dtype) if mx.issubdtype(x.dtype, mx.floating) else x)
            quantize_weights(model, bits=bits, group_size=group_size, predicate=quantizable)
        weights = to_pack(dict(tree_flatten(model.parameters())))
        weights = _file_weights(component, weights, cfg, seed, variant)
        _write_component(folder, component, weights, dtype)
    for component, ucfg in up_cfgs.items():
        (folder / f"{standard_stem(component)}_config.json").write_text(json.dumps(ucfg, indent=2))
    (folder / "embedded_config.json").write_text(json.dumps(cfg, indent=2))
    version = f"{variant}.0"  # mlx-forge records the checkpoint's model_version in both files
    (folder / "config.json").write_text(json.dumps(
        {"model_type": f"ltx-{variant}", "model_version": version, "variant": "tiny", "seed": seed}
        | ({} if dit == "tiny" else {"dit": dit}), indent=2))
    (folder / "split_model.json").write_text(json.dumps(
        {"source": "farm pack tiny", "model_version": version, "variant": "distilled",
         "components": list(components)}, indent=2))
    if bits:
        (folder / "quantize_config.json").write_text(json.dumps(
            {"bits": bits, "group_size": group_size, "scope": "transformer_blocks"}, indent=2))
    if variant == "2.5":
        _write_25_extras(folder, cfg["transformer"], seed)
    else:
        write_tiny_text_encoder(folder / "text_encoder", seed)
    return LAYOUTS[layout](folder, seed)


def _write_25_extras(folder: Path, tcfg: dict, seed: int) -> None:
    """What a 2.5 pack holds beyond 2.3's: the Gemma 4 tower at the pack's top (as mlx-forge writes it),
    2.5's file names, the detailing and HDR IC-LoRAs, the diffusion decoder."""
    from ltx_engine.models.gemma4 import write_tiny_tower

    write_tiny_tower(folder, tcfg["num_attention_heads"] * tcfg["attention_head_dim"],
                     tcfg["audio_num_attention_heads"] * tcfg["audio_attention_head_dim"], seed)
    _ltx25_names(folder)
    write_detailing_lora(folder / DETAILING_LORA, tcfg, seed)
    tiny_hdr_lora.write_hdr_lora(folder / tiny_hdr_lora.HDR_LORA_FILE, tcfg, seed)
    write_diffusion_decoder(folder, seed)


def _file_weights(component: str, weights: dict, cfg: dict, seed: int, variant: str) -> dict:
    """What a component's file holds beyond (or short of) its model's own weights."""
    if component == "audio_vae":  # the encoder beside the decoder, from a seed of its own
        return weights | _tiny_audio_encoder(cfg, seed)
    if component == "connector" and variant == "2.5":  # its aggregate embeds live in the Gemma 4 tower file
        return {k: v for k, v in weights.items() if not k.startswith("text_embedding_projection.")}
    return weights


AUDIO_ENCODER_SEED_OFFSET = 90  # past every component index, so no other component's draw moves


def _tiny_audio_encoder(cfg: dict, seed: int) -> dict[str, mx.array]:
    """`encoder.*` weights of the tiny audio VAE (its statistics are the decoder's, written once)."""
    from ltx_engine.models.audio_encoder import AudioEncoder

    model = AudioEncoder.from_config(cfg)
    params = {k: v for k, v in tree_flatten(model.parameters()) if not k.startswith("per_channel_statistics.")}
    return AudioEncoder.model_to_pack(_seeded_like(params, seed * 100 + AUDIO_ENCODER_SEED_OFFSET))


DIFFUSION_DECODER_SEED_OFFSET = 91  # its own draw: no other component's weights move


def write_diffusion_decoder(folder: Path, seed: int, dtype: mx.Dtype = mx.bfloat16) -> None:
    """A tiny `vae_decoder_av.safetensors` in the MLX packs' layout (`vae_decoder_av.` keys, fused qkv)
    with its architecture in the file's `config` metadata, as a real 2.5 pack ships it."""
    from ltx_engine.models.diffusion_decoder import DiffusionVideoDecoder, tiny_config

    cfg = tiny_config()
    params = dict(tree_flatten(DiffusionVideoDecoder(cfg).parameters()))
    weights = _seeded_like(params, seed * 100 + DIFFUSION_DECODER_SEED_OFFSET)
    cast = {f"vae_decoder_av.{k}": v.astype(dtype) for k, v in DiffusionVideoDecoder.pack_to_model(weights).items()}
    mx.eval(cast)
    mx.save_safetensors(str(folder / "vae_decoder_av.safetensors"), cast,
                        metadata={"format": "mlx", "config": json.dumps({"vae": cfg.to_vae()})})


DETAILING_LORA = "ltx-2.5-22b-ic-lora-pixel-spatial-upscaler.safetensors"


def write_detailing_lora(path: Path, tcfg: dict, seed: int, rank: int = 4) -> None:
    """A tiny x2 detailing IC-LoRA in the reference's layout: `diffusion_model.<module>.lora_A/B.weight`
    on every block's video self-attention projections, `reference_downscale_factor` 2 in its metadata."""
    rng = np.random.default_rng(seed + 4242)
    dim = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
    tensors = {}
    for block in range(tcfg["num_layers"]):
        for module in ("to_q", "to_k", "to_v", "to_out.0"):
            key = f"diffusion_model.transformer_blocks.{block}.attn1.{module}"
            tensors[f"{key}.lora_A.weight"] = mx.array((rng.standard_normal((rank, dim)) / np.sqrt(dim)).astype(np.float32))
            tensors[f"{key}.lora_B.weight"] = mx.array((0.5 * rng.standard_normal((dim, rank))).astype(np.float32))
    tensors = {k: v.astype(mx.bfloat16) for k, v in tensors.items()}
    mx.eval(tensors)
    mx.save_safetensors(str(path), tensors, metadata={"reference_downscale_factor": "2"})


def _ltx25_names(folder: Path) -> None:
    """The file names a 2.5 pack gives its conv VAE (`vae_decoder_conv` / `vae_encoder_conv`, keys under
    the same prefix), in place of 2.3's `vae_decoder` / `vae_encoder`."""
    from ltx_engine.tiny.tiny_layouts import _reprefix

    for stem in ("vae_decoder", "vae_encoder"):
        _reprefix(folder, stem, f"{stem}_conv")
        (folder / f"{stem}.safetensors").unlink()
