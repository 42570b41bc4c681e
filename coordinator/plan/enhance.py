"""`--enhance-prompt`: an enhance task before the render's text task, and its refusal at submit. Pure.

The text encoder's Gemma 3 writes the prompt the text task then encodes (`ltx_engine.models.prompt_enhancer`).
As upstream, only the render's prompt is enhanced (a guided render's negative prompt is encoded as given),
with the T2V system prompt, or the I2V one when images condition the render. Decoding is greedy, so the
enhanced prompt is a function of (pack, encoder, prompt, mode) and not of the seed: the enhance task is
cached under that key as a text task is (lease.lua), and the text task's key follows it, so a seed sweep
enhances and encodes its prompt once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import SpecError, expect, ref, task
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules import text_encoders

MAX_NEW_TOKENS = 512  # upstream's Gemma 3 enhancer (ltx_engine.models.prompt_enhancer.MAX_NEW_TOKENS)


@dataclass(frozen=True)
class Asked:
    """What the enhancer reads of a plan."""

    on: bool
    pack: str
    prompt: str
    mode: str
    encoder: str | None
    pack_key: tuple


def asked(spec: RenderPlan) -> Asked:
    """The plan's fields the enhancer reads (its only reads of the plan)."""
    return Asked(bool(spec.enhance_prompt), spec.pack, spec.prompt, "i2v" if spec.images else "t2v",
                 spec.text_encoder, (spec.generation, spec.pack_bytes))


def enhance_key(a: Asked) -> str:
    """The cache key of an enhanced prompt: everything it depends on (not the seed: decoding is greedy)."""
    parts = ["enhance", a.pack, *a.pack_key, a.encoder, a.prompt, a.mode, MAX_NEW_TOKENS]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def plan_enhance(rid: str, spec: RenderPlan, text_params: dict) -> tuple[list[dict], dict, str | None]:
    """(the enhance task, or none; the text task's inputs; the text task's cache key when enhanced, else
    None). `text_params`: the text task's encoder params, which the enhance task shares."""
    a = asked(spec)
    if not a.on:
        return [], {}, None
    key = enhance_key(a)
    params = {"pack": a.pack, "prompt": a.prompt, "mode": a.mode, "max_new_tokens": MAX_NEW_TOKENS,
              **text_params, "text_key": key, "expect": {"prompt": expect("uint8", -1)}}
    enhance = task(rid, "enhance", "enhance_prompt", params, {})
    if text_params.get("text_encoder") == text_encoders.PACK:  # the lease: a worker whose pack's Gemma writes
        enhance["params"]["needs"] = [*enhance["params"]["needs"], text_encoders.LM_HEAD]
    text_key = hashlib.sha256(f"enhanced|{key}".encode()).hexdigest()
    return [enhance], {"prompt": ref(enhance["id"], "prompt")}, text_key


def check_enhancer(spec: RenderPlan, has_head: bool | None) -> None:
    """Refuse `--enhance-prompt` when the render's own text encoder cannot write (`has_head` False: the
    pack, as its holders or this machine describe it, advertises no LM head), in one line with the
    download; a separate encoder (`--text-encoder`) is an mlx-lm Gemma 3, which always can."""
    a = asked(spec)
    if not a.on or has_head is not False or a.encoder not in (None, text_encoders.PACK):
        return
    tower = a.pack_key[0] == "2.5"  # LTX-2.5 packs carry the Gemma 4 tower, which encodes only
    why = (f"its text encoder, LTX-2.5's Gemma 4 tower ({text_encoders.GEMMA4_WEIGHTS}), only encodes" if tower
           else "its text_encoder/ has neither lm_head.weight nor tied embeddings")
    raise SpecError(text_encoders.no_head_line(a.pack, why, tower))


def fleet_has_head(spec: RenderPlan, fleet: Fleet) -> bool | None:
    """Whether the live workers describing the render's pack advertise its LM head; None when none does."""
    held = fleet.components(asked(spec).pack)
    return None if held is None else text_encoders.LM_HEAD in held
