"""`--audio` files that cannot serve an A2V render, through the real `farm submit` and coordinator: one line naming the file and what is wrong, exit 2, nothing queued; the coordinator
probes each uploaded file in its child process and survives them all, and a refused blob is gone once
retention's grace has passed. `farm render --local` refuses the same file the same way. IC-LoRA
control and Dub-It the same way: a clip shorter than the render, an IC-LoRA without its metadata (or
declaring another factor than the spec, past the CLI), a clip without the IC-LoRA, a Dub-It clip
without sound. Each table's first case and its good submits run `farm` in its own process; the other
cases run the same entry point (`farm_cli.main.main`: argv pairing, settings, the app) in the test's
process, which spares each a Python start and the CLI's imports and asserts the same exit code and line."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import grpc
import numpy as np
import pytest
from safetensors.numpy import save_file

from coordinator.retention import prune
from farm_cli.client import FarmClient, FarmError
from farm_cli.main import main
from tests.farm.farm_harness import ROOT
from tests.farm.test_cli_messages import JOIN, coordinator, farm, one_line  # noqa: F401 - the fixture
from tests.media_files import forged_long_wav, write_clip, write_clip_with_audio, write_ic_lora, write_wav

SPEC = ["-p", "a fox", "-H", "128", "-W", "192", "-f", "25"]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "notes.wav").write_text("not audio at all, only words")
    return {
        "tone": str(write_wav(tmp_path / "tone.wav", seconds=1.0)),
        "notes": str(tmp_path / "notes.wav"),
        "clip": str(write_clip(tmp_path / "clip.mp4", frames=8)),
        "long": str(forged_long_wav(tmp_path / "long.wav")),
        "gone": str(tmp_path / "gone.wav"),
        "clip30": str(write_clip(tmp_path / "clip30.mp4", frames=30)),
        "talk": str(write_clip_with_audio(tmp_path / "talk.mp4", frames=30)),
        "talk10": str(write_clip_with_audio(tmp_path / "talk10.mp4", frames=10)),
        "ic": str(write_ic_lora(tmp_path / "ic.safetensors")),
        "bare": str(write_ic_lora(tmp_path / "bare.safetensors", metadata=False)),
    }


def _cases(f: dict) -> dict[str, tuple[list[str], str]]:
    return {
        "not audio": (["--audio", f["notes"]], "--audio notes.wav: "),
        "no audio stream": (["--audio", f["clip"]], "--audio clip.mp4: has no audio stream"),
        "too long": (
            ["--audio", f["long"]],
            "--audio long.wav: claims 133200.0 s of audio, longer than the 600 s limit",
        ),
        "start past the end": (
            ["--audio", f["tone"], "--audio-start", "5"],
            "--audio tone.wav: --audio-start 5 s is outside the track's 1.00 s",
        ),
        "start without a file": (["--audio-start", "1"], "--audio-start needs --audio FILE"),
        "no such file": (["--audio", f["gone"]], "no such file"),
        "negative start": (
            ["--audio", f["tone"], "--audio-start", "-1"],
            "--audio-start -1.0 is outside",
        ),
        "A2V on the audio-only recipe": (
            ["--audio", f["tone"], "--pipeline", "t2a"],
            "--audio does not apply to the t2a recipe (--pipeline t2a); it applies to: distilled, one-stage, two-stage, "
            "two-stage-hq, dfr",
        ),
        "audio guidance on a frozen track": (
            ["--audio", f["tone"], "--pipeline", "two-stage", "--audio-cfg-scale", "7"],
            "--audio and --audio-cfg-scale do not compose (the track is frozen",
        ),
    }


def farm_here(monkeypatch, address: str, *args: str) -> subprocess.CompletedProcess:
    """`farm ARGS` as `farm` runs it (its entry point, the environment `farm()` gives the process), in this
    process: the exit code and what it printed, as `farm()` returns them."""
    argv = ["farm", *args, "--coordinator", address]
    out, err = io.StringIO(), io.StringIO()
    with monkeypatch.context() as env:
        for key in [k for k in os.environ if k.startswith("FARM_")]:
            env.delenv(key)
        env.setenv("FARM_DATA", str(ROOT / "nonexistent-farm-data"))
        env.setenv("FARM_TOKEN", JOIN[address])
        env.setenv("HOME", "/nonexistent")
        env.setattr(sys, "argv", argv)
        env.chdir(ROOT)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _refused(monkeypatch, coordinator: str, base: list[str], cases: dict) -> None:  # noqa: F811
    """Each case refused with exit 2 and its one line: the first through `farm` in its own process."""
    for n, (name, (args, line)) in enumerate(cases.items()):
        run = farm if n == 0 else lambda *a: farm_here(monkeypatch, *a)
        result = run(coordinator, "submit", *base, *args)
        assert result.returncode == 2, (name, result.returncode, result.stderr[-2000:])
        assert line in one_line(result), (name, result.stderr)


@pytest.mark.timeout(240)
def test_audio_that_cannot_serve_a2v_is_refused_at_submit(coordinator, files, store, tmp_data, monkeypatch):  # noqa: F811
    _refused(monkeypatch, coordinator, SPEC, _cases(files))
    assert not store.client.keys(
        f"{store.prefix}:render:*"
    )  # nothing queued, and the coordinator still answers
    uploaded = set(store.blob_shas())
    assert uploaded  # the refused files were uploaded before the probe refused them ...
    prune(store, tmp_data, 0, int(time.time() * 1000) + 3 * 3600 * 1000)
    assert not set(store.blob_shas()) & uploaded  # ... and no render names them: gone past the grace
    good = farm(coordinator, "submit", *SPEC, "--audio", files["tone"], "--audio-start", "0.5")
    assert good.returncode == 0 and good.stdout.strip(), good.stderr


@pytest.mark.timeout(120)
def test_render_local_probes_the_file_as_the_coordinator_does(files, tmp_path, tiny_packs):
    (tmp_path / "packs").symlink_to(tiny_packs)  # a pack here: its refusal is the one line
    result = farm(
        "127.0.0.1:1", "render", "--local", *SPEC, "--audio", files["clip"], token="unused", data=tmp_path
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--audio clip.mp4: has no audio stream" in one_line(result)


@pytest.mark.timeout(60)
def test_a_client_past_the_cli_is_refused_by_the_coordinator(coordinator, files, store):  # noqa: F811
    with FarmClient(coordinator, JOIN[coordinator], timeout=10) as client:
        tone = client.put_blob(Path(files["tone"]).read_bytes())
        base = {"prompt": "a fox", "height": 128, "width": 192, "frames": 25, "pack": "tiny"}
        for extra, line in (
            ({"source_video": {"blob": tone, "name": "tone.wav"}}, "source video tone.wav: has no video"),
            (
                {"audio_input": {"blob": "cd" * 32, "name": "x.wav"}},
                "--audio x.wav: its blob cdcdcdcdcdcd was never",
            ),
            ({"audio_input": {"blob": tone, "start": 1.0}}, "--audio-start 1 s is outside"),
        ):
            with pytest.raises(FarmError, match=line) as refused:
                client.submit({**base, **extra})
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "\n" not in str(refused.value)
        assert client.list() == [] and not store.client.keys(f"{store.prefix}:render:*")


CONTROL = ["-p", "a fox", "-H", "256", "-W", "256", "-f", "25"]


def _control_cases(f: dict) -> dict[str, tuple[list[str], str]]:
    ic = ["--ic-lora", f["ic"], "1"]
    return {
        "control shorter than the clip": (
            ["--control-video", f["clip"], "0.9", *ic],
            "--control-video clip.mp4: 8 frames, shorter than the render's 25",
        ),
        "control not a video": (["--control-video", f["notes"], "1", *ic], "--control-video notes.wav: "),
        "IC-LoRA without its metadata": (
            ["--control-video", f["clip"], "1", "--ic-lora", f["bare"], "1"],
            "--ic-lora bare.safetensors: an IC-LoRA without a reference_downscale_factor in its metadata",
        ),
        "control without an IC-LoRA": (
            ["--control-video", f["clip"], "1"],
            "--control-video needs --ic-lora FILE STRENGTH",
        ),
        "an IC-LoRA without a clip": (ic, "--ic-lora needs --control-video FILE STRENGTH or --dub VIDEO"),
        "a dub clip without sound": (["--dub", f["clip30"], *ic], "--dub clip30.mp4: has no audio stream"),
        "a dub clip shorter than the render": (
            ["--dub", f["talk10"], *ic],
            "--dub talk10.mp4: 10 frames, shorter than the render's 25",
        ),
        "dub without its LoRA": (["--dub", f["talk"]], "--dub needs --ic-lora FILE STRENGTH"),
        "dub and control at once": (
            ["--dub", f["talk"], "--control-video", f["clip30"], "1", *ic],
            "--dub and --control-video are two recipes: give one",
        ),
        "guided control (no such pipeline)": (
            ["--control-video", f["clip30"], "1", *ic, "--pipeline", "two-stage"],
            "--control-video and --pipeline two-stage are two recipes: give one (IC-LoRA control samples "
            "distilled: upstream's ICLoraPipeline takes the distilled model alone",
        ),
        "guided Dub-It (no such pipeline)": (
            ["--dub", f["talk"], *ic, "--pipeline", "one-stage"],
            "--dub and --pipeline one-stage are two recipes: give one (Dub-It samples distilled",
        ),
        "control in stage 2 without a clip": (["--control-stage2"], "--control-stage2 needs --control-video FILE"),
        "Dub-It's reference in stage 2 asked again": (
            ["--dub", f["talk"], *ic, "--control-stage2"],
            "--control-stage2 does not apply to the dub-it recipe (--dub); it applies to: ic-lora",
        ),
        "control in a tiled stage 2 below full attention": (
            ["--control-video", f["clip30"], "1", *ic, "--control-stage2", "--control-attention", "0.5",
             "--stage2-tiles", "1x2"],
            "--control-stage2 with --control-attention 0.5 needs an untiled stage 2",
        ),
        "a mask without a control clip": (["--control-mask", f["clip30"]], "--control-mask needs --control-video FILE"),
        "a mask shorter than the render": (
            ["--control-video", f["clip30"], "1", *ic, "--control-mask", f["clip"]],
            "--control-mask clip.mp4: 8 frames, shorter than the render's 25",
        ),
        "a mask beside Dub-It": (
            ["--dub", f["talk"], *ic, "--control-mask", f["clip30"]],
            "--control-mask does not apply to the dub-it recipe (--dub); it applies to: ic-lora",
        ),
        "a masked control in a tiled stage 2": (
            ["--control-video", f["clip30"], "1", *ic, "--control-stage2", "--control-mask", f["clip30"],
             "--stage2-tiles", "1x2"],
            "--control-stage2 with --control-mask needs an untiled stage 2",
        ),
        "a reference the VAE cannot encode": (
            ["-W", "192", "--control-video", f["clip"], "1", *ic],
            "the reference at 64x48 (a 128x96 stage over the IC-LoRA's downscale 2) is not a multiple of 32",
        ),
    }


@pytest.mark.timeout(180)
def test_control_that_cannot_serve_is_refused_at_submit(coordinator, files, store, monkeypatch):  # noqa: F811
    _refused(monkeypatch, coordinator, CONTROL, _control_cases(files))
    assert not store.client.keys(f"{store.prefix}:render:*")  # nothing queued
    with FarmClient(coordinator, JOIN[coordinator], timeout=10) as client:  # past the CLI: the blob's header
        clip, ic, bare = (client.put_blob(Path(files[k]).read_bytes()) for k in ("clip30", "ic", "bare"))
        wrong = Path(files["ic"]).with_name("misfit.safetensors")  # declares the factor, fits no pack
        save_file(
            {"diffusion_model.x.lora_A.weight": np.zeros((1, 1), np.float32)},
            str(wrong),
            metadata={"reference_downscale_factor": "2"},
        )
        misfit = client.put_blob(wrong.read_bytes())
        base = {
            "prompt": "a fox",
            "height": 256,
            "width": 256,
            "frames": 25,
            "pack": "tiny",
            "control_video": {"blob": clip, "name": "clip30.mp4"},
        }
        for lora, line in (
            (
                {"blob": bare, "downscale": 2, "name": "bare"},
                "--ic-lora bare: an IC-LoRA without a reference_",
            ),
            (
                {"blob": misfit, "downscale": 2, "name": "misfit"},
                "misfit: key 'diffusion_model.x.lora_A.weight' has",
            ),
            (
                {"blob": ic, "downscale": 4, "name": "ic"},
                "--ic-lora ic: its metadata's reference_downscale_factor 2 is not the spec's 4",
            ),
        ):
            with pytest.raises(FarmError, match=line):
                client.submit({**base, "ic_lora": {**lora, "strength": 1.0}})
        assert client.list() == [] and not store.client.keys(f"{store.prefix}:render:*")
    for args in (
        ["--control-video", files["clip30"], "0.9"],
        ["--dub", files["talk"]],
    ):  # both files uploaded
        good = farm(coordinator, "submit", *CONTROL, *args, "--ic-lora", files["ic"], "1")
        assert good.returncode == 0 and good.stdout.strip(), good.stderr


def _mutants(seed: int, blob: bytes, count: int) -> list[bytes]:
    """Seeded damage to a real file: truncations, flipped bytes, a spliced-in run, a doubled header."""
    rng, out = random.Random(seed), []
    for n in range(count):
        data = bytearray(blob)
        kind = n % 4
        if kind == 0:
            data = data[: rng.randrange(8, len(data))]
        elif kind == 1:
            for _ in range(rng.randrange(1, 64)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:
            at = rng.randrange(len(data))
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(16, 4096)))
        else:
            data = data[:64] + data  # a second header in front of the first
        out.append(bytes(data))
    return out


@pytest.mark.timeout(240)
def test_fuzzed_media_end_in_one_line_or_a_render_and_the_coordinator_serves_on(coordinator, files, store):  # noqa: F811
    """24 seeded mutants of a real mp4 (as a retake clip) and a real wav (as A2V audio), past the CLI:
    each is refused with one line (INVALID_ARGUMENT) or accepted; the probes run in the child, so the
    coordinator answers throughout and a good file is still taken afterwards."""
    base = {"prompt": "a fox", "height": 128, "width": 192, "frames": 25, "pack": "tiny"}
    talk, tone = Path(files["talk"]).read_bytes(), Path(files["tone"]).read_bytes()
    outcomes = {"refused": 0, "accepted": 0}
    with FarmClient(coordinator, JOIN[coordinator], timeout=30) as client:
        for n, blob in enumerate(_mutants(7, talk, 12) + _mutants(8, tone, 12)):
            sha, name = client.put_blob(blob), f"m{n}"
            media = (
                {"source_video": {"blob": sha, "name": f"{name}.mp4"}, "retake": {"start": 0.2, "end": 0.6}}
                if n < 12
                else {"audio_input": {"blob": sha, "name": f"{name}.wav"}}
            )
            try:
                render_id = client.submit({**base, **media})
            except FarmError as refused:
                assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, (n, refused)
                assert "\n" not in str(refused) and len(str(refused)) < 400, (n, str(refused))
                assert name in str(refused), (n, str(refused))  # it names the file
                outcomes["refused"] += 1
                continue
            outcomes["accepted"] += 1
            assert client.cancel(render_id)
        assert outcomes["refused"] >= 12, outcomes  # most damage is seen at submit, not on a worker
        good = client.put_blob(tone)
        assert client.submit({**base, "audio_input": {"blob": good, "name": "tone.wav"}})
