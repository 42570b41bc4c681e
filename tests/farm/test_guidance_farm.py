"""The guided recipes on real workers: one-stage, two-stage and two-stage HQ on 1, 2 and 3 workers, each
bit-identical to `farm render --local` on the tiny dev-only pack (one farm for the module, workers added
as the count grows); a worker SIGKILLed while it holds a guidance pass loses only that pass; bad guidance
input is refused at submit with nothing queued; A2V on the two-stage recipe (upstream's a2vid_two_stage:
the track's latent frozen in every pass and in stage 2, the source track muxed) and one-stage on 2
workers == --local."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess

import numpy as np
import pytest

from coordinator.auth import load_or_create_token
from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.client import FarmError
from farm_cli.local import render_local
from farm_cli.services import worker_command
from tests.farm.farm_harness import (
    ROOT,
    assert_identical,
    farm,
    farm_results,
    local_results,
    token_file,
    wait_done,
    wait_until,
)
from tests.farm.user_loras import write_user_loras
from tests.media_files import write_wav

BASE = {
    "prompt": "a fox",
    "frames": 9,
    "seed": 3,
    "pack": "dev",
    "decode_tiles": "off",
    "negative_prompt": "blurry",
}
ONE = {**BASE, "pipeline": "one-stage", "height": 64, "width": 64, "steps": 2, "stg_blocks": [1]}
TWO = {
    **BASE,
    "pipeline": "two-stage",
    "height": 128,
    "width": 128,
    "stage1_steps": 2,
    "stage2_steps": 1,
    "stg_blocks": [1],
}
HQ = {**BASE, "pipeline": "two-stage-hq", "height": 128, "width": 128, "stage1_steps": 2, "stage2_steps": 1}
SPECS = {"one-stage": ONE, "two-stage": TWO, "two-stage-hq": HQ}
KILLED = {**ONE, "steps": 4}  # more rounds of passes for the victim to take one of
USER_LORA = "style-lora.safetensors"
LORA = [{"file": USER_LORA, "strength": 0.8}]
# Pass tasks: one-stage 2 steps x 4 passes; two-stage the same; HQ stage 1 (2 res_2s steps + the final
# evaluation) x 3 passes (STG off) + stage 2 (1 step + final) x the cond pass.
PASSES = {"one-stage": 8, "two-stage": 8, "two-stage-hq": 5 * 3 + 3}
STEPS = {"one-stage": 2, "two-stage": 2, "two-stage-hq": 5 + 3}


@pytest.fixture(scope="module")
def dev_packs(tmp_path_factory):
    from ltx_engine.tiny_pack import write_tiny_pack

    folder = tmp_path_factory.mktemp("devpacks")
    write_tiny_pack(folder / "dev", seed=0, layout="dev-only")
    style, _camera = write_user_loras(tmp_path_factory.mktemp("user-loras"), folder / "dev")
    shutil.copy(style, folder / "dev" / USER_LORA)  # a pack file: no upload, no shelf needed
    return folder


@pytest.fixture(scope="module")
def reference(dev_packs, tmp_path_factory):
    from worker.runner import Runner

    runner, done = Runner(dev_packs), {}

    def local(name: str) -> dict:
        if name not in done:
            out = tmp_path_factory.mktemp("guided") / "local.mp4"
            spec = SPECS.get(name.removesuffix("+lora"), KILLED)
            spec = {**spec, "loras": LORA} if name.endswith("+lora") else spec
            _, outputs, blobs = render_local(dict(spec), out, runner)
            done[name] = local_results(outputs, blobs)
        return done[name]

    return local


class ModuleFarm:
    """One coordinator for the module; `workers(n)` starts more worker processes as tests ask for them."""

    def __init__(self, client, procs: dict, data, packs):
        self.client, self.procs, self.data, self.packs = client, procs, data, packs

    def start(self, name: str, *extra: str) -> subprocess.Popen:
        token = load_or_create_token(self.data)
        cmd = worker_command(
            str(self.client.endpoints),
            token_file(self.data, name, token),
            self.packs,
            name,
            self.data / f"cache-{name}",
            wait_ms=500,
        )
        log = open(self.data / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until it exits
        self.procs[name] = subprocess.Popen(
            [*cmd, *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        return self.procs[name]

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        proc.wait(timeout=20)

    def workers(self, n: int) -> None:
        for i in range(1, n + 1):
            if f"w{i}" not in self.procs:
                self.start(f"w{i}")


@pytest.fixture(scope="module")
def mstore(redis_server):
    client = connect(redis_server.url)
    client.flushdb()
    yield FarmStore(client)
    client.close()


@pytest.fixture(scope="module")
def guided_farm(mstore, dev_packs, tmp_path_factory):
    data = tmp_path_factory.mktemp("guided-farm")
    with farm(mstore, data, dev_packs, workers=0) as (client, procs):
        yield ModuleFarm(client, procs, data, dev_packs)


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_pass_loses_only_that_pass(guided_farm, mstore, reference):
    """The module's first test. A healthy worker renders the prompts once (their embeddings are then
    cached) and stops; a throttled victim (each task 25x its compute), the farm's only worker, takes a
    guidance pass; the healthy worker comes back and the victim is SIGKILLed: its broken stream hands
    that lease back, the pass runs again on the other worker, and nothing else ran twice."""
    assert not guided_farm.procs, "runs first: the victim alone takes the first pass"
    registered = lambda name: wait_until(  # noqa: E731 - the fleet at submit keys the prompt cache
        lambda: any(w.get("id") == name for w in mstore.list_workers()), 30, f"{name} registering"
    )
    guided_farm.workers(1)
    registered("w1")
    wait_done(guided_farm.client, guided_farm.client.submit(dict(ONE)), timeout=60)
    guided_farm.stop("w1")
    victim = guided_farm.start("victim", "--throttle", "25")
    registered("victim")
    render_id = guided_farm.client.submit(dict(KILLED))

    def victim_pass():
        held = [
            t for t in mstore.render_tasks(render_id) if t["state"] == "leased" and t["worker"] == "victim"
        ]
        return [t["id"] for t in held if t["kind"] == "guidance_pass"] and held

    held = wait_until(victim_pass, 60, "the victim leasing a guidance pass")
    guided_farm.workers(1)  # starting: it takes the pass once the lease is back
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    render = wait_done(guided_farm.client, render_id, timeout=60)
    assert_identical(farm_results(guided_farm.client, render), reference("killed"))
    tasks = {t["id"]: t for t in mstore.render_tasks(render_id)}
    again = {tid for tid, t in tasks.items() if int(t["attempts"]) > 1}
    assert again == {t["id"] for t in held} and len(again) == 1, (again, [t["id"] for t in held])
    assert tasks[next(iter(again))]["worker"] == "w1"  # run again, elsewhere
    del guided_farm.procs["victim"]


CASES = [(w, name) for w in (1, 2, 3) for name in SPECS]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers,name", CASES, ids=[f"{n}-{w}" for w, n in CASES])
def test_guided_on_the_farm_equals_local(workers, name, guided_farm, reference):
    guided_farm.workers(workers)
    render = wait_done(guided_farm.client, guided_farm.client.submit(dict(SPECS[name])), timeout=200)
    assert_identical(farm_results(guided_farm.client, render), reference(name))
    passes = [t for t in render["tasks"] if t["kind"] == "guidance_pass"]
    steps = [t for t in render["tasks"] if t["kind"] == "guide_step"]
    assert len(passes) == PASSES[name] and len(steps) == STEPS[name]
    assert {t["worker"] for t in steps} == {"coordinator"}
    if name == "two-stage-hq":  # stage 1 on dev + distilled LoRA 0.25, stage 2 on dev + 0.5
        strengths = {t["id"].split(".")[1]: t["params"]["distilled_lora_strength"] for t in passes}
        assert strengths == {"stage1": 0.25, "stage2": 0.5}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["one-stage", "two-stage-hq"])
def test_user_loras_reach_the_guided_passes(name, guided_farm, reference):
    """A user LoRA (a pack file) on every guidance pass (HQ: under the distilled LoRA too): farm == local,
    and the passes' outputs differ from the render without it."""
    guided_farm.workers(3)
    spec = {**SPECS[name], "loras": LORA}
    render = wait_done(guided_farm.client, guided_farm.client.submit(spec), timeout=100)
    arrays = farm_results(guided_farm.client, render)
    assert_identical(arrays, reference(f"{name}+lora"))
    assert not np.array_equal(arrays["stage1_video"], reference(name)["stage1_video"])
    passes = [t for t in render["tasks"] if t["kind"] == "guidance_pass"]
    assert all(t["params"]["loras"] == LORA for t in passes)
    assert sum(int(t["metrics"]["lora_fusions"]) for t in passes) <= 3 * (1 if name == "one-stage" else 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "bad,line",
    [
        ({"stg_blocks": [99]}, "--stg-blocks 99: outside the model's"),
        ({"cfg_scale": -1.0}, "cfg_scale -1.0 is outside [0.0, 100.0]"),
        ({"pipeline": "distilled"}, "--steps does not apply to the distilled pipeline"),
        ({"steps": 5000}, "steps 5000 is outside 1..200"),
        ({"pipeline": "two-stage", "stage2_steps": 4}, "--stage2-steps 4: stage 2's sigma table has 3 steps"),
        ({"stage1_steps": 3}, "--steps 2 and --stage1-steps 3 disagree"),
    ],
)
def test_bad_guidance_refused_at_submit(bad, line, guided_farm, mstore):
    before = len(mstore.list_renders())
    with pytest.raises(FarmError) as info:
        guided_farm.client.submit({**ONE, **bad})
    message = str(info.value)
    assert "\n" not in message and line in message, message
    assert len(mstore.list_renders()) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["two-stage", "one-stage"])
