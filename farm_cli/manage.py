"""Renders as people manage them: farm ls (filters, columns), retry, delete, logs, and batches (a group
of renders from --seeds / --prompts-file, fetched together with `farm fetch GROUP -o DIR`)."""

import json
import re
import secrets
import time
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common
from farm_cli.config import submitter
from farm_cli.options import Coordinator, DataDir, Json, Token
from farm_cli.remote import client, submit_render, wait_for
from farm_cli.render_options import spec_option
from farm_cli.session import fail, one_line
from farm_cli.views import duration, stage_label

COLUMNS = ("id", "state", "stage", "progress", "eta", "age", "by", "group", "prompt", "output")
DEFAULT_COLUMNS = "id,state,stage,progress,eta,age,by,prompt"

AnotherSeed = spec_option("seed", help="Another seed.")  # farm rerun --seed N


def parse_seeds(text: str) -> list[int]:
    """'1-8' / '1,3,5' / '2-4,9' as seeds; one line when it is not that."""
    seeds: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match or (match[2] and int(match[2]) < int(match[1])):
            fail(f"--seeds {text!r}: give seeds as 1-8, 1,3,5 or a mix")
        seeds += list(range(int(match[1]), int(match[2] or match[1]) + 1))
    if len(seeds) > 1000:
        fail(f"--seeds {text!r} makes {len(seeds)} renders; 1000 at most")
    return seeds


