"""The guided recipes on real workers: one-stage, two-stage and two-stage HQ on 2 workers (the plan is the
same on 1, 2 or 3), each bit-identical to `farm render --local` on the tiny dev-only pack (one farm for the
module, workers added as tests ask for them); a worker SIGKILLed while it holds a guidance pass loses
only that pass; bad guidance input is refused at submit with nothing queued; one modality's skip step
while the other's passes run, with the modality isolation in chosen blocks, == --local; A2V on the two-stage recipe (upstream's a2vid_two_stage:
the track's latent frozen in every pass and in stage 2, the source track muxed), one-stage and two-stage HQ
(res_2s in both stages, the track frozen in both) on 2 workers == --local; a user LoRA set unfused (run-time
adapters on the dev DiT) on each guided recipe, on 2 workers == --local; LTX-2.5 generated keyframe slots
(`dev25`, a 2.5 dev-only pack) in every pass of one-stage, two-stage and HQ stage 1, on 2 workers == --local."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal

import numpy as np
import pytest

from farm_cli.client import FarmError
from farm_cli.local import render_local
from tests.farm.farm_harness import (
    assert_identical,
    farm_results,
    local_references,
    local_results,
    shelf_farm,
    wait_done,
    wait_until,
)
from tests.farm.user_loras import write_user_loras
from tests.media_files import write_wav
from tests.session_fixtures import pack_without

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
def dev_packs(tiny_dev_pack, tmp_path_factory):
    """`dev`: the session's dev-only pack's files (links) and a user LoRA among them."""
    folder = tmp_path_factory.mktemp("devpacks")
    pack_without(folder / "dev", tiny_dev_pack)
    style, _camera = write_user_loras(tmp_path_factory.mktemp("user-loras"), folder / "dev")
    shutil.copy(style, folder / "dev" / USER_LORA)  # a pack file: no upload, no shelf needed
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    write_tiny_pack(folder / "dev25", seed=0, variant="2.5", layout="dev-only")  # the keyframe marker's DiT
    return folder


@pytest.fixture(scope="module")
def dev_runner(dev_packs):
    """The module's one in-process Runner for `--local` references: models stay warm between them."""
    from worker.runner import Runner

    return Runner(dev_packs)


@pytest.fixture(scope="module")
def reference(dev_runner, tmp_path_factory):
    def spec_of(name: str) -> dict:
        spec = SPECS.get(name.removesuffix("+lora"), KILLED)
        return dict({**spec, "loras": LORA} if name.endswith("+lora") else spec)

    return local_references(dev_runner, tmp_path_factory.mktemp, spec_of)


@pytest.fixture(scope="module")
def guided_farm(mstore, dev_packs, tmp_path_factory):
    with shelf_farm(mstore, tmp_path_factory.mktemp("guided-farm"), dev_packs) as module_farm:  # as `farm up`
        yield module_farm


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


