"""Gemma 3 hidden states through mlx-lm, and the prompt -> DiT context path.

The reference (`GemmaTextEncoder.encode` + `LTXVGemmaTokenizer`) strips the prompt, tokenizes it with
`<bos>`, left-pads with the pad token to 1024 tokens (truncating on the right), runs the Gemma
decoder with a causal + padding mask and positions 0..L-1, and keeps all `num_hidden_layers + 1`
hidden states as transformers returns them: the scaled embeddings, the outputs of layers 0..N-2
and the final-normed output of the last layer. We reuse mlx-lm's Gemma 3 modules (loaded with
`mlx_lm.utils.load_model`, so quantized community checkpoints work) and only run the loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ltx_engine.models.connector import TextConnector

# Sequence length the reference tokenizer pads and truncates to (module_ops_from_gemma_root).
REFERENCE_MAX_LENGTH = 1024


def _gemma_backbone(model: nn.Module) -> nn.Module:
    """The `Gemma3Model` (embed_tokens, layers, norm) inside an mlx-lm gemma3 or gemma3_text Model."""
    if "language_model" in model:
        model = model.language_model
    return model.model


def attention_masks(mask: mx.array, window: int | None, dtype: mx.Dtype) -> mx.array:
    """Additive (B, 1, L, L) mask: causal, keys that are real tokens, and within `window` if given.

    Finite (not -inf) so that fully masked rows of left padding stay finite instead of NaN.
    """
    length = mask.shape[1]
    q = mx.arange(length)[:, None]
    k = mx.arange(length)[None, :]
    allowed = k <= q
    if window is not None:
        allowed = allowed & (q - k < window)
    allowed = allowed[None, None] & (mask[:, None, None, :] > 0)
    return mx.where(allowed, mx.array(0.0, dtype), mx.array(mx.finfo(dtype).min, dtype))


def gemma_hidden_states(model: nn.Module, input_ids: mx.array, mask: mx.array) -> list[mx.array]:
    """Run Gemma 3 (mlx-lm modules) and return all hidden states, as transformers' `hidden_states`."""
    gemma = _gemma_backbone(model)
    args = gemma.args
    h = gemma.embed_tokens(input_ids)
    # transformers casts the sqrt(hidden) scale to the embedding dtype (55.4256 -> 55.5 in bf16).
    h = h * mx.array(args.hidden_size**0.5, dtype=h.dtype)
    pattern = args.sliding_window_pattern
    full_mask = attention_masks(mask, None, h.dtype)
    sliding_mask = attention_masks(mask, args.sliding_window, h.dtype)
    states = [h]
    for i, layer in enumerate(gemma.layers):
        is_global = i % pattern == pattern - 1
        h = layer(h, full_mask if is_global else sliding_mask, None)
        mx.eval(h)  # bound the lazy graph per layer (large models on small Macs)
        states.append(h)
    states[-1] = gemma.norm(h)
    return states


def without_eos(tokenizer, ids: list[int]) -> int:
    """How many of `ids` precede a trailing EOS (the port's adjustment: an EOS would shift every later
    segment's columns by one)."""
    eos = tokenizer.eos_token_id
    return len(ids) - 1 if len(ids) > 1 and eos is not None and ids[-1] == eos else len(ids)


