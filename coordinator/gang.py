"""What a lease reply carries for a gang task: the group handout and the kept step.

coordinator/state/lua/gang.lua writes the handout (`gang`: degree, members, host:port per rank,
deadlines) on the task and adds the asking member's `gang_rank`; heartbeat.lua keeps rank 0's last
step (`resume`: step, blobs). Both reach the worker through the contract: the handout with its rank
as `params.gang`, the kept step as `params.resume_step` plus its state blobs as inputs (fetched as
any input)."""

from __future__ import annotations

import json


def _json(value) -> dict:
    if isinstance(value, dict):
        return value
    try:
        got = json.loads(value) if isinstance(value, str | bytes) and value else {}
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def handout(task: dict, params: dict, inputs: dict) -> tuple[dict, dict]:
    """The params and inputs of the lease reply for this task as the script returned it."""
    params, inputs = dict(params), dict(inputs)
    resume = _json(task.get("resume"))
    if isinstance(resume.get("step"), int) and isinstance(resume.get("blobs"), dict):
        params["resume_step"] = resume["step"]
        inputs.update({str(k): str(v) for k, v in resume["blobs"].items()})
    gang = _json(task.get("gang"))
    if gang and task.get("gang_rank") not in (None, ""):
        params["gang"] = {**gang, "rank": int(task["gang_rank"])}
    return params, inputs
