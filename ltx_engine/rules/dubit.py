"""Dub-It's audio reference, as upstream 1.2 `dubit.py` writes it. Pure numpy.

Read from upstream 1.2 (`DubItPipeline.__call__`, `patchify_dubit_audio_reference_latent`, ltx-core
`AudioConditionByReferenceLatent`); there is no 1.0.0 reference to run, so these are not parity-tested:
- one IC-LoRA (the Dub-It LoRA) fused into the DiT of BOTH stages (one `DiffusionStage` with the LoRA);
- video: the reference clip as IC-LoRA reference tokens (`ic_lora.ControlReference`, strength
  `--reference-strength`, attention strength 1, the LoRA's downscale) in stage 1 at half size and
  again in stage 2 at full size (each stage's own encode of the clip);
- audio: the reference audio latent's tokens appended after the generated audio, latent = clean =
  the reference, mask 1 - 1 = 0, positions the audio patchifier's seconds shifted to negative time
  (t - duration - 0.04, duration = the reference's last end), no attention mask. Stage 1's reference is
  the source clip's audio, stage 2's is stage 1's generated audio, which stage 2 also keeps frozen
  (noise scale 0) and the output decodes;
- the clip length is the reference's frame count snapped to 8k + 1, at its fps.
One variant of ltx-core's item (a later tree) appends latent 0 instead of the tokens; this follows the
1.2 file read (tokens), which a mask-0 token keeps through every step either way after the first.
"""

from __future__ import annotations

import numpy as np

from ltx_engine.rules.retake import audio_time_bounds
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tokens import patchify_audio

F32 = np.float32
NEGATIVE_GAP_S = 0.04


def reference_audio_positions(frames: int) -> np.ndarray:
    """(1, 1, T, 2) float32 positions of the reference audio, shifted before the generated audio's t = 0."""
    bounds = audio_time_bounds(frames)
    duration = bounds[-1, 1] if frames else F32(0)
    return (bounds - duration - F32(NEGATIVE_GAP_S)).astype(F32)[None, None]


def append_audio_reference(audio: LatentState, reference: np.ndarray) -> LatentState:
    """`audio` with the reference latent (1, C, T, M) appended clean (mask 0) at negative positions.

    Appended after the noise, so its latent is the clean value the noiser would have left (mask 0)."""
    tokens = patchify_audio(np.asarray(reference, F32))
    return audio.append_tokens(tokens, reference_audio_positions(tokens.shape[1]), 1.0, latent=tokens)
