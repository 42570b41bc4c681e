"""User LoRAs in the plan: every DiT task of a render carries the render's LoRA set, given by the block
that makes it (`lora_params`), and its text tasks key on it (`lora_text`).

As upstream's pipelines do: `distilled.py` builds one transformer with the user's LoRAs for both
stages, and `ti2vid_two_stages.py` loads them into stage 1's and (with the distilled LoRA) stage 2's
transformer. So stage 1, stage 2 (untiled, or each tile's forward at each step) and every DFR round tile
run with the set; the set is in each task's params (`loras`, `lora_mode`) and in the recorded spec.
A DiT task also asks for the set's warm name (`params["warm"]`, `protos.lora_set.warm_key`): the lease
script's affinity prefers a worker whose DiT with that set is already built. The fusion's cold seconds
are part of the DiT task's `load_s` (`costs.lora_fuse_seconds`), which the placement and `farm plan` count.
"""

from __future__ import annotations

import hashlib

from coordinator.plan.resolved import RenderPlan
from protos.lora_set import warm_key


def lora_params(spec: RenderPlan) -> dict:
    """A DiT task's LoRA params: the set as the spec records it (JSON, as params travel) and its mode; none
    without LoRAs."""
    loras = [lora.to_dict() for lora in spec.loras]
    if not loras:
        return {}
    mode = spec.lora_mode
    return {"loras": loras, "lora_mode": mode, "warm": [warm_key(loras, mode)]}


def lora_text(text: dict, spec: RenderPlan) -> dict:
    """A text task as it is emitted, given the render's LoRA set: a LoRA's factors for the embeddings
    connector (upstream's connector sits inside the checkpoint the LoRA was trained on) are fused into the
    connector that encodes the prompt, so the prompt-embedding cache keys on the set as well (its key
    covers whatever the task's own key covers: the prompt, a relay's segments). A new record."""
    params = lora_params(spec)
    if not params:
        return text
    key = hashlib.sha256(f"{text['params'].get('text_key')}|{params['warm'][0]}".encode()).hexdigest()
    return {**text, "params": {**text["params"], "loras": params["loras"], "lora_mode": params["lora_mode"],
                               "text_key": key}}
