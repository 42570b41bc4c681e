"""`--exr-colorspace`: a tiny render's EXR frames in acescg / acescct, read back with OpenEXR,
hold the colour transforms (ltx_engine/rules/color.py) of the frames the sRGB-linear EXR holds, with the
primaries in their chromaticities header; an unknown colourspace or an --auto-duration range outside the
duration head's is refused at submit through the real CLI and coordinator: one line, exit 2, nothing queued;
`--hdr` writes the HLG master (coordinator/assemble/hdr_master.py), the farm's bit for bit the same as --local's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import OpenEXR
import pytest

from coordinator.assemble.assembler import assemble_streaming, video_frames
from coordinator.assemble.hdr_master import hlg_frame, hlg_path
from coordinator.server import serve, stop
from farm_cli.local import render_local
from ltx_engine.rules import color
from tests.farm.farm_harness import ROOT, farm, join_token

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
TOKEN = "h" * 24
SPEC = {"prompt": "a lighthouse at dusk", "height": 64, "width": 64, "frames": 9, "seed": 5, "pack": "tiny",
        "decode_tiles": "off"}


def _read(folder: Path) -> tuple[list[np.ndarray], dict]:
    frames, header = [], {}
    for path in sorted(folder.glob("frame_*.exr")):
        with OpenEXR.File(str(path), separate_channels=True) as exr:
            frames.append(np.stack([exr.channels()[c].pixels for c in "RGB"], axis=-1))
            header = dict(exr.header())  # a copy: the file's own is emptied on close
    return frames, header


@pytest.mark.timeout(600)
def test_acescg_and_acescct_exr_frames_are_the_transforms_of_the_srgb_linear_ones(local_runner, tmp_path):
    spec = {**SPEC, "exr": str(tmp_path / "acescg"), "exr_colorspace": "acescg"}
    mp4, outputs, blobs = render_local(spec, tmp_path / "local.mp4", local_runner)
    plan = json.loads(mp4.with_suffix(".json").read_text())["spec"]
    assert plan["exr_colorspace"] == "acescg"

    def get(name: str, output: str):
        sha = outputs.get(f"local.{name}", {}).get(output)
        return None if sha is None else blobs.get(sha)

    for name in ("srgb-linear", "acescct"):  # the same render's frames, assembled in the other colourspaces
        assemble_streaming({**plan, "exr_colorspace": name}, get, tmp_path / name, exr_dir=tmp_path / name / "exr")
    acescg, header = _read(tmp_path / "acescg")
    linear, linear_header = _read(tmp_path / "srgb-linear" / "exr")
    acescct, cct_header = _read(tmp_path / "acescct" / "exr")
    assert len(acescg) == len(linear) == len(acescct) == 9 and acescg[0].dtype == np.float16
    to_ap1 = color.rgb_to_rgb_matrix(color.BT709, color.AP1)
    for a, lin, cct in zip(acescg, linear, acescct, strict=True):  # through the half-float the files hold
        np.testing.assert_allclose(a, color.apply_matrix(to_ap1, lin), rtol=2e-3, atol=2e-5)
        np.testing.assert_allclose(cct, color.acescct_encode(a), rtol=2e-3, atol=2e-5)
    sdr, _ = video_frames(plan, get)
    for frame, a in zip(sdr, acescg, strict=True):  # and exactly what the assembler computes from the frame
        assert np.array_equal(a, color.sdr_to_exr(frame, "acescg").astype(np.float16))
    np.testing.assert_allclose(header["chromaticities"], color.AP1.chromaticities(), rtol=1e-6)
    np.testing.assert_allclose(linear_header["chromaticities"], color.BT709.chromaticities(), rtol=1e-6)
    assert (header["colorSpace"], cct_header["colorSpace"], linear_header["colorSpace"]) == ("ACEScg", "ACEScct", "sRGB")


@pytest.fixture
def coordinator(store, tmp_data, tiny_packs):
    (tmp_data / "packs").symlink_to(tiny_packs)
    server, port = serve(store, tmp_data, token=TOKEN)
    try:
        yield f"127.0.0.1:{port}", join_token(tmp_data, TOKEN)
    finally:
        stop(server)


def _submit(address: str, token: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "FARM_DATA": str(ROOT / "nonexistent-farm-data"), "HOME": "/nonexistent",
           "FARM_TOKEN": token}
    return subprocess.run([*CLI, "submit", "-p", "a fox", "-H", "64", "-W", "64", *args, "--coordinator", address],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)


@pytest.mark.timeout(120)
def test_unknown_colourspaces_and_ranges_are_refused_at_submit(coordinator, store, tmp_path):
    address, token = coordinator
    cases = [(("--exr", str(tmp_path / "e"), "--exr-colorspace", "rec2020"),
              "--exr-colorspace 'rec2020' is not one the farm writes: srgb-linear, acescg, acescct"),
             (("--exr-colorspace", "acescg"), "give --exr DIR too"),
             (("--auto-duration", "0.5:30"), "--auto-duration 0.5:30 is outside the duration head's 1:20 s"),
             (("--auto-duration", "2to8"), "--auto-duration '2to8' is not MIN:MAX seconds")]
    for args, words in cases:
        refused = _submit(address, token, *args)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and words in lines[0], (args, refused.stderr[-2000:])
        assert "INVALID_ARGUMENT" not in lines[0]
    assert not store.client.keys(f"{store.prefix}:render:*")  # nothing queued
    taken = _submit(address, token, "-f", "9", "--exr", str(tmp_path / "e"), "--exr-colorspace", "acescct")
    assert taken.returncode == 0 and taken.stdout.strip(), taken.stderr[-2000:]


def _planes(path: Path) -> tuple[list[np.ndarray], tuple]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        tags = (ctx.name, ctx.pix_fmt, ctx.color_primaries, ctx.color_trc, ctx.colorspace, ctx.color_range)
        return [f.to_ndarray() for f in container.decode(stream)], tags


@pytest.mark.timeout(600)
def test_hdr_writes_the_hlg_master_on_the_farm_as_locally(local_runner, store, tmp_data, tiny_packs, tmp_path):
    spec = {**SPEC, "hdr": True}
    mp4, outputs, blobs = render_local(spec, tmp_path / "local.mp4", local_runner)
    local, tags = _planes(hlg_path(mp4))
    assert tags == ("hevc", "yuv420p10le", 9, 18, 9, 1) and len(local) == 9
    plan = json.loads(mp4.with_suffix(".json").read_text())["spec"]
    sdr, _ = video_frames(plan, lambda name, out: blobs.get(outputs[f"local.{name}"][out])
                          if out in outputs.get(f"local.{name}", {}) else None)
    for frame, planes in zip(sdr, local, strict=True):  # the master holds the pure functions' planes (CRF 12)
        want = hlg_frame(color.srgb_eotf(frame)).astype(np.int32)
        diff = planes.astype(np.int32) - want
        err, bias = float(np.abs(diff).mean()), float(diff.mean())
        print(f"HLG master: mean abs error {err:.2f} codes, bias {bias:.2f}, spread {float(want.std()):.1f}")
        assert err < 0.15 * float(want.std()) and abs(bias) < 2.0, (err, bias)  # noise-like tiny frames, lossy
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _procs):
        env = {"PATH": "/usr/bin:/bin", "FARM_DATA": str(tmp_data), "HOME": "/nonexistent",
               "FARM_TOKEN": (tmp_data / "token").read_text().strip()}
        args = ["render", *sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in SPEC.items()
                                if k in ("height", "width", "frames", "seed", "pack", "decode_tiles")), []),
                "-p", SPEC["prompt"], "--hdr", "-o", str(tmp_path / "farm.mp4"), "--coordinator", client.address]
        done = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=500, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {tmp_path / 'farm.hlg.mp4'}" in done.stdout, done.stdout
    assert (tmp_path / "farm.hlg.mp4").read_bytes() == hlg_path(mp4).read_bytes()  # bit for bit
