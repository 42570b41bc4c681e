"""The HDR IC-LoRA render in process on the tiny 2.5 pack (`ltx_engine.hdr_pipeline`, the oracle a farm
graph must equal), and its rules (`ltx_engine.rules.hdr_lora`).

A 25-frame 32x32 SDR clip written with PyAV (libx264) is read back as rgb24; the scene embedding is a
`.safetensors` with `video_context` (the pack's own connector output for a prompt); the pack's tiny HDR
LoRA (`farm pack tiny --variant 2.5`, metadata hdr_transform=acescct, downscale 1) is fused. One
full-size stage (8 Euler steps) with the reference tokens, a slot and a guide at the clip's one seam
(frame 24), the conv decode -> ACEScct codes -> Rec.709 linear (HLG master) and ACEScg (EXR).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from ltx_engine import hdr_pipeline
from ltx_engine.hdr_sources import read_exr_dir, read_sdr_clip
from ltx_engine.rules import hdr_lora
from tests.session_fixtures import link_packs

pytestmark = pytest.mark.timeout(120)
FPS, SIZE, FRAMES = 24.0, 32, 25


def _sdr_clip(path) -> np.ndarray:
    """A moving coloured gradient written as H.264 with PyAV and read back: (F, H, W, 3) uint8."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(24))
        stream.width = stream.height = SIZE
        stream.pix_fmt = "yuv420p"
        for i in range(FRAMES):
            ramp = (np.arange(SIZE)[None, :, None] * 3 + i * 9 + np.array([0, 60, 120])) % 256
            img = np.broadcast_to(ramp, (SIZE, SIZE, 3)).astype(np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode(None))
    frames, fps = read_sdr_clip(path)
    assert fps == FPS and frames.shape == (FRAMES, SIZE, SIZE, 3)
    return frames


@pytest.fixture(scope="module")
def hdr_setup(tiny25_pack, tmp_path_factory):
    import mlx.core as mx

    from ltx_engine.lora.lora import WithLoras
    from worker.runner import Runner

    folder = link_packs(tmp_path_factory.mktemp("packs25"), tiny25=tiny25_pack)
    runner = Runner(folder)
    engine, pack = runner.engine, runner.pack("tiny25")
    emb = folder / "scene-emb.safetensors"
    mx.save_safetensors(
        str(emb), {"video_context": mx.array(engine.encode_prompt(pack, "a scene")["video_context"])}
    )
    lora = folder / "tiny25" / hdr_lora.HDR_LORA_FILE
    config = hdr_lora.refuse_lora(lora)
    render = hdr_pipeline.HdrRender(FPS, 11, hdr_pipeline.load_video_context(emb), config.transfer)
    fused = WithLoras(pack, ((str(lora), hdr_lora.HDR_LORA_STRENGTH),))
    return engine, pack, fused, render, _sdr_clip(tmp_path_factory.mktemp("sdr") / "sdr.mp4")


def _run(setup, packs=None, **changes):
    from dataclasses import replace

    engine, pack, fused, render, clip = setup
    decode = hdr_pipeline.conv_decode(engine, pack)
    return hdr_pipeline.hdr_ic_lora(engine, packs or (pack, fused), clip, replace(render, **changes), decode)


@pytest.fixture(scope="module")
def base(hdr_setup):
    return _run(hdr_setup)


def test_the_tiny_hdr_lora_fits_the_pack_from_headers(hdr_setup):
    """The submit-time LoRA check (safetensors headers only) finds a module for every pair of factors."""
    from coordinator.admit.lora_check import _components
    from ltx_engine.rules.lora_check import check_lora_files
    from ltx_engine.rules.transformer_keys import pack_keys

    pack = hdr_setup[1]
    lora = pack.root / hdr_lora.HDR_LORA_FILE
    layers = pack.config["transformer"]["num_layers"]
    assert check_lora_files(_components(pack.root), [(lora, 1.0, "hdr")], pack_keys) == 5 * layers


