"""The Lua scripts held against the state vocabulary (protos/states.py).

The Lua cannot import Python, so common.lua keeps its own TERMINAL table and every script writes and
compares bare words. These tests read the scripts: common.lua's TERMINAL is protos.states.TERMINAL,
every state a script writes into a render, task or worker hash (HSET 'state', worker_seen) or compares
a state it read with is a member of that record's enum, and every word a script answers with is an
Outcome. A state added in Lua only, or a word nobody uses any more left in the enum, fails here.
"""

from __future__ import annotations

import re
from collections import defaultdict
from enum import StrEnum
from pathlib import Path

import pytest

from protos.kinds import TaskKind
from protos.states import RETRYABLE, TERMINAL, Fault, Outcome, RenderState, TaskState, WorkerState

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "coordinator" / "state" / "lua"
ENUMS: dict[str, type[StrEnum]] = {"render": RenderState, "task": TaskState, "worker": WorkerState}
# Names the scripts give a record's key (local tk = key('task', tid), ...).
KEY_VARS = {"tk": "task", "rk": "render", "wk": "worker"}
# States that reach a script as an argument or a parameter, not read from a hash here.
ARGUMENTS = {
    ("set_render_state.lua", "state"): "render",  # ARGV[4]: the state the coordinator sets (scheduler)
    ("lease.lua", "h[1]"): "worker",  # free_in(w, h): the peer's HMGET 'state', ... (h[1])
    ("common.lua", "outcome"): "task",  # release(tid, worker, leased_ms, outcome): 'done', 'failed' or nil
}
# Words compared with something that is not a state (types, flags, capabilities, kinds, lease.lua's
# text_shortcut answers that never leave the script); any other compared word must be in the vocabulary.
NOT_STATES = {"", "0", "1", "table", "string", "coordinator", "moved", "wait"}
NOT_STATES |= set(TaskKind)  # a kind word (tests/unit/test_kinds.py holds them against protos.kinds)
NOT_STATES |= {"open", "started"}  # gang.lua: a reservation's phase, never a task/worker/render state
NOT_STATES |= set(Fault)  # fail.lua's ARGV[7]: the worker's class of a task error
NOT_STATES |= {"peek", "*"}  # lease.lua's ARGV[5] mode (a read-only look); gang.lua's "any class"
INTERNAL_RETURNS = {("lease.lua", "moved"), ("lease.lua", "wait")}  # text_shortcut's, read by lease.lua only
WORD = re.compile(r"'([^']*)'")


def scripts() -> dict[str, str]:
    """Every script's text without its comments (a word in a comment is no state)."""
    return {p.name: re.sub(r"--[^\n]*", "", p.read_text()) for p in sorted(LUA.glob("*.lua"))}


def calls(text: str, name: str) -> list[tuple[int, list[str]]]:
    """(offset, top-level arguments) of every call `name(...)` in the text, parentheses balanced."""
    out = []
    for m in re.finditer(rf"(?<![\w.]){re.escape(name)}\(", text):
        depth, i, quoted, args, start = 1, m.end(), False, [], m.end()
        while depth:
            c = text[i]
            if c == "'":
                quoted = not quoted
            elif not quoted and c in "({":
                depth += 1
            elif not quoted and c in ")}":
                depth -= 1
            elif not quoted and c == "," and depth == 1:
                args.append(text[start:i].strip())
                start = i + 1
            i += 1
        args.append(text[start:i - 1].strip())
        out.append((m.start(), args))
    return out


def key_kind(expr: str) -> str | None:
    """'task', 'render' or 'worker' for a record's key expression (key('task', tid) or tk), else None."""
    m = re.fullmatch(r"key\('(\w+)',\s*[^,]+\)", expr)
    if m:
        return m.group(1) if m.group(1) in ENUMS else None
    return KEY_VARS.get(expr)


def values(expr: str) -> set[str]:
    """The words an expression can yield: `a == 'ok' and 'busy' or 'idle'` -> {busy, idle}."""
    return set(WORD.findall(re.sub(r"(?:==|~=)\s*'[^']*'", "", expr)))


def written() -> dict[str, set[tuple[str, str]]]:
    """kind -> {(script, state)} for every state a script writes: HSET ... 'state', X, worker_seen,
    a release outcome and a render_state event."""
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for name, text in scripts().items():
        for _, args in calls(text, "redis.call"):
            if WORD.fullmatch(args[0]) and args[0].strip("'") in ("HSET", "HMSET"):
                fields = args[2:]
                for field, value in zip(fields[::2], fields[1::2], strict=True):
                    if field == "'state'":
                        kind = key_kind(args[1])
                        assert kind, f"{name}: a state written under a key this test cannot place: {args[1]}"
                        found[kind] |= {(name, v) for v in values(value)}
        for _, args in calls(text, "worker_seen"):  # (the definitions' parameters hold no words)
            found["worker"] |= {(name, v) for v in values(args[1])}
        for _, args in calls(text, "release"):
            found["task"] |= {(name, v) for v in values(args[3])}
        for _, args in calls(text, "emit"):  # a render_state event names the render's new state
            found["render"] |= {(name, v) for v in re.findall(r"\bstate = '(\w+)'", args[1])}
    return found


