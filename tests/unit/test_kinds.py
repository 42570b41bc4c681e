"""The task-kind vocabulary (protos/kinds.py) held against everyone who names a kind.

Every kind has one row of facts; every kind word the Lua compares, the planner writes or a planned
render holds is a `TaskKind`; the worker has an operation for every kind it runs and the reducer a step
for every kind the coordinator runs. A new kind without facts, or facts naming a missing runner, fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from coordinator.plan.graph import task
from coordinator.plan.render import normalize_spec, plan_render
from protos.kinds import DIT_KINDS, KINDS, NO_FACTS, WORKER_KINDS, TaskKind, facts
from tests.unit.test_states import scripts

ROOT = Path(__file__).resolve().parents[2]
PLANNER = sorted((ROOT / "coordinator" / "plan").glob("*.py"))
BASE = {"prompt": "a fox", "height": 128, "width": 256, "frames": 9, "seed": 5, "pack": "tiny"}
SPECS = [BASE, {**BASE, "stage2_tiles": "2x2", "tile_overlap": 1, "decode_tiles": "32,128,128"},
         {**BASE, "audio": False}]


def test_every_kind_has_one_row_of_facts() -> None:
    assert set(KINDS) == set(TaskKind)
    for kind, f in KINDS.items():
        assert f.operation or f.reduce, f"{kind}: neither a worker operation nor a reducer step"
        assert not f.streams or f.runs_dit, f"{kind}: streams a DiT it does not run"
    assert facts("text_encode") is KINDS[TaskKind.TEXT_ENCODE] and facts("no_such_kind") is NO_FACTS
    assert TaskKind.HDR_STAGE in DIT_KINDS and not KINDS[TaskKind.HDR_STAGE].streams


def _lua_kind_words() -> set[tuple[str, str]]:
    """(script, word) for every word a script compares with a kind: `x.kind`, a `kind` local, or the
    place of 'kind' in the latest `local t = redis.call('HMGET', ...)` of that name."""
    found = set()
    for name, text in scripts().items():
        reads: list[tuple[int, str, int]] = []  # (offset, local, place of 'kind' or 0)
        for m in re.finditer(r"local (\w+) = (redis\.call\('HMGET'[^\n]*)?", text):
            fields = re.findall(r"'([^']*)'", m.group(2) or "")[2:]
            reads.append((m.start(), m.group(1), fields.index("kind") + 1 if "kind" in fields else 0))
        for m in re.finditer(r"([\w.]+)(?:\[(\d+)\])?\s*(?:==|~=)\s*'([^']*)'", text):
            lhs, place, word = m.groups()
            if place:
                held = [p for offset, var, p in reads if var == lhs and offset < m.start()]
                if held and held[-1] == int(place):
                    found.add((name, word))
            elif re.fullmatch(r"(?:\w+\.)?kind", lhs):
                found.add((name, word))
    return found


def test_every_kind_word_in_the_lua_is_a_task_kind() -> None:
    seen = _lua_kind_words()
    assert ("lease.lua", "text_encode") in seen, "the scan no longer sees lease.lua's text shortcut"
    strangers = sorted((script, word) for script, word in seen if word not in set(TaskKind))
    assert not strangers, f"kind words in Lua that protos.kinds.TaskKind lacks: {strangers}"


def _planner_kind_words() -> list[tuple[str, str]]:
    """(module, word) for every string the planner passes as a task's kind: `task(rid, name, KIND, ...)`
    and `{"kind": KIND}` literals."""
    out = []
    for path in PLANNER:
        for node in ast.walk(ast.parse(path.read_text())):
            values = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "task" and len(node.args) >= 3:
                values.append(node.args[2])
            elif isinstance(node, ast.Dict):
                values += [v for k, v in zip(node.keys, node.values, strict=True)
                           if isinstance(k, ast.Constant) and k.value == "kind"]
            out += [(path.name, v.value) for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return out


def test_every_kind_the_planner_writes_is_in_the_table() -> None:
    words = _planner_kind_words()
    assert len({w for _, w in words}) >= 20, "the scan lost the planner's task() calls"
    strangers = sorted((m, w) for m, w in words if w not in KINDS)
    assert not strangers, f"kinds the planner writes without facts in protos/kinds.py: {strangers}"
    with pytest.raises(ValueError):
        task("r", "x", "no_such_kind", {}, {})


@pytest.mark.parametrize("spec", SPECS, ids=["base", "tiled", "silent"])
def test_a_planned_render_runs_where_its_kinds_say(spec: dict) -> None:
    for t in plan_render(normalize_spec(spec), "r"):
        f = KINDS[t["kind"]]
        assert type(t["kind"]) is str, "a task record keeps the plain word"
        assert f.operation if t["capability"] == "mlx" else f.reduce, (t["id"], t["kind"], t["capability"])


def test_the_worker_has_an_operation_for_every_kind_it_runs() -> None:
    pytest.importorskip("mlx.core")
    from worker.runner import Runner

    ops = {KINDS[k].operation for k in WORKER_KINDS}
    methods = {name.removeprefix("_run_") for name in dir(Runner) if name.startswith("_run_")}
    assert ops <= methods, f"kinds whose operation the runner lacks: {sorted(ops - methods)}"
    assert methods <= ops, f"runner operations no kind names: {sorted(methods - ops)}"


def test_the_reducer_has_a_step_for_every_kind_it_runs() -> None:
    from coordinator.plan.length import PLAN_KIND
    from coordinator.reduce.reducer import STEPS

    steps = {f.reduce for f in KINDS.values() if f.reduce}
    assert KINDS[PLAN_KIND].reduce == "plan_length"  # the reducer thread plans the rest itself
    assert set(STEPS) == steps - {"plan_length"}