# One worker count for the module: a guided plan (its passes and guide steps) is the same on 1, 2 or 3
# workers; on 2 a step's passes already run at once on different workers.
WORKERS = 2
CASES = [(WORKERS, name) for name in SPECS]


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
    guided_farm.workers(WORKERS)
    spec = {**SPECS[name], "loras": LORA}
    render = wait_done(guided_farm.client, guided_farm.client.submit(spec), timeout=100)
    arrays = farm_results(guided_farm.client, render)
    assert_identical(arrays, reference(f"{name}+lora"))
    assert not np.array_equal(arrays["stage1_video"], reference(name)["stage1_video"])
    passes = [t for t in render["tasks"] if t["kind"] == "guidance_pass"]
    assert all(t["params"]["loras"] == LORA for t in passes)
    assert sum(int(t["metrics"]["lora_fusions"]) for t in passes) <= WORKERS * (1 if name == "one-stage" else 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", list(SPECS))
def test_unfused_user_loras_on_the_guided_recipes_on_2_workers_equal_local(name, guided_farm, dev_runner, reference,
                                                                          tmp_path):
    """`--lora-mode unfused` on the dev DiT: the set's adapters on each guided pass's `transformer_dev` (and
    under the distilled LoRA: two-stage's stage 2, HQ's both stages); farm == --local for every output, the
    video not the render's without the LoRA (the adapters are on the DiT that ran)."""
    spec = {**SPECS[name], "loras": LORA, "lora_mode": "unfused"}
    _, outputs, blobs = render_local(dict(spec), tmp_path / "local.mp4", dev_runner)
    guided_farm.workers(2)
    for extra in [w for w in guided_farm.procs if w not in ("w1", "w2")]:  # a worker beyond the module's two
        guided_farm.stop(extra)
    render = wait_done(guided_farm.client, guided_farm.client.submit(dict(spec)), timeout=120)
    arrays = farm_results(guided_farm.client, render)
    assert_identical(arrays, local_results(outputs, blobs))
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert {n: tasks[n].get("outputs") or {} for n in local} == local  # every output, bit for bit
    dits = [t for t in tasks.values() if t["kind"] in ("guidance_pass", "denoise_stage2")]
    assert all(t["params"]["lora_mode"] == "unfused" and t["params"]["loras"] == LORA for t in dits)
    assert sum(int(t["metrics"]["lora_fusions"]) for t in dits) >= 1  # adapters attached on some worker
    assert not np.array_equal(arrays["stage1_video"], reference(name)["stage1_video"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "bad,line",
    [
        ({"stg_blocks": [99]}, "--stg-blocks 99: outside the model's"),
        ({"cfg_scale": -1.0}, "cfg_scale -1.0 is outside [0.0, 100.0]"),
        ({"pipeline": "distilled"}, "--steps does not apply to the distilled recipe"),
        ({"steps": 5000}, "steps 5000 is outside 1..200"),
        ({"pipeline": "two-stage", "stage2_steps": 4}, "--stage2-steps 4: stage 2's sigma table has 3 steps"),
        ({"stage1_steps": 3}, "--steps 2 and --stage1-steps 3 disagree"),
        ({"skip_step": 1, "audio_skip_step": 2, "step_cache": 0.5},
         "--skip-step 1 and --audio-skip-step 2 differ: --step-cache replays whole passes"),
        ({"modality_blocks": [0, 2]}, "--modality-blocks 2: outside the model's 2 blocks (0..1)"),
        ({"modality_blocks": "1,x"}, "must be block numbers like 28"),
        ({"guidance_schedule": "0.5:cfg_scale=-2"}, "guidance_schedule cfg_scale -2.0 is outside [0.0, 100.0]"),
        ({"guidance_schedule": "0.5:stg_scale=1", "stg_blocks": [7]}, "--stg-blocks 7: outside the model's 2 blocks"),
        ({"apg_eta": 0.5, "cfg_scale": 1.0, "audio_cfg_scale": 1.0, "negative_prompt": None},
         "--apg-eta needs a cfg scale other than 1"),
        ({"apg_norm_threshold": 2.0}, "--apg-norm-threshold needs --apg-eta"),
        ({"skip_step": -1}, "skip_step -1 is negative"),
    ],
)
def test_bad_guidance_refused_at_submit(bad, line, guided_farm, mstore):
    before = len(mstore.list_renders())
    with pytest.raises(FarmError) as info:
        guided_farm.client.submit({**ONE, **bad})
    message = str(info.value)
    assert "\n" not in message and line in message, message
    assert len(mstore.list_renders()) == before


@pytest.mark.timeout(60)
def test_the_default_stg_block_is_held_to_the_packs_depth(guided_farm, mstore, dev_packs, tmp_path):
    """The default STG block is the 22B's (28); the tiny DiT has 2. With the pack on the coordinator's
    shelf (as `farm up` keeps it) the submit is refused in one line and nothing is queued, where every
    worker used to fail the pass; `--local` refuses with the same line before any work."""
    from coordinator.admit.lora_check import pack_dit_depth
    from protos.spec import SpecError
    from worker.runner import Runner

    assert pack_dit_depth(dev_packs / "dev") == 2
    default = {k: v for k, v in ONE.items() if k != "stg_blocks"}
    line = "the default --stg-blocks (the 22B's) 28: outside the model's 2 blocks (0..1)"
    before = len(mstore.list_renders())
    with pytest.raises(FarmError) as info:
        guided_farm.client.submit(default)
    assert "\n" not in str(info.value) and line in str(info.value), info.value
    assert len(mstore.list_renders()) == before
    with pytest.raises(SpecError) as local:
        render_local(default, tmp_path / "x.mp4", Runner(dev_packs))
    assert line in str(local.value) and not (tmp_path / "x.mp4").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["two-stage", "one-stage", "two-stage-hq"])
def test_a2v_dev_on_2_workers_equals_local(name, guided_farm, dev_runner, tmp_path):
    """The track encoded once; every guidance pass reads the prep's frozen audio; stage 2 and the output's
    track are the source's; farm bit for bit --local on the same plan."""
    wav = write_wav(tmp_path / "tone.wav")
    sha = hashlib.sha256(wav.read_bytes()).hexdigest()
    spec = {**SPECS[name], "audio_input": {"blob": sha, "start": 0.25, "name": "tone.wav"}}
    _, outputs, blobs = render_local(dict(spec), tmp_path / "local.mp4", dev_runner, media={sha: wav})
    guided_farm.workers(2)
    for extra in [w for w in guided_farm.procs if w not in ("w1", "w2")]:  # a worker beyond the module's two
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
    if name == "two-stage-hq":  # res_2s holds the frozen track too: both stages prepare from it, never re-noised
        assert tasks["stage2.prep"]["inputs"]["audio_latent"] == tasks["audio"]["outputs"]["latent"]
        assert tasks["stage2"]["outputs"]["audio_latent"] == tasks["audio"]["outputs"]["latent"]
    assert int(blobs.get(local["audio"]["sample_rate"])[0]) == 44100  # the source track, at its rate


# Upstream's skip step (guide steps 0, N+1, 2(N+1), ...; the others reuse the last guided x0, res_2s's
# substep never skipped) and the CFG term as APG. One-stage: 4 Euler steps, skip 1 -> steps 1 and 3 run no
# passes (the last step is the one named `stage1`). HQ: stage 1's res_2s step 1 (its first half) reuses step 0's second half; stage 2 has no guidance.
# One modality held: the audio skips steps 1 and 3 while the video's passes run with the audio frozen (video
# cfg 1: those rounds run its cond, perturbed and isolated passes, the isolation in block 1 alone).
SKIPPED = {"one-stage": ({**ONE, "steps": 4, "skip_step": 1, "audio_skip_step": 1, "apg_eta": 0.5,
                          "apg_norm_threshold": 5.0}, 2 * 4, 4),
           "two-stage-hq": ({**HQ, "skip_step": 1, "audio_skip_step": 1}, 4 * 3 + 3, 5 + 3),
           "audio-held": ({**ONE, "steps": 4, "audio_skip_step": 1, "cfg_scale": 1.0, "modality_blocks": [1]},
                          2 * 4 + 2 * 3, 4),
           # --guidance-schedule (sigmas 1.0, 0.87, 0.63, 0.1): full guidance above 0.7, below it STG alone and
           # the audio held on step 3.
           "schedule": ({**ONE, "steps": 4, "guidance_schedule": "1.0:cfg_scale=4;0.7:cfg_scale=1,audio_cfg_scale=1,"
                         "modality_scale=1,audio_modality_scale=1,audio_skip_step=1"}, 2 * 4 + 2 * 2, 4)}
HELD = {"one-stage": {"stage1": True, "stage1.s1": True}, "two-stage-hq": {"stage1.s1a": True},
        "audio-held": {"stage1": ["audio_"], "stage1.s1": ["audio_"]}, "schedule": {"stage1": ["audio_"]}}
FROZEN = {"audio-held": [f"stage1.s{i}.{p}" for i in (1, 3) for p in ("cond", "isolated", "perturbed")],
          "schedule": ["stage1.s3.cond", "stage1.s3.perturbed"]}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(SKIPPED))