def test_the_local_hdr_render_is_finite_in_range_and_deterministic(hdr_setup, base):
    from coordinator.assemble.hdr_master import hlg_signal

    out, again = base, _run(hdr_setup)
    for name in out:
        np.testing.assert_array_equal(out[name], again[name])
    assert out["video_latent"].shape == (1, 128, 4, 1, 1) and out["slots"].shape == (1, 128, 1, 1, 1)
    assert out["codes"].shape == out["linear_709"].shape == out["exr"].shape == (FRAMES, SIZE, SIZE, 3)
    for name in ("codes", "linear_709", "exr"):
        assert np.isfinite(out[name]).all() and out[name].min() >= 0.0
    signal = hlg_signal(out["linear_709"])
    assert np.isfinite(signal).all() and 0.0 <= signal.min() and signal.max() <= 1.0
    assert out["exr"].max() <= 2 ** (17.52 - 9.72) + 1e-3  # ACEScct's code 1.0 in ACEScg


def test_the_lora_the_keyframes_and_the_input_colorspace_each_change_the_render(hdr_setup, base):
    from dataclasses import replace

    _, pack, _, render, clip = hdr_setup
    plain = _run(hdr_setup, packs=(pack, pack))
    assert not np.allclose(plain["video_latent"], base["video_latent"], atol=1e-4)
    unkeyed = _run(hdr_setup, keyframes=False)
    assert "slots" not in unkeyed and not np.allclose(
        unkeyed["video_latent"], base["video_latent"], atol=1e-4
    )
    gamma, linear = (
        hdr_pipeline.reference_pixels(clip, replace(render, input_colorspace=name))
        for name in ("srgb_gamma", "srgb")
    )
    assert gamma.shape == (1, 3, FRAMES, SIZE, SIZE) and gamma.min() >= -1.0 and gamma.max() <= 1.0
    assert (linear >= gamma).all() and (linear > gamma).any()  # the sRGB EOTF darkens every code below 1
    hq = hdr_pipeline.reference_pixels(clip[:, :30, :30], replace(render, high_quality=True))
    assert hq.shape == (1, 3, 2 * FRAMES - 1, 32, 32)  # every frame twice, sides reflect-padded to 32
    np.testing.assert_array_equal(hq[:, :, 1::2], hq[:, :, 0:-1:2])
    np.testing.assert_array_equal(hq[:, :, :, 30:], hq[:, :, :, 28:26:-1])
    engine, _, fused, _, _ = hdr_setup
    decode = hdr_pipeline.conv_decode(engine, pack)
    odd = hdr_pipeline.hdr_ic_lora(
        engine, (pack, fused), clip[:, :30, :28], replace(render, high_quality=True), decode
    )
    assert odd["video_latent"].shape == (1, 128, 7, 1, 1) and odd["slots"].shape == (
        1,
        128,
        1,
        1,
        1,
    )  # seam 48
    assert odd["exr"].shape == (FRAMES, 30, 28, 3)  # cropped back, every other generated frame kept
    plates = hdr_pipeline.reference_pixels(np.float32(clip) / 255, replace(render, input_colorspace="acescg"))
    assert plates.shape == gamma.shape and not np.allclose(plates, linear)


