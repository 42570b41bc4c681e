"""Sequence-parallel stage 1 against the unsplit DiT: k shards in one process and k ring processes.

Measured on MLX's CPU backend (0.32): the SP forward is BIT-IDENTICAL to the unsplit forward for 2, 3
and 4 ranks, padded or not (every op outside attention is row-local, the gathered K/V are the
unsplit ones, and the kernels compute each query row alike whatever the row count). The tests
assert exact equality; docs/ARCHITECTURE.md ("Sequence-parallel stage 1") states it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.denoise import build_stage_states
from ltx_engine.guided import pass_x0
from ltx_engine.parallel.sequence_parallel import LocalExchange, ShardPlan, forward_bytes, sp_forward
from ltx_engine.parallel.sp_denoise import Resume, Split, denoise_stage1
from ltx_engine.parallel.sp_group import run_ring
from ltx_engine.rules import guidance
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tdp import first_frame_marker
from tests.unit import sp_model

ROOT = Path(__file__).resolve().parents[2]
RING_TIMEOUT_S = 90  # a ring that hangs is killed, and the test fails instead of hanging


@pytest.fixture(scope="module")
def model():
    return sp_model.seeded_model()


def _unsplit(model, grid):
    video, audio = sp_model.forward_inputs(grid)
    v, a = model(video, audio)
    mx.eval(v, a)
    return np.array(v), np.array(a)


def _local(model, grid, k):
    video, audio = sp_model.forward_inputs(grid)
    ex = LocalExchange(ShardPlan(video.latent.shape[1], k))
    v, a = sp_forward(model, video, audio, ex)
    mx.eval(v, a)
    return np.array(v), np.array(a), ex


def _ring(tmp_path: Path, k: int, *case: str, backend: str = "ring") -> list[dict]:
    """k rank processes on 127.0.0.1 over mx.distributed's ring, or over the worker's `SocketGroup`."""
    results = run_ring([sys.executable, "-m", "tests.unit.sp_rank", case[0], str(tmp_path), *case[1:]], k,
                       RING_TIMEOUT_S, env={**os.environ, "SP_BACKEND": backend}, cwd=ROOT)
    for r in results:
        assert r.returncode == 0, f"rank {r.rank} ({r.returncode}): {r.output[-2000:]}"
    return [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(k)]


def test_shard_plan_pads_to_a_multiple_of_k() -> None:
    plan = ShardPlan(105, 2)
    assert (plan.per_rank, plan.padding) == (53, 1)
    assert plan.indices(1)[-2:].tolist() == [104, 104]  # the padded row repeats the last token
    assert ShardPlan(105, 3).padding == 0 and ShardPlan(70, 3).padding == 2
    with pytest.raises(ValueError):
        ShardPlan(2, 3)


@pytest.mark.parametrize("grid,k", [((3, 5, 7), 2), ((3, 5, 7), 3), ((2, 5, 7), 3), ((3, 5, 7), 4)])
def test_local_split_is_bit_identical_to_the_unsplit_forward(model, grid, k) -> None:
    rv, ra = _unsplit(model, grid)
    sv, sa, ex = _local(model, grid, k)
    assert np.array_equal(sv, rv) and np.array_equal(sa, ra)
    # per block: self K, V, the text K, V of both streams (5 rows: split) and v2a K, V; plus the output
    # once; the byte formula counts the same
    assert ex.gathers == 8 * len(model.transformer_blocks) + 1
    c = model.config
    assert ex.bytes_received == forward_bytes(ex.plan, c.num_layers, c.num_attention_heads * c.attention_head_dim,
                                              c.audio_num_attention_heads * c.audio_attention_head_dim, 4,
                                              c.out_channels, 5)


@pytest.mark.parametrize("backend", ["ring", "socket"])
@pytest.mark.parametrize("grid,k", [((3, 5, 7), 2), ((2, 5, 7), 3)])
def test_ring_ranks_equal_the_one_process_split_and_the_unsplit_forward(model, tmp_path, grid, k, backend) -> None:
    """k real processes over mx.distributed's ring, or plain sockets (a gang's group), on 127.0.0.1 (105
    tokens over 2, 70 over 3: padded): the same bits as the one-process split."""
    ranks = _ring(tmp_path, k, "forward", *map(str, grid), backend=backend)
    rv, ra = _unsplit(model, grid)
    sv, sa, ex = _local(model, grid, k)
    for got in ranks:
        assert np.array_equal(got["video"], sv) and np.array_equal(got["audio"], sa)
        assert int(got["bytes"]) == ex.bytes_received > 0
    assert np.array_equal(sv, rv) and np.array_equal(sa, ra)


def _local_denoise(model, k, resume=None):
    inputs = sp_model.stage1_inputs()
    kept = {}

    def keep(step, video, audio):
        kept[step] = (video, audio)

    out = denoise_stage1(model, inputs, 128, LocalExchange(ShardPlan(inputs.video_tokens, k)), resume=resume,
                         on_step=keep)
    return out, kept


@pytest.mark.parametrize("backend", ["ring", "socket"])
def test_sp_denoise_ring_equals_one_process_and_resumes_on_another_degree(model, tmp_path, backend) -> None:
    """Stage 1 (4 steps) on a 2-rank ring (or socket group) == the same 2-way plan in one process, bit for
    bit, at every step; and the latent kept after step 2, continued on 3 shards (and unsplit), ends identical."""
    ranks = _ring(tmp_path, 2, "denoise", "0", "0", "0", backend=backend)
    out2, kept2 = _local_denoise(model, 2)
    for got in ranks:
        for step, (video, audio) in kept2.items():
            assert np.array_equal(got[f"video{step}"], video.latent)
            assert np.array_equal(got[f"audio{step}"], audio.latent)
        assert np.array_equal(got["video_latent"], out2["video_latent"])
        assert np.array_equal(got["audio_latent"], out2["audio_latent"])
    video, audio = kept2[2]
    for k in (3, 1):
        resumed, _ = _local_denoise(model, k, Resume(2, video, audio))
        assert np.array_equal(resumed["video_latent"], out2["video_latent"])
        assert np.array_equal(resumed["audio_latent"], out2["audio_latent"])
    assert isinstance(video, LatentState) and not np.array_equal(video.latent, kept2[4][0].latent)


def test_engine_stage1_on_the_tiny_pack_equals_its_k_way_plans(tiny_packs) -> None:
    """The tiny pack through the Engine: `denoise_stage1` (what `farm render --local` runs today) and
    `denoise_stage1_sp` with 2 and 3 shards in one process (a k-way plan) give the same latents, bit for bit."""
    from ltx_engine.engine import Engine
    from ltx_engine.loading.pack import open_pack

    engine, pack = Engine(), open_pack(tiny_packs / "tiny")
    inputs = sp_model.stage1_inputs()
    plain = engine.denoise_stage1(pack, inputs)
    for k in (2, 3):
        split = engine.denoise_stage1_sp(pack, inputs, LocalExchange(ShardPlan(inputs.video_tokens, k)))
        assert split.keys() == plain.keys()
        for key in plain:
            assert np.array_equal(split[key], plain[key]), (k, key)


def test_runner_stage1_task_with_a_planned_degree_equals_the_plain_task(local_runner) -> None:
    """A `denoise_stage1` task whose plan records `stage1_parallel: k` runs its k shards in the process
    (`farm render --local` of a k-way plan) and equals the task without it: 105 generated tokens plus
    a keyframe image at frame 8 appended (35 conditioning tokens at timestep 0; 140 = 3·47 - 1: padded)."""
    inputs = sp_model.stage1_inputs()
    params = {"pack": "tiny", "frames": inputs.frames, "height": inputs.height, "width": inputs.width,
              "fps": inputs.fps, "seed": inputs.seed, "sigmas": inputs.sigmas, "audio_frames": inputs.audio_frames,
              "sampler": "euler", "image_frame": 8}
    task_inputs = {**inputs.contexts,
                   "image_latent": np.random.default_rng(3).standard_normal((1, 128, 1, 5, 7)).astype(np.float32)}
    plain, _ = local_runner.run("denoise_stage1", params, task_inputs)
    for k in (2, 3):
        split, _ = local_runner.run("denoise_stage1", {**params, "stage1_parallel": k}, task_inputs)
        assert split.keys() == plain.keys()
        assert all(np.array_equal(split[key], plain[key]) for key in plain), k


@pytest.mark.parametrize("mode", ["freeze", "fail"])
def test_a_ring_with_a_frozen_or_dead_peer_is_killed_not_left_hanging(tmp_path, mode) -> None:
    """Rank 1 SIGSTOPs itself (or exits) after the group opens; rank 0 blocks in its first all_gather
    forever. `run_ring` ends both: at the deadline for a frozen peer, at once for a dead one."""
    results = run_ring([sys.executable, "-m", "tests.unit.sp_rank", mode, str(tmp_path), "3", "5", "7"], 2,
                       8 if mode == "freeze" else RING_TIMEOUT_S, cwd=ROOT)
    assert not (tmp_path / "rank0.npz").exists()
    if mode == "freeze":  # both blocked (rank 0 in the collective, rank 1 stopped): killed at the deadline
        assert [(r.returncode, r.ended) for r in results] == [(None, "deadline")] * 2
        return
    # A dead peer ends the ring at once, not at the deadline: rank 0 is killed because its peer failed,
    # or (MLX's ring noticing the closed socket first) exits non-zero by itself.
    assert (results[1].returncode, results[1].ended) == (3, "exited")
    assert (results[0].returncode, results[0].ended) == (None, "peer failed") or (
        results[0].ended == "exited" and results[0].returncode != 0), results[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["freeze", "fail"])
def test_a_socket_group_with_a_frozen_or_dead_peer_raises_not_hangs(tmp_path, mode) -> None:
    """The gang's own group: rank 1 SIGSTOPs itself (or exits) once open; rank 0's gather raises
    `PeerLost` by itself (exit 4), at its deadline for the frozen peer, at once for the dead one."""
    results = run_ring([sys.executable, "-m", "tests.unit.sp_rank", mode, str(tmp_path), "3", "5", "7"], 2,
                       RING_TIMEOUT_S, env={**os.environ, "SP_BACKEND": "socket"}, cwd=ROOT)
    assert not (tmp_path / "rank0.npz").exists()
    assert (results[0].returncode, results[0].ended) == (4, "exited"), results[0]
    assert ("past the deadline" if mode == "freeze" else "rank 1") in results[0].output, results[0].output


def _media_inputs(case: str):
    """`sp_model.stage1_inputs` with one media pipeline's stage-1 fields, and the tokens its video stream holds."""
    from ltx_engine.conditioning import REPLACE, ImageCondition
    from ltx_engine.rules.ic_lora import ControlReference
    from ltx_engine.rules.retake import RetakeWindow

    inputs, rng = sp_model.stage1_inputs(), np.random.default_rng(11)
    latent = rng.standard_normal((1, 128, 1, 5, 7)).astype(np.float32)
    audio = rng.standard_normal((1, 8, 5, 16)).astype(np.float32)
    extra, tokens = {
        "control-attention": ({"control": ControlReference(latent, 0.9, attention_strength=0.5)}, 35),
        "dub-it": ({"control": ControlReference(latent), "audio_reference": audio}, 35),
        "retake": ({"retake": RetakeWindow(0.2, 0.5, True), "audio_frames": 9,
                    "initial_video": rng.standard_normal((1, 128, 3, 5, 7)).astype(np.float32),
                    "initial_audio": rng.standard_normal((1, 8, 9, 16)).astype(np.float32)}, 0),
        "extend-pins": ({"audio_pin": audio[:, :, :3], "audio_pin_start": 2,
                         "images": (ImageCondition(latent, 0, 1.0, REPLACE, "context"),)}, 0),
    }[case]
    return type(inputs)(**{**inputs.__dict__, **extra}), inputs.video_tokens + tokens


