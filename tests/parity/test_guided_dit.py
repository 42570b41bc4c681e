"""Parity of the perturbed DiT passes (STG block skipping, modality isolation; T2A's audio-only passes)
and of one full guided step of the tiny DiT with ltx-core 1.0.0 (+ the 1.2.0 cross-attention rule),
float32 <= 1e-4."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.components.diffusion_steps import EulerDiffusionStep  # noqa: E402
from ltx_core.components.guiders import MultiModalGuider, MultiModalGuiderParams  # noqa: E402
from ltx_core.model.transformer.model import X0Model  # noqa: E402

from ltx_engine.guided import guided_euler_step, guided_x0, pass_x0  # noqa: E402
from ltx_engine.rules import guidance as G  # noqa: E402
from ltx_engine.rules.sampling import LatentState, apply_clean  # noqa: E402
from ltx_engine.rules.schedule import ltx2_sigmas  # noqa: E402
from tests.parity import pipelines_ref as refp  # noqa: E402
from tests.parity.test_transformer import (  # noqa: E402
    _audio_inputs,
    _cfg,
    _models,
    _our_mod,
    _ref_mod,
    _rel,
    _video_inputs,
)

TOL = 1e-4


def _pair(ref, ours, video, audio, ref_pert, our_pert):
    with torch.no_grad():
        rv, ra = ref(_ref_mod(video), _ref_mod(audio), ref_pert)
    ov, oa = ours(_our_mod(video), _our_mod(audio), our_pert)
    return [_rel(np.array(o), r.numpy()) for o, r in ((ov, rv), (oa, ra)) if r is not None]


PERTURBED_CASES = {
    "stg_video_block1": (lambda b: refp.stg_config([1], None, b), G.Perturbation(video_self_blocks=frozenset({1}))),
    "stg_audio_block0": (lambda b: refp.stg_config(None, [0], b), G.Perturbation(audio_self_blocks=frozenset({0}))),
    "stg_both_all": (lambda b: refp.stg_config([0, 1], [0, 1], b),
                     G.Perturbation(video_self_blocks=frozenset({0, 1}), audio_self_blocks=frozenset({0, 1}))),
    "isolated": (refp.isolation_config, G.Perturbation(skip_a2v=True, skip_v2a=True)),
    "isolated_block1": (lambda b: refp.isolation_config(b, [1]),
                        G.Perturbation(skip_a2v=True, skip_v2a=True, cross_blocks=frozenset({1}))),
}


@pytest.fixture(scope="module")
def av_models():
    return _models(_cfg("split"), video_only=False)


@pytest.mark.parametrize("case", list(PERTURBED_CASES))
def test_perturbed_pass(av_models, case):
    ref, ours = av_models
    t = _cfg("split")["transformer"]
    rng = np.random.default_rng(11)
    video, audio = _video_inputs(rng, t["cross_attention_dim"]), _audio_inputs(rng, t["audio_cross_attention_dim"])
    make_ref, ours_pert = PERTURBED_CASES[case]
    errs = _pair(ref, ours, video, audio, make_ref(2), ours_pert)
    plain = _pair(ref, ours, video, audio, make_ref(2), None)
    print(case, errs, "vs unperturbed", plain)
    assert len(errs) == 2 and max(errs) <= TOL
    assert max(plain) > 1e-2  # the perturbation really changes the output


def test_audio_only_passes(av_models):
    """T2A's passes: the joint DiT with no video stream (upstream's `video=None`), plain and with the
    audio's STG block skipped, against ltx-core's; the perturbation changes the audio."""
    ref, ours = av_models
    audio = _audio_inputs(np.random.default_rng(12), _cfg("split")["transformer"]["audio_cross_attention_dim"])
    make_ref, ours_pert = PERTURBED_CASES["stg_audio_block0"]
    errs = _pair(ref, ours, None, audio, make_ref(2), ours_pert) + _pair(ref, ours, None, audio, None, None)
    changed = _pair(ref, ours, None, audio, make_ref(2), None)
    assert len(errs) == 2 and max(errs) <= TOL and max(changed) > 1e-2


def test_stg_blocks_outside_the_model_refused(av_models):
    _, ours = av_models
    with pytest.raises(ValueError, match="outside the model"):
        ours.block_skips(G.Perturbation(video_self_blocks=frozenset({28})))
    with pytest.raises(ValueError, match="outside the model"):
        ours.block_skips(G.Perturbation(skip_a2v=True, skip_v2a=True, cross_blocks=frozenset({2})))


def test_isolation_in_some_blocks_differs_from_every_block(av_models):
    """--modality-blocks 1 is its own pass: neither the plain model nor the every-block isolation."""
    ref, ours = av_models
    t = _cfg("split")["transformer"]
    rng = np.random.default_rng(11)
    video, audio = _video_inputs(rng, t["cross_attention_dim"]), _audio_inputs(rng, t["audio_cross_attention_dim"])
    some = ours(_our_mod(video), _our_mod(audio), PERTURBED_CASES["isolated_block1"][1])
    every = ours(_our_mod(video), _our_mod(audio), PERTURBED_CASES["isolated"][1])
    plain = ours(_our_mod(video), _our_mod(audio), None)
    for out in (every, plain):
        assert min(_rel(np.array(a), np.array(b)) for a, b in zip(some, out, strict=True)) > 1e-3


@pytest.mark.parametrize("frozen", ["video", "audio"])
@pytest.mark.parametrize("case", [None, "stg_both_all", "isolated_block1"])
def test_a_disabled_modality_is_frozen_as_upstreams(av_models, frozen, case):
    """One modality's guidance skipping this step (upstream's `Modality(enabled=False)`, ltx-core 1.0.0 as
    1.2.0): the other's velocity equals the reference's, ours gives none for the frozen one, and the frozen
    stream still feeds the other's cross-attention (the result differs from leaving it out)."""
    from dataclasses import replace

    ref, ours = av_models
    t = _cfg("split")["transformer"]
    rng = np.random.default_rng(13)
    video, audio = _video_inputs(rng, t["cross_attention_dim"]), _audio_inputs(rng, t["audio_cross_attention_dim"])
    make_ref, ours_pert = PERTURBED_CASES[case] if case else (lambda b: None, None)
    rv, ra = _ref_mod(video), _ref_mod(audio)
    ov, oa = _our_mod(video), _our_mod(audio)
    if frozen == "video":
        rv, ov = replace(rv, enabled=False), replace(ov, enabled=False)
    else:
        ra, oa = replace(ra, enabled=False), replace(oa, enabled=False)
    with torch.no_grad():
        ref_v, ref_a = ref(rv, ra, make_ref(2))
    out_v, out_a = ours(ov, oa, ours_pert)
    live_ref, live, dead = (ref_a, out_a, out_v) if frozen == "video" else (ref_v, out_v, out_a)
    err = _rel(np.array(live), live_ref.numpy())
    print(frozen, case, err)
    assert dead is None and err <= TOL
    alone = ours(None, _our_mod(audio), ours_pert)[1] if frozen == "video" else ours(_our_mod(video), None, ours_pert)[0]
    assert _rel(np.array(live), np.array(alone)) > 1e-3