def test_the_hdr_stage_split_two_and_three_ways_equals_the_unsplit_stage(hdr_setup):
    """The grade's stage under `--stage1-parallel`: its video tokens (4 latent frames generated, the 4 of the
    reference, the seam's guide and slot: 10 per cell, 2x2 cells at 64x64) cut 2 and 3 ways (40 = 3·14 - 2:
    padded) by rows, K/V gathered whole, equals the unsplit stage bit for bit, latent and slots; a stage
    resumed 3 ways from the 2-way split's kept step 3 (a gang that broke, rank 0 on) too."""
    from ltx_engine.conditioning import GUIDE, ImageCondition
    from ltx_engine.parallel.sp_denoise import Resume, Split

    engine, pack, fused, render, clip = hdr_setup
    pixels = hdr_pipeline.reference_pixels(np.tile(clip, (1, 2, 2, 1)), render)
    reference = hdr_pipeline.encode(engine, pack, pixels)
    guide = ImageCondition(hdr_pipeline.encode(engine, pack, pixels[:, :, 24:25]), 24, 0.95, GUIDE, "seam")
    stage = hdr_pipeline.stage_inputs(render, pixels, reference, (guide,), (24,))
    plain = hdr_pipeline.denoise_video(engine, fused, stage)
    assert plain["video_latent"].shape == (1, 128, 4, 2, 2) and plain["slots"].shape == (1, 128, 1, 2, 2)
    kept = {}
    for k in (2, 3):
        keep = (lambda n, video, audio: kept.setdefault(n, video)) if k == 2 else None
        split = hdr_pipeline.denoise_video(engine, fused, stage, Split(k), on_step=keep)
        assert split.keys() == plain.keys()
        for key in plain:
            np.testing.assert_array_equal(split[key], plain[key], err_msg=f"{k} ways: {key}")
    resumed = hdr_pipeline.denoise_video(engine, fused, stage, Split(3), resume=Resume(3, kept[3], None))
    for key in plain:
        np.testing.assert_array_equal(resumed[key], plain[key], err_msg=f"resumed: {key}")


def test_hdr_rules_seams_fps_and_lora_metadata(tmp_path):
    import mlx.core as mx

    assert (
        hdr_lora.seam_frames(25) == (24,) and hdr_lora.seam_frames(17) == () and hdr_lora.seam_frames(1) == ()
    )
    assert hdr_lora.seam_frames(49) == (24, 48) and hdr_lora.seam_frames(25, high_quality=True) == (48,)
    assert hdr_lora.conditioning_fps(60.0) == 30.0 and hdr_lora.conditioning_fps(24.0) == 24.0
    cases = {
        "flag": ({"use_hdr_transform": "1"}, "logc3"),
        "true": ({"hdr_transform": "true"}, "logc3"),
        "acescct": ({"hdr_transform": "acescct", "reference_downscale_factor": "1"}, "acescct"),
    }
    for name, (metadata, transfer) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        mx.save_safetensors(str(path), {"x": mx.zeros((1,))}, metadata=metadata)
        assert hdr_lora.read_hdr_lora_config(path) == hdr_lora.HdrLoraConfig(transfer, 1)
    plain = tmp_path / "plain.safetensors"
    mx.save_safetensors(str(plain), {"x": mx.zeros((1,))}, metadata={"reference_downscale_factor": "2"})
    assert hdr_lora.read_hdr_lora_config(plain) is None


def test_an_exr_folder_reads_back_as_plates_for_the_reference(tmp_path):
    import OpenEXR

    plates = np.random.default_rng(4).uniform(0, 6, (2, 8, 8, 3)).astype(np.float16)
    for i, plate in enumerate(plates):
        channels = {c: np.ascontiguousarray(plate[..., k]) for k, c in enumerate("RGB")}
        header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
        with OpenEXR.File(header, channels) as exr:
            exr.write(str(tmp_path / f"frame_{i:05d}.exr"))
    got = read_exr_dir(tmp_path)
    np.testing.assert_array_equal(got, plates.astype(np.float32))
    render = hdr_pipeline.HdrRender(FPS, 0, np.zeros((1, 1, 1), np.float32), input_colorspace="acescg")
    pixels = hdr_pipeline.reference_pixels(got[:1], render)
    assert pixels.shape == (1, 3, 1, 32, 32) and -1.0 <= pixels.min() and pixels.max() <= 1.0
    with pytest.raises(hdr_lora.HdrRefusal, match="8k\\+1"):
        hdr_pipeline.reference_pixels(got, render)


