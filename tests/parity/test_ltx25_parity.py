"""LTX-2.5 DiT parts against ltx_core 1.0.0 (with 1.2.0's cross-attention AdaLN rule), which predates them.

ltx_core 1.0.0 has neither `ff_bias` nor the keyframe absolute-position embedding (both arrive with the
2.5 checkpoints). What it does have pins their placement: a 2.5 DiT without video FF biases equals the
1.0.0 DiT whose FF biases are zero, and the keyframe marker (added to marked tokens right after
`patchify_proj`, before anything reads them) equals a forward hook adding it to that Linear's output.
Keyframe-token positions equal 1.0.0's `VideoConditionByKeyframeIndex` for a multi-frame keyframe; the
single-frame narrowing ([t, t+1)) is newer than 1.0.0 and is checked in tests/unit/test_dfr_engine.py.
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

import mlx.core as mx  # noqa: E402
from ltx_core.model.transformer.model_configurator import LTXModelConfigurator  # noqa: E402

from ltx_engine.loading.loader import apply_weights  # noqa: E402
from ltx_engine.models import patchify as P  # noqa: E402
from ltx_engine.models.transformer import LTXModel, TransformerConfig, tiny_config  # noqa: E402
from ltx_engine.tiny.tiny_pack import LTX25_TRANSFORMER  # noqa: E402
from tests.parity.test_transformer import (  # noqa: E402
    _audio_inputs,
    _our_mod,
    _randomize,
    _ref_mod,
    _rel,
    _video_inputs,
)
from tests.parity.upstream_rules import follow_ltx_core_1_2_0  # noqa: E402


def _pair():
    """The 1.0.0 reference with zeroed video FF biases, and our 2.5 DiT with its weights."""
    base = {"transformer": copy.deepcopy(tiny_config())}
    ref = follow_ltx_core_1_2_0(LTXModelConfigurator.from_config(base).float().eval())
    _randomize(ref, 3)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if ".ff." in name and name.endswith(".bias") and ".audio_ff." not in name:
                p.zero_()
    cfg = {"transformer": {**base["transformer"], **LTX25_TRANSFORMER}}
    ours = LTXModel(TransformerConfig.from_config(cfg))
    sd = {k: v.numpy() for k, v in ref.state_dict().items()
          if not (".ff." in k and k.endswith(".bias") and ".audio_ff." not in k)}
    embedding = np.random.default_rng(7).standard_normal((1, ours.keyframes_abs_pos_embedding.shape[1]))
    sd["keyframes_abs_pos_embedding"] = (0.5 * embedding).astype(np.float32)
    apply_weights(ours, LTXModel.sanitize(sd), file="test")
    return ref, ours, torch.from_numpy(sd["keyframes_abs_pos_embedding"])


def _marker(n_tokens: int, batch: int) -> np.ndarray:
    mask = np.zeros((batch, n_tokens, 1), np.float32)
    mask[:, :24] = 1.0          # the first latent frame (4 x 6 tokens)
    mask[:, -24:-12] = 0.7      # any non-zero value marks (the reference tests > 0)
    return mask


def test_ltx25_dit_matches_reference_with_hooked_marker():
    ref, ours, embedding = _pair()
    rng = np.random.default_rng(0)
    t = tiny_config()
    video, audio = _video_inputs(rng, t["cross_attention_dim"]), _audio_inputs(rng, t["audio_cross_attention_dim"])
    marker = _marker(video["latent"].shape[1], video["latent"].shape[0])
    hook_mask = torch.from_numpy((marker > 0).astype(np.float32))
    handle = ref.patchify_proj.register_forward_hook(lambda _m, _i, out: out + hook_mask * embedding)
    try:
        with torch.no_grad():
            rv, ra = ref(_ref_mod(video), _ref_mod(audio), None)
    finally:
        handle.remove()
    marked = _our_mod(video)
    marked.keyframes_mask = mx.array(marker)
    ov, oa = ours(marked, _our_mod(audio))
    errs = (_rel(np.array(ov), rv.numpy()), _rel(np.array(oa), ra.numpy()))
    print("ltx2.5 dit vs hooked 1.0.0", errs)
    assert max(errs) <= 1e-4
    with torch.no_grad():
        plain, _ = ref(_ref_mod(video), _ref_mod(audio), None)
    assert _rel(np.array(ov), plain.numpy()) > 1e-3  # the marker really changes the output


@pytest.mark.parametrize("frame", [0, 16, 40])
def test_multi_frame_keyframe_positions_match_reference(frame):
    from ltx_core.components.patchifiers import VideoLatentPatchifier
    from ltx_core.conditioning.types import VideoConditionByKeyframeIndex
    from ltx_core.tools import VideoLatentTools
    from ltx_core.types import VideoLatentShape

    tools = VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, 8, 3, 2, 3), fps=24.0)
    state = tools.create_initial_state("cpu", torch.float32)
    kf = torch.zeros(1, 8, 1, 2, 3)
    ref = VideoConditionByKeyframeIndex(kf, frame_idx=frame, strength=0.95).apply_to(state, tools)
    ours = P.keyframe_positions(1, frame, 2, 3, 24.0, num_pixel_frames=8)
    np.testing.assert_array_equal(np.array(ours), ref.positions[:, :, 18:].numpy())
