"""Guidance for the dev recipes: which forward passes a guided step needs, and their combine.

Pure numpy (the coordinator's reducer imports it, as it imports `sampling`). Facts from ltx-core's
`components/guiders.py` (`CFGGuider`, `STGGuider`, `CFGStarRescalingGuider`, `MultiModalGuider`) and
ltx-pipelines' `multi_modal_guider_denoising_func` / `utils/constants.py`:

- A guided step runs up to four forwards over the same tokens: COND (the prompt), UNCOND (the negative
  prompt; needed when cfg != 1), PERTURBED (the prompt with self-attention skipped in the STG blocks:
  video self-attention when the video STG scale != 0, audio self-attention when the audio one != 0;
  needed when either is non-zero), ISOLATED (the prompt with both audio<->video cross-attentions
  skipped, in every block as upstream's pipelines do, or in the `modality_blocks` given; needed when a
  modality scale != 1). One pass serves both modalities: its
  video output feeds the video combine and its audio output the audio one.
- The combine, per modality, on the denoised (x0) outputs, in this order and association:
  `pred = cond + (cfg-1)(cond-uncond) + stg(cond-perturbed) + (mod-1)(cond-isolated)`, then when
  rescale != 0, `pred *= rescale * std(cond)/std(pred) + (1 - rescale)` (std over the whole tensor,
  unbiased, as torch's `Tensor.std()`). A pass a modality does not use contributes a zero term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32

COND, UNCOND, PERTURBED, ISOLATED = "cond", "uncond", "perturbed", "isolated"
PASS_ORDER: tuple[str, ...] = (COND, UNCOND, PERTURBED, ISOLATED)


@dataclass(frozen=True)
class GuiderParams:
    """One modality's guidance scales (ltx-core's `MultiModalGuiderParams`), and the CFG term's form.

    `skip_step` N > 0: guidance runs on every (N+1)-th step only; a skipped step reuses the modality's
    last guided x0 (`skips_step`). `apg_eta` set: the CFG term is `LtxAPGGuider`'s projected delta
    (`apg_delta`: the part of cond - uncond parallel to cond weighted by eta, optionally clipped to
    `apg_norm_threshold`) instead of the plain difference; upstream's pipelines run plain CFG.
    `modality_blocks`: the blocks whose audio<->video cross-attentions the ISOLATED pass skips (None:
    every block, upstream's pipelines' `blocks=None`; ltx-core's `Perturbation` takes a block list).
    """

    cfg_scale: float = 1.0
    stg_scale: float = 0.0
    stg_blocks: tuple[int, ...] = ()
    rescale: float = 0.0
    modality_scale: float = 1.0
    skip_step: int = 0
    apg_eta: float | None = None
    apg_norm_threshold: float = 0.0
    modality_blocks: tuple[int, ...] | None = None

    def needs_uncond(self) -> bool:
        return not math.isclose(self.cfg_scale, 1.0)

    def needs_perturbed(self) -> bool:
        return not math.isclose(self.stg_scale, 0.0)

    def needs_isolated(self) -> bool:
        return not math.isclose(self.modality_scale, 1.0)


# ltx-pipelines `constants.py`: LTX-2.3 dev (one-stage / two-stage stage 1) and the HQ recipe.
STG_BLOCK_2_3 = 28
DEV_STEPS_2_3 = 30
HQ_STEPS = 15
VIDEO_DEV = GuiderParams(cfg_scale=3.0, stg_scale=1.0, stg_blocks=(STG_BLOCK_2_3,), rescale=0.7, modality_scale=3.0)
AUDIO_DEV = GuiderParams(cfg_scale=7.0, stg_scale=1.0, stg_blocks=(STG_BLOCK_2_3,), rescale=0.7, modality_scale=3.0)
VIDEO_HQ = GuiderParams(cfg_scale=3.0, stg_scale=0.0, stg_blocks=(), rescale=0.45, modality_scale=3.0)
AUDIO_HQ = GuiderParams(cfg_scale=7.0, stg_scale=0.0, stg_blocks=(), rescale=1.0, modality_scale=3.0)
DEFAULT_NEGATIVE_PROMPT = (
    "blurry, out of focus, overexposed, underexposed, low contrast, washed out colors, excessive noise, "
    "grainy texture, poor lighting, flickering, motion blur, distorted proportions, unnatural skin tones, "
    "deformed facial features, asymmetrical face, missing facial features, extra limbs, disfigured hands, "
    "wrong hand count, artifacts around text, inconsistent perspective, camera shake, incorrect depth of "
    "field, background too sharp, background clutter, distracting reflections, harsh shadows, inconsistent "
    "lighting direction, color banding, cartoonish rendering, 3D CGI look, unrealistic materials, uncanny "
    "valley effect, incorrect ethnicity, wrong gender, exaggerated expressions, wrong gaze direction, "
    "mismatched lip sync, silent or muted audio, distorted voice, robotic voice, echo, background noise, "
    "off-sync audio, incorrect dialogue, added dialogue, repetitive speech, jittery movement, awkward "
    "pauses, incorrect timing, unnatural transitions, inconsistent framing, tilted camera, flat lighting, "
    "inconsistent tone, cinematic oversaturation, stylized filters, or AI artifacts."
)


@dataclass(frozen=True)
class Perturbation:
    """What one forward pass skips (ltx-core's `PerturbationConfig` for one sample).

    Skipping a self-attention passes its value projection through (gates and output projection still
    apply); skipping an audio<->video cross-attention drops its residual update, in `cross_blocks`
    (None: every block).
    """

    video_self_blocks: frozenset[int] = field(default_factory=frozenset)
    audio_self_blocks: frozenset[int] = field(default_factory=frozenset)
    skip_a2v: bool = False
    skip_v2a: bool = False
    cross_blocks: frozenset[int] | None = None

    def skips_cross(self, block: int) -> tuple[bool, bool]:
        """(a2v, v2a) skipped in `block`."""
        inside = self.cross_blocks is None or block in self.cross_blocks
        return self.skip_a2v and inside, self.skip_v2a and inside

    def is_identity(self) -> bool:
        return not (self.video_self_blocks or self.audio_self_blocks or self.skip_a2v or self.skip_v2a)


NO_PERTURBATION = Perturbation()


def passes_needed(video: GuiderParams, audio: GuiderParams | None = None) -> tuple[str, ...]:
    """The forward passes a guided step runs, in PASS_ORDER; COND always. Video-only: audio None."""
    both = [video] + ([audio] if audio is not None else [])
    need = {COND: True,
            UNCOND: any(p.needs_uncond() for p in both),
            PERTURBED: any(p.needs_perturbed() for p in both),
            ISOLATED: any(p.needs_isolated() for p in both)}
    return tuple(name for name in PASS_ORDER if need[name])


def perturbation_for(name: str, video: GuiderParams, audio: GuiderParams | None = None) -> Perturbation:
    """The perturbation of pass `name`; COND and UNCOND run the plain model (UNCOND on the negative context)."""
    if name in (COND, UNCOND):
        return NO_PERTURBATION
    if name == PERTURBED:
        vblocks = frozenset(video.stg_blocks) if video.needs_perturbed() else frozenset()
        ablocks = frozenset(audio.stg_blocks) if audio is not None and audio.needs_perturbed() else frozenset()
        return Perturbation(video_self_blocks=vblocks, audio_self_blocks=ablocks)
    if name == ISOLATED:
        owner = video if video.needs_isolated() or audio is None else audio
        blocks = owner.modality_blocks
        return Perturbation(skip_a2v=True, skip_v2a=True, cross_blocks=None if blocks is None else frozenset(blocks))
    raise ValueError(f"unknown guidance pass {name!r}")


def cfg_delta(scale: float, cond: np.ndarray, uncond: np.ndarray) -> np.ndarray:
    """`CFGGuider.delta`: (scale - 1) * (cond - uncond)."""
    return (F32(scale - 1) * (np.asarray(cond, F32) - np.asarray(uncond, F32))).astype(F32)


def stg_delta(scale: float, cond: np.ndarray, perturbed: np.ndarray) -> np.ndarray:
    """`STGGuider.delta`: scale * (cond - perturbed)."""
    return (F32(scale) * (np.asarray(cond, F32) - np.asarray(perturbed, F32))).astype(F32)


def projection_coef(to_project: np.ndarray, onto: np.ndarray) -> np.ndarray:
    """Per-sample <a, b> / (|b|^2 + 1e-8), shape (B, 1), float32."""
    a = np.asarray(to_project, F32).reshape(to_project.shape[0], -1)
    b = np.asarray(onto, F32).reshape(onto.shape[0], -1)
    return (np.sum(a * b, axis=1, keepdims=True) / (np.sum(b * b, axis=1, keepdims=True) + F32(1e-8))).astype(F32)


def cfg_star_delta(scale: float, cond: np.ndarray, uncond: np.ndarray) -> np.ndarray:
    """`CFGStarRescalingGuider.delta`: uncond projected onto cond's norm before the CFG difference."""
    c, u = np.asarray(cond, F32), np.asarray(uncond, F32)
    coef = projection_coef(c, u).reshape((c.shape[0],) + (1,) * (c.ndim - 1))
    return (F32(scale - 1) * (c - coef * u)).astype(F32)


def apg_delta(scale: float, cond: np.ndarray, uncond: np.ndarray, eta: float = 1.0,
              norm_threshold: float = 0.0) -> np.ndarray:
    """`LtxAPGGuider.delta`: cond - uncond (scaled down to `norm_threshold` over the last three axes when
    larger), split into its part parallel to cond (weighted by eta) and the rest, times (scale - 1)."""
    c = np.asarray(cond, F32)
    guidance = c - np.asarray(uncond, F32)
    if norm_threshold > 0:
        axes = tuple(range(max(0, guidance.ndim - 3), guidance.ndim))
        norm = np.sqrt(np.sum(guidance * guidance, axis=axes, keepdims=True, dtype=F32)).astype(F32)
        guidance = guidance * np.minimum(F32(1), F32(norm_threshold) / norm)
    coef = projection_coef(guidance, c).reshape((c.shape[0],) + (1,) * (c.ndim - 1))
    parallel = coef * c
    return ((parallel * F32(eta) + (guidance - parallel)) * F32(scale - 1)).astype(F32)


def skips_step(p: GuiderParams, step: int) -> bool:
    """`MultiModalGuider.should_skip_step`: with skip_step N, only steps 0, N+1, 2(N+1), ... are guided."""
    return p.skip_step > 0 and step % (p.skip_step + 1) != 0


def params_for_sigma(bins: tuple[tuple[float, GuiderParams], ...], sigma: float) -> GuiderParams:
    """`MultiModalGuiderFactory.params`: bins are (sigma upper bound, params); sigma falls in the bin of
    the smallest bound >= sigma, or the largest bin when above them all."""
    if not bins:
        raise ValueError("a guidance schedule needs at least one (sigma, params) bin")
    ordered = sorted(bins, key=lambda b: b[0], reverse=True)
    at_or_above = [p for bound, p in ordered if bound >= float(sigma)]
    return at_or_above[-1] if at_or_above else ordered[0][1]


def _std(x: np.ndarray) -> F32:
    return F32(np.std(x, dtype=np.float64, ddof=1))


def combine(p: GuiderParams, outputs: dict[str, np.ndarray]) -> np.ndarray:
    """`MultiModalGuider.calculate` on one modality's pass outputs {pass name: x0}; COND required.

    A term whose scale makes it vanish is left out (its pass may not have run): adding an exact
    zero to a float leaves it unchanged, so the bits equal the reference's sum with its 0.0 stand-ins.
    """
    cond = np.asarray(outputs[COND], F32)
    pred = cond
    terms = ((UNCOND, F32(p.cfg_scale - 1)), (PERTURBED, F32(p.stg_scale)), (ISOLATED, F32(p.modality_scale - 1)))
    for name, coef in terms:
        if coef == 0:
            continue
        if name == UNCOND and p.apg_eta is not None:
            pred = pred + apg_delta(p.cfg_scale, cond, outputs[name], p.apg_eta, p.apg_norm_threshold)
        else:
            pred = pred + coef * (cond - np.asarray(outputs[name], F32))
    if p.rescale != 0:
        factor = F32(p.rescale) * (_std(cond) / _std(pred)) + F32(1 - p.rescale)
        pred = pred * F32(factor)
    return np.asarray(pred, F32)


def params_to_dict(p: GuiderParams) -> dict:
    """The JSON form a task's params carry; the skip step, APG and modality blocks only when set, so a plain render's
    params (and the tasks recorded for it) read as before they existed."""
    out = {"cfg_scale": p.cfg_scale, "stg_scale": p.stg_scale, "stg_blocks": list(p.stg_blocks),
           "rescale": p.rescale, "modality_scale": p.modality_scale}
    if p.skip_step:
        out["skip_step"] = p.skip_step
    if p.apg_eta is not None:
        out.update(apg_eta=p.apg_eta, apg_norm_threshold=p.apg_norm_threshold)
    if p.modality_blocks is not None:
        out["modality_blocks"] = list(p.modality_blocks)
    return out


def params_from_dict(d: dict) -> GuiderParams:
    eta, blocks = d.get("apg_eta"), d.get("modality_blocks")
    return GuiderParams(cfg_scale=float(d["cfg_scale"]), stg_scale=float(d["stg_scale"]),
                        stg_blocks=tuple(int(b) for b in d["stg_blocks"]), rescale=float(d["rescale"]),
                        modality_scale=float(d["modality_scale"]), skip_step=int(d.get("skip_step", 0)),
                        apg_eta=None if eta is None else float(eta),
                        apg_norm_threshold=float(d.get("apg_norm_threshold", 0.0)),
                        modality_blocks=None if blocks is None else tuple(int(b) for b in blocks))