def read_prompts(path: Path) -> list[str]:
    """One prompt per non-empty line (lines starting with # are comments)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read --prompts-file {path}: {getattr(exc, 'strerror', None) or exc}")
    prompts = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not prompts:
        fail(f"--prompts-file {path} holds no prompt")
    return prompts


def batch_specs(spec: dict, seeds: str | None, prompts_file: Path | None) -> list[dict]:
    """The specs of a batch (prompts x seeds), all carrying one new group id; [spec] when no batch."""
    if not seeds and not prompts_file:
        return [spec]
    prompts = read_prompts(prompts_file) if prompts_file else [spec["prompt"]]
    group = f"g{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    return [{**spec, "prompt": p, "seed": s, "group": group}
            for p in prompts for s in (parse_seeds(seeds) if seeds else [spec["seed"]])]


def since_seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not match:
        fail(f"--since {text!r}: give an age like 30m, 2h or 1d")
    return float(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]


def cell(render: dict, column: str) -> str:
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    return {
        "id": render.get("id") or "",
        "state": render.get("state") or "",
        "stage": stage_label(render) or "-",
        "progress": f"{float(render.get('progress') or 0):.0%}",
        "eta": duration(render.get("eta_s")),
        "age": duration(render.get("age_s")),
        "by": render.get("submitter") or "-",
        "group": spec.get("group") or "-",
        "prompt": " ".join(str(render.get("prompt") or "").split()),
        "output": render.get("output") or "-",
    }[column]


def table(renders: list[dict], columns: list[str]) -> list[str]:
    """Aligned rows under a header of the column names (lower case, as `farm workers` has them); the
    prompt (last) column is never padded."""
    rows = [list(columns)] + [[cell(r, c) for c in columns] for r in renders]
    widths = [min(60, max(len(row[i]) for row in rows)) for i in range(len(columns))]
    return ["  ".join(v[:w].ljust(w) if i < len(columns) - 1 else v for i, (v, w) in enumerate(zip(row, widths,
                                                                                                   strict=True)))
            .rstrip() for row in rows]


def matches(render: dict, state: str | None, by: str | None, since_s: float | None, group: str | None) -> bool:
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    return ((not state or render.get("state") in [w.strip() for w in state.split(",")])
            and (not by or by.lower() in str(render.get("submitter") or "").lower())
            and (since_s is None or float(render.get("age_s") or 0) <= since_s)
            and (not group or spec.get("group") == group))


def asked_for(spec: dict) -> dict:
    """The fields a submit may carry, out of a recorded spec (which also holds what validation derived,
    e.g. the fleet's pack sizes): what `farm retry` sends again."""
    from coordinator.plan.render import DEFAULTS
    from protos.spec import GIVEN_FIELDS

    return {k: v for k, v in spec.items() if k in DEFAULTS or k in GIVEN_FIELDS or k in ("priority", "group", "notify")}


def group_renders(farm, group: str, limit: int = 500) -> list[dict]:
    """The renders of one batch (newest first), from the coordinator's list."""
    return [r for r in farm.list(limit) if (r.get("spec") or {}).get("group") == group]


LOST_EVENTS = {"task_lost": "lost with", "task_expired": "lease expired on", "task_retry": "failed on"}


def earlier_attempts(events: list[dict]) -> dict[str, list[str]]:
    """Per task, the runs that did not end it (from the render's events): where and why, and whether
    they spent an attempt (a raise does; a lost or expired lease does not, README's failure policy)."""
    found: dict[str, list[str]] = {}
    for e in events:
        if e.get("type") in LOST_EVENTS:
            cost = "an attempt spent" if e["type"] == "task_retry" else "no attempt spent"
            why = e.get("reason") or e.get("error") or ""
            found.setdefault(str(e.get("task")), []).append(
                f"{LOST_EVENTS[e['type']]} {e.get('worker') or '?'} ({cost}){': ' + why if why else ''}")
    return found


def made_by_line(made: dict) -> str:
    """What produced a task's output, in one line: chip, backend, versions, class, installed set."""
    installed = made.get("installed") if isinstance(made.get("installed"), dict) else {}
    return (f"{made.get('chip') or '?'} ({made.get('backend') or '?'}), ltx-farm {made.get('project_version') or '?'}, "
            f"mlx {made.get('mlx_version') or '?'}, class {made.get('fingerprint') or '-'}, "
            f"installed {installed.get('installed') or '?'} (lock {installed.get('lock') or '?'})")


def print_logs(render: dict, task: str | None, events: list[dict] | None = None) -> None:
    """Each task's worker, outcome, its earlier runs (lost leases, failures) and the log lines its
    worker sent with the result."""
    from coordinator.views.metrics import task_workers  # a gang's task ran on every rank's worker

    tasks = [t for t in render.get("tasks") or [] if not task or t["id"] == task or t["id"].endswith("." + task)]
    if task and not tasks:
        fail(f"render {render.get('id')} has no task {task}", code=1)
    earlier = earlier_attempts(events or [])
    for t in tasks:
        metrics = t.get("metrics") if isinstance(t.get("metrics"), dict) else {}
        secs = f" {metrics['seconds']:.2f}s" if isinstance(metrics.get("seconds"), (int, float)) else ""
        typer.echo(f"== {t['id']}  {t.get('state')} on {', '.join(task_workers(t)) or '-'}{secs}")
        if isinstance(t.get("made_by"), dict):
            typer.echo(f"   made by: {made_by_line(t['made_by'])}")
        for line in earlier.get(t["id"], []):
            typer.echo(f"   earlier: {line}")
        for line in metrics.get("log") or []:
            typer.echo(f"   {line}")
        if t.get("error") and t.get("state") != "done":
            typer.echo(f"   error: {t['error']}")


def ls(state: Annotated[str | None, typer.Option("--state", help="done, failed, running, ... (comma-separated).")] = None,
       by: Annotated[str | None, typer.Option("--by", help="Submitter (part of user@host).")] = None,
       since: Annotated[str | None, typer.Option("--since", help="Younger than this: 30m, 2h, 1d.")] = None,
       group: Annotated[str | None, typer.Option("--group", help="One batch's renders.")] = None,
       columns: Annotated[str, typer.Option("--columns", help=f"Any of {','.join(COLUMNS)}.")] = DEFAULT_COLUMNS,
       limit: Annotated[int, typer.Option("--limit")] = 50, *, coordinator: Coordinator, token: Token = None,
       as_json: Json = False) -> None:
    """The newest renders, filtered, one row each (`farm status` without an id prints the same list)."""
    chosen = [c.strip() for c in columns.split(",") if c.strip()]
    if not chosen or set(chosen) - set(COLUMNS):
        fail(f"--columns {columns!r}: choose from {', '.join(COLUMNS)}")
    from protos.states import RenderState

    unknown = [w for w in (state or "").split(",") if w.strip() and w.strip() not in set(RenderState)]
    if unknown:
        fail(f"--state {state!r}: choose from {', '.join(RenderState)}")
    since_s = since_seconds(since) if since else None
    with one_line(code=1), client(coordinator, token) as farm:
        renders = [r for r in farm.list(limit) if matches(r, state, by, since_s, group)]
    if as_json:
        typer.echo(json.dumps(renders, indent=2))
        return
    if not renders and not (state or by or since or group):
        typer.echo("no renders yet: `farm submit -p \"...\"` queues one")
        return
    for line in table(renders, chosen):
        typer.echo(line)


def retry(render_id: str, new: bool = typer.Option(False, "--new", help="Render it all again under a new id."),
          *, coordinator: Coordinator, token: Token = None) -> None:
    """Render a failed or cancelled render again and print its id: the same id, re-running only the
    tasks that had not finished, while its blobs are kept; else (or with --new) the same spec anew."""
    with one_line(code=1), client(coordinator, token) as farm:
        render = farm.get(render_id)
        if render.get("state") not in ("failed", "cancelled"):
            fail(f"render {render_id} is {render.get('state')}: only failed or cancelled renders are retried",
                 code=1)
        known_bad = render.get("fails_again") == "1"  # the same spec, anew or not, fails the same way
        outcome = "" if new or known_bad else farm.retry(render_id)
        if known_bad or outcome == "fails_again":
            fail(fails_again(render_id, str(render.get("error") or "")), code=1)
        if outcome == "retried":
            again = render_id
        else:
            again = farm.submit({**asked_for(render["spec"]), "submitter": submitter()})
    typer.echo(again)


def fails_again(render_id: str, error: str) -> str:
    """Why a retry of a render that failed on an error every worker would hit is refused, in one line."""
    return (f"render {render_id} failed on an error every worker would hit ({error}): a retry fails the same "
            f"way; change the spec and submit it, or `farm rerun {render_id} --seed N`")


def rerun(render_id: str, seed: AnotherSeed = None,
          *, coordinator: Coordinator, token: Token = None) -> None:
    """Queue a render's recorded spec again as a new render, whatever its state (--seed N: with that
    seed); prints the new id."""
    from protos.spec import spec_field_names

    with one_line(code=1), client(coordinator, token) as farm:
        recorded = farm.get(render_id).get("spec") or {}
        spec = {k: v for k, v in recorded.items() if k in spec_field_names() and k not in ("submitter", "group")}
        again = farm.submit({**spec, **({} if seed is None else {"seed": seed}), "submitter": submitter()})
    typer.echo(again)


def output_names(renders: list[dict]) -> dict[str, str]:
    """A batch's file names by seed (seed-7.mp4); with the id too where seeds repeat (several prompts)."""
    seeds = [(r.get("spec") or {}).get("seed") for r in renders]
    return {r["id"]: f"seed-{seed}.mp4" if seeds.count(seed) == 1 else f"seed-{seed}-{r['id']}.mp4"
            for r, seed in zip(renders, seeds, strict=True)}


def delete(render_ids: list[str], *, coordinator: Coordinator, token: Token = None) -> None:
    """Forget finished renders (record, tasks, events, the coordinator's mp4); a running one is refused."""
    for render_id in render_ids:
        with one_line(code=1), client(coordinator, token) as farm:
            deleted, state = farm.delete(render_id)
        if not deleted:
            fail(f"render {render_id} is {state}: cancel it first (`farm cancel {render_id}`)", code=1)
        typer.echo(f"{render_id} deleted")


def token_rotate(data: DataDir = None) -> None:
    """A new secret (same CA) in DATA/token: the coordinator and workers reading that file follow it
    within seconds; copy the file again to other Macs and laptops."""
    from coordinator.api.auth import rotate_token

    folder = common.data_dir(data)
    if not (folder / "token").is_file():
        fail(f"no farm token in {folder} (this is not the coordinator's data folder)", code=1)
    rotate_token(folder)
    typer.echo(f"new farm token in {folder / 'token'}; copy it to each Mac's token file")


def prune(older_than: float = typer.Option(..., "--older-than", help="Days since a render ended (0: all)."),
          *, coordinator: Coordinator, token: Token = None) -> None:
    """Forget finished renders older than that (record, tasks, events, folder) and unreferenced blobs."""
    with one_line(code=1), client(coordinator, token) as farm:
        done = farm.prune(older_than)
    typer.echo(f"forgot {len(done['render_ids'])} renders and {done['blobs']} blobs "
               f"({done['blob_bytes'] / 1e6:.1f} MB)")


def logs(render_id: str, task: str = typer.Argument(None, help="One task (its id or its last part)."),
         *, coordinator: Coordinator, token: Token = None) -> None:
    """What each task of a render logged on its worker, with its worker, time and error."""
    from protos.states import TERMINAL

    with one_line(code=1), client(coordinator, token) as farm:
        render = farm.get(render_id)  # an ended render's events are all there: its lost and failed runs
        events = list(farm.watch(render_id, timeout=10)) if render.get("state") in TERMINAL else []
    print_logs(render, task, events)


def submit_batch(specs: list[dict], pixels, coordinator: str, token: str | None, wait: bool,
                 output: Path | None, as_json: bool) -> None:
    """Queue a batch's renders; print the group id, then each render id. With --wait, follow them all
    and (with -o DIR) fetch each mp4 into DIR; exit 1 when any did not end done."""
    group = specs[0]["group"]
    ids = [submit_render(dict(spec), pixels, coordinator, token) for spec in specs]
    typer.echo(json.dumps({"group": group, "render_ids": ids}) if as_json else "\n".join([group, *ids]))
    if not (wait or output):
        return
    states = {rid: wait_for(rid, coordinator, token, quiet=True, output=output, group=group).get("state")
              for rid in ids}
    if output:
        fetch_group(group, output, coordinator, token)
    bad = [f"{rid} {state}" for rid, state in states.items() if state != "done"]
    if bad:
        fail(f"group {group}: {len(bad)} of {len(ids)} renders did not finish: {', '.join(bad)}", code=1)


def fetch_group(group: str, folder: Path, coordinator: str, token: str | None) -> None:
    """Every finished render of the group into folder/ID.mp4; one line for those without output."""
    from farm_cli.follow import Outage, ride

    folder.mkdir(parents=True, exist_ok=True)
    with one_line(code=1), client(coordinator, token) as farm:
        renders = group_renders(farm, group)
        if not renders:
            fail(f"no renders in group {group}", code=1)
        names = output_names(renders)
        for r in sorted(renders, key=lambda r: r["id"]):
            if r.get("state") != "done":
                typer.echo(f"{r['id']} {r.get('state')}: no output", err=True)
                continue
            path = folder / names[r["id"]]
            ride(lambda rid=r["id"], path=path: farm.fetch_output(rid, path), Outage())
            typer.echo(f"wrote {path}")
