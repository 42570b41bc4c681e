"""Prompt Relay in the stages: a stream's text cross-attention mask from its contexts and its tokens' times.

Why here, between the contexts and the Modality: every forward (a whole stage, a tile, a guidance pass, a
sequence-parallel shard) builds its streams from the contexts it was handed and the positions of its own
tokens, so the relay reaches each of them the same way, and only where the contexts carry the text task's
`relay` table (the uncond pass reads the negative prompt's, which has none: the port masks the conditional
passes only). The rule itself is `ltx_engine.rules.prompt_relay`.
"""

from __future__ import annotations

import numpy as np

from ltx_engine.rules.prompt_relay import RELAY, RelayTable, audio_frames, relay_bias, video_frames

CONTEXT_KEYS = ("video_context", "audio_context", "context_mask", RELAY)  # what a text task hands the stages


def contexts_of(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The text inputs of a task (its prompt's or the negative's), the relay table among them when it has one."""
    return {k: inputs[k] for k in CONTEXT_KEYS if k in inputs}


def without_contexts(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A task's other inputs: its tokens and states."""
    return {k: v for k, v in inputs.items() if k not in CONTEXT_KEYS}


def text_mask(contexts: dict[str, np.ndarray], positions: np.ndarray, audio: bool = False) -> np.ndarray | None:
    """The text cross-attention mask of one stream: the context mask as it is, or with a relay table the
    (1, 1, T, L) additive bias of its tokens (the float context mask is additive too, so it is added in)."""
    mask = contexts.get("context_mask")
    table = contexts.get(RELAY)
    if table is None:
        return mask
    relay = RelayTable.from_array(table)
    frames = (audio_frames if audio else video_frames)(positions, relay.fps)
    columns = contexts["audio_context" if audio else "video_context"].shape[1]
    bias = relay_bias(frames, relay, columns)
    if mask is not None:
        bias = bias + np.asarray(mask, np.float32).reshape(1, -1)
    return bias[None, None]