def test_skip_step_and_apg_on_2_workers_equal_local(name, guided_farm, dev_runner, tmp_path):
    spec, passes, steps = SKIPPED[name]
    _, outputs, blobs = render_local(dict(spec), tmp_path / "local.mp4", dev_runner)
    guided_farm.workers(2)
    render = wait_done(guided_farm.client, guided_farm.client.submit(dict(spec)), timeout=150)
    assert_identical(farm_results(guided_farm.client, render), local_results(outputs, blobs))
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert {n: tasks[n].get("outputs") or {} for n in local} == local  # every output, bit for bit
    kinds = [t["kind"] for t in tasks.values()]
    assert kinds.count("guidance_pass") == passes and kinds.count("guide_step") == steps
    held = {n: t["params"]["held"] for n, t in tasks.items() if t["kind"] == "guide_step" and t["params"].get("held")}
    assert held == HELD[name]
    frozen = sorted(n for n, t in tasks.items() if t["kind"] == "guidance_pass" and t["params"].get("frozen"))
    assert frozen == FROZEN.get(name, [])
    assert all(set(tasks[n]["outputs"]) == {"x0"} for n in frozen)  # the frozen audio's x0 neither computed nor sent
    if name == "audio-held":  # the isolation in block 1 only
        assert tasks["stage1.s0.isolated"]["params"]["video"]["modality_blocks"] == [1]
    if name == "one-stage":  # the CFG term as APG: every pass and step carries it
        assert all(t["params"]["video"]["apg_eta"] == 0.5 for t in tasks.values() if t["kind"] == "guidance_pass")


