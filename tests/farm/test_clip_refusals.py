"""`--retake` / `--extend` asks that cannot render, through the real `farm submit` and coordinator
(retake/extend): one line naming the flag (and the file, once the probe has read it), exit 2,
nothing queued; `farm render --local` refuses a window outside the clip the same way."""

from __future__ import annotations

import pytest

from tests.farm.test_cli_messages import coordinator, farm, one_line  # noqa: F401 - the fixture
from tests.media_files import write_clip, write_clip_with_audio

SPEC = ["-p", "a fox", "-H", "128", "-W", "192", "-f", "25"]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "notes.mp4").write_text("not a video, only words")
    return {
        "clip": str(write_clip_with_audio(tmp_path / "clip.mp4")),  # 33 frames at 24 fps, with a track
        "silent": str(write_clip(tmp_path / "silent.mp4", frames=33, width=192, height=128)),
        "notes": str(tmp_path / "notes.mp4"),
        "gone": str(tmp_path / "gone.mp4"),
    }


def _cases(f: dict) -> dict[str, tuple[list[str], str]]:
    retake, extend = ["--retake", f["clip"]], ["--extend", f["clip"]]
    return {
        "window past the render": (
            [*retake, "--start", "0.5", "--end", "3"],
            "--retake: --end 3 s is past the",
        ),
        "clip shorter than -f": (
            [*retake, "--start", "0.5", "--end", "1", "-f", "41"],
            "--retake clip.mp4: 33 frames, fewer than the render's 41 (-f)",
        ),
        "empty window": (
            [*retake, "--start", "0.6", "--end", "0.4"],
            "--start 0.6 s to --end 0.4 s is empty",
        ),
        "not a video": (["--retake", f["notes"], "--start", "0", "--end", "0.5"], "--retake notes.mp4: "),
        "missing --end": ([*retake, "--start", "0.2"], "--retake needs --start S and --end E"),
        "start without retake": (
            ["--start", "0.2", "--end", "0.5"],
            "--start / --end / --no-regen-audio need",
        ),
        "too short at another rate": (
            [*retake, "--start", "0.2", "--end", "0.5", "--frame-rate", "30", "-f", "49"],
            "--retake clip.mp4: 33 frames at 24 fps (42 at 30), fewer than the render's 49 (-f)",
        ),
        "no such file": (["--retake", f["gone"], "--start", "0", "--end", "0.5"], "no such file"),
        "retake with stage 2 tiles": (
            [*retake, "--start", "0.2", "--end", "0.5", "--stage2-tiles", "1x2"],
            "--stage2-tiles does not apply to the retake recipe (--retake); it applies to: distilled, two-stage, dfr, extend, ic-lora, dub-it",
        ),
        "extend without frames": (extend, "--extend needs --extend-frames N"),
        "extend bad direction": ([*extend, "--extend-frames", "1", "--direction", "up"], "--direction 'up'"),
        "extend no track": (
            ["--extend", f["silent"], "--extend-frames", "1"],
            "--extend silent.mp4: the clip has no audio track to continue; give --no-audio",
        ),
        "extend a -f not 8k+1": (
            [*extend, "--extend-frames", "1", "-f", "24"],
            "frames 24 is not of the form 8k+1",
        ),
    }


@pytest.mark.timeout(240)
def test_clip_asks_that_cannot_render_are_refused_at_submit(coordinator, files, store):  # noqa: F811
    for name, (args, line) in _cases(files).items():
        result = farm(coordinator, "submit", *SPEC, *args)
        assert result.returncode == 2, (name, result.returncode, result.stderr[-2000:])
        assert line in one_line(result), (name, result.stderr)
    assert not store.client.keys(f"{store.prefix}:render:*")  # nothing queued; the coordinator still answers
    good = farm(coordinator, "submit", *SPEC, "--retake", files["clip"], "--start", "0.4", "--end", "0.6")
    assert good.returncode == 0 and good.stdout.strip(), good.stderr
    whole = farm(coordinator, "submit", *SPEC[:-2], "--retake", files["clip"], "--start", "1", "--end", "1.3")
    assert whole.returncode == 0, whole.stderr  # no -f: the whole clip (33 frames at 24 fps), so 1.3 s fits
    assert store.get_render(whole.stdout.strip().split()[-1])["spec"]["frames"] == 33


@pytest.mark.timeout(120)
def test_render_local_refuses_a_clip_shorter_than_the_render(files, tmp_path, tiny_packs):
    (tmp_path / "packs").symlink_to(tiny_packs)  # a pack here: its refusal is the one line
    args = ["--retake", files["clip"], "--start", "0.2", "--end", "0.5", "-f", "41"]
    result = farm("127.0.0.1:1", "render", "--local", *SPEC, *args, token="unused", data=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--retake clip.mp4: 33 frames, fewer than the render's 41 (-f)" in one_line(result)
