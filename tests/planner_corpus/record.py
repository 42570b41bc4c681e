"""The recorded outcomes (`expected.json`): written one task per line, read back, compared.

Why: a re-record after a deliberate planner change should read in review as a diff of the tasks that
changed, so each task is one sorted-key JSON line; a failing comparison names the case, the first task
that differs and the first field in it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.planner_corpus.run import canonical

EXPECTED = Path(__file__).with_name("expected.json")


def dumps(records: dict[str, dict]) -> str:
    """The whole record as JSON text: cases in corpus order, each task on a line of its own."""
    lines = ["{"]
    for i, (name, rec) in enumerate(records.items()):
        head = {k: v for k, v in rec.items() if k != "tasks"}
        lines.append(f"{json.dumps(name)}: {{")
        lines.extend(f"  {json.dumps(k)}: {canonical(v)}," for k, v in sorted(head.items()))
        tasks = rec.get("tasks")
        if tasks is None:
            lines[-1] = lines[-1].rstrip(",")
        else:
            lines.append('  "tasks": [')
            lines.extend(f"    {canonical(t)}{',' if j < len(tasks) - 1 else ''}" for j, t in enumerate(tasks))
            lines.append("  ]")
        lines.append("}" + ("," if i < len(records) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def load(path: Path = EXPECTED) -> dict[str, dict]:
    return json.loads(path.read_text())


def first_difference(want, got, where: str = "") -> str | None:
    """The path of the first field where two JSON values differ, with both values; None when equal."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if key not in got:
                return f"{where}.{key}: missing (recorded {canonical(want[key])[:200]})"
            if key not in want:
                return f"{where}.{key}: new (now {canonical(got[key])[:200]})"
            diff = first_difference(want[key], got[key], f"{where}.{key}")
            if diff:
                return diff
        return None
    if isinstance(want, list) and isinstance(got, list):
        for i, (w, g) in enumerate(zip(want, got, strict=False)):
            diff = first_difference(w, g, f"{where}[{i}]")
            if diff:
                return diff
        if len(want) != len(got):
            return f"{where}: {len(got)} items, recorded {len(want)}"
        return None
    if want != got or type(want) is not type(got):
        return f"{where}: {canonical(got)[:200]}, recorded {canonical(want)[:200]}"
    return None


def explain(name: str, want: dict, got: dict) -> str | None:
    """None when the case plans as recorded; else one line naming the case, the task and the field."""
    if not want:
        return f"case {name}: not recorded: re-record (python -m tests.planner_corpus --write)"
    if want.get("digest") != got.get("digest"):
        return f"case {name}: the case changed since it was recorded: re-record (python -m tests.planner_corpus --write)"
    if ("refusal" in want) != ("refusal" in got):
        was = f"refused: {want['refusal']!r}" if "refusal" in want else f"planned {len(want['tasks'])} tasks"
        now = f"refused: {got['refusal']!r}" if "refusal" in got else f"planned {len(got['tasks'])} tasks"
        return f"case {name}: was {was}; now {now}"
    if "refusal" in want:
        diff = first_difference({k: want.get(k) for k in ("refusal", "error")},
                                {k: got.get(k) for k in ("refusal", "error")})
        return f"case {name}: refusal{diff}" if diff else None
    want_tasks, got_tasks = want["tasks"], got["tasks"]
    for i, (w, g) in enumerate(zip(want_tasks, got_tasks, strict=False)):
        diff = first_difference(w, g)
        if diff:
            return f"case {name}: task {i} ({w.get('id')}, {w.get('kind')}){diff}"
    if len(want_tasks) != len(got_tasks):
        ids = [t["id"] for t in (want_tasks if len(want_tasks) > len(got_tasks) else got_tasks)]
        extra = ids[min(len(want_tasks), len(got_tasks)):][:5]
        return f"case {name}: {len(got_tasks)} tasks, recorded {len(want_tasks)} (first extra: {extra})"
    diff = first_difference(want.get("stored"), got.get("stored"))
    return f"case {name}: stored spec{diff}" if diff else None
