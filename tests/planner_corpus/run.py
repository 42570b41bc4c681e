"""Plan one corpus case as the farm does, and turn the outcome into a machine-independent record.

Why: the record must be the same on every machine and every run, so what varies (the packs folder, the
media files' folder, the machine's memory) is given by the case or replaced by a placeholder, and the
record is serialized with sorted keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.plan.resolved import Resolved

RENDER_ID = "r"  # every case is planned under this render id: no ids or timestamps in the record
GB = 2**30
PACKS = "<packs>"  # the packs folder, in any recorded string
MEDIA = "<media>"  # the generated media files' folder
DISK_PACKS = {"tiny": {}, "tiny25": {"variant": "2.5"}, "dev": {"layout": "dev-only"}}


def blob(label: str) -> str:
    """A media or LoRA blob's sha: fixed per label, so the record names the same blob everywhere."""
    return hashlib.sha256(f"planner-corpus:{label}".encode()).hexdigest()


def write_packs(folder: Path) -> Path:
    """The tiny packs the fleets describe (the 2.3 `tiny`, the LTX-2.5 `tiny25`, the dev-only `dev`)."""
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    folder.mkdir(parents=True, exist_ok=True)
    for name, options in DISK_PACKS.items():
        if not (folder / name).exists():
            write_tiny_pack(folder / name, seed=0, **options)
    return folder


def write_media(folder: Path) -> dict[str, Path]:
    """The media files the cases name, by blob sha (written by PyAV, read only by the media probe)."""
    from tests.media_files import write_clip, write_clip_with_audio, write_wav

    folder.mkdir(parents=True, exist_ok=True)
    files = {"clip": lambda p: write_clip(p, frames=30), "clip_av": lambda p: write_clip_with_audio(p, frames=41),
             "voice": write_wav}
    suffix = {"voice": ".wav"}
    return {blob(label): write(folder / f"{label}{suffix.get(label, '.mp4')}") for label, write in files.items()}


def pack_facts(packs_dir: Path) -> Callable[[str], dict]:
    """pack name -> what a worker holding it reports of it (worker/runner.py `capabilities`), read from
    the pack on disk; the machine's own facts (memory, chip) are left to the case."""
    from worker.runner import Runner

    runner = Runner(packs_dir)
    holdings, problems = runner.pack_holdings()

    def facts(name: str) -> dict:
        generation = runner.pack_generation(name)
        return {"pack_generation": {name: generation} if generation else {},
                "pack_components": {name: holdings[name]} if name in holdings else {},
                "pack_bytes": {name: runner.pack_bytes(name)}, "pack_features": {name: runner.pack_features(name)},
                "pack_problems": {name: problems[name]} if name in problems else {}}
    return facts


def fleet_caps(rows: list[dict], facts: Callable[[str], dict] | None) -> list[dict]:
    """The case's fleet as the capabilities the planner validates against. A row: count (1), memory_gb,
    packs, disk (describe the packs from disk, as a live worker does), and any capability key verbatim."""
    caps = []
    for row in rows:
        row = dict(row)
        count, disk = int(row.pop("count", 1)), bool(row.pop("disk", False))
        if "memory_gb" in row:
            row["memory_bytes"] = int(float(row.pop("memory_gb")) * GB)
        if disk:
            if facts is None:
                raise ValueError("a fleet row with disk=True needs the packs folder")
            for name in row.get("packs") or []:
                for key, value in facts(name).items():
                    row[key] = {**row.get(key, {}), **value}
        caps += [row] * count
    return caps


def plan_case(case: dict, facts: Callable[[str], dict] | None, media: dict[str, Path] | None) -> dict:
    """The planner's outcome for a case: its stored view and tasks, or its one-line refusal. As `farm plan`
    and Submit call it: typed spec, -f from the clip, validation, the media probe, then the graph."""
    from coordinator.admit.media_check import check_render_media, clip_frames

    path_of = (media or {}).get
    try:
        plan = normalize_spec(case["spec"])
        if case.get("known"):
            plan = type(plan)(plan.spec, Resolved(**case["known"]))
        if case.get("media"):
            plan = plan.resolve(**clip_frames(plan, path_of))
        plan = validate_spec(plan, fleet_caps(case.get("fleet") or [], facts))
        if case.get("media"):
            plan = plan.resolve(**check_render_media(plan, path_of))
        tasks = plan_render(plan, RENDER_ID)
    except (ValueError, KeyError, TypeError) as exc:  # SpecError is a ValueError; Submit refuses all three
        return {"refusal": str(exc), "error": type(exc).__name__}
    return {"stored": plan.as_dict(), "tasks": tasks}


def case_digest(case: dict) -> str:
    """What the case asks, hashed: a record made for another version of the case is stale."""
    return hashlib.sha256(canonical({k: case.get(k) for k in ("spec", "fleet", "known", "media")}).encode()).hexdigest()[:16]


def canonical(value) -> str:
    """One deterministic JSON text (sorted keys, NaN and infinities as JSON5-style names)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def normalized(outcome: dict, roots: dict[str, str]) -> dict:
    """The outcome with machine paths replaced by placeholders, as plain JSON values."""
    text = canonical(outcome)
    for root, placeholder in roots.items():
        text = text.replace(json.dumps(root)[1:-1], placeholder)
    return json.loads(text)
