"""Where the installed reference (ltx-core 1.0.0) and current upstream (ltx-core 1.2.0) disagree.

The parity tests run against `ltx-core==1.0.0` from the package index, but the engine follows 1.2.0
(`Lightricks/LTX-2` main), the reference the released checkpoints are served with. Each rule that
changed between them is written here once, from reading upstream, and applied to a 1.0.0 module.
"""

from __future__ import annotations

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
