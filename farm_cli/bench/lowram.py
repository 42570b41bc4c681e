"""`farm bench lowram`: peak RSS and seconds of one DiT forward, resident vs block-streamed, paired.

Why: a 16-32 GB Mac takes DiT work only streamed (`ltx_engine.loading.streaming`); the cost model says the
streamed peak is the non-block weights + two blocks + activations and the time ~1.05x. This measures
both on a synthetic transformer big enough for the weights to dominate: the tiny pack's DiT layout at
a wider config with as many blocks as fill `--gb` of seeded bf16 weights, written once into a temp
folder with the tiny-pack writer's seeding. Each side runs in its own subprocess (a clean peak RSS:
`ru_maxrss`, which counts the weights however MLX maps them), sides interleaved pair by pair (the
order alternating), and the medians of the per-pair ratios are reported with their spread.
Goal beside the figures: peak <= 0.3x resident, time <= 1.15x resident.
"""

from __future__ import annotations

import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEAK_GOAL, TIME_GOAL = 0.3, 1.15
WIDE = {"num_attention_heads": 16, "attention_head_dim": 64, "cross_attention_dim": 1024,
        "audio_num_attention_heads": 4, "audio_attention_head_dim": 32, "audio_cross_attention_dim": 128}
VIDEO_GRID = (2, 4, 8)  # latent frames, height, width: 64 video tokens (the weights dominate the peak)
AUDIO_TOKENS = 10