# Text-to-audio (upstream's t2a_one_stage): the audio track alone; 2 steps x 3 passes (modality off: no video).
T2A = {"prompt": "a bell rings", "frames": 9, "seed": 3, "pack": "dev", "pipeline": "t2a", "steps": 2,
       "stg_blocks": [1], "negative_prompt": "noise"}


@pytest.fixture(scope="module")
def t2a_local(dev_runner, tmp_path_factory):
    """`--local` of T2A, for both T2A tests: the wav, task outputs and blobs."""
    return render_local(dict(T2A), tmp_path_factory.mktemp("t2a-local") / "local.wav", dev_runner)


@pytest.mark.timeout(120)
def test_t2a_on_2_workers_equals_local(guided_farm, t2a_local, tmp_path):
    """Every task output bit for bit --local, no video task, and the fetched WAV is --local's file, its
    samples the decoded waveform as upstream scales it."""
    import wave

    from coordinator.assemble.audio_file import pcm16

    local_wav, outputs, blobs = t2a_local
    guided_farm.workers(2)
    for extra in [w for w in guided_farm.procs if w not in ("w1", "w2")]:  # a worker beyond the module's two
        guided_farm.stop(extra)
    render = wait_done(guided_farm.client, guided_farm.client.submit(dict(T2A)), timeout=100)
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert {name: tasks[name].get("outputs") or {} for name in local} == local and set(tasks) == set(local)
    assert {t["kind"] for t in tasks.values()} == {"text_encode", "stage_prepare", "guidance_pass", "guide_step",
                                                    "decode_audio"}
    assert {t.get("worker") for t in tasks.values() if t.get("worker")} <= {"w1", "w2", "coordinator"}
    farm_wav = guided_farm.client.fetch_output(render["id"], tmp_path / "farm.wav")
    assert farm_wav.read_bytes() == local_wav.read_bytes()
    # -o NAME.m4a: the render's AAC file beside the WAV (what `farm render` fetches for that suffix), the
    # bytes --local writes for the same waveform.
    from coordinator.assemble.audio_file import M4A_FILE, write_m4a

    farm_m4a = guided_farm.client.fetch_output(render["id"], tmp_path / "farm.m4a", file=M4A_FILE)
    write_m4a(tmp_path / "local.m4a", blobs.get(local["audio"]["waveform"]),
              int(blobs.get(local["audio"]["sample_rate"])[0]))
    assert farm_m4a.read_bytes() == (tmp_path / "local.m4a").read_bytes() and farm_m4a.stat().st_size > 0
    with wave.open(str(farm_wav)) as wav:
        rate, samples = wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), "<i2").reshape(-1, 2)
    assert rate == int(blobs.get(local["audio"]["sample_rate"])[0])
    np.testing.assert_array_equal(samples, pcm16(blobs.get(local["audio"]["waveform"])))


@pytest.mark.timeout(120)
def test_t2a_with_a_user_lora_on_2_workers_equals_local(guided_farm, dev_runner, t2a_local, tmp_path):
    """Upstream's T2A takes LoRAs (an accent LoRA is its example): the pack file's factors on every audio-only
    pass, farm == --local for every output, the audio different from the render without it."""
    spec = {**T2A, "loras": LORA}
    _, outputs, blobs = render_local(dict(spec), tmp_path / "lora.wav", dev_runner)
    _, plain, plain_blobs = t2a_local
    guided_farm.workers(2)
    render = wait_done(guided_farm.client, guided_farm.client.submit(spec), timeout=100)
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert {name: tasks[name].get("outputs") or {} for name in local} == local
    assert all(t["params"]["loras"] == LORA for t in tasks.values() if t["kind"] == "guidance_pass")
    with_lora = blobs.get(local["stage1"]["audio_latent"])
    assert not np.array_equal(with_lora, plain_blobs.get(plain["local.stage1"]["audio_latent"]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad,line", [
    ({"decode_tiles": "off"}, "--decode-tiles does not apply to the t2a recipe (--pipeline t2a)"),
    ({"cfg_scale": 2.0}, "--cfg-scale does not apply to the t2a recipe (--pipeline t2a)"),
    ({"height": 128}, "-W/-H 384x128: --pipeline t2a renders only the audio track (no picture); drop them"),
])
def test_t2a_with_video_flags_refused_at_submit(bad, line, guided_farm, mstore):
    before = len(mstore.list_renders())
    with pytest.raises(FarmError) as info:
        guided_farm.client.submit({**T2A, **bad})
    assert "\n" not in str(info.value) and line in str(info.value), info.value
    assert len(mstore.list_renders()) == before