@pytest.mark.parametrize("case", ["control-attention", "dub-it", "retake", "extend-pins"])
def test_engine_stage1_of_the_media_pipelines_equals_its_k_way_plans(tiny_packs, case) -> None:
    """The media pipelines' stage 1 split 2 and 3 ways equals the unsplit stage, bit for bit. Reference tokens
    split with the video tokens: an IC-LoRA control at attention strength 0.5 (its (1, T, T) mask cut by query
    rows on each shard, the keys whole) and a Dub-It reference (video tokens at full attention, its audio
    appended to the stream every rank holds whole, dropped from the output), 105 + 35 = 140 tokens, padded
    for k = 3; a retake's window masks and an extend's replaced context and pinned audio are per-token states."""
    from ltx_engine.engine import Engine
    from ltx_engine.loading.pack import open_pack

    engine, pack = Engine(), open_pack(tiny_packs / "tiny")
    inputs, tokens = _media_inputs(case)
    plain = engine.denoise_stage1(pack, inputs)
    assert plain["audio_latent"].shape[2] == inputs.audio_frames
    for k in (2, 3):
        split = engine.denoise_stage1_sp(pack, inputs, LocalExchange(ShardPlan(tokens, k)))
        assert split.keys() == plain.keys()
        for key in plain:
            assert np.array_equal(split[key], plain[key]), (k, key)


