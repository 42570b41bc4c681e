"""Sampler math: sigma tables, Euler / ancestral steps, noise streams, LatentState."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ltx_engine.rules.sampling import (
    DISTILLED_SIGMAS,
    STAGE_2_DISTILLED_SIGMAS,
    STREAM_AUDIO,
    STREAM_VIDEO,
    TDP_STAGE_2_SIGMAS,
    LatentState,
    ancestral_denoise_step,
    apply_clean,
    denoise_step,
    euler_ancestral_step,
    euler_step,
    lerp_noise,
    noise,
    stream_id,
    timesteps_from_mask,
    x0_from_velocity,
)

RNG = np.random.default_rng(0)


def _arr(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_sigma_tables() -> None:
    assert DISTILLED_SIGMAS == (1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0)
    assert STAGE_2_DISTILLED_SIGMAS == (0.909375, 0.725, 0.421875, 0.0)
    assert STAGE_2_DISTILLED_SIGMAS == DISTILLED_SIGMAS[5:]
    assert TDP_STAGE_2_SIGMAS == (0.625, 0.4, 0.0)


def test_euler_step_formula() -> None:
    x, x0 = _arr(1, 6, 4), _arr(1, 6, 4)
    out = euler_step(x, x0, 0.725, 0.421875)
    expected = x.astype(np.float64) + (x - x0.astype(np.float64)) / 0.725 * (0.421875 - 0.725)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(euler_step(x, x0, 0.421875, 0.0), x0, atol=1e-6)
    with pytest.raises(ValueError):
        euler_step(x, x0, 0.0, 0.0)


def test_ancestral_step() -> None:
    x, x0, n = _arr(1, 5, 3), _arr(1, 5, 3), _arr(1, 5, 3)
    # eta = 0 is the plain Euler step
    np.testing.assert_allclose(
        euler_ancestral_step(x, x0, 0.9, 0.7, 0.0, None), euler_step(x, x0, 0.9, 0.7), atol=1e-6
    )
    # terminal sigma returns x0 exactly
    np.testing.assert_array_equal(euler_ancestral_step(x, x0, 0.4, 0.0, 0.5, n), x0)
    with pytest.raises(ValueError, match="noise"):
        euler_ancestral_step(x, x0, 0.9, 0.7, 0.5, None)
    # hand evaluation in float64
    s, sn, eta = 0.975, 0.909375, 0.5
    sd = sn * (1 + (sn / s - 1) * eta)
    r = sd / s
    an, ad = 1 - sn, 1 - sd
    renoise = np.sqrt(max(sn**2 - sd**2 * an**2 / ad**2, 0.0))
    expected = (an / ad) * (r * x + (1 - r) * x0) + n * renoise
    np.testing.assert_allclose(euler_ancestral_step(x, x0, s, sn, eta, n), expected, rtol=1e-5, atol=1e-6)


def test_noise_is_deterministic_and_streamed() -> None:
    a = noise((2, 7, 3), seed=42, stream=STREAM_VIDEO)
    assert a.dtype == np.float32 and a.shape == (2, 7, 3)
    np.testing.assert_array_equal(a, noise((2, 7, 3), 42, STREAM_VIDEO))
    assert not np.array_equal(noise((5,), 42, STREAM_VIDEO), noise((5,), 42, STREAM_AUDIO))
    assert not np.array_equal(noise((5,), 42), noise((5,), 43))
    assert stream_id(STREAM_VIDEO, 3) != stream_id(STREAM_AUDIO, 3) != stream_id(STREAM_VIDEO, 4)
    # pinned values: the same on every platform (Philox + numpy's float32 ziggurat)
    np.testing.assert_allclose(
        noise((5,), 42, 0), [0.18170474, -1.2426393, -0.55155301, 0.36648002, 0.60079044], rtol=0, atol=1e-7
    )


def test_noise_same_in_another_process() -> None:
    code = "from ltx_engine.rules.sampling import noise; import sys; sys.stdout.buffer.write(noise((64,), 7, 5).tobytes())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    np.testing.assert_array_equal(np.frombuffer(out, dtype=np.float32), noise((64,), 7, 5))


def test_lerp_noise_and_apply_clean() -> None:
    clean, latent, n = _arr(1, 4, 3), _arr(1, 4, 3), _arr(1, 4, 3)
    mask = np.array([1, 1, 0, 0.5], np.float32).reshape(1, 4, 1)
    x = lerp_noise(clean, clean, n, 0.8, mask)
    np.testing.assert_allclose(x[:, 0], n[:, 0] * 0.8 + clean[:, 0] * 0.2, atol=1e-6)
    np.testing.assert_array_equal(x[:, 2], clean[:, 2])
    np.testing.assert_allclose(x[:, 3], n[:, 3] * 0.4 + clean[:, 3] * 0.6, atol=1e-6)
    own = lerp_noise(latent, clean, n, 0.8, mask)  # starts from the token's own latent
    np.testing.assert_allclose(own[:, 3], 0.5 * clean[:, 3] + 0.5 * (0.2 * latent[:, 3] + 0.8 * n[:, 3]), atol=1e-6)
    x0 = _arr(1, 4, 3)
    y = apply_clean(x0, clean, mask)
    np.testing.assert_array_equal(y[:, 0], x0[:, 0])
    np.testing.assert_array_equal(y[:, 2], clean[:, 2])


def test_x0_from_velocity_shapes() -> None:
    x, v = _arr(2, 4, 3), _arr(2, 4, 3)
    mask = np.ones((2, 4, 1), np.float32)
    mask[:, 1] = 0
    ts = timesteps_from_mask(mask, 0.5)
    out = x0_from_velocity(x, v, ts)
    np.testing.assert_allclose(out, x - v * ts, atol=1e-6)
    np.testing.assert_array_equal(out[:, 1], x[:, 1])
    np.testing.assert_array_equal(x0_from_velocity(x, v, ts[..., 0]), out)


def _state(t: int = 6, c: int = 4) -> LatentState:
    return LatentState.initial(_arr(1, t, c), np.zeros((1, 3, t, 2), np.float32))


def test_latent_state_append_replace_truncate() -> None:
    st = _state()
    tok = _arr(1, 2, 4)
    st2 = st.append_tokens(tok, np.ones((1, 3, 2, 2), np.float32), strength=0.95)
    assert st2.num_tokens == 8
    np.testing.assert_allclose(st2.denoise_mask[0, 6:, 0], [0.05, 0.05], atol=1e-7)
    np.testing.assert_array_equal(st2.clean_latent[:, 6:], tok)
    np.testing.assert_array_equal(st2.latent[:, 6:], 0.0)  # placeholder zeros, the clean value apart
    np.testing.assert_array_equal(st2.positions[:, :, 6:], 1.0)
    st3 = st2.replace_tokens(0, tok, strength=1.0)
    np.testing.assert_array_equal(st3.denoise_mask[0, :2, 0], [0, 0])
    np.testing.assert_array_equal(st3.clean_latent[:, :2], tok)
    np.testing.assert_array_equal(st3.latent, st2.latent)  # the noisy latent stays as it was
    assert st3.truncate(6).num_tokens == 6
    with pytest.raises(ValueError):
        st.append_tokens(_arr(1, 2, 5), np.zeros((1, 3, 2, 2), np.float32), 1.0)
    with pytest.raises(ValueError):
        LatentState(
            _arr(1, 3, 2), np.ones((1, 3), np.float32), _arr(1, 3, 2), np.zeros((1, 3, 3, 2), np.float32)
        )


def test_denoise_steps_keep_conditioning_clean() -> None:
    st = _state().append_tokens(_arr(1, 2, 4), np.zeros((1, 3, 2, 2), np.float32), strength=1.0)
    st = st.noised(noise(st.latent.shape, 1), 0.909375)
    np.testing.assert_array_equal(st.latent[:, 6:], st.clean_latent[:, 6:])
    x0 = _arr(*st.latent.shape)
    sig = STAGE_2_DISTILLED_SIGMAS
    nxt = denoise_step(st, x0, sig, 0)
    np.testing.assert_array_equal(nxt.latent[:, 6:], st.clean_latent[:, 6:])
    anc = ancestral_denoise_step(st, x0, sig, 0, 0.5, noise(st.latent.shape, 2))
    np.testing.assert_array_equal(anc.latent[:, 6:], st.clean_latent[:, 6:])
    last = ancestral_denoise_step(st, x0, sig, 2, 0.5, noise(st.latent.shape, 3))
    np.testing.assert_array_equal(last.latent[:, :6], x0[:, :6])
