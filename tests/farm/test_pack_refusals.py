"""Through the real CLI against a real coordinator and worker: a render whose pack lacks a part it
needs is refused at submit in one line (the missing file and the command that gets it), exit 2,
nothing queued; a pack with a broken file fails only its own renders, naming file and key, and the
worker stays up serving its other packs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import mlx.core as mx
import pytest

from ltx_engine.tiny.tiny_pack import write_tiny_pack
from tests.farm.farm_harness import ROOT, farm, wait_done

SMALL = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 3}
REFUSED = [
    ("minimal", [], "pack 'minimal' has no spatial_upscaler (spatial_upscaler_x2_v1_1.safetensors): "
                    "get it with `mlx-forge convert ltx-2.3 --spatial-upscaler x2`"),
    ("published", [], "no live worker holds the text encoder 'mlx-community/gemma-3-12b-it-4bit' that pack "
                      "'published' needs: fetch it with `farm pack pull mlx-community/gemma-3-12b-it-4bit`"),
    ("published", ["--text-encoder", "pack"], "pack 'published' has no text_encoder (text_encoder/)"),
    ("truncated", [], "vae_decoder.safetensors: tensor 'vae_decoder."),
    ("noencoder", ["--image", "IMAGE", "0", "1.0"], "pack 'noencoder' has no vae_encoder (vae_encoder.safetensors)"),
]


@pytest.fixture
def packs(tmp_path, tiny_packs):
    """One packs folder: a good pack, packs missing parts, and packs with broken files."""
    folder = tmp_path / "packs"
    shutil.copytree(tiny_packs / "tiny", folder / "tiny")
    write_tiny_pack(folder / "minimal", layout="minimal")
    write_tiny_pack(folder / "published", layout="published-2.3")
    shutil.copytree(tiny_packs / "tiny", folder / "noencoder")
    (folder / "noencoder" / "vae_encoder.safetensors").unlink()
    shutil.copytree(tiny_packs / "tiny", folder / "truncated")
    path = folder / "truncated" / "vae_decoder.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size - 100])
    shutil.copytree(tiny_packs / "tiny", folder / "badshape")
    path = folder / "badshape" / "transformer-distilled.safetensors"
    tensors = dict(mx.load(str(path)))
    tensors["transformer.proj_out.weight"] = mx.zeros((3, 3), dtype=mx.bfloat16)
    mx.save_safetensors(str(path), tensors)
    return folder


def _submit(address: str, token: str, data, *args: str) -> subprocess.CompletedProcess:
    code = "from farm_cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, "submit", "-p", "a fox", "-H", "128", "-W", "128", "-f", "9",
                           *args, "--coordinator", address], capture_output=True, text=True,
                          timeout=120, env={"FARM_DATA": str(data), "PATH": "/usr/bin:/bin", "FARM_TOKEN": token}, cwd=ROOT)


def _wait_registered(store, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [w for w in store.list_workers() if (w.get("info") or {}).get("pack_components")]
        if workers:
            return workers[0]["info"]
        time.sleep(0.2)
    raise AssertionError("the worker never registered its packs")


@pytest.mark.timeout(400)
def test_missing_parts_refused_at_submit_and_broken_packs_fail_alone(store, tmp_data, packs, tmp_path, monkeypatch):
    import av
    import numpy as np

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # the worker's hub cache holds no Gemma

    image = tmp_path / "still.png"
    with av.open(str(image), "w") as out:  # a real PNG for --image
        stream = out.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = 64, 64, "rgb24"
        frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 128, np.uint8), format="rgb24")
        for packet in stream.encode(frame):
            out.mux(packet)
    with farm(store, tmp_data, packs, workers=1) as (client, procs):
        info = _wait_registered(store)
        assert "spatial_upscaler" not in info["pack_components"]["minimal"]
        assert "spatial_upscaler" in info["pack_components"]["tiny"]
        token = (tmp_data / "token").read_text().strip()
        for pack, extra, message in REFUSED:
            args = [str(image) if a == "IMAGE" else a for a in extra]
            result = _submit(client.address, token, tmp_data, "--pack", pack, *args)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1 and message in lines[0], (pack, result.stderr)
        assert store.list_renders() == []
        broken = client.submit({**SMALL, "pack": "badshape"})
        deadline = time.monotonic() + 200
        while client.get(broken)["state"] not in ("failed", "done") and time.monotonic() < deadline:
            time.sleep(0.3)
        render = client.get(broken)
        assert render["state"] == "failed", render.get("state")
        assert "transformer-distilled.safetensors: tensor 'proj_out.weight' has shape (3, 3)" in render["error"]
        good = client.submit({**SMALL, "pack": "tiny"})
        assert wait_done(client, good, timeout=240)["state"] == "done"
        assert procs["w1"].poll() is None  # the same worker process served both