@pytest.fixture(scope="module")
def keyframe_model():
    return sp_model.seeded_model(keyframes=True)


_VIDEO = guidance.GuiderParams(cfg_scale=3.0, stg_scale=1.0, stg_blocks=(1,), modality_scale=3.0)
_AUDIO = guidance.GuiderParams(cfg_scale=7.0, stg_scale=1.0, stg_blocks=(0,), modality_scale=3.0,
                               modality_blocks=(1,))


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("name,frozen", [(guidance.COND, None), (guidance.UNCOND, None), (guidance.PERTURBED, None),
                                         (guidance.ISOLATED, None), (guidance.COND, "audio")])
def test_a_guidance_pass_split_k_ways_equals_the_unsplit_pass(keyframe_model, name, frozen, k) -> None:
    """A guided stage's pass, its forward split as a gang splits it (STG-skipped self-attention, isolated
    cross-attention in some blocks only, a frozen audio stream, the LTX-2.5 keyframe marker): the unsplit bits."""
    inputs = sp_model.stage1_inputs()
    video, audio = build_stage_states(inputs, 128)
    rng = np.random.default_rng(3)
    negative = {n: rng.standard_normal(c.shape).astype(np.float32) for n, c in inputs.contexts.items()}
    marker = first_frame_marker((3, 5, 7), video.num_tokens, (70, 80))
    args = (keyframe_model, name, video, audio, 0.909375, inputs.contexts, negative, _VIDEO, _AUDIO)
    whole = pass_x0(*args, frozen=frozen, marker=marker)
    split = pass_x0(*args, frozen=frozen, marker=marker, split=Split(k))
    assert (split[1] is None) == (frozen == "audio") == (whole[1] is None)
    for got, want in zip(split, whole, strict=True):
        assert want is None or np.array_equal(got, want)
    assert not np.array_equal(whole[0], pass_x0(*args, frozen=frozen)[0])  # the marker reaches the DiT
    if name != guidance.COND:  # the pass's perturbation (or negative prompt) reaches the DiT
        assert not np.array_equal(whole[0], pass_x0(*args[:1], guidance.COND, *args[2:], marker=marker)[0])


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("name", [guidance.COND, guidance.UNCOND, guidance.PERTURBED, guidance.ISOLATED])
def test_a_guided_retake_pass_split_k_ways_equals_the_unsplit_pass(model, name, k) -> None:
    """The dev retake's passes as a farm gang runs them (tests/farm/test_clip_farm.py renders only the ganged
    one): the window's per-token masks split with the tokens, the unsplit pass's bits."""
    inputs = _media_inputs("retake")[0]
    video, audio = build_stage_states(inputs, 128)
    assert video.denoise_mask is not None and not np.all(video.denoise_mask == video.denoise_mask.flat[0])
    rng = np.random.default_rng(3)
    negative = {n: rng.standard_normal(c.shape).astype(np.float32) for n, c in inputs.contexts.items()}
    args = (model, name, video, audio, 0.909375, inputs.contexts, negative, _VIDEO, _AUDIO)
    whole, split = pass_x0(*args), pass_x0(*args, split=Split(k))
    for got, want in zip(split, whole, strict=True):
        assert np.array_equal(got, want)
