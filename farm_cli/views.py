"""How renders read in the terminal: the stage and durations of the one list view (`farm ls`, and
`farm status` without an id: farm_cli.manage.table) and the details of one (`farm status ID`). The
fields come from the coordinator's summaries (coordinator.views.metrics), so the stage, progress and ETA read
as on the dashboard."""

from __future__ import annotations

import time

from coordinator.plan.length import length_line
from coordinator.views.metrics import STAGE_LABELS, stage_summaries, task_view
from protos.states import TERMINAL


def duration(seconds: float | None) -> str:
    """1h02m, 3m05s, 12s, or '-' when unknown."""
    if seconds is None or seconds < 0:
        return "-"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def stage_label(render: dict) -> str:
    """The stage a render is in (or waits for), as people read it; blank once it has ended."""
    if render.get("state") in TERMINAL:
        return ""
    stage = str(render.get("current_stage") or "")
    return render.get("current_stage_label") or STAGE_LABELS.get(stage, stage)


def pack_copies(pack: str, workers: list[dict]) -> list[str]:
    """The copies of a render's pack under way on workers (`farm status ID`): a render waiting for its
    pack says so, with how far each copy is, rather than only an ETA."""
    lines = []
    for w in workers:
        sync = (w.get("pack_sync") or {}).get(pack) or {}
        if sync.get("state") in ("copying", "failed") and pack not in (w.get("packs") or {}):
            done, total = int(sync.get("bytes") or 0), int(sync.get("total") or 0)
            share = f"{done / total:.0%} ({done / 1e6:.1f} of {total / 1e6:.1f} MB)" if total else "starting"
            what = f"failed: {sync.get('error')}" if sync["state"] == "failed" else share
            lines.append(f"  pack copy  {w.get('id')} is copying pack {pack} from the coordinator: {what}")
    return lines


WORKER_HEADER = ("worker", "state", "chip", "memory", "packs", "versions", "class", "installed", "task", "speed")


def _installed_cell(w: dict) -> str:
    """The installed set's hash, and the lock's when the worker has one ("no lock" otherwise)."""
    found = w.get("installed") if isinstance(w.get("installed"), dict) else {}
    if not found:
        return "-"
    return f"{found.get('installed') or '?'} (lock {found.get('lock') or '?'})"


def _versions_cell(w: dict) -> str:
    if not w.get("project_version"):
        return "-"
    return f"{w['project_version']}, mlx {w.get('mlx_version') or '?'} {w.get('backend') or ''}".rstrip()


def class_lines(workers: list[dict]) -> list[str]:
    """The determinism classes (workers whose fixed tiny forward hashes alike), when the fleet has two."""
    classes: dict[str, list[str]] = {}
    for w in workers:
        if w.get("state") != "refused":
            classes.setdefault(str(w.get("fingerprint") or "-"), []).append(str(w.get("id")))
    if len(classes) < 2:
        return []
    return [f"{len(classes)} determinism classes (a step's tiles and a gang's ranks stay within one; "
            "--any-class mixes them): " + "; ".join(f"{c}: {', '.join(ids)}" for c, ids in sorted(classes.items()))]


def worker_rows(workers: list[dict]) -> list[str]:
    """`farm workers`: a header, then per worker its state, chip, memory, packs, versions, determinism
    class, installed set, current task and speed (tasks done and mean seconds per task), the renders it
    is blocklisted for and why it was refused; then the classes when there are several."""
    cells = [WORKER_HEADER]
    for w in workers:
        memory = f"{int(w['memory_bytes']) / 2**30:.0f} GiB" if w.get("memory_bytes") else "-"
        mean = w.get("mean_s_per_tile")
        speed = f"{w.get('tasks_done') or 0} tasks, {mean:.1f} s/task" if mean else "no tasks yet"
        packs = ",".join(sorted(w.get("packs") or {})) or "-"
        cells.append((str(w.get("id")), str(w.get("state") or "?"), str(w.get("chip") or "-"), memory, packs,
                      _versions_cell(w), str(w.get("fingerprint") or "-"), _installed_cell(w),
                      str(w.get("current_task") or "-"), speed))
    widths = [max(len(row[i]) for row in cells) for i in range(len(WORKER_HEADER) - 1)]
    lines = ["  ".join(c.ljust(n) for c, n in zip(row, widths, strict=False)) + "  " + row[-1] for row in cells]
    for w, i in zip(workers, range(1, len(cells)), strict=True):
        if w.get("blocklisted_for"):
            lines[i] += f"  blocklisted for {', '.join(w['blocklisted_for'])}"
        if w.get("refused"):
            lines[i] += f"  {w['refused']}"
    return lines + class_lines(workers)


