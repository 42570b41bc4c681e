"""The text cross-attention's K/V split over a gang's ranks (each projects its share of the context rows, the
shares gathered per block as the video K/V are): the unsplit forward's bits whatever the layout (2.3's and
2.5's sigma-modulated context, 2.0's plain one), the streams, and the shares (1,024 rows over 3: padded)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.parallel.sequence_parallel import LocalExchange, ShardPlan, forward_bytes, sp_forward
from ltx_engine.rules.sp_plan import splits_text_kv
from ltx_engine.tiny.tiny_pack import LTX25_TRANSFORMER
from tests.unit import sp_model

LAYOUTS = {"2.3": {}, "2.5": LTX25_TRANSFORMER,
           "2.0": {"cross_attention_adaln": False, "apply_gated_attention": False}}


@pytest.fixture(scope="module")
def models():
    built: dict = {}

    def get(layout: str):
        if layout not in built:
            built[layout] = sp_model.seeded_model(layout=LAYOUTS[layout])
        return built[layout]

    return get


def _text_gathers(ex: LocalExchange) -> list[str]:
    return [what for what, _ in ex.log if "text" in what]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("streams", ["audio+video", "video"])
@pytest.mark.parametrize("k,rows", [(2, 5), (3, 1024), (4, 5), (3, 2)])
def test_split_text_kv_give_the_unsplit_bits(models, layout, streams, k, rows) -> None:
    """k ranks in one process; 2 rows over 3 ranks: too few to split, every rank projects them all."""
    model = models(layout)
    video, audio = sp_model.forward_inputs((2, 5, 7), text_rows=rows)
    audio = audio if streams == "audio+video" else None
    want = model(video, audio)
    ex = LocalExchange(ShardPlan(video.latent.shape[1], k))
    got = sp_forward(model, video, audio, ex)
    mx.eval(*[x for x in (*want, *got) if x is not None])
    assert np.array_equal(np.array(got[0]), np.array(want[0]))
    assert (got[1] is None) == (audio is None) and (audio is None or np.array_equal(np.array(got[1]), np.array(want[1])))
    per_block = ["text_k", "text_v"] + (["audio_text_k", "audio_text_v"] if audio is not None else [])
    assert _text_gathers(ex) == per_block * len(model.transformer_blocks) * splits_text_kv(k, rows)
    c = model.config
    audio_width = c.audio_num_attention_heads * c.audio_attention_head_dim if audio is not None else 0
    assert ex.bytes_received == forward_bytes(ex.plan, c.num_layers, c.num_attention_heads * c.attention_head_dim,
                                              audio_width, 4, c.out_channels, rows)


def test_the_text_shares_are_the_rows_of_the_context() -> None:
    """1,024 rows over 3 ranks: 342 each, the last share padded with the last row twice, cut after the gather."""
    plan = ShardPlan(1024, 3)
    assert (plan.per_rank, plan.padding) == (342, 2)
    assert np.array_equal(np.concatenate([plan.indices(r) for r in range(3)])[:1024], np.arange(1024))
    assert splits_text_kv(2, 1024) and not splits_text_kv(1, 1024) and not splits_text_kv(4, 3)
