"""The dev DiT with the distilled LoRA at a recipe's strength (ltx_engine/lora/dev_distilled.py) on the tiny
dev-only pack: at strength 1 it is the pack's own fused distilled DiT, bit for bit; at HQ's 0.25 / 0.5 it
is neither that nor the plain dev DiT; each strength has its own registry key; a user LoRA reaches the
dev DiT a guided pass loads."""

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.lora.dev_distilled import DevWithDistilled, dev_view

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dev_pack(tiny_dev_pack):
    from ltx_engine.loading.pack import Pack

    return Pack(tiny_dev_pack)


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(
        np.array_equal(np.array(a[k].astype(mx.float32)), np.array(b[k].astype(mx.float32))) for k in a
    )


def test_strength_one_is_the_packs_fused_distilled_dit(dev_pack):
    assert _same(DevWithDistilled(dev_pack, 1.0).tensors("transformer"), dev_pack.tensors("transformer"))


def test_hq_strengths_are_their_own_dits(dev_pack):
    dev = dev_pack.tensors("transformer_dev")
    quarter = DevWithDistilled(dev_pack, 0.25)
    assert _same(quarter.tensors("transformer_dev"), quarter.tensors("transformer"))
    assert not _same(quarter.tensors("transformer_dev"), dev)
    assert not _same(
        quarter.tensors("transformer_dev"), DevWithDistilled(dev_pack, 0.5).tensors("transformer_dev")
    )
    assert len({DevWithDistilled(dev_pack, s).key for s in (0.25, 0.5, 1.0)} | {dev_pack.key}) == 4
    assert (
        dev_view(dev_pack, {}) is dev_pack
        and dev_view(dev_pack, {"distilled_lora_strength": 0.5}).strength == 0.5
    )


def test_a_user_lora_reaches_the_dev_dit(dev_pack, tmp_path):
    from tests.farm.user_loras import write_user_loras

    style, _ = write_user_loras(tmp_path, dev_pack.root)
    fused = dev_pack.tensors("transformer_dev", loras=((str(style), 0.8),))
    assert not _same(fused, dev_pack.tensors("transformer_dev"))