def write_pack(folder: Path, gb: float, seed: int = 0) -> dict:
    """A pack folder holding only a transformer of ~`gb` GiB of seeded bf16 weights (tiny layout, WIDE
    widths), written block by block so the writer never holds the float32 draws of more than one."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ltx_engine.models.transformer import LTXModel, TransformerConfig, tiny_config
    from ltx_engine.tiny.tiny_pack import _seeded_like, _write_component

    cfg = {"transformer": {**tiny_config(), **WIDE, "num_layers": 1}}
    one = dict(tree_flatten(LTXModel(TransformerConfig.from_config(cfg)).parameters()))
    block_bytes = sum(v.size * 2 for k, v in one.items() if k.startswith("transformer_blocks."))
    cfg["transformer"]["num_layers"] = layers = max(2, round(gb * 2**30 / block_bytes))
    model = LTXModel(TransformerConfig.from_config(cfg))
    params = dict(tree_flatten(model.parameters()))
    groups: dict[str, dict] = {}
    for key, value in params.items():
        head = ".".join(key.split(".")[:2]) if key.startswith("transformer_blocks.") else "rest"
        groups.setdefault(head, {})[key] = value
    weights = {}
    for index, (_, group) in enumerate(sorted(groups.items())):
        drawn = {k: v.astype(mx.bfloat16) for k, v in _seeded_like(group, seed * 1000 + index).items()}
        mx.eval(drawn)
        weights.update(drawn)
    folder.mkdir(parents=True, exist_ok=True)
    _write_component(folder, "transformer", weights, mx.bfloat16)
    (folder / "embedded_config.json").write_text(json.dumps(cfg))
    return {"layers": layers, "bytes": sum(v.nbytes for v in weights.values())}


def peak_rss() -> int:
    """This process's peak RSS in bytes: Linux's VmHWM (of this program's memory map: `ru_maxrss` keeps
    the parent's high-water mark across fork + exec), else `ru_maxrss` (bytes on macOS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def measure(side: str, folder: str, forwards: int = 2) -> dict:
    """`forwards` forwards of `side` ("resident" / "streamed") in this process after its load (resident:
    every block), the fastest timed (the machine is shared); peak RSS over the whole process."""
    import mlx.core as mx
    import numpy as np

    from ltx_engine.loading.pack import Pack
    from ltx_engine.loading.registry import ModelRegistry
    from ltx_engine.loading.streaming import StreamedPack
    from ltx_engine.models import patchify as P
    from ltx_engine.models.transformer import Modality

    pack = Pack(folder)
    model = ModelRegistry().get(StreamedPack(pack) if side == "streamed" else pack, "transformer")
    t = pack.config["transformer"]
    rng = np.random.default_rng(3)
    f, h, w = VIDEO_GRID
    tv = f * h * w
    video = Modality(latent=mx.array(rng.standard_normal((1, tv, 128), np.float32)), sigma=mx.array([0.7]),
                     timesteps=mx.full((1, tv), 0.7), positions=P.video_positions(1, f, h, w, 24.0),
                     context=mx.array(rng.standard_normal((1, 8, t["cross_attention_dim"]), np.float32)))
    audio = Modality(latent=mx.array(rng.standard_normal((1, AUDIO_TOKENS, 128), np.float32)), sigma=mx.array([0.7]),
                     timesteps=mx.full((1, AUDIO_TOKENS), 0.7), positions=P.audio_positions(1, AUDIO_TOKENS),
                     context=mx.array(rng.standard_normal((1, 8, t["audio_cross_attention_dim"]), np.float32)))
    times = []
    for _ in range(forwards):
        start = time.perf_counter()
        v, a = model(video, audio)
        mx.eval(v, a)
        times.append(time.perf_counter() - start)
    return {"side": side, "seconds": min(times), "peak_rss": peak_rss(),
            "checksum": float(np.array(v.astype(mx.float32)).sum())}


def _write_child(folder: Path, gb: float) -> dict:
    """The synthetic pack written by a subprocess, so this process never holds its weights."""
    code = ("import sys, json; from pathlib import Path; from farm_cli.bench.lowram import write_pack; "
            "print(json.dumps(write_pack(Path(sys.argv[1]), float(sys.argv[2]))))")
    out = subprocess.run([sys.executable, "-c", code, str(folder), str(gb)], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"farm bench lowram: writing the synthetic DiT failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(side: str, folder: Path) -> dict:
    code = "import sys, json; from farm_cli.bench.lowram import measure; print(json.dumps(measure(sys.argv[1], sys.argv[2])))"
    out = subprocess.run([sys.executable, "-c", code, side, str(folder)], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"farm bench lowram: the {side} forward failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def run(pairs: int, gb: float, as_json: bool) -> None:
    folder = Path(tempfile.mkdtemp(prefix="farm-bench-lowram-"))
    try:
        info = _write_child(folder / "wide", gb)
        rows = []
        for i in range(pairs):
            order = ("resident", "streamed") if i % 2 == 0 else ("streamed", "resident")
            got = {side: _child(side, folder / "wide") for side in order}
            if got["resident"]["checksum"] != got["streamed"]["checksum"]:
                raise SystemExit("farm bench lowram: streamed and resident outputs differ")
            rows.append(got)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    peaks = [r["streamed"]["peak_rss"] / r["resident"]["peak_rss"] for r in rows]
    times = [r["streamed"]["seconds"] / r["resident"]["seconds"] for r in rows]
    report = {"layers": info["layers"], "weights_bytes": info["bytes"], "pairs": pairs,
              "resident_peak_rss": statistics.median(r["resident"]["peak_rss"] for r in rows),
              "streamed_peak_rss": statistics.median(r["streamed"]["peak_rss"] for r in rows),
              "resident_s": statistics.median(r["resident"]["seconds"] for r in rows),
              "streamed_s": statistics.median(r["streamed"]["seconds"] for r in rows),
              "peak_ratio": statistics.median(peaks), "peak_ratio_spread": [min(peaks), max(peaks)],
              "time_ratio": statistics.median(times), "time_ratio_spread": [min(times), max(times)],
              "goal": {"peak_ratio": PEAK_GOAL, "time_ratio": TIME_GOAL}}
    if as_json:
        print(json.dumps(report))
        return
    mib = 2**20
    print(f"synthetic DiT: {info['layers']} blocks, {info['bytes'] / 2**30:.2f} GiB bf16; a forward (fastest of 2), "
          f"{pairs} interleaved pairs (own subprocess each)")
    print(f"peak RSS  resident {report['resident_peak_rss'] / mib:.0f} MiB, streamed {report['streamed_peak_rss'] / mib:.0f}"
          f" MiB: ratio {report['peak_ratio']:.3f} (spread {_spread(peaks)}; goal <= {PEAK_GOAL})")
    print(f"forward   resident {report['resident_s']:.2f} s, streamed {report['streamed_s']:.2f} s: ratio "
          f"{report['time_ratio']:.3f} (spread {_spread(times)}; goal <= {TIME_GOAL})")