def test_a2v_dev_on_2_workers_equals_local(name, guided_farm, dev_packs, tmp_path):
    """The track encoded once; every guidance pass reads the prep's frozen audio; stage 2 and the output's
    track are the source's; farm bit for bit --local on the same plan."""
    from worker.runner import Runner

    wav = write_wav(tmp_path / "tone.wav")
    sha = hashlib.sha256(wav.read_bytes()).hexdigest()
    spec = {**SPECS[name], "audio_input": {"blob": sha, "start": 0.25, "name": "tone.wav"}}
    _, outputs, blobs = render_local(dict(spec), tmp_path / "local.mp4", Runner(dev_packs), media={sha: wav})
    guided_farm.workers(2)
    for extra in [w for w in guided_farm.procs if w not in ("w1", "w2")]:  # earlier tests' third worker
        guided_farm.stop(extra)
    assert guided_farm.client.put_blob(wav.read_bytes()) == sha
    render = wait_done(guided_farm.client, guided_farm.client.submit(dict(spec)), timeout=100)
    assert_identical(farm_results(guided_farm.client, render), local_results(outputs, blobs))
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    kinds = [t["kind"] for t in tasks.values()]
    assert {t.get("worker") for t in tasks.values() if t.get("worker")} <= {"w1", "w2", "coordinator"}
    assert kinds.count("audio_encode") == 1 and "decode_audio" not in kinds
    assert kinds.count("guidance_pass") == PASSES[name]
    assert tasks["stage1"]["outputs"]["audio_latent"] == tasks["audio"]["outputs"]["latent"]  # frozen
    if name == "two-stage":
        assert tasks["stage2"]["inputs"]["audio_latent"] == tasks["audio"]["outputs"]["latent"]
    assert int(blobs.get(local["audio"]["sample_rate"])[0]) == 44100  # the source track, at its rate
