"""The text-to-audio recipe (T2A): the audio track alone, guided on the dev DiT with no video stream.

Why its own recipe: upstream's t2a_one_stage runs the DiT with `video=None` and writes only the
decoded waveform, so it takes no picture flag at all; which guidance knobs it takes (its steps,
negative prompt and audio guider) is the modifier table's, the size and `--no-audio` are refused here.
"""

from __future__ import annotations

from coordinator.plan.build import build_t2a
from coordinator.plan.graph import SpecError
from coordinator.plan.guidance import AUDIO_ONLY
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.recipes.guided import guided_check
from coordinator.plan.recipes.modifiers import AUDIO_KNOBS
from coordinator.plan.resolved import RenderPlan
from protos.spec import RenderSpec

_PICTURE = (RenderSpec().width, RenderSpec().height)  # the spec's default size: a size given is a video flag


def _asked(spec: RenderPlan) -> tuple[tuple[int, int], bool]:
    """The fields beside its knobs that T2A reads: the picture's size and whether audio is on."""
    return (spec.width, spec.height), bool(spec.audio)


def check_t2a(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """No picture to size and the audio on; then the guided recipes' rules on its audio guider."""
    size, audio = _asked(spec)
    if size != _PICTURE:
        raise SpecError(f"-W/-H {size[0]}x{size[1]}: --pipeline t2a renders only the audio track (no picture); "
                        "drop them")
    if not audio:
        raise SpecError("--no-audio: --pipeline t2a renders only the audio track; drop it")
    return guided_check(AUDIO_ONLY)(spec, pack)


T2A = Recipe(
    builds=build_t2a,
    name="t2a",
    purpose="text-to-audio: the dev DiT's audio stream alone (no video tokens) with upstream's audio guider, "
            "each pass on its own Mac; the audio VAE + vocoder to a .wav or .m4a",
    upstream="ltx-pipelines T2AOneStagePipeline (`ltx_pipelines.t2a_one_stage`); its pipelines.md section 11",
    flag="--pipeline t2a",
    pipeline="t2a",
    fields=AUDIO_KNOBS,
    components=("text_encoder", "connector", "transformer_dev", "audio_vae", "vocoder"),
    check=check_t2a,
    two_stage=False,
    guidance=AUDIO_ONLY,
    distilled_stage2=False,
    video=False,
    dits=("transformer_dev",),
    default_spec={"pipeline": "t2a"},
)