def state_reads(text: str) -> list[tuple[int, str, str]]:
    """(offset, name, kind) of each local that holds a state read: `local s = HGET(key, 'state')`
    names s, `local t = HMGET(key, 'state', ...)` names t[1] (the field's place)."""
    reads = []
    for m in re.finditer(r"local (\w+) = (?=redis\.call\()", text):
        offset, args = calls(text[m.end():], "redis.call")[0]
        if offset or args[0] not in ("'HGET'", "'HMGET'") or (kind := key_kind(args[1])) is None:
            continue
        for i, field in enumerate(args[2:], start=1):
            if field == "'state'":
                reads.append((m.start(), m.group(1) if args[0] == "'HGET'" else f"{m.group(1)}[{i}]", kind))
    # A later assignment of the name, a function parameter or a loop variable of that name ends the read.
    for m in re.finditer(r"local ([\w, ]+) = |function\s*[\w.]*\(([\w, .]*)\)|\bfor ([\w, ]+) in ", text):
        names = next(g for g in m.groups() if g is not None)
        for var in (v.strip() for v in names.split(",")):
            reads.append((m.start(), var, ""))
            reads.extend((m.start(), f"{var}[{i}]", "") for i in range(1, 10))  # and its fields' places
    reads.sort(key=lambda r: (r[0], r[2] != ""))  # at one offset the read itself wins
    return reads


def compared() -> tuple[dict[str, set[tuple[str, str]]], set[tuple[str, str]]]:
    """kind -> {(script, word)} for every word compared with a state; and the other compared words."""
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    others: set[tuple[str, str]] = set()
    for name, text in scripts().items():
        reads = state_reads(text)
        for m in re.finditer(r"([\w.]+(?:\[\d+\])?|\))\s*(?:==|~=)\s*'([^']*)'", text):
            lhs, word = m.groups()
            inline = re.search(r"redis\.call\('HGET', (key\('\w+', [^()]+\)|\w+), 'state'\)\s*$", text[:m.end(1)])
            render_info = re.search(r"render_info\([^()]*\)\.state$", text[:m.end(1)])
            kind = (key_kind(inline.group(1)) if inline else "render" if render_info else None)
            if kind is None:
                held = [k for offset, var, k in reads if var == lhs and offset < m.start()]
                kind = held[-1] if held and held[-1] else ARGUMENTS.get((name, lhs))
            if kind:
                found[kind].add((name, word))
            else:
                others.add((name, word))
    return found, others


def test_common_lua_terminal_is_the_vocabulary() -> None:
    table = re.search(r"local TERMINAL = \{([^}]*)\}", (LUA / "common.lua").read_text())
    assert table, "common.lua lost its TERMINAL table"
    entries = dict(re.findall(r"(\w+)\s*=\s*(\w+)", table.group(1)))
    assert set(entries.values()) == {"true"}, entries
    assert set(entries) == set(TERMINAL), "common.lua's TERMINAL and protos.states.TERMINAL differ"


@pytest.mark.parametrize("kind", sorted(ENUMS))
def test_every_state_the_lua_writes_or_compares_is_in_its_enum(kind: str) -> None:
    enum = ENUMS[kind]
    seen = written()[kind] | compared()[0][kind]
    strangers = sorted((script, word) for script, word in seen if word not in set(enum))
    assert not strangers, f"{kind} states in Lua that protos.states.{enum.__name__} lacks: {strangers}"
    # The scan sees them all (a word nothing writes or compares any more leaves the enum). The
    # scheduler sets `assembling` through set_render_state.lua, which compares it.
    assert {word for _, word in seen} == set(enum), f"{enum.__name__} words no script uses"


def test_every_other_compared_word_is_an_outcome_or_known() -> None:
    _, others = compared()
    # A state compared where this scan cannot tell whose it is lands here too: name it in ARGUMENTS.
    strangers = sorted((s, w) for s, w in others if w not in set(Outcome) | NOT_STATES)
    assert not strangers, f"words compared in Lua that are neither placed states, outcomes nor known: {strangers}"


def test_every_answer_of_a_script_is_an_outcome() -> None:
    answers = set()
    for name, text in scripts().items():
        answers |= {(name, w) for w in re.findall(r"\breturn '(\w+)'", text)}
        answers |= {(name, w) for w in re.findall(r"\bbeat\('(\w+)'\)", text)}  # heartbeat.lua's answer
    answers -= INTERNAL_RETURNS
    strangers = sorted((s, w) for s, w in answers if w not in set(Outcome))
    assert not strangers, f"Lua answers protos.states.Outcome lacks: {strangers}"
    assert {w for _, w in answers} == set(Outcome), "Outcome words no script answers with"


def test_retry_takes_the_retryable_states() -> None:
    text = (LUA / "retry_render.lua").read_text()
    line = next(x for x in text.splitlines() if "return 'live'" in x)
    assert set(re.findall(r"state ~= '(\w+)'", line)) == set(RETRYABLE)
    assert RETRYABLE < TERMINAL


def test_the_terminal_set_is_written_once_in_python_and_not_in_the_page() -> None:
    """Done-when of the set is protos/states.py's; nothing else spells it out."""
    spelled = re.compile(r"""(?x)[(\[{]\s*(?:["'](?:done|failed|cancelled)["']\s*,?\s*){3}[)\]}]""")
    defined = re.compile(r"(?i)terminal\w*\s*[:=]\s*(frozenset|set|\{|\(|\[)")
    found = []
    for path in [*ROOT.glob("coordinator/**/*.py"), *ROOT.glob("farm_cli/**/*.py"), *ROOT.glob("worker/**/*.py"),
                 *ROOT.glob("protos/*.py"), *ROOT.glob("coordinator/dashboard/static/*.js")]:
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in (*spelled.finditer(text), *defined.finditer(text))]
    assert found == ["protos/states.py: TERMINAL: frozenset"], found
    assert "canceled" not in " ".join(found)
