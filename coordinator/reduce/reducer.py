"""The reducer: the coordinator's own tasks between tiled forwards (cut a step's tile inputs; blend the
tile outputs in tile order and take the sampler step). Pure numpy over `ltx_engine.rules.tdp`.

These tasks sit in the same stage graph as the workers' tasks, under the capability `coordinator`, and
are leased with the same fencing as any other task by a thread of the coordinator process. `farm
render --local` runs `run_reduce_task` on the same inputs, so both paths compute the same bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from coordinator.leadership import LostEpoch, check_epoch
from coordinator.plan.length import PLAN_KIND, picked
from coordinator.reduce.chunks import CHUNK_STEPS
from coordinator.reduce.encode_blend import ENCODE_STEPS
from coordinator.reduce.guide_step import guide_step
from coordinator.state.store import NotLeader, is_transient
from ltx_engine.rules import dfr_epilogue, dfr_layout, dfr_windows, tdp
from ltx_engine.rules.tokens import slot_latent, unpatchify_video
from protos.kinds import facts
from protos.retry import Backoff, GaveUp, Outage, retry
from protos.states import Outcome
from protos.tensors import encode_tensor

log = logging.getLogger(__name__)
CAPABILITY = "coordinator"
REDUCER_ID = "coordinator"


def _sets(params: dict, positions: np.ndarray):
    overlap = params["overlap"]
    overlap = int(overlap) if isinstance(overlap, int | float) else tuple(int(x) for x in overlap)
    return tdp.token_sets(tuple(params["grid"]), tuple(params["counts"]), overlap, positions)


def _tile_outputs(params: dict, latent: np.ndarray, mask: np.ndarray, positions: np.ndarray, sigma: float,
                  sets) -> dict[str, np.ndarray]:
    slots = params.get("slot_range")
    marker = (tdp.first_frame_marker(tuple(params["grid"]), latent.shape[1], tuple(slots) if slots else None)
              if params.get("marker") else None)
    out = {}
    for i, arrays in enumerate(tdp.step_tile_inputs(latent, mask, positions, sigma, sets, marker)):
        for name, array in arrays.items():
            out[f"t{i}_{name}"] = array
    return out


def dfr_stitch(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A DFR round's latent from its tiles (tile order, lead-ins dropped) and the keyframes it carries
    on: the round's anchors plus every tile's new slots (the earlier tile's copy of a slot wins).
    The last round also gives the latent trimmed to the requested length."""
    plan = dfr_layout.plan_from_params(params["dfr"])
    rnd = plan.rounds[int(params["round"]) - 1]
    latent = dfr_layout.stitch_round([inputs[f"t{t.index}_latent"] for t in rnd.tiles], rnd)
    planes = {p: inputs["carry"][:, :, i : i + 1] for i, p in enumerate(rnd.seams)}
    for tile in reversed(rnd.tiles):  # a lead-in repeats the previous tile's slot: the earlier tile wins
        for k, p in enumerate(tile.slots):
            planes[p] = inputs[f"t{tile.index}_slots"][:, :, k : k + 1]
    if tuple(sorted(planes)) != rnd.carry():
        raise ValueError(f"round {rnd.round} carry {sorted(planes)} != plan {list(rnd.carry())}")
    out = {"latent": latent, "keyframes": np.concatenate([planes[p] for p in rnd.carry()], axis=2)}
    if rnd.round == len(plan.rounds):
        out["video_latent"] = np.ascontiguousarray(dfr_layout.trim_latent(latent, plan))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def dfr_trim(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """DFR without rounds (the base path, or after the epilogue): the canvas latent trimmed to the asked
    length and the keyframes a decode of it receives (`keyframes`, only when any lie inside the clip)."""
    plan = dfr_layout.plan_from_params(params["dfr"])
    planes = inputs["keyframes"] if "keyframes" in inputs else np.concatenate(
        [inputs[f"kf{i}"] for i in range(len(params["positions"]))], axis=2)
    kept, _ = dfr_epilogue.decode_keyframes(planes, params["positions"], plan.output_frames)
    latent = inputs["latent"] if "windows" not in params else dfr_windows.join_windows(
        [inputs[f"w{i}"] for i in range(int(params["windows"]))], dfr_windows.plan_windows(plan))
    out = {"video_latent": dfr_layout.trim_latent(latent, plan)}
    out |= {"keyframes": kept} if kept.shape[2] else {}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def dfr_epi_window(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One epilogue window after rounds (`ltx_engine/rules/dfr_windows.py`): its starting latent, IC-LoRA
    reference and resampled frozen audio, and (a non-first window) its prefix pinned on the previous
    window's finished output."""
    plan = dfr_layout.plan_from_params(params["dfr"])
    windows = dfr_windows.plan_windows(plan)
    window = windows[int(params["window"])]
    plane = inputs.get("plane")
    out = {
        "latent": dfr_windows.window_latent(inputs["up"], window, plane),
        "reference": dfr_windows.window_reference(inputs["guide"], window),
        "audio": dfr_windows.window_audio(inputs["audio"], window, plan.output_fps,
                                          plan.canvas.frames / plan.fps, plan.rounds[-1].conditioning_fps),
    }
    if window.plane is not None:
        out["prefix"] = dfr_windows.carried_prefix(inputs["previous"], windows[window.index - 1], window, plane)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _embeddings(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A cached prompt's text (or enhance) task: the outputs lease.lua moved to it are its outputs."""
    return dict(inputs)


def _tdp_cut(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Step 0's tile inputs, cut from the stage's starting latent."""
    positions = inputs["positions"]
    sigma = float(params["sigmas"][0])
    return _tile_outputs(params, inputs["latent"], inputs["mask"], positions, sigma, _sets(params, positions))


def _tdp_step(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Blend one step's tile velocities in tile order, take the sampler step, cut the next step's tiles
    (or, after the last step, give the stage's latent)."""
    positions, mask = inputs["positions"], inputs["mask"]
    sets = _sets(params, positions)
    sigmas = [float(s) for s in params["sigmas"]]
    step = int(params["step"])
    velocities = [inputs[f"v{i}"] for i in range(len(sets))]
    latent = tdp.reduce_step(inputs["latent"], inputs["clean"], mask, positions, velocities, sets, sigmas, step,
                             tdp.step_ancestral(params))
    if step + 1 == len(sigmas) - 1:
        grid = tuple(params["grid"])
        out = {"video_latent": unpatchify_video(latent[:, : int(np.prod(grid))], grid)}
        if params.get("slot_range"):  # DFR's slots, read out as the untiled stage gives them
            out["slots"] = slot_latent(latent, params["slot_range"], grid)
        return out
    if params.get("next_tiling"):  # DFR's epilogue retiles after its first step (plan/dfr_finish.py)
        sets = _sets({**params, **params["next_tiling"]}, positions)
    return {"latent": latent, **_tile_outputs(params, latent, mask, positions, sigmas[step + 1], sets)}


# The coordinator's steps by name: a kind's `reduce` fact (protos/kinds.py) picks one.
STEPS: dict[str, Callable[[dict, dict[str, np.ndarray]], dict[str, np.ndarray]]] = {
    "embeddings": _embeddings, "tdp_cut": _tdp_cut, "tdp_step": _tdp_step, "dfr_stitch": dfr_stitch,
    "dfr_trim": dfr_trim, "dfr_epi_window": dfr_epi_window,
    "guide_step": guide_step,  # a guided step: combine its passes, step (coordinator/reduce/guide_step.py)
    **ENCODE_STEPS,  # a source clip's encode tiles blended, retake/extend (coordinator/reduce/encode_blend.py)
    **CHUNK_STEPS,  # a chunked render's carry and joined audio (coordinator/reduce/chunks.py)
}


def run_reduce_task(kind: str, params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of a coordinator task: the step its kind names (`tdp_cut`, `tdp_step`, DFR's, a guided
    step, a clip's encode blend, or a `text_encode` the prompt-embedding cache answers: lease.lua moved
    it here with the embeddings an earlier text task of the same key left as its inputs)."""
    step = STEPS.get(facts(kind).reduce)
    if step is None:
        raise ValueError(f"unknown coordinator task kind {kind!r}")
    return step(params, inputs)


class ReducerThread(threading.Thread):
    """Leases `coordinator` tasks from the store and runs them next to the blob store.

    Redis or blob errors never end it: it waits them out (one log line per outage), and every result or
    failure it owes the store is retried until it lands. Leases held under REDUCER_ID are reclaimed when
    it starts and after an outage: it runs one task at a time, so between tasks any such lease is an
    orphan (of a previous coordinator process, or a commit that a Redis restart lost). It also plans the
    rest of a render whose length a DurationHead picked (`plan_length`), checked against `fleet()`."""

    def __init__(self, store, blobs, scheduler, lease_ms: int = 60_000, idle_s: float = 0.25,
                 fleet: Callable[[], list[dict]] | None = None):
        super().__init__(name="farm-reducer", daemon=True)
        self.store, self.blobs, self.scheduler = store, blobs, scheduler
        self.fleet = fleet or list
        self.lease_ms, self.idle_s = lease_ms, idle_s
        self.stopping = threading.Event()
        self.deposed = LostEpoch("reducer", log)

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        outage, backoff = Outage("reducer", log), Backoff()
        self._reclaim()
        while not self.stopping.is_set():
            try:
                task = self.store.lease(REDUCER_ID, [CAPABILITY], self.lease_ms)
                self.deposed.ok()
            except NotLeader as exc:  # a paused old leader woke up: one line, then stood down
                self.deposed.note(exc)
                self.stopping.wait(backoff.delay())
                continue
            except Exception as exc:  # noqa: BLE001 - Redis away (or worse): wait, never die
                if not is_transient(exc):
                    log.exception("reducer lease failed")
                outage.failed(exc)
                self.stopping.wait(backoff.delay())
                continue
            if outage.ok():
                backoff.reset()
                self._reclaim()
                continue
            if task is None:
                self.scheduler.wait_for_work(self.idle_s, (CAPABILITY,))
                continue
            try:
                self._run_one(task)
            except NotLeader as exc:
                self.deposed.note(exc)
            except Exception:  # noqa: BLE001 - never die
                log.exception("reducer task %s could not be reported", task["id"])

    def _reclaim(self) -> None:
        try:
            lost = self._landed(lambda: self.store.lose_leases(REDUCER_ID, reason="reclaimed by the coordinator"))
        except Exception as exc:  # noqa: BLE001 - stopping, or not the leader any more: the next one reclaims
            log.info("reducer: leases not reclaimed now (%s)", exc)
            return
        if lost:
            log.info("reducer reclaimed its orphaned leases: %s", ", ".join(lost))
            self.scheduler.wake()

    def _landed(self, fn):
        """fn() retried through transient errors until it lands (or the reducer stops)."""
        return retry(fn, "reducer", transient=is_transient, log=log, stop=self.stopping)

    def _compute(self, task: dict) -> dict[str, str]:
        inputs = {name: self.blobs.read_tensor(sha) for name, sha in task["inputs"].items()}
        if task["kind"] == PLAN_KIND:
            return self._plan_length(task, inputs)
        outputs = run_reduce_task(task["kind"], task["params"], inputs)
        check_epoch(self.store)  # an old leader that woke up writes no blob for the new one's render
        return {name: self.blobs.put_bytes(encode_tensor(array)) for name, array in outputs.items()}

    def _plan_length(self, task: dict, inputs: dict[str, np.ndarray]) -> dict[str, str]:
        """The DurationHead picked the length: the rest of the graph is queued (with the spec that records
        the length) before this task is done, so the render never looks finished in between. A length
        the render cannot take fails it, in one line."""
        from coordinator.plan.fleet import Fleet
        from coordinator.plan.render import continue_render

        frames, seconds = picked(inputs)
        check_epoch(self.store)
        spec, tasks = continue_render(task["params"]["spec"], frames, seconds, task["render"], Fleet.of(self.fleet()))
        self.store.set_length(task["render"], task["id"], REDUCER_ID, int(task["fence"]), spec, tasks)
        return {"frames": self.blobs.put_bytes(encode_tensor(inputs["frames"]))}

    def _run_one(self, task: dict) -> None:
        start = time.perf_counter()
        try:
            shas = self._landed(lambda: self._compute(task))
        except GaveUp:
            return  # stopping: the lease is reclaimed by the next reducer
        except NotLeader:
            raise  # another coordinator leads: not this task's failure (run() says so once)
        except Exception as exc:  # noqa: BLE001 - reported on the task, the render fails with the text
            log.exception("reducer task %s failed", task["id"])
            error = f"{type(exc).__name__}: {exc}"
            self._report(lambda: self.store.fail(task["id"], REDUCER_ID, int(task["fence"]), error, False))
            return
        metrics = {"seconds": round(time.perf_counter() - start, 4)}
        status = self._report(lambda: self.store.complete(task["id"], REDUCER_ID, int(task["fence"]), shas, metrics))
        if status == Outcome.RENDER_READY:
            self.scheduler.start_assembly(task["render"])

    def _report(self, fn) -> str | None:
        """A result or failure retried until it lands; a reply lost in a blip reads 'stale' on the retry,
        and the scheduler's assembly sweep still finds a render that became ready."""
        try:
            status = self._landed(fn)
        except GaveUp:
            return None
        self.scheduler.wake()
        return status