def test_hdr_refusals_are_one_line_and_say_how(tmp_path):
    with pytest.raises(hdr_lora.HdrRefusal, match=r"needs an LTX-2.5 pack; 'tiny' is LTX-2.3"):
        hdr_lora.refuse_pack("2.3", "tiny")
    hdr_lora.refuse_pack("2.5", "tiny25")
    missing = tmp_path / hdr_lora.HDR_LORA_FILE
    with pytest.raises(hdr_lora.HdrRefusal) as err:
        hdr_lora.refuse_lora(missing)
    line = str(err.value)
    assert "\n" not in line and hdr_lora.HDR_LORA_FILE in line
    assert f"hf download {hdr_lora.HDR_LORA_REPO} {hdr_lora.HDR_LORA_FILE}" in line
    import mlx.core as mx

    plain = tmp_path / "detailing.safetensors"
    mx.save_safetensors(str(plain), {"x": mx.zeros((1,))}, metadata={"reference_downscale_factor": "2"})
    with pytest.raises(hdr_lora.HdrRefusal, match="not an HDR IC-LoRA"):
        hdr_lora.refuse_lora(plain)
    with pytest.raises(hdr_lora.HdrRefusal, match="8k\\+1 frames; it has 24: trim it to 17"):
        hdr_lora.refuse_frames(24)
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    with pytest.raises(ValueError, match="bad.mp4: not a readable video"):
        read_sdr_clip(tmp_path / "bad.mp4")
    with pytest.raises(hdr_lora.HdrRefusal, match="text-embeddings file"):
        hdr_pipeline.load_video_context(tmp_path / "none.safetensors")


def test_the_stage_layout_generated_guides_slots_then_the_clean_reference():
    from ltx_engine.conditioning import GUIDE, ImageCondition
    from ltx_engine.denoise import build_stage_states
    from ltx_engine.rules.tokens import patchify_video

    rng = np.random.default_rng(5)
    ref, seam = (rng.standard_normal((1, 128, f, 1, 1)).astype(np.float32) for f in (4, 1))
    render = hdr_pipeline.HdrRender(FPS, 1, np.zeros((1, 4, 64), np.float32))
    pixels = np.zeros((1, 3, FRAMES, 32, 32), np.float32)
    masks = {}
    for seams in ((24,), ()):
        guides = tuple(ImageCondition(seam, s, hdr_lora.KEYFRAME_STRENGTH, GUIDE, "seam") for s in seams)
        video, _ = build_stage_states(hdr_pipeline.stage_inputs(render, pixels, ref, guides, seams), 128)
        np.testing.assert_array_equal(video.latent[:, -4:], patchify_video(ref))  # the reference stays clean
        masks[seams] = video.denoise_mask[0, :, 0]
    want = (
        [1.0] * 4 + [1 - hdr_lora.KEYFRAME_STRENGTH, 1.0] + [0.0] * 4
    )  # generated, seam guide, slot, reference
    np.testing.assert_allclose(masks[(24,)], want, atol=1e-7)
    np.testing.assert_allclose(masks[()], [1.0] * 4 + [0.0] * 4)


def test_seam_slots_on_a_23_dit_are_refused(local_runner):
    """A 2.3 DiT has no keyframe position embedding: the slots would be unmarked, so the stage refuses."""
    render = hdr_pipeline.HdrRender(FPS, 1, np.zeros((1, 4, 64), np.float32))
    pixels, ref = np.zeros((1, 3, FRAMES, 32, 32), np.float32), np.zeros((1, 128, 4, 1, 1), np.float32)
    inputs = hdr_pipeline.stage_inputs(render, pixels, ref, (), (24,))
    with pytest.raises(hdr_lora.HdrRefusal, match="need an LTX-2.5 DiT"):
        hdr_pipeline.denoise_video(local_runner.engine, local_runner.pack("tiny"), inputs)
