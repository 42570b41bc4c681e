"""LTX-2.5's text tower: the Gemma 4 text model a 2.5 pack carries, through mlx-lm's `gemma4_text`.

An mlx-forge 2.5 pack holds it at its top: `text_encoder.safetensors` (keys `text_encoder.` + upstream's
flat names: `model.layers.*`, `model.embed_tokens.*`, `model.norm.*`, the vision/audio branches, and the
feature extractor's `text_embedding_projection.{video,audio}_aggregate_embed`), `text_encoder_config.json`
(the checkpoint's Gemma config: `gemma4_unified`, its `text_config` is mlx-lm's `gemma4_text` args) and
the tokenizer files. Upstream (`ltx_core.text_encoders.gemma`, main) runs the language model with
`output_hidden_states=True` and feeds all `num_hidden_layers + 1` states to the same V2 feature
extractor as 2.3; its tokenizer prepends `<bos>` when Gemma 4's tokenizer adds none, then left-pads to
1024. Only the text branch loads here: encoding never reads the vision or audio towers.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ltx_engine.models.connector import TextProjection
from ltx_engine.models.connector_config import ConnectorConfig
from ltx_engine.models.text_encoder import REFERENCE_MAX_LENGTH, attention_masks, without_eos
from ltx_engine.rules.text_encoders import GEMMA4_CONFIG, GEMMA4_WEIGHTS

PREFIX = "text_encoder."
LM_PREFIXES = ("model.language_model.", "model.")   # HF nesting, or the flat names mlx-forge keeps
PROJECTION = "text_embedding_projection."


def split_tower_weights(weights: dict[str, mx.array]) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    """(language model weights under mlx-lm's `model.` names, feature-extractor weights) of a tower file;
    the vision and audio branches are left out."""
    lm, projection = {}, {}
    for key, value in weights.items():
        key = key.removeprefix(PREFIX)
        if key.startswith(PROJECTION):
            projection[key.removeprefix(PROJECTION)] = value
        elif key.startswith(LM_PREFIXES) and not key.startswith(("model.vision", "model.audio", "model.embed_vision",
                                                                  "model.embed_audio", "model.multi_modal")):
            lm["model." + key.removeprefix("model.language_model.").removeprefix("model.")] = value
    return lm, projection


def build_language_model(config: dict, weights: dict[str, mx.array], quantize: dict | None = None) -> nn.Module:
    """mlx-lm's gemma4_text Model from the tower's config (its `text_config`) and language weights."""
    from mlx_lm.models import gemma4_text

    args = gemma4_text.ModelArgs.from_dict({**config.get("text_config", config), "model_type": "gemma4_text"})
    model = gemma4_text.Model(args)
    weights = model.sanitize(dict(weights))
    if any(k.endswith(".scales") for k in weights):
        q = quantize or {}
        nn.quantize(model, group_size=int(q.get("group_size", 64)), bits=int(q.get("bits", 8)),
                    class_predicate=lambda path, _: f"{path}.scales" in weights)
    if args.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    return model


def _per_layer_inputs(gemma, input_ids: mx.array, h: mx.array) -> list:
    """Dense Gemma 4's per-layer input embeddings (none on the unified tower LTX-2.5 ships)."""
    if not gemma.hidden_size_per_layer_input:
        return [None] * len(gemma.layers)
    inputs = gemma._project_per_layer_inputs(h, gemma._get_per_layer_inputs(input_ids))
    return [inputs[:, :, i, :] for i in range(len(gemma.layers))]


def gemma4_hidden_states(model: nn.Module, input_ids: mx.array, mask: mx.array) -> list[mx.array]:
    """All hidden states as transformers returns them: the scaled embeddings, each layer's output,
    the last one final-normed. Padding-aware causal masks per layer type (sliding or full)."""
    gemma = model.model
    h = gemma.embed_tokens(input_ids)
    h = h * mx.array(gemma.embed_scale, dtype=h.dtype)
    masks = {"full_attention": attention_masks(mask, None, h.dtype),
             "sliding_attention": attention_masks(mask, gemma.window_size, h.dtype)}
    per_layer = _per_layer_inputs(gemma, input_ids, h)
    shared: list = [(None, None)] * len(gemma.layers)
    states = [h]
    for i, layer in enumerate(gemma.layers):
        kvs, offset = shared[gemma.previous_kvs[i]]
        h, kvs, offset = layer(h, masks[layer.layer_type], None, per_layer_input=per_layer[i], shared_kv=kvs,
                               offset=offset)
        shared[i] = (kvs, offset)
        mx.eval(h)  # bound the lazy graph per layer (large towers on small Macs)
        states.append(h)
    states[-1] = gemma.norm(h)
    return states


def tokenize(tokenizer, prompt: str, max_length: int = REFERENCE_MAX_LENGTH) -> tuple[mx.array, mx.array]:
    """(1, max_length) ids and mask as upstream's LTXGemmaTokenizer: strip, truncate, a leading `<bos>`
    when the tokenizer adds none (Gemma 4's does not), left-pad with the pad token."""
    ids = tokenizer(prompt.strip(), truncation=True, max_length=max_length)["input_ids"]
    bos = tokenizer.bos_token_id
    if bos is None:
        raise ValueError("the Gemma 4 tokenizer has no <bos> token: upstream's encode needs one")
    if not ids or ids[0] != bos:
        ids = [bos, *ids][:max_length]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    n = len(ids)
    return (mx.array([[pad] * (max_length - n) + ids], dtype=mx.int32),
            mx.array([[0] * (max_length - n) + [1] * n], dtype=mx.int32))


class Gemma4Tower:
    """Tokenizer + Gemma 4 language model + the feature extractor an LTX-2.5 tower file carries."""

    def __init__(self, model: nn.Module, tokenizer, projection: TextProjection, max_length: int = REFERENCE_MAX_LENGTH):
        self.model, self.tokenizer, self.projection, self.max_length = model, tokenizer, projection, max_length

    @classmethod
    def load(cls, folder: Path, max_length: int = REFERENCE_MAX_LENGTH) -> Gemma4Tower:
        """The tower of the pack at `folder`, offline."""
        from transformers import PreTrainedTokenizerFast

        folder = Path(folder)
        config = json.loads((folder / GEMMA4_CONFIG).read_text())
        lm, proj = split_tower_weights(mx.load(str(folder / GEMMA4_WEIGHTS)))
        quantize = folder / "quantize_config.json"
        model = build_language_model(config, lm, json.loads(quantize.read_text()) if quantize.is_file() else None)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
        return cls(model, tokenizer, load_projection(proj), max_length)

    def token_count(self, prompt: str) -> int:
        """The tokens `tokenize` gives the prompt before padding or truncation (its `<bos>` in, a trailing
        EOS out): Prompt Relay counts a segment's columns with it."""
        ids = self.tokenizer(prompt.strip())["input_ids"]
        return without_eos(self.tokenizer, ids) + (0 if ids and ids[0] == self.tokenizer.bos_token_id else 1)

    def hidden_states(self, prompt: str) -> tuple[list[mx.array], mx.array]:
        """All Gemma 4 hidden states (num_hidden_layers + 1 arrays of (1, L, hidden)) and the (1, L) mask."""
        ids, mask = tokenize(self.tokenizer, prompt, self.max_length)
        return gemma4_hidden_states(self.model, ids, mask), mask


def load_projection(weights: dict[str, mx.array]) -> TextProjection:
    """The V2 feature extractor from the tower's `text_embedding_projection` tensors, at their sizes."""
    video, audio = weights["video_aggregate_embed.weight"], weights["audio_aggregate_embed.weight"]
    proj = TextProjection(ConnectorConfig(video_dim=video.shape[0], audio_dim=audio.shape[0],
                                          text_features=video.shape[1]))
    proj.load_weights(list(weights.items()), strict=True)
    return proj


# ---------------------------------------------------------------- the tiny tower of `farm pack tiny --variant 2.5`

def tiny_gemma4_config(vocab_size: int) -> dict:
    """A Gemma 4 unified config whose `text_config` is a tiny gemma4_text: 3 layers (sliding, sliding,
    full with a wider head and proportional partial RoPE), width 64, no per-layer inputs, no KV sharing."""
    text = {
        "model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 3, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "global_head_dim": 64,
        "rms_norm_eps": 1e-6, "vocab_size": vocab_size, "vocab_size_per_layer_input": vocab_size,
        "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "sliding_window": 16,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"}},
        "max_position_embeddings": 4096, "attention_k_eq_v": False, "use_double_wide_mlp": False,
        "enable_moe_block": False, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "hidden_activation": "gelu_pytorch_tanh",
    }
    return {"model_type": "gemma4_unified", "gemma_version": "gemma4-tiny-ltx", "text_config": text}


