"""The text connector's configuration: from a pack's embedded config, with sizes read from its weights.

Kept apart from the modules (`connector.py`) because the loader and the tiny-pack writer need the
config alone; sizes come from the tensors themselves (`ConnectorConfig.from_weights`) so a pack whose
config keys are stale still loads with the shapes it really has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import mlx.core as mx

# Keys of a V2 (LTX-2.3) embedded config and the values the reference accepts.
_V2_EXPECTED = {
    "caption_proj_before_connector": True,
    "caption_projection_first_linear": False,
    "caption_proj_input_norm": False,
    "caption_projection_second_linear": False,
}


@dataclass
class ConnectorConfig:
    """Sizes of the feature extractor and both connectors, from the checkpoint's embedded config."""

    video_dim: int = 4096
    audio_dim: int = 2048
    text_features: int = 3840 * 49  # Gemma width x hidden states (layers + 1), flattened per token
    video_heads: int = 30
    video_head_dim: int = 128
    video_layers: int = 2
    audio_heads: int = 30
    audio_head_dim: int = 128
    audio_layers: int = 2
    num_learnable_registers: int = 128
    rope_type: str = "interleaved"
    double_precision_rope: bool = False
    positional_embedding_max_pos: list[int] = field(default_factory=lambda: [1])
    positional_embedding_theta: float = 10000.0
    gated_attention: bool = False
    norm_eps: float = 1e-6
    ff_bias: bool = True        # LTX-2.5 connectors' feed-forwards have no biases (`connector_ff_bias`)
    projection: bool = True     # LTX-2.5 keeps the aggregate embeds in its Gemma 4 tower file instead

    @classmethod
    def from_config(cls, cfg: dict) -> ConnectorConfig:
        """Read the reference keys of `cfg["transformer"]` (defaults equal the reference's).

        Gemma's width and depth are not in the reference config (it reads them from the Gemma it
        loads; Gemma 3 12B: 3840 wide, 48 layers); `text_encoder_hidden_size` /
        `text_encoder_num_hidden_layers` override them. `from_weights` takes them from the tensors.
        """
        t = cfg.get("transformer", {})
        present = t.keys() & _V2_EXPECTED.keys()
        if present != _V2_EXPECTED.keys() or any(t[k] != _V2_EXPECTED[k] for k in present):
            raise NotImplementedError(
                "only the LTX-2.3 (V2) text projection is supported; config lacks or differs in "
                + ", ".join(sorted(_V2_EXPECTED))
            )
        heads = t.get("connector_num_attention_heads", 30)
        head_dim = t.get("connector_attention_head_dim", 128)
        layers = t.get("connector_num_layers", 2)
        return cls(
            video_dim=t.get("num_attention_heads", 32) * t.get("attention_head_dim", 128),
            audio_dim=t.get("audio_num_attention_heads", 32) * t.get("audio_attention_head_dim", 64),
            text_features=t.get("text_encoder_hidden_size", 3840) * (t.get("text_encoder_num_hidden_layers", 48) + 1),
            video_heads=heads,
            video_head_dim=head_dim,
            video_layers=layers,
            audio_heads=t.get("audio_connector_num_attention_heads", heads),
            audio_head_dim=t.get("audio_connector_attention_head_dim", head_dim),
            audio_layers=t.get("audio_connector_num_layers", layers),
            num_learnable_registers=t.get("connector_num_learnable_registers", 128),
            rope_type=t.get("rope_type", "interleaved"),
            double_precision_rope=t.get("frequencies_precision", False) == "float64",
            positional_embedding_max_pos=list(t.get("connector_positional_embedding_max_pos", [1])),
            gated_attention=t.get("connector_apply_gated_attention", False),
            ff_bias=t.get("connector_ff_bias", True),
        )


    @classmethod
    def from_weights(cls, cfg: dict, weights: dict[str, mx.array]) -> ConnectorConfig:
        """`from_config`, then every size the tensors fix taken from them (model keys).

        A pack converted with another Gemma, or whose config keys are stale, still loads: the text
        width (Gemma width x hidden states), output widths, connector depth, head width, registers and
        gating come from the shapes. Head counts come from the gate logits when the attention is
        gated, else from the config (a plain q/k/v shape cannot tell heads from head width).
        """
        c = cls.from_config(cfg)
        sizes: dict = {}
        for stream in ("video", "audio"):
            shape = _linear_shape(weights, f"text_embedding_projection.{stream}_aggregate_embed")
            if shape is not None:
                sizes[f"{stream}_dim"] = shape[0]
                if shape[1] is not None:
                    sizes["text_features"] = shape[1]
            sizes.update(_connector_sizes(weights, stream, getattr(c, f"{stream}_heads")))
        if any(k.startswith(("video_embeddings_connector.", "audio_embeddings_connector.")) for k in weights):
            registers = weights.get("video_embeddings_connector.learnable_registers")
            sizes["num_learnable_registers"] = 0 if registers is None else registers.shape[0]
            sizes["gated_attention"] = any(".attn1.to_gate_logits." in k for k in weights)
            sizes["ff_bias"] = any(k.endswith(".ff.net.0.proj.bias") for k in weights)
        sizes["projection"] = any(k.startswith("text_embedding_projection.") for k in weights)
        return replace(c, **sizes)


