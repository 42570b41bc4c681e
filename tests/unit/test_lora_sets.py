"""LoRA sets and several images on the engine side: layouts, refusals, the set identity, the tiny pack."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.conditioning import ConditioningError, ImageCondition, apply_image_conditions, resolve_frame
from ltx_engine.loading.model_classes import model_class
from ltx_engine.lora.lora import (
    MAX_LORAS,
    LoraError,
    LoraInput,
    LoraKeyError,
    LoraModelError,
    LoraShapeError,
    check_loras,
    fuse_loras,
    lora_set_identity,
)
from ltx_engine.rules.lora_keys import LAYOUTS, read_factors
from ltx_engine.rules.sampling import LatentState
from ltx_engine.tiny.tiny_loras import TINY_CONNECTOR_MODULE, in_layout, tiny_lora_factors, write_tiny_lora

pytestmark = pytest.mark.timeout(20)
SANITIZE = model_class("transformer").sanitize
SHAPES = {"transformer_blocks.0.attn1.to_out.0": (8, 16), "transformer_blocks.0.ff.net.0.proj": (32, 16),
          "transformer_blocks.1.audio_ff.net.2": (8, 32)}
PACK = {"transformer_blocks.0.attn1.to_out.weight": (8, 16), "transformer_blocks.0.ff.proj_in.weight": (32, 16),
        "transformer_blocks.1.audio_ff.proj_out.weight": (8, 32)}


def _weights() -> dict[str, mx.array]:
    return {k: mx.zeros(s) for k, s in PACK.items()}


@pytest.mark.parametrize("layout", [x.name for x in LAYOUTS])
def test_every_layout_reads_as_the_reference(layout):
    factors = tiny_lora_factors(SHAPES, seed=1)
    modules = ("transformer_blocks.0.attn1.to_out.0", "transformer_blocks.0.ff.net.0.proj",
               "transformer_blocks.1.audio_ff.net.2")
    got = read_factors(in_layout(factors, layout, alpha=2.0), file="l", modules=modules)
    assert sorted(got) == sorted(factors)
    fused = fuse_loras(_weights(), [LoraInput(in_layout(factors, layout, alpha=2.0), 0.5, "l")], SANITIZE, file="dit")
    ref = fuse_loras(_weights(), [LoraInput(in_layout(factors, "reference"), 0.5, "r")], SANITIZE, file="dit")
    for k in PACK:
        np.testing.assert_allclose(np.array(fused[k]), np.array(ref[k]), rtol=1e-5, atol=1e-7)


def _one(tensors: dict, strength: float = 1.0) -> list[LoraInput]:
    return [LoraInput(tensors, strength, "user.safetensors")]


def test_refusals_name_the_file_and_the_first_bad_key():
    good = in_layout(tiny_lora_factors(SHAPES, seed=1), "reference")
    with pytest.raises(LoraKeyError, match=r"user.safetensors: key 'diffusion_model.x.lora_A.weight' targets"):
        check_loras(_weights(), _one({**good, "diffusion_model.x.lora_A.weight": mx.zeros((4, 16)),
                                      "diffusion_model.x.lora_B.weight": mx.zeros((8, 4))}), SANITIZE, file="dit")
    with pytest.raises(LoraKeyError, match="not a LoRA factor"):
        check_loras(_weights(), _one({**good, "diffusion_model.y.diff": mx.zeros(3)}), SANITIZE, file="dit")
    bad_rank = dict(good, **{"diffusion_model.transformer_blocks.0.attn1.to_out.0.lora_B.weight": mx.zeros((8, 3))})
    with pytest.raises(LoraShapeError, match="rank 4 in its down factor but 3"):
        check_loras(_weights(), _one(bad_rank), SANITIZE, file="dit")
    wide = in_layout(tiny_lora_factors({m: (s[0] * 2, s[1] * 2) for m, s in SHAPES.items()}, seed=1), "reference")
    with pytest.raises(LoraModelError, match="another model"):
        check_loras(_weights(), _one(wide), SANITIZE, file="dit")
    assert issubclass(LoraModelError, ValueError)
    with pytest.raises(LoraError, match="not a finite"):
        check_loras(_weights(), _one(good, float("nan")), SANITIZE, file="dit")
    with pytest.raises(LoraError, match=f"at most {MAX_LORAS}"):
        check_loras(_weights(), _one(good) * (MAX_LORAS + 1), SANITIZE, file="dit")


def test_the_set_identity_is_stable_and_tells_sets_apart():
    a, b = "a" * 64, "b" * 64
    key = lora_set_identity([(a, 0.8), (b, 0.35)])
    assert key == lora_set_identity([(a, 0.8), (b, 0.35)], "fused") and len(key) == 64
    assert key != lora_set_identity([(b, 0.35), (a, 0.8)])  # order changes the float32 sum's last bits
    assert key != lora_set_identity([(a, 0.8), (b, 0.35)], "unfused")
    assert key != lora_set_identity([(a, 0.8), (b, 0.3500001)])
    with pytest.raises(LoraError):
        lora_set_identity([("nothex", 1.0)])


def test_tiny_pack_fuses_a_set_once_and_the_connector_factor_into_the_connector(tmp_path):
    from ltx_engine.loading.pack import Pack
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    write_tiny_pack(tmp_path / "p", seed=0, bits=8)
    pack = Pack(tmp_path / "p")
    dit, conn = pack.tensors("transformer"), pack.tensors("connector")
    shapes = {"transformer_blocks.0.attn1.to_q": (64, 64), TINY_CONNECTOR_MODULE:
              tuple(conn[TINY_CONNECTOR_MODULE + ".weight"].shape)}
    one, two = tiny_lora_factors(shapes, seed=1), tiny_lora_factors(shapes, seed=2)
    write_tiny_lora(tmp_path / "p" / "style-lora.safetensors", one)
    write_tiny_lora(tmp_path / "p" / "camera-lora.safetensors", two, "comfyui", alpha=2.0)
    loras = (("style-lora.safetensors", 0.8), ("camera-lora.safetensors", 0.4))
    inputs = [LoraInput(in_layout(one, "reference"), 0.8, "1"), LoraInput(in_layout(two, "comfyui", 2.0), 0.4, "2")]
    fused = pack.tensors("transformer", loras=loras)
    want = fuse_loras(dit, inputs, SANITIZE, file="dit")
    assert all(mx.array_equal(fused[k], want[k]).item() for k in dit)
    assert not mx.array_equal(fused["transformer_blocks.0.attn1.to_q.weight"],
                              dit["transformer_blocks.0.attn1.to_q.weight"]).item()
    fused_conn = pack.tensors("connector", loras=loras)
    assert not mx.array_equal(fused_conn[TINY_CONNECTOR_MODULE + ".weight"], conn[TINY_CONNECTOR_MODULE + ".weight"]).item()


def test_image_frames_and_refusals():
    assert resolve_frame("last", 25) == 24 and resolve_frame(-1, 25) == 24 and resolve_frame(-25, 25) == 0
    with pytest.raises(ConditioningError, match="outside the clip"):
        resolve_frame(25, 25)
    video = LatentState.initial(np.zeros((1, 4 * 6, 8), np.float32), np.zeros((1, 3, 24, 2), np.float32))
    img = np.ones((1, 8, 1, 2, 3), np.float32)
    with pytest.raises(ConditioningError, match="which a replaces too"):
        apply_image_conditions(video, [ImageCondition(img, 9, 1.0, "replace", "a"),
                                       ImageCondition(img, 9, 1.0, "replace", "b")], (4, 2, 3), 25, 24.0)
    with pytest.raises(ConditioningError, match="1 \\+ 8k"):
        apply_image_conditions(video, [ImageCondition(img, "last", 1.0, "replace")], (4, 2, 3), 25, 24.0)
    out = apply_image_conditions(video, [ImageCondition(img, -8, 0.5, "replace")], (4, 2, 3), 25, 24.0)
    assert (out.clean_latent[:, 18:] == 1).all() and (out.denoise_mask[:, 18:] == 0.5).all()


def test_an_alpha_beside_reference_factors_scales_them_as_comfyui_does():
    factors = tiny_lora_factors(SHAPES, seed=1)
    plain = in_layout(factors, "reference")
    with_alpha = dict(plain, **{f"diffusion_model.{m}.alpha": mx.array(np.float32(2.0)) for m in SHAPES})
    got = read_factors(with_alpha, file="l", modules=())
    assert {f.scale for f in got.values()} == {0.5}  # alpha 2 / rank 4
    assert {f.scale for f in read_factors(plain, file="l").values()} == {1.0}


def test_appended_tokens_counts_the_guides():
    from ltx_engine.conditioning import appended_tokens

    one, two = np.zeros((1, 8, 1, 2, 3), np.float32), np.zeros((1, 8, 2, 2, 3), np.float32)
    conds = [ImageCondition(one, 0), ImageCondition(one, "last"), ImageCondition(two, 9, binding="guide")]
    assert appended_tokens(conds, (4, 2, 3)) == 6 + 12


def test_dfr_tiles_take_several_images_the_single_one_unchanged():
    from ltx_engine.dfr import build_tile_state
    from ltx_engine.rules.dfr_layout import plan_dfr

    rnd = plan_dfr(97, 24.0, 1, seed=7).rounds[-1]
    first, second = rnd.tiles
    rng = np.random.default_rng(5)
    latent = rng.standard_normal((1, 128, rnd.latent_frames, 2, 3)).astype(np.float32)
    carry = rng.standard_normal((1, 128, len(rnd.seams), 2, 3)).astype(np.float32)
    a, b = (rng.standard_normal((1, 128, 1, 2, 3)).astype(np.float32) for _ in range(2))
    prefix = rng.standard_normal((1, 128, second.pinned, 2, 3)).astype(np.float32)  # tile 2 pins tile 1's cells
    for tile, pinned in ((first, None), (second, prefix)):
        single = build_tile_state(latent, tile, rnd, carry, rnd.seams, (a, 0, 0.8), prefix=pinned)[0].joined()
        listed = build_tile_state(latent, tile, rnd, carry, rnd.seams, images=[(a, 0, 0.8)], prefix=pinned)[0].joined()
        assert all(np.array_equal(x, y) for x, y in zip(single, listed, strict=True))
    both = build_tile_state(latent, second, rnd, carry, rnd.seams, (a, 0, 0.8), [(b, 150, 0.5)], prefix)[0].joined()
    alone = build_tile_state(latent, second, rnd, carry, rnd.seams, (b, 150, 0.5), prefix=prefix)[0].joined()
    assert all(np.array_equal(x, y) for x, y in zip(both, alone, strict=True))  # frame 0 is outside tile 2


def test_a_dev_only_q8_pack_fuses_the_distilled_and_a_user_lora_as_one_set(tmp_path):
    from ltx_engine.loading.pack import Pack
    from ltx_engine.tiny.tiny_layouts import LORA_FILE
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    root = write_tiny_pack(tmp_path / "dev", seed=0, bits=8, layout="dev-only")
    pack = Pack(root)
    dev = pack._read("transformer_dev")
    write_tiny_lora(root / "style-lora.safetensors", tiny_lora_factors({"transformer_blocks.0.attn1.to_q": (64, 64)}, 3))
    got = pack.tensors("transformer", loras=(("style-lora.safetensors", 0.6),))
    once = fuse_loras(dev, [pack._lora(LORA_FILE, 1.0), pack._lora("style-lora.safetensors", 0.6)], SANITIZE, file="dev")
    twice = fuse_loras(fuse_loras(dev, [pack._lora(LORA_FILE, 1.0)], SANITIZE, file="dev"),
                       [pack._lora("style-lora.safetensors", 0.6)], SANITIZE, file="dev")
    key = "transformer_blocks.0.attn1.to_q.scales"
    assert all(mx.array_equal(got[k], once[k]).item() for k in once)
    assert not mx.array_equal(got[key], twice[key]).item()  # requantizing per LoRA is another weight
