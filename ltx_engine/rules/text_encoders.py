"""Which text encoder encodes a render's prompts, and where a machine finds one. No mlx import.

The published LTX-2.3 MLX packs carry no text encoder: the MLX port encodes prompts with a separate
Gemma 3 checkpoint in mlx-lm format (`mlx-community/gemma-3-12b-it-4bit` by default). A pack's own
tower (a `text_encoder/` folder, an LTX-2.5 Gemma 4 tower at its top — `text_encoder.safetensors` with
`text_encoder_config.json` and the tokenizer files — or `LTX_GEMMA_DIR` beside a single-file checkpoint) always wins;
otherwise the render names an encoder: `--text-encoder`, else the pack's default in the farm's
config file, else the MLX port's default. The coordinator records the choice in the spec
(`resolve`), the lease gives the text task only to a worker holding one of its `names`, and a worker
finds it like a pack (`find_local`): a folder, a name in its packs folder, or a repo id in the
Hugging Face cache, offline; nothing here downloads.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

DEFAULT = "mlx-community/gemma-3-12b-it-4bit"   # the MLX LTX-2 port's `--gemma` default
PACK = "pack"                                    # the spec's value for the pack's own tower
GEMMA_TYPES = ("gemma3", "gemma3_text")          # mlx-lm model types our prompt path runs
GEMMA4_WEIGHTS, GEMMA4_CONFIG = "text_encoder.safetensors", "text_encoder_config.json"  # an LTX-2.5 pack's tower
GEMMA4_FILES = (GEMMA4_WEIGHTS, GEMMA4_CONFIG, "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                "generation_config.json", "processor_config.json", "special_tokens_map.json")
# What mlx-lm's load_model and the tokenizer read; nothing else of a repo is fetched or copied.
FILES = ("config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer.model",
         "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def is_repo_id(ref: str) -> bool:
    """`owner/name` that is not a path (`./x/y`, `/x`, `~/x`)."""
    return ref.count("/") == 1 and not ref.startswith((".", "/", "~")) and all(ref.split("/"))


def names(ref: str) -> list[str]:
    """What a worker may hold `ref` under: the ref itself, and for a repo id also the folder name a
    `farm pack pull REPO --packs-dir` gives it (the repo's name, as for packs)."""
    return [ref, ref.split("/")[-1]] if is_repo_id(ref) else [ref]


def resolve(has_tower: bool | None, given: str | None) -> str | None:
    """The encoder a render uses: the pack's own tower when it has one, else the one given, else the
    MLX port's default; None when the pack is not known here (the worker decides, as the rule says)."""
    if has_tower:
        return PACK
    if given:
        return given
    return None if has_tower is None else DEFAULT


def fetch_line(ref: str) -> str:
    """The command that puts an encoder where workers find it."""
    if is_repo_id(ref):
        return f"farm pack pull {ref}"
    return f"copy the folder {ref} to every worker (or into the coordinator's packs folder)"


def refusal(ref: str, pack: str, holder: str = "no live worker holds") -> str:
    """The one line a render gets when no worker (or, for a local render, not this machine) holds
    its text encoder."""
    return f"{holder} the text encoder {ref!r} that pack {pack!r} needs: fetch it with `{fetch_line(ref)}`"


def is_encoder_listing(files: list[str]) -> bool:
    """A repo or folder listing that is an mlx-lm checkpoint, not a pack: a config, weights and a
    tokenizer at the top, and no pack config."""
    top = {f for f in files if "/" not in f}
    return ("config.json" in top and "embedded_config.json" not in top and any(f.endswith(".safetensors") for f in top)
            and bool(top & {"tokenizer.json", "tokenizer.model"}))


def pull_files(files: list[str]) -> list[str]:
    """Of an encoder repo's files, the ones mlx-lm needs (top level only)."""
    return sorted(f for f in files if "/" not in f and any(fnmatch.fnmatch(f, p) for p in FILES))


# ---------------------------------------------------------------- on this machine


def is_encoder(folder: Path) -> bool:
    """A folder holding an mlx-lm Gemma 3 checkpoint (its config's model type says so)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict) and config.get("model_type") in GEMMA_TYPES
            and not (folder / "embedded_config.json").exists())


def is_gemma4_tower(folder: Path) -> bool:
    """A folder (an LTX-2.5 pack) holding the Gemma 4 tower at its top, as mlx-forge writes it."""
    return (Path(folder) / GEMMA4_WEIGHTS).is_file() and (Path(folder) / GEMMA4_CONFIG).is_file()


def weight_bytes(folder: Path) -> int:
    """Bytes of the checkpoint's weights: what loading it adds to a worker's models (of a pack holding
    a Gemma 4 tower, the tower's file only)."""
    if is_gemma4_tower(folder):
        return (Path(folder) / GEMMA4_WEIGHTS).stat().st_size
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors") if p.is_file())


def hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment at each call (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "huggingface" / "hub"


def _snapshot(repo_folder: Path) -> Path | None:
    ref = repo_folder / "refs" / "main"
    if not ref.is_file():
        return None
    snapshot = repo_folder / "snapshots" / ref.read_text().strip()
    return snapshot if snapshot.is_dir() else None


def _cached(repo: str, root: Path) -> Path | None:
    return _snapshot(root / f"models--{repo.replace('/', '--')}")


def find_local(ref: str, packs_dir: Path | None) -> Path | None:
    """The encoder's folder on this machine, or None: an absolute folder path; a name in the packs
    folder (a repo id also by its repo name, or as an HF cache repo there); a repo id in the hub
    cache; else a folder relative to here."""
    path = Path(ref).expanduser()
    candidates: list[Path | None] = [path] if path.is_absolute() else []
    if packs_dir is not None and not path.is_absolute():
        candidates += [packs_dir / n for n in names(ref) if "/" not in n]
    if is_repo_id(ref):
        candidates += [_cached(ref, packs_dir) if packs_dir is not None else None, _cached(ref, hub_cache())]
    elif not path.is_absolute():
        candidates.append(path)
    return next((c for c in candidates if c is not None and is_encoder(c)), None)


def held(packs_dir: Path | None) -> dict[str, int]:
    """Every encoder this machine holds, by each name a render may give it, with its weight bytes:
    folders and HF cache repos in the packs folder, repos in the hub cache, and `$LTX_GEMMA_DIR`."""
    found: dict[str, Path] = {}
    if packs_dir is not None and packs_dir.is_dir():
        for p in sorted(packs_dir.iterdir()):
            if p.name.startswith("."):
                continue
            if p.name.startswith("models--") and (snap := _snapshot(p)) is not None and is_encoder(snap):
                found[p.name.removeprefix("models--").replace("--", "/", 1)] = snap
            elif is_encoder(p):
                found[p.name] = found[str(p.resolve())] = p
    cache = hub_cache()
    if cache.is_dir():
        for p in sorted(cache.glob("models--*")):
            if (snap := _snapshot(p)) is not None and is_encoder(snap):
                found.setdefault(p.name.removeprefix("models--").replace("--", "/", 1), snap)
    env = os.environ.get("LTX_GEMMA_DIR")
    if env and is_encoder(Path(env).expanduser()):
        found[str(Path(env).expanduser().resolve())] = Path(env).expanduser()
    return {name: weight_bytes(folder) for name, folder in found.items()}


# ---------------------------------------------------------------- the enhancer's LM head

LM_HEAD = "lm_head"   # what a pack advertises when its text encoder can write (`--enhance-prompt`)
WRITER = "mlx-community/gemma-3-12b-it-4bit"   # a Gemma 3 that writes: upstream's enhancer family


def lm_head_problem(folder: Path) -> str | None:
    """Why the Gemma in `folder` cannot generate text, naming its files; None when it can. Gemma 3
    writes through its LM head: `lm_head.weight`, or the embeddings when the config ties them (mlx-lm's
    and transformers' default). LTX-2.5's Gemma 4 tower encodes only (upstream's `gemma4_unified`)."""
    folder = Path(folder)
    if not is_encoder(folder):
        if is_gemma4_tower(folder):
            return f"its text encoder, LTX-2.5's Gemma 4 tower ({GEMMA4_WEIGHTS}), only encodes"
        return f"{folder}/config.json names no Gemma 3 (mlx-lm) checkpoint"
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)) is not False:
        return None
    from ltx_engine.rules.safetensors_header import read_raw_header

    for weights in sorted(folder.glob("*.safetensors")):
        if any(k.endswith("lm_head.weight") for k in read_raw_header(weights)[1]):
            return None
    return f"{folder.name}/config.json unties the embeddings and no {folder.name}/*.safetensors holds lm_head.weight"


def no_head_line(pack: str, why: str, tower: bool) -> str:
    """The one line `--enhance-prompt` gets on a pack whose text encoder cannot write, with the download."""
    get = f"hf download {WRITER}" + ("" if tower else f" --local-dir {pack}/text_encoder")
    note = " (upstream runs it as a separate enhancer, which the farm does not yet)" if tower else ""
    return f"--enhance-prompt: pack {pack!r} has no LM head ({why}): a Gemma 3 that writes is `{get}`{note}"
