"""`farm pack tiny --layout`: the tiny pack rearranged as the other real packs hold their files.

Each layout starts from the standard tiny pack (mlx-forge's current names) and renames, shards, adds
or removes files the way an older mlx-forge, a published `dgrauet/ltx-2.x-mlx*` repo or the Hugging
Face cache would have them, so tests can show every layout loads by key and renders the same frames.
Weights are never changed, except where a layout must hold an older version (then the older file
differs, so picking it would show) or a dev DiT (the distilled weights minus a seeded LoRA delta).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

DISTILLED = "transformer-distilled.safetensors"
LORA_FILE = "ltx-2.3-22b-distilled-lora-384.safetensors"
LORA_RANK = 4
LORA_TARGETS = (".attn1.to_q.weight", ".attn1.to_out.weight", ".attn2.to_k.weight")


def _load(path: Path) -> dict[str, mx.array]:
    return dict(mx.load(str(path)))


def _save(path: Path, tensors: dict[str, mx.array]) -> None:
    mx.eval(tensors)
    mx.save_safetensors(str(path), tensors, metadata={"format": "mlx"})


def _reprefix(folder: Path, old: str, new: str, change: Callable[[mx.array], mx.array] | None = None) -> None:
    """Rename the file stem `old` to `new` with its key prefix (and config), optionally changing values."""
    tensors = {new + k[len(old):]: (change(v) if change else v) for k, v in _load(folder / f"{old}.safetensors").items()}
    _save(folder / f"{new}.safetensors", tensors)
    if (folder / f"{old}_config.json").is_file():
        shutil.copy(folder / f"{old}_config.json", folder / f"{new}_config.json")


def _older(value: mx.array) -> mx.array:
    """Another version of a weight: same shape and dtype, different values."""
    return -value if mx.issubdtype(value.dtype, mx.floating) else value


def standard(folder: Path, seed: int) -> Path:
    return folder


def legacy(folder: Path, seed: int) -> Path:
    """Older mlx-forge packs: one `transformer.safetensors`."""
    (folder / DISTILLED).rename(folder / "transformer.safetensors")
    return folder


def versioned(folder: Path, seed: int) -> Path:
    """`transformer-distilled-1.1` beside an older `transformer-distilled`, and an older spatial
    upscaler `x2_v1_0` beside `x2_v1_1`: the newest of each must be the one used."""
    (folder / DISTILLED).rename(folder / "transformer-distilled-1.1.safetensors")
    _save(folder / DISTILLED, {k: _older(v) for k, v in _load(folder / "transformer-distilled-1.1.safetensors").items()})
    _reprefix(folder, "spatial_upscaler_x2_v1_1", "spatial_upscaler_x2_v1_0", _older)
    return folder


def sharded(folder: Path, seed: int, shards: int = 3) -> Path:
    """The DiT in `-0000i-of-0000n` shards with the Hugging Face index, as large files are split."""
    tensors = _load(folder / DISTILLED)
    keys = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        name = f"transformer-distilled-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in keys[i::shards]}
        _save(folder / name, part)
        weight_map.update(dict.fromkeys(part, name))
    (folder / f"{DISTILLED}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (folder / DISTILLED).unlink()
    return folder


def _reference_name(pack_key: str) -> str:
    """The reference (PyTorch) name of a pack key a LoRA targets, checked against the DiT's own renames."""
    from ltx_engine.models.transformer import LTXModel

    ref = pack_key.removeprefix("transformer.").replace(".to_out.", ".to_out.0.")
    assert next(iter(LTXModel.sanitize({"model.diffusion_model." + ref: mx.array(0)}))) == pack_key.removeprefix(
        "transformer."), pack_key
    return ref