class TextEncoder:
    """Tokenizer + Gemma 3 (mlx-lm) from one local folder; yields per-layer hidden states."""

    def __init__(self, model: nn.Module, tokenizer, max_length: int = REFERENCE_MAX_LENGTH):
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length

    @classmethod
    def load(cls, folder: Path, max_length: int = REFERENCE_MAX_LENGTH) -> TextEncoder:
        """Load an mlx-lm Gemma 3 checkpoint and its tokenizer from `folder`, offline."""
        from mlx_lm.utils import load_model
        from transformers import AutoTokenizer

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder}: no config.json (expected an mlx-lm Gemma 3 checkpoint)")
        model, _ = load_model(folder)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, model_max_length=max_length)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return cls(model, tokenizer, max_length)

    def tokenize(self, prompt: str) -> tuple[mx.array, mx.array]:
        """(1, max_length) token ids and binary mask, left padded, as the reference tokenizer."""
        enc = self.tokenizer(
            prompt.strip(), padding="max_length", max_length=self.max_length, truncation=True
        )
        return mx.array([enc["input_ids"]], dtype=mx.int32), mx.array([enc["attention_mask"]], dtype=mx.int32)

    def token_count(self, prompt: str) -> int:
        """The tokens `tokenize` gives the prompt before padding or truncation, a trailing EOS left out:
        Prompt Relay counts a segment's columns with it."""
        return without_eos(self.tokenizer, self.tokenizer(prompt.strip())["input_ids"])

    def hidden_states(self, prompt: str) -> tuple[list[mx.array], mx.array]:
        """All Gemma hidden states (num_hidden_layers + 1 arrays of (1, L, hidden)) and the (1, L) mask."""
        ids, mask = self.tokenize(prompt)
        return gemma_hidden_states(self.model, ids, mask), mask


def encode_prompt(encoder: TextEncoder, connector: TextConnector, prompt: str) -> dict[str, np.ndarray]:
    """Prompt -> float32 numpy `video_context` (1, L, Dv), `audio_context` (1, L, Da), `context_mask` (1, L)."""
    states, mask = encoder.hidden_states(prompt)
    video, audio, out_mask = connector(states, mask, getattr(encoder, "projection", None))  # a 2.5 tower's own
    mx.eval(video, audio, out_mask)
    return {
        "video_context": np.array(video.astype(mx.float32)),
        "audio_context": np.array(audio.astype(mx.float32)),
        "context_mask": np.array(out_mask.astype(mx.float32)),
    }


def tiny_gemma_config(vocab_size: int | None = None) -> dict:
    """mlx-lm `gemma3_text` config.json of a tiny Gemma 3 (3 layers, width 64, sliding + global)."""
    from ltx_engine.tiny.tiny_tokenizer import tiny_vocab_size

    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size or tiny_vocab_size(),
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window": 16,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 4096,
        "hidden_activation": "gelu_pytorch_tanh",
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def tiny_gemma_weights(config: dict, seed: int) -> dict[str, mx.array]:
    """Seeded float32 weights with mlx-lm / transformers Gemma 3 key names (lm_head tied)."""
    rng = np.random.default_rng(seed)
    d, f = config["hidden_size"], config["intermediate_size"]
    hd, nh, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]

    def normal(shape: tuple[int, ...], std: float) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32) * std)

    w = {"model.embed_tokens.weight": normal((config["vocab_size"], d), 1.0 / np.sqrt(d))}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal((nh * hd, d), d**-0.5)
        w[p + "self_attn.k_proj.weight"] = normal((nkv * hd, d), d**-0.5)
        w[p + "self_attn.v_proj.weight"] = normal((nkv * hd, d), d**-0.5)
        w[p + "self_attn.o_proj.weight"] = normal((d, nh * hd), (nh * hd) ** -0.5)
        w[p + "self_attn.q_norm.weight"] = normal((hd,), 0.1)
        w[p + "self_attn.k_norm.weight"] = normal((hd,), 0.1)
        w[p + "mlp.gate_proj.weight"] = normal((f, d), d**-0.5)
        w[p + "mlp.up_proj.weight"] = normal((f, d), d**-0.5)
        w[p + "mlp.down_proj.weight"] = normal((d, f), f**-0.5)
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            w[p + norm + ".weight"] = normal((d,), 0.1)
    w["model.norm.weight"] = normal((d,), 0.1)
    return w


def write_tiny_text_encoder(folder: Path, seed: int, max_length: int = REFERENCE_MAX_LENGTH) -> Path:
    """Write a tiny Gemma 3 checkpoint (config.json, model.safetensors, tokenizer files) to `folder`."""
    from ltx_engine.tiny.tiny_tokenizer import write_tiny_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(folder, model_max_length=max_length)
    config = tiny_gemma_config()
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    mx.save_safetensors(str(folder / "model.safetensors"), tiny_gemma_weights(config, seed), {"format": "mlx"})
    return folder
