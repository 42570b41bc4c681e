"""What the CLI commands share: the client-side render flags (text encoder, detailing LoRA), reading images,
writing latents."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from farm_cli.config import CONFIG_FILE, data_dir, farm_config
from farm_cli.session import fail


def text_encoder_choice(pack: str, given: str | None, data: Path | None = None) -> str | None:
    """`--text-encoder`, else the pack's default in the config file's [text_encoders] table (by the pack
    as given, or its last path part), else None: the planner then takes the pack's own tower or the
    MLX port's default. A folder on this machine travels as its absolute path."""
    table = farm_config(data).get("text_encoders") or {}
    if not isinstance(table, dict):
        fail(f"{data_dir(data) / CONFIG_FILE}: [text_encoders] must be a table of pack = \"REPO_OR_PATH\"")
    ref = given or table.get(pack) or table.get(pack.rstrip("/").split("/")[-1])
    if ref is not None and not isinstance(ref, str):
        fail(f"{data_dir(data) / CONFIG_FILE}: the text encoder of {pack!r} is not a string")
    path = Path(ref).expanduser() if ref else None
    return str(path.resolve()) if path is not None and ref != "pack" and path.is_dir() else ref


def read_image(path: Path) -> np.ndarray:
    """The first frame of an image file as uint8 RGB (H, W, 3); one line if it cannot be read."""
    import av

    try:
        with av.open(str(path)) as container:
            frame = next(container.decode(video=0))
            return frame.to_ndarray(format="rgb24")
    except (OSError, StopIteration, av.error.FFmpegError, ValueError) as exc:
        fail(f"cannot read image {path}: {getattr(exc, 'strerror', None) or exc}")


def detailing_spec(lora: str | None, strength: float) -> dict:
    """DFR's detailing IC-LoRA as spec fields (only when one is named). A Hugging Face repo id is checked
    here, before anything is queued: a gated repo whose licence this user has not accepted fails in one
    line naming the licence page (workers read the LoRA from the pack folder, so a repo is not fetched)."""
    if lora and lora.count("/") == 1 and not lora.endswith(".safetensors"):
        check_lora_repo(lora)
    return {"detailing_lora": lora, "detailing_strength": strength} if lora else {}


def check_lora_repo(repo: str) -> None:
    """One line, exit 2, for a LoRA repo: gated and not accepted, missing, or (accessible) how to place it."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    endpoint = os.environ.get("HF_ENDPOINT") or None
    page = f"{(endpoint or 'https://huggingface.co').rstrip('/')}/{repo}"
    try:
        HfApi(endpoint=endpoint).auth_check(repo)
    except GatedRepoError:
        fail(f"detailing LoRA repo {repo!r} is gated: accept its licence at {page} (logged in with `hf auth "
             "login`), then put its .safetensors in the pack folder and pass the file name")
    except RepositoryNotFoundError:
        fail(f"detailing LoRA repo {repo!r} not found on the hub (or not visible to this token)")
    except Exception as exc:  # noqa: BLE001 - offline, proxy: one line
        fail(f"detailing LoRA repo {repo!r}: the hub could not be asked ({type(exc).__name__})")
    fail(f"detailing LoRA {repo!r} is a repo: `hf download {repo} --local-dir PACK_FOLDER` on the coordinator's "
         "packs, then pass the .safetensors file name")


def save_latents(folder: Path, arrays: dict[str, np.ndarray]) -> None:
    """One safetensors file per stage latent, so runs can be compared exactly."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        save_file({"latent": np.ascontiguousarray(array)}, str(folder / f"{name}.safetensors"))


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