def _linear_shape(weights: dict[str, mx.array], path: str) -> tuple[int, int | None] | None:
    """(out, in) of a Linear's weight; `in` is None when quantized (the packed width hides it)."""
    w = weights.get(f"{path}.weight")
    if w is None:
        return None
    return w.shape[0], None if f"{path}.scales" in weights else w.shape[1]


def _connector_sizes(weights: dict[str, mx.array], stream: str, heads: int) -> dict:
    """Depth, heads and head width of one embeddings connector, from its tensors."""
    prefix = f"{stream}_embeddings_connector.transformer_1d_blocks."
    blocks = {int(m.group(1)) for k in weights if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if not blocks:
        return {}
    gate = weights.get(f"{prefix}0.attn1.to_gate_logits.weight")
    heads = heads if gate is None else gate.shape[0]
    q = _linear_shape(weights, f"{prefix}0.attn1.to_q")
    sizes = {f"{stream}_layers": max(blocks) + 1}
    if q is not None:
        if q[0] % heads:
            raise ValueError(f"{prefix}0.attn1.to_q.weight: width {q[0]} does not split into {heads} heads")
        sizes.update({f"{stream}_heads": heads, f"{stream}_head_dim": q[0] // heads})
    return sizes


def tiny_connector_config(gemma_hidden: int, gemma_layers: int, video_dim: int, audio_dim: int,
                          heads: int = 2) -> dict:
    """Embedded-config `transformer` fields for a tiny pack's text path (merge into that section).

    Video and audio use the same head count (as the reference configurator does); the connector
    widths equal the DiT's video / audio widths because the projection feeds the connectors. `heads`:
    the video DiT's (2 in the tiny pack); the audio stream keeps 2.
    """
    return {
        "caption_proj_before_connector": True,
        "caption_projection_first_linear": False,
        "caption_proj_input_norm": False,
        "caption_projection_second_linear": False,
        "num_attention_heads": heads,
        "attention_head_dim": video_dim // heads,
        "audio_num_attention_heads": 2,
        "audio_attention_head_dim": audio_dim // 2,
        "connector_num_attention_heads": heads,
        "connector_attention_head_dim": video_dim // heads,
        "connector_num_layers": 2,
        "audio_connector_num_attention_heads": 2,
        "audio_connector_attention_head_dim": audio_dim // 2,
        "audio_connector_num_layers": 2,
        "connector_positional_embedding_max_pos": [4096],
        "connector_apply_gated_attention": True,
        "rope_type": "split",
        "frequencies_precision": "float64",
        "text_encoder_hidden_size": gemma_hidden,
        "text_encoder_num_hidden_layers": gemma_layers,
    }
