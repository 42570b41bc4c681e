"""Parity of guidance (guiders, combine, perturbed DiT passes), the LTX2 scheduler and res_2s with
ltx-core 1.0.0 (float32, <= 1e-4 relative); ltx-pipelines' loops as transcribed in pipelines_ref."""

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.components.diffusion_steps import EulerDiffusionStep, Res2sDiffusionStep  # noqa: E402
from ltx_core.components.guiders import (  # noqa: E402
    CFGGuider,
    CFGStarRescalingGuider,
    LtxAPGGuider,
    MultiModalGuider,
    MultiModalGuiderFactory,
    MultiModalGuiderParams,
    STGGuider,
)
from ltx_core.components.schedulers import LTX2Scheduler  # noqa: E402

from ltx_engine.rules import guidance as G  # noqa: E402
from ltx_engine.rules import res2s as R  # noqa: E402
from ltx_engine.rules.schedule import ltx2_sigmas  # noqa: E402
from tests.parity import pipelines_ref as ref_loops  # noqa: E402

TOL = 1e-4


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _outputs(seed: int, shape=(2, 24, 16)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    cond = rng.standard_normal(shape, np.float32)
    return {G.COND: cond, **{n: (cond + 0.3 * rng.standard_normal(shape, np.float32)).astype(np.float32)
                             for n in (G.UNCOND, G.PERTURBED, G.ISOLATED)}}


def _t(x):
    return torch.from_numpy(np.asarray(x))


def test_single_guiders():
    # Batch 1: 1.0.0's CFGStarRescalingGuider broadcasts its (B, 1) coefficient against the trailing
    # axes, so it is only defined for one sample (ours is per sample, equal there).
    o = _outputs(0, (1, 24, 16))
    c, u, p = o[G.COND], o[G.UNCOND], o[G.PERTURBED]
    for scale in (1.0, 3.0, 7.5):
        assert _rel(G.cfg_delta(scale, c, u), CFGGuider(scale).delta(_t(c), _t(u)).numpy()) <= TOL or scale == 1.0
        assert _rel(G.cfg_star_delta(scale, c, u), CFGStarRescalingGuider(scale).delta(_t(c), _t(u)).numpy()) <= TOL \
            or scale == 1.0
        assert _rel(G.stg_delta(scale, c, p), STGGuider(scale).delta(_t(c), _t(p)).numpy()) <= TOL
    assert not G.cfg_delta(1.0, c, u).any()


COMBINES = {
    "dev_video": G.VIDEO_DEV, "dev_audio": G.AUDIO_DEV, "hq_video": G.VIDEO_HQ, "hq_audio": G.AUDIO_HQ,
    "cfg_only": G.GuiderParams(cfg_scale=3.0),
    "stg_only": G.GuiderParams(stg_scale=1.0, stg_blocks=(1,)),
    "modality_only_rescaled": G.GuiderParams(modality_scale=2.0, rescale=0.7),
    "plain": G.GuiderParams(),
}


def _ref_params(p: G.GuiderParams) -> MultiModalGuiderParams:
    return MultiModalGuiderParams(cfg_scale=p.cfg_scale, stg_scale=p.stg_scale, stg_blocks=list(p.stg_blocks),
                                  rescale_scale=p.rescale, modality_scale=p.modality_scale)


@pytest.mark.parametrize("name", list(COMBINES))
def test_combine_matches_multimodal_guider(name):
    p = COMBINES[name]
    o = _outputs(1)
    guider = MultiModalGuider(_ref_params(p))
    # The reference loop passes 0.0 for a pass it did not run; ours leaves the term out.
    ran = G.passes_needed(p)
    args = [_t(o[n]) if n in ran else 0.0 for n in (G.UNCOND, G.PERTURBED, G.ISOLATED)]
    want = guider.calculate(_t(o[G.COND]), *args).numpy()
    got = G.combine(p, {n: o[n] for n in ran})
    assert _rel(got, want) <= TOL
    assert guider.do_unconditional_generation() == (G.UNCOND in ran)
    assert guider.do_perturbed_generation() == (G.PERTURBED in ran)
    assert guider.do_isolated_modality_generation() == (G.ISOLATED in ran)


@pytest.mark.parametrize(("scale", "eta", "threshold"), [(3.0, 1.0, 0.0), (3.0, 0.0, 0.0), (7.0, 0.5, 2.0),
                                                          (4.0, 1.5, 50.0)])
def test_apg_delta_matches_ltx_apg_guider(scale, eta, threshold):
    """`LtxAPGGuider.delta` (1.0.0, unchanged in 1.2.0); one sample, as its (B, 1) projection broadcasts."""
    o = _outputs(5, (1, 24, 16))
    c, u = o[G.COND], o[G.UNCOND]
    want = LtxAPGGuider(scale, eta, threshold).delta(_t(c), _t(u)).numpy()
    assert _rel(G.apg_delta(scale, c, u, eta, threshold), want) <= TOL


def test_a_combine_with_apg_takes_apgs_delta_for_the_cfg_term():
    p = G.GuiderParams(cfg_scale=3.0, stg_scale=1.0, stg_blocks=(1,), modality_scale=2.0, rescale=0.7, apg_eta=0.5,
                       apg_norm_threshold=3.0)
    o = _outputs(6, (1, 24, 16))
    apg = LtxAPGGuider(3.0, 0.5, 3.0).delta(_t(o[G.COND]), _t(o[G.UNCOND]))
    # MultiModalGuider.calculate with its CFG difference replaced by APG's delta:
    # uncond_text chosen so that (cfg - 1)(cond - uncond_text) == apg.
    uncond_text = _t(o[G.COND]) - apg / 2.0
    want = MultiModalGuider(_ref_params(p)).calculate(_t(o[G.COND]), uncond_text, _t(o[G.PERTURBED]),
                                                      _t(o[G.ISOLATED])).numpy()
    assert _rel(G.combine(p, o), want) <= TOL
    assert G.params_from_dict(G.params_to_dict(p)) == p
    assert "apg_eta" not in G.params_to_dict(G.VIDEO_DEV) and "skip_step" not in G.params_to_dict(G.VIDEO_DEV)


@pytest.mark.parametrize("skip", [0, 1, 2, 4])
def test_skip_step_is_the_guiders(skip):
    ref = MultiModalGuider(MultiModalGuiderParams(cfg_scale=3.0, skip_step=skip))
    ours = G.GuiderParams(cfg_scale=3.0, skip_step=skip)
    assert [G.skips_step(ours, i) for i in range(12)] == [ref.should_skip_step(i) for i in range(12)]


def test_params_binned_by_sigma_are_the_factorys():
    bins = {1.0: G.GuiderParams(cfg_scale=5.0), 0.6: G.GuiderParams(cfg_scale=3.0), 0.2: G.GuiderParams(cfg_scale=1.5)}
    factory = MultiModalGuiderFactory.from_dict({k: _ref_params(v) for k, v in bins.items()})
    for sigma in (1.5, 1.0, 0.99, 0.6, 0.59, 0.2, 0.1, 0.0):
        assert _ref_params(G.params_for_sigma(tuple(bins.items()), sigma)) == factory.params(sigma), sigma
    with pytest.raises(ValueError, match="at least one"):
        G.params_for_sigma((), 0.5)


def test_a_planned_guidance_schedule_is_the_factorys_per_round():
    """--guidance-schedule on a one-stage plan: each round's guide step carries, per modality, the params
    ltx-core's `MultiModalGuiderFactory.from_dict(...).build_from_sigma(sigma)` gives at that round's sigma
    (as ltx-pipelines 1.2.0's `FactoryGuidedDenoiser` asks for them), and runs the passes those guiders ask
    for (`do_unconditional_generation` ...); the skip step read from the bin's params, as upstream."""
    from coordinator.plan import guidance as PG
    from coordinator.plan.recipes import guided_stage
    from coordinator.plan.resolved import RenderPlan

    spec = {"pipeline": "one-stage", "steps": 4, "stg_blocks": [1],
            "guidance_schedule": "1.0:cfg_scale=5,audio_stg_scale=0;0.7:cfg_scale=1,audio_cfg_scale=1,modality_scale=1,"
                                 "audio_modality_scale=1,skip_step=1,audio_skip_step=1"}
    rec = guided_stage(RenderPlan.from_stored(spec), num_layers=2)
    ctx = {k: {n: {"task": f"r.{k}", "output": n} for n in ("video_context", "audio_context")}
           for k in ("prompt", "negative")}
    tasks = PG.plan_guided_stage("r", "stage1", rec, {"pack": "tiny", "seed": 1}, "r.prep", ctx)
    factories = [MultiModalGuiderFactory.from_dict({b: _ref_params(v if i == 0 else a) for b, v, a in rec.bins})
                 for i in range(2)]
    steps = [t for t in tasks if t["kind"] == "guide_step"]
    assert len(steps) == 4
    seen = set()
    for t in steps:
        sigma, index = rec.sigmas[t["params"]["step"]], t["params"]["step"]
        guiders = [f.build_from_sigma(sigma) for f in factories]
        ours = [G.params_from_dict(t["params"][m]) for m in ("video", "audio")]
        assert [_ref_params(p) for p in ours] == [g.params for g in guiders], sigma
        skip = [G.skips_step(p, index) for p in ours]
        upstream_skip = [MultiModalGuider(replace(g.params, skip_step=p.skip_step)).should_skip_step(index)
                         for g, p in zip(guiders, ours, strict=True)]
        assert skip == upstream_skip
        want = [] if skip[0] and skip[1] else [G.COND] + [n for n, ask in (
            (G.UNCOND, any(g.do_unconditional_generation() for g in guiders)),
            (G.PERTURBED, any(g.do_perturbed_generation() for g in guiders)),
            (G.ISOLATED, any(g.do_isolated_modality_generation() for g in guiders))) if ask]
        assert t["params"]["passes"] == want, (sigma, t["params"]["passes"])
        seen.add(tuple(want))
    assert len(seen) == 3  # the 1.0 bin's four passes, the 0.7 bin's cond + perturbed, and a held round


def test_passes_for_the_recipes():
    assert G.passes_needed(G.VIDEO_DEV, G.AUDIO_DEV) == (G.COND, G.UNCOND, G.PERTURBED, G.ISOLATED)
    assert G.passes_needed(G.VIDEO_HQ, G.AUDIO_HQ) == (G.COND, G.UNCOND, G.ISOLATED)
    assert G.passes_needed(G.GuiderParams(), G.GuiderParams()) == (G.COND,)
    # Audio alone asking for STG still needs the perturbed pass, with only audio self-attention skipped.
    audio_stg = G.GuiderParams(stg_scale=1.0, stg_blocks=(0,))
    assert G.passes_needed(G.GuiderParams(), audio_stg) == (G.COND, G.PERTURBED)
    pert = G.perturbation_for(G.PERTURBED, G.GuiderParams(stg_blocks=(1,)), audio_stg)
    assert pert.video_self_blocks == frozenset() and pert.audio_self_blocks == {0}
    assert G.perturbation_for(G.ISOLATED, G.VIDEO_DEV, G.AUDIO_DEV) == G.Perturbation(skip_a2v=True, skip_v2a=True)


@pytest.mark.parametrize("steps", [1, 8, 15, 30, 40])
def test_ltx2_scheduler_sigmas(steps):
    want = LTX2Scheduler().execute(steps=steps).numpy()
    got = np.array(ltx2_sigmas(steps), np.float32)
    assert got.shape == want.shape and got[0] == want[0] and got[-1] == 0.0
    np.testing.assert_allclose(got, want, rtol=TOL, atol=1e-7)


def test_ltx2_scheduler_token_shift():
    latent = torch.zeros(1, 8, 3, 16, 24)  # 1152 tokens
    want = LTX2Scheduler().execute(steps=12, latent=latent, terminal=0.2).numpy()
    np.testing.assert_allclose(ltx2_sigmas(12, tokens=3 * 16 * 24, terminal=0.2), want, rtol=TOL, atol=1e-7)
    with pytest.raises(ValueError):
        ltx2_sigmas(0)


def test_res2s_step_and_sde_coefficients():
    rng = np.random.default_rng(3)
    x, d, n = (rng.standard_normal((1, 30, 8)) for _ in range(3))
    step = Res2sDiffusionStep()
    for sigmas in ([0.9, 0.6], [0.3, 0.0011], [0.05, 0.02]):
        s32 = torch.tensor(sigmas, dtype=torch.float32)
        want = step.step(sample=_t(x), denoised_sample=_t(d), sigmas=s32, step_index=0, noise=_t(n)).numpy()
        got = R.sde_step(x, d, np.float32(sigmas[0]), np.float32(sigmas[1]), n, dtype=np.float32)
        assert _rel(got, want) <= TOL
        alpha, down, up = step.get_sde_coeff(s32[1:], sigma_up=s32[1:] * 0.5)
        ours = R.sde_coefficients(sigmas[1])
        np.testing.assert_allclose(ours, [alpha.item(), down.item(), up.item()], rtol=1e-6)


def _toy_denoise_np(x, sigma):
    return (np.tanh(np.asarray(x, np.float32)) * np.float32(0.8) + np.float32(0.05) * np.float32(sigma)).astype(np.float32)


def _toy_denoise_torch(x, sigma):
    return (torch.tanh(x.float()) * 0.8 + 0.05 * float(sigma)).float()


def _res2s_ours(sigmas, latent, mask, clean, step_raw, sub_raw, denoise):
    ext = R.res2s_sigmas(sigmas)
    x = latent
    for i in range(R.full_steps(sigmas)):
        mid = R.res2s_midpoint(x, denoise(x, ext[i]), mask, clean, ext, i, R.normalise_noise(sub_raw[i]))
        x0_2 = denoise(mid.x_mid.astype(np.float32), mid.sub_sigma)
        x = R.res2s_finish(mid, x0_2, mask, clean, ext, i, R.normalise_noise(step_raw[i]))
    if sigmas[-1] == 0:
        x0 = denoise(x, ext[R.full_steps(sigmas)])
        x = (x0 * mask + clean * (1 - mask)).astype(np.float32)
    return x


@pytest.mark.parametrize("sigmas", [tuple(ltx2_sigmas(6)), (0.909375, 0.725, 0.421875, 0.0), (1.0, 0.5, 0.2)])
def test_res2s_loop(sigmas):
    rng = np.random.default_rng(5)
    shape = (1, 40, 8)
    latent = rng.standard_normal(shape).astype(np.float32)
    clean = rng.standard_normal(shape).astype(np.float32)
    mask = np.ones((1, 40, 1), np.float32)
    mask[:, :6] = 0.0  # conditioned tokens
    step_raw = [rng.standard_normal(shape) for _ in sigmas]
    sub_raw = [rng.standard_normal(shape) for _ in sigmas]
    want = ref_loops.res2s_loop(torch.tensor(sigmas, dtype=torch.float32), _t(latent), _t(mask), _t(clean),
                                _toy_denoise_torch, [_t(n) for n in step_raw], [_t(n) for n in sub_raw]).numpy()
    got = _res2s_ours(sigmas, latent, mask, clean, step_raw, sub_raw, _toy_denoise_np)
    assert got.dtype == np.float32
    assert _rel(got, want) <= TOL
    np.testing.assert_array_equal(got[:, :6], clean[:, :6])
    assert R.evaluations(sigmas) == 2 * (len(sigmas) - 1) + (sigmas[-1] == 0)


def test_noise_normalisation_and_streams():
    raw = np.random.default_rng(2).standard_normal((2, 30, 8))
    np.testing.assert_allclose(R.normalise_noise(raw), ref_loops.new_noise(_t(raw.copy())).numpy(), rtol=1e-10)
    a = R.sde_noise((1, 30, 8), seed=7, stream=R.STREAM_VIDEO_STEP)
    assert a.dtype == np.float64
    np.testing.assert_array_equal(a, R.sde_noise((1, 30, 8), seed=7, stream=R.STREAM_VIDEO_STEP))
    assert not np.array_equal(a, R.sde_noise((1, 30, 8), seed=7, stream=R.STREAM_VIDEO_SUBSTEP))


def test_euler_after_combine_matches_reference_step():
    """The Euler step the guided one-stage loop takes, on a combined x0 (ltx-core's EulerDiffusionStep)."""
    from ltx_engine.rules.sampling import euler_step

    o = _outputs(4, (1, 24, 16))
    x0 = G.combine(G.VIDEO_DEV, o)
    x = np.random.default_rng(9).standard_normal((1, 24, 16)).astype(np.float32)
    sig = ltx2_sigmas(30)
    want = EulerDiffusionStep().step(_t(x), _t(x0), torch.tensor(sig, dtype=torch.float32), 3).numpy()
    assert _rel(euler_step(x, x0, sig[3], sig[4]), want) <= TOL


def test_combine_follows_main_float32_rule_on_bf16_passes():
    """bf16 pass outputs (what a bf16 DiT returns): ours upcasts and combines in float32, as main does;
    1.0.0's bf16 combine is far off — the case tells the two rules apart."""
    from tests.parity.upstream_rules import multimodal_calculate_main

    o = {n: torch.from_numpy(x).to(torch.bfloat16) for n, x in _outputs(6, (1, 64, 32)).items()}
    guider = MultiModalGuider(_ref_params(G.VIDEO_DEV))
    args = (o[G.COND], o[G.UNCOND], o[G.PERTURBED], o[G.ISOLATED])
    main = multimodal_calculate_main(guider, *args).numpy()
    old = guider.calculate(*args).float().numpy()
    ours = G.combine(G.VIDEO_DEV, {n: x.float().numpy() for n, x in o.items()})
    print("bf16 passes: ours vs main", _rel(ours, main), "1.0.0 vs main", _rel(old, main))
    assert _rel(ours, main) <= TOL
    assert _rel(old, main) > 10 * TOL