def _states(rng, t):
    """Batch-1 states with a conditioned first frame (mask 0 on its tokens), as the pipelines run."""
    v = {k: (None if x is None else np.asarray(x)[:1]) for k, x in _video_inputs(rng, t["cross_attention_dim"]).items()}
    a = {k: (None if x is None else np.asarray(x)[:1]) for k, x in _audio_inputs(rng, t["audio_cross_attention_dim"]).items()}
    n = v["latent"].shape[1]
    vmask = np.ones((1, n, 1), np.float32)
    vmask[:, :24] = 0.0
    vclean = rng.standard_normal(v["latent"].shape).astype(np.float32)
    v["latent"][:, :24] = vclean[:, :24]  # conditioned tokens sit at their clean value
    video = LatentState(latent=v["latent"], denoise_mask=vmask, clean_latent=vclean, positions=v["positions"])
    amask = np.ones((1, a["latent"].shape[1], 1), np.float32)
    audio = LatentState(latent=a["latent"], denoise_mask=amask, clean_latent=a["latent"].copy(), positions=a["positions"])
    pos = {"video_context": v["context"], "audio_context": a["context"], "context_mask": None}
    neg = {"video_context": rng.standard_normal(v["context"].shape).astype(np.float32),
           "audio_context": rng.standard_normal(a["context"].shape).astype(np.float32), "context_mask": None}
    return video, audio, pos, neg