def dev_only(folder: Path, seed: int) -> Path:
    """Only `transformer-dev` and the distilled LoRA beside it (mlx-forge `--variant dev`): the dev
    weights are the distilled ones minus `B @ A`, so fusing the LoRA gives the distilled DiT back."""
    tensors = _load(folder / DISTILLED)
    quant = json.loads((folder / "quantize_config.json").read_text()) if (folder / "quantize_config.json").is_file() else None
    rng = np.random.default_rng(seed + 7)
    lora, dev = {}, dict(tensors)
    for key in sorted(k for k in tensors if k.endswith(LORA_TARGETS)):
        out_f = tensors[key].shape[0]
        in_f = tensors[key].shape[1] * 32 // quant["bits"] if quant else tensors[key].shape[1]
        a = (rng.standard_normal((LORA_RANK, in_f)) / np.sqrt(in_f)).astype(np.float32)
        b = (0.05 * rng.standard_normal((out_f, LORA_RANK))).astype(np.float32)
        ref = _reference_name(key)
        lora[f"diffusion_model.{ref.removesuffix('.weight')}.lora_A.weight"] = mx.array(a).astype(mx.bfloat16)
        lora[f"diffusion_model.{ref.removesuffix('.weight')}.lora_B.weight"] = mx.array(b).astype(mx.bfloat16)
        if not quant:
            delta = mx.array(b).astype(mx.bfloat16).astype(mx.float32) @ mx.array(a).astype(mx.bfloat16).astype(mx.float32)
            dev[key] = (tensors[key].astype(mx.float32) - delta).astype(tensors[key].dtype)
    _save(folder / "transformer-dev.safetensors", dev)
    _save(folder / LORA_FILE, lora)
    (folder / DISTILLED).unlink()
    split = json.loads((folder / "split_model.json").read_text())
    (folder / "split_model.json").write_text(json.dumps({**split, "transformer_variants": ["dev"], "lora": [LORA_FILE]}))
    return folder


def published_23(folder: Path, seed: int) -> Path:
    """A published `dgrauet/ltx-2.3-mlx*` repo: distilled and dev DiTs, README and .gitattributes,
    and no text encoder inside (it is a separate Gemma repo)."""
    shutil.copy(folder / DISTILLED, folder / "transformer-dev.safetensors")
    shutil.rmtree(folder / "text_encoder")
    (folder / "README.md").write_text("# tiny LTX-2.3 MLX pack\n\nConverted with mlx-forge (tiny sizes).\n")
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    return folder


def minimal(folder: Path, seed: int) -> Path:
    """`mlx-forge convert ltx-2.3` without upscaler flags: the six core components only."""
    for stem in ("spatial_upscaler_x2_v1_1", "temporal_upscaler_x2_v1_0"):
        (folder / f"{stem}.safetensors").unlink()
        (folder / f"{stem}_config.json").unlink()
    return folder


def extras(folder: Path, seed: int) -> Path:
    """An LTX-2.5-style pack: the spatial upscaler as `x2_v1_0`, 2.5 extras (Gemma 4 tower, duration
    head, conv and diffusion VAEs, x1.5 upscaler), a task LoRA beside the pack and files nobody knows."""
    _reprefix(folder, "spatial_upscaler_x2_v1_1", "spatial_upscaler_x2_v1_0")
    (folder / "spatial_upscaler_x2_v1_1.safetensors").unlink()
    (folder / "spatial_upscaler_x2_v1_1_config.json").unlink()
    small = mx.zeros((4, 4), dtype=mx.bfloat16)
    for stem in ("text_encoder", "duration_head", "vae_decoder_conv", "vae_encoder_conv", "vae_decoder_av",
                 "spatial_upscaler_x1_5_v1_0"):
        if not (folder / f"{stem}.safetensors").exists():  # a 2.5 tiny pack has real ones already
            _save(folder / f"{stem}.safetensors", {f"{stem}.weight": small})
    if not (folder / "text_encoder_config.json").exists():  # a 2.5 tiny pack's tower has its own
        (folder / "text_encoder_config.json").write_text(json.dumps({"model_type": "gemma4_text"}))
    (folder / "spatial_upscaler_x1_5_v1_0_config.json").write_text(json.dumps({"rational_resampler": True}))
    _save(folder / "ltx-2.3-22b-ic-lora-union-control-ref0.5.safetensors", {"diffusion_model.x.lora_A.weight": small})
    (folder / "notes.txt").write_text("not a pack file\n")
    _save(folder / "mystery.safetensors", {"mystery.weight": small})
    return folder


def hf_cache(folder: Path, seed: int, repo: str = "farm/tiny") -> Path:
    """The Hugging Face cache: `models--owner--name/blobs/<sha256>` and a snapshot folder of relative
    symlinks into blobs/ (what `snapshot_download` returns); the snapshot is the pack."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    cache = folder / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = cache / "snapshots" / commit
    (cache / "blobs").mkdir(parents=True)
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text(commit)
    for path in files:
        rel = path.relative_to(folder)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        path.rename(cache / "blobs" / sha)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(cache / "blobs" / sha, link.parent))
    for path in sorted(folder.iterdir()):
        if path != cache:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return snapshot


LAYOUTS: dict[str, Callable[[Path, int], Path]] = {
    "standard": standard, "legacy": legacy, "versioned": versioned, "sharded": sharded, "dev-only": dev_only,
    "hf-cache": hf_cache, "published-2.3": published_23, "minimal": minimal, "extras": extras,
}
