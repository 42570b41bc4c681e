"""A render with the tiny pack in each layout that has the parts it needs gives the standard layout's
frames: bit for bit where the layout only moves files, within the bf16 rounding of the fused LoRA for
a dev-only pack. Renders run in-process (`farm render --local`'s path) at a minimal size."""

from __future__ import annotations

import numpy as np
import pytest

from farm_cli.local import render_local
from ltx_engine.tiny.tiny_pack import write_tiny_pack
from tests.farm.farm_harness import assert_identical, local_results

SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 3}
MOVED = ("legacy", "versioned", "sharded", "hf-cache", "extras")


def _render(runner, pack, out) -> dict[str, np.ndarray]:
    _, outputs, blobs = render_local({**SPEC, "pack": str(pack)}, out, runner)
    return local_results(outputs, blobs)


@pytest.fixture(scope="module")
def reference(tiny_packs, local_runner, tmp_path_factory):
    return _render(local_runner, tiny_packs / "tiny", tmp_path_factory.mktemp("ref") / "ref.mp4")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", MOVED)
def test_layout_renders_the_standard_frames(layout, reference, local_runner, tmp_path):
    pack = write_tiny_pack(tmp_path / "pack", seed=0, layout=layout)
    assert_identical(_render(local_runner, pack, tmp_path / "out.mp4"), reference)


@pytest.mark.timeout(180)
def test_dev_only_pack_renders_with_the_distilled_lora_fused(reference, local_runner, tiny_dev_pack, tmp_path):
    pack = tiny_dev_pack
    arrays = _render(local_runner, pack, tmp_path / "out.mp4")
    frames, want = arrays["frames"], reference["frames"]
    assert frames.shape == want.shape and np.isfinite(frames).all()
    mean, worst = float(np.abs(frames - want).mean()), float(np.abs(frames - want).max())
    unrelated = _render(local_runner, write_tiny_pack(tmp_path / "other", seed=1), tmp_path / "o.mp4")["frames"]
    other = float(np.abs(unrelated - want).mean())
    print(f"dev-only + fused LoRA vs distilled frames: mean {mean:.2e} max {worst:.2e}; another model: mean {other:.2e}")
    # The bf16 rounding of dev = W - BA and of the fused W moves frames a little (measured: mean 2.7e-3,
    # max 6.6e-2 of [0, 1]); a different model moves them ~100x more (mean ~0.29).
    assert mean < 0.01 and worst < 0.15 and other > 20 * mean