def spent(task: dict) -> str:
    """What a task's retries cost, as README's failure policy counts them: a raise spends an attempt,
    a lost lease (its worker died or went silent) spends none."""
    failures, lost = int(task.get("failures") or 0), int(task.get("lost") or 0)
    words = [f"{failures} attempt{'s' if failures != 1 else ''} spent on {task.get('failed_on') or '?'}"] if failures else []
    words += [f"lost {lost} time{'s' if lost != 1 else ''}, no attempt spent"] if lost else []
    return "; ".join(words) or "no attempt spent"


def _when(ms: object) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(ms) / 1000)) if ms and int(ms) else "-"


def _encoder(ref: str | None) -> str:
    """The text encoder the spec records, in words."""
    if ref == "pack":
        return "the pack's own"
    return ref or "the worker's choice (no worker described the pack at submit)"


def length_note(spec: dict) -> str | None:
    """How a render's length was chosen, when a DurationHead chose (or is choosing) it."""
    if spec.get("predicted_seconds") is not None:
        return length_line(int(spec["frames"]), float(spec["predicted_seconds"]), float(spec["frame_rate"]))
    if spec.get("frames") is None and spec.get("generation"):
        return "duration head: picking the length (before stage 1)"
    return None


def render_details(render: dict, enhanced: str | None = None) -> list[str]:
    """What `farm status ID` prints: prompt (and, with `--enhance-prompt`, the prompt the encoder's Gemma
    wrote from it, once written), size, times, stage timings, output, failures."""
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    created, started, finished = (int(render.get(k) or 0) for k in ("created_ms", "started_ms", "finished_ms"))
    state = render.get("state")
    lines = [
        f"{render.get('id')}  {state}" + (f" ({stage_label(render)}, {float(render.get('progress') or 0):.0%})"
                                          if stage_label(render) else ""),
        f"  prompt     {spec.get('prompt', '')}",
        *([f"  enhanced   {enhanced}"] if enhanced else []),
        f"  size       {spec.get('height')}x{spec.get('width')}, {spec.get('frames')} frames at "
        f"{spec.get('frame_rate')} fps, seed {spec.get('seed')}, pack {spec.get('pack')}",
        f"  encoder    {_encoder(spec.get('text_encoder'))}",
        *([f"  length     {length_note(spec)}"] if length_note(spec) else []),
        f"  submitted  {_when(created)}" + (f" by {render['submitter']}" if render.get("submitter") else ""),
        f"  started    {_when(started)}" + (f" (queued {duration((started - created) / 1000)})"
                                            if started and created else ""),
    ]
    if finished:
        lines.append(f"  finished   {_when(finished)} (took {duration((finished - (started or created)) / 1000)})")
    elif render.get("eta_s") is not None:
        lines.append(f"  eta        {duration(render['eta_s'])}")
    views = [task_view(t) for t in render.get("tasks") or []]
    for stage in stage_summaries(render, views):
        took = duration(stage["duration_s"]) if stage["duration_s"] is not None else stage["state"]
        ran = sorted({w for v in views if v["stage"] == stage["name"] for w in v["workers"]})
        lines.append(f"    {stage['label']:<10} {stage['done']}/{stage['total']} {took}" + (f"  on {', '.join(ran)}" if ran else ""))
    if render.get("output"):
        lines.append(f"  output     {render['output']} (`farm fetch {render.get('id')} -o FILE`)")
    if render.get("error"):
        lines.append(f"  error      {render['error']}")
    for t in render.get("tasks") or []:
        if t.get("error"):  # the failure text of a failed or retried task, and where it ran
            lines.append(f"  {t['id']}  {t.get('state')} on {t.get('worker') or '?'} ({spent(t)}): {t['error']}")
    return lines