GENERATED = {name: {**SPECS[name], "pack": "dev25", "num_generated_keyframes": 1} for name in SPECS}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(GENERATED))
def test_generated_keyframes_in_every_guided_pass_on_2_workers_equal_local(name, guided_farm, dev_runner, tmp_path):
    """`--num-generated-keyframes` on a guided stage (upstream forwards it to the first stage): the prep
    appends the slot, every pass runs with it and the 2.5 keyframe marker, the last guide step reads it out;
    farm == --local for every task output and the frames."""
    spec = GENERATED[name]
    _, outputs, blobs = render_local(dict(spec), tmp_path / "local.mp4", dev_runner)
    guided_farm.workers(2)
    for extra in [w for w in guided_farm.procs if w not in ("w1", "w2")]:  # a worker beyond the module's two
        guided_farm.stop(extra)
    client = guided_farm.client  # the planner needs the pack's generation (2.5) at submit
    wait_until(lambda: sum(bool((w.get("packs") or {}).get("dev25")) for w in client.workers()) >= 2, 60,
               "the workers describing dev25")
    render = wait_done(client, client.submit(dict(spec)), timeout=240)
    assert_identical(farm_results(client, render), local_results(outputs, blobs))
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert {n: t.get("outputs") or {} for n, t in tasks.items()} == local  # every task, every output, bit for bit
    assert tasks["stage1.prep"]["params"]["generated_slots"] == [4] and "slots" in tasks["stage1"]["outputs"]
    passes = [t for t in tasks.values() if t["kind"] == "guidance_pass" and t["id"].split(".")[1] == "stage1"]
    hw = (SPECS[name]["height"] // (32 if name == "one-stage" else 64)) ** 2  # stage 1: half size on two stages
    assert passes and all(t["params"]["slot_range"] == [2 * hw, 3 * hw] for t in passes)


@pytest.mark.timeout(240)
def test_stage1_parallel_gangs_the_guided_passes_on_2_workers_equal_local(guided_farm, dev_runner, reference,
                                                                          tmp_path):
    """`--stage1-parallel 2` on one-stage: each pass a gang task, its one forward split over both workers when
    both are idle (STG's skipped block and the modality isolation on every rank alike), the same bits as
    unsplit: farm == --local (its passes split 2 ways in one process) for every task output and the frames,
    both == the render without the flag; at least one pass ran as a gang of the two workers."""
    spec = {**ONE, "stage1_parallel": "2"}
    _, outputs, blobs = render_local(dict(spec), tmp_path / "local.mp4", dev_runner)
    assert_identical(local_results(outputs, blobs), reference("one-stage"))
    guided_farm.workers(2)
    for extra in [w for w in guided_farm.procs if w not in ("w1", "w2")]:  # a worker beyond the module's two
        guided_farm.stop(extra)
    render = wait_done(guided_farm.client, guided_farm.client.submit(dict(spec)), timeout=200)
    assert_identical(farm_results(guided_farm.client, render), local_results(outputs, blobs))
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert {n: t.get("outputs") or {} for n, t in tasks.items()} == local  # every task, every output, bit for bit
    passes = [t for t in tasks.values() if t["kind"] == "guidance_pass"]
    assert len(passes) == PASSES["one-stage"] and all(t["params"]["stage1_degrees"][1] == 2 for t in passes)
    ganged = [t for t in passes if (t.get("metrics") or {}).get("stage1_parallel") == 2]
    assert ganged, [(t["id"], t.get("metrics")) for t in passes]
    assert all(len(set(t["ranks"])) == 2 for t in ganged), [t.get("ranks") for t in ganged]