def _ref_modality(state: LatentState, sigma: float, context: np.ndarray):
    from ltx_core.model.transformer.modality import Modality

    ts = torch.from_numpy(state.denoise_mask * np.float32(sigma))  # (B, T, 1), as the pipelines build it
    return Modality(latent=torch.from_numpy(state.latent), sigma=torch.tensor([sigma], dtype=torch.float32),
                    timesteps=ts, positions=torch.from_numpy(state.positions), context=torch.from_numpy(context),
                    context_mask=None)


def _ref_guided_step(ref, video, audio, pos, neg, sigmas, step, vp: G.GuiderParams, ap: G.GuiderParams):
    """ltx-pipelines' multi_modal_guider_denoising_func + euler loop body, on ltx-core's parts."""
    x0 = X0Model(ref)
    s = sigmas[step]
    pv, pa = _ref_modality(video, s, pos["video_context"]), _ref_modality(audio, s, pos["audio_context"])
    nv, na = _ref_modality(video, s, neg["video_context"]), _ref_modality(audio, s, neg["audio_context"])
    with torch.no_grad():
        cond = x0(pv, pa, None)
        unc = x0(nv, na, None)
        ptb = x0(pv, pa, refp.stg_config(list(vp.stg_blocks), list(ap.stg_blocks), 1))
        mod = x0(pv, pa, refp.isolation_config(1))
    out = []
    for i, (p, state) in enumerate(((vp, video), (ap, audio))):
        params = MultiModalGuiderParams(cfg_scale=p.cfg_scale, stg_scale=p.stg_scale, stg_blocks=list(p.stg_blocks),
                                        rescale_scale=p.rescale, modality_scale=p.modality_scale)
        d = MultiModalGuider(params, negative_context=None).calculate(cond[i], unc[i], ptb[i], mod[i])
        d = refp.post_process_latent(d, torch.from_numpy(state.denoise_mask), torch.from_numpy(state.clean_latent))
        sig = torch.tensor(sigmas, dtype=torch.float32)
        out.append((EulerDiffusionStep().step(torch.from_numpy(state.latent), d, sig, step).numpy(), d.numpy()))
    return out


def test_one_full_guided_step_of_the_tiny_dit(av_models):
    ref, ours = av_models
    t = _cfg("split")["transformer"]
    video, audio, pos, neg = _states(np.random.default_rng(12), t)
    vp = G.GuiderParams(cfg_scale=3.0, stg_scale=1.0, stg_blocks=(1,), rescale=0.7, modality_scale=3.0)
    ap = G.GuiderParams(cfg_scale=7.0, stg_scale=1.0, stg_blocks=(1,), rescale=0.7, modality_scale=3.0)
    sigmas = list(ltx2_sigmas(30))
    step = 2
    (want_v, x0_v), (want_a, x0_a) = _ref_guided_step(ref, video, audio, pos, neg, sigmas, step, vp, ap)
    got_v, got_a = guided_euler_step(ours, video, audio, sigmas, step, pos, neg, vp, ap)
    ours_x0 = guided_x0(ours, video, audio, sigmas[step], pos, neg, vp, ap)
    errs = [_rel(got_v.latent, want_v), _rel(got_a.latent, want_a),
            _rel(apply_clean(ours_x0[0], video.clean_latent, video.denoise_mask), x0_v), _rel(ours_x0[1], x0_a)]
    # The step really moved: guided x0 differs from the conditional one by far more than the tolerance.
    cond_v, _ = pass_x0(ours, G.COND, video, audio, sigmas[step], pos, neg, vp, ap)
    guided_v, _ = guided_euler_step(ours, video, audio, sigmas, step, pos, neg, G.GuiderParams(), G.GuiderParams())
    print("guided step", errs, "guided vs unguided", _rel(got_v.latent, guided_v.latent))
    assert max(errs) <= TOL
    assert _rel(got_v.latent, guided_v.latent) > 1e-3
    np.testing.assert_array_equal(got_v.latent[:, :24], video.clean_latent[:, :24])
    assert cond_v.shape == video.latent.shape