def tiny_gemma4_weights(config: dict, video_dim: int, audio_dim: int, seed: int) -> dict[str, mx.array]:
    """Seeded float32 tower weights under the pack's keys (`text_encoder.` + flat upstream names),
    the feature extractor's aggregate embeds included."""
    from mlx_lm.models import gemma4_text

    rng = np.random.default_rng(seed)
    text = config["text_config"]
    params = dict(tree_flatten(gemma4_text.Model(gemma4_text.ModelArgs.from_dict(text)).parameters()))
    out = {}
    for key, value in sorted(params.items()):
        std = 0.1 if value.ndim == 1 else value.shape[-1] ** -0.5
        base = 1.0 if key.endswith("layer_scalar") else 0.0
        out[PREFIX + key] = mx.array(base + rng.standard_normal(value.shape).astype(np.float32) * std)
    features = text["hidden_size"] * (text["num_hidden_layers"] + 1)
    for name, dim in (("video", video_dim), ("audio", audio_dim)):
        out[f"{PREFIX}{PROJECTION}{name}_aggregate_embed.weight"] = mx.array(
            rng.standard_normal((dim, features)).astype(np.float32) * features**-0.5)
        out[f"{PREFIX}{PROJECTION}{name}_aggregate_embed.bias"] = mx.array(
            rng.standard_normal((dim,)).astype(np.float32) * 0.1)
    return out


def write_tiny_tower(folder: Path, video_dim: int, audio_dim: int, seed: int, dtype: mx.Dtype = mx.float32) -> None:
    """Write the tiny Gemma 4 tower into a pack folder the way mlx-forge lays out a 2.5 pack."""
    from ltx_engine.tiny.tiny_tokenizer import tiny_vocab_size, write_tiny_tokenizer

    folder = Path(folder)
    write_tiny_tokenizer(folder, bos=False)  # Gemma 4's tokenizer adds no <bos>: the encoder prepends it
    config = tiny_gemma4_config(tiny_vocab_size())
    (folder / GEMMA4_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = {k: v.astype(dtype) for k, v in tiny_gemma4_weights(config, video_dim, audio_dim, seed).items()}
    mx.save_safetensors(str(folder / GEMMA4_WEIGHTS), weights, {"format": "mlx"})
