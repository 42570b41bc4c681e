"""LTX-2.5's DurationHead and its frame rule against the reference.

ltx-core 1.0.0 (the installed reference) has no `duration_head` module, so `_Reference` below is
upstream's `ltx_core/duration_head/duration_head.py` (DurationHead + AttentionPooler, ltx-core main)
written out in torch with `nn.MultiheadAttention`, and `_reference_frames` upstream's
`seconds_to_clamped_num_frames` / `snap_frames_to_grid` (ltx_pipelines/utils/helpers.py) with the
DurationPredictor's clamp (AutoDuration: 1 s .. 20 s). Every parameter is drawn from a seeded generator.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from torch import nn  # noqa: E402

from ltx_engine.models.duration_head import DurationHead  # noqa: E402
from ltx_engine.rules.duration import frames_for  # noqa: E402

VIDEO, AUDIO, HIDDEN, QUERIES, HEADS, MLP = 48, 24, 32, 2, 4, 40


class _Pooler(nn.Module):
    def __init__(self):
        super().__init__()
        self.query_tokens = nn.Parameter(torch.zeros(QUERIES, HIDDEN))
        self.cross_attn = nn.MultiheadAttention(embed_dim=HIDDEN, num_heads=HEADS, batch_first=True)

    def forward(self, tokens):
        queries = self.query_tokens.unsqueeze(0).expand(tokens.shape[0], -1, -1)
        return self.cross_attn(queries, tokens, tokens, need_weights=False)[0]


class _Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.video_input_proj = nn.Linear(VIDEO, HIDDEN)
        self.video_modality_emb = nn.Parameter(torch.zeros(HIDDEN))
        self.audio_input_proj = nn.Linear(AUDIO, HIDDEN)
        self.audio_modality_emb = nn.Parameter(torch.zeros(HIDDEN))
        self.attention_pooler = _Pooler()
        self.mlp_hidden = nn.Linear(HIDDEN * QUERIES, MLP)
        self.mlp_out = nn.Linear(MLP, 1)

    def forward(self, video=None, audio=None):
        groups = []
        if video is not None:
            groups.append(self.video_input_proj(video) + self.video_modality_emb)
        if audio is not None:
            groups.append(self.audio_input_proj(audio) + self.audio_modality_emb)
        pooled = self.attention_pooler(torch.cat(groups, dim=1))
        hidden = torch.nn.functional.gelu(self.mlp_hidden(pooled.reshape(pooled.shape[0], -1)), approximate="tanh")
        return self.mlp_out(hidden).squeeze(-1).exp()


def _reference_frames(seconds: float, frame_rate: float, min_s: float = 1.0, max_s: float = 20.0) -> int:
    min_frames, max_frames = round(min_s * frame_rate), round(max_s * frame_rate)
    raw = max(min_frames, min(round(seconds * frame_rate), max_frames))
    frames = ((raw - 1) // 8) * 8 + 1
    if frames < min_frames:
        frames = min(-(-(min_frames - 1) // 8) * 8 + 1, max_frames)
    return frames


def _pair():
    torch.manual_seed(0)
    ref = _Reference().eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    weights = {k: mx.array(v.detach().numpy()) for k, v in ref.state_dict().items()}
    ours = DurationHead.from_weights({"duration_head": {"num_pooler_heads": HEADS}}, weights)
    ours.load_weights(list(weights.items()), strict=True)
    return ref, ours


@pytest.mark.parametrize("streams", ["both", "video", "audio"])
def test_duration_head_matches_reference(streams):
    ref, ours = _pair()
    rng = np.random.default_rng(1)
    video = rng.standard_normal((1, 9, VIDEO)).astype(np.float32) if streams != "audio" else None
    audio = rng.standard_normal((1, 5, AUDIO)).astype(np.float32) if streams != "video" else None
    with torch.no_grad():
        want = ref(None if video is None else torch.from_numpy(video), None if audio is None else torch.from_numpy(audio))
    got = ours(None if video is None else mx.array(video), None if audio is None else mx.array(audio))
    rel = abs(float(np.array(got)[0]) - float(want[0])) / abs(float(want[0]))
    print("duration head", streams, "rel", rel)
    assert rel <= 1e-4


@pytest.mark.parametrize("seconds", [0.01, 0.9, 1.0, 2.3, 4.04, 7.5, 19.99, 20.0, 55.0])
@pytest.mark.parametrize("fps", [24.0, 25.0, 30.0, 12.5])
def test_frames_follow_upstreams_clamp_and_grid(seconds, fps):
    frames = frames_for(seconds, fps)
    assert frames == _reference_frames(seconds, fps) and (frames - 1) % 8 == 0
