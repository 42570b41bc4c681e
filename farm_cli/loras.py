"""`--lora SOURCE STRENGTH` (repeatable) and `--lora-mode` on the client.

A SOURCE is, in this order: a `.safetensors` on this machine (uploaded once as a blob named by its
sha256, as an `--image` is: a second render with it sends nothing new), a `.safetensors` file name in
the pack folder (read where each worker holds the pack), or a Hugging Face `REPO[/FILE]` (fetched once
into this machine's HF cache through `huggingface_hub`, then uploaded as a blob, so the farm fetches it
once and workers get it from the coordinator). A gated repo whose licence this user has not accepted is
refused here in one line naming the licence page, before anything is queued. The spec records each LoRA
(blob or file, strength, the repo or file name it came from); what the set may hold (count, finite
strengths) is `protos.spec`'s rule, and whether it fits the pack is the coordinator's check at submit.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from farm_cli.session import fail

PAIR = "\x1f"  # joins SOURCE and STRENGTH into the one value a typer option takes


def pair_argv(argv: list[str]) -> list[str]:
    """`--lora SOURCE STRENGTH` as `--lora SOURCE<US>STRENGTH` (typer options take one value each)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--lora" and len(argv) > i + 2 and not argv[i + 2].startswith("--") and PAIR not in argv[i + 1]:
            out += ["--lora", argv[i + 1] + PAIR + argv[i + 2]]
            i += 3
        elif argv[i] == "--":
            return out + argv[i:]
        else:
            out.append(argv[i])
            i += 1
    return out


def _pair(value: str) -> tuple[str, float]:
    source, sep, strength = value.partition(PAIR)
    if not sep:
        fail(f"--lora {source}: give SOURCE STRENGTH (a file, pack file name or REPO[/FILE], then a number)")
    try:
        return source, float(strength)
    except ValueError:
        fail(f"--lora {source} {strength}: the strength {strength!r} is not a number")


@dataclass
class ClientLoras:
    """The spec fields of a LoRA set and the client files its blobs are (sha256 -> path)."""

    fields: dict = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve(loras: list[str] | None, mode: str | None) -> ClientLoras:
    """The LoRA set of the command's `--lora` options (none: no fields, the spec's defaults stand)."""
    out = ClientLoras()
    if not loras:
        if mode and mode != "fused":
            out.fields["lora_mode"] = mode
        return out
    records = []
    for value in loras:
        record, path = _one(*_pair(value))
        if path is not None:
            out.files[record["blob"]] = path
        records.append(record)
    out.fields = {"loras": records, "lora_mode": mode or "fused"}
    return out


def _one(source: str, strength: float) -> tuple[dict, Path | None]:
    path = Path(source).expanduser()
    if path.is_file():
        return {"blob": _sha256(path), "name": path.name, "strength": strength}, path.resolve()
    if source.startswith((".", "/", "~")):
        fail(f"--lora {source}: no such file")
    if "/" not in source:
        if not source.endswith(".safetensors"):
            fail(f"--lora {source}: not a file here, nor a .safetensors name in the pack folder, nor REPO[/FILE]")
        return {"file": source, "strength": strength}, None
    parts = source.split("/")
    repo, name = "/".join(parts[:2]), "/".join(parts[2:])
    local = hub_file(repo, name or None)
    return {"blob": _sha256(local), "repo": f"{repo}/{local.name}" if not name else source,
            "name": local.name, "strength": strength}, local


def hub_file(repo: str, name: str | None) -> Path:
    """A hub LoRA in this machine's HF cache (downloaded once); one line, exit 2, for a gated, missing or
    ambiguous repo, or a hub that cannot be reached."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    endpoint = os.environ.get("HF_ENDPOINT") or None
    page = f"{(endpoint or 'https://huggingface.co').rstrip('/')}/{repo}"
    try:
        if name is None:
            found = [f for f in HfApi(endpoint=endpoint).list_repo_files(repo) if f.endswith(".safetensors")]
            if len(found) == 1:
                name = found[0]
        if name is not None:
            return Path(hf_hub_download(repo, name, endpoint=endpoint))
    except GatedRepoError:
        fail(f"LoRA repo {repo!r} is gated: accept its licence at {page} (logged in with `hf auth login`), "
             "then submit again")
    except RepositoryNotFoundError:
        fail(f"LoRA repo {repo!r} not found on the hub (or not visible to this token)")
    except EntryNotFoundError:
        fail(f"LoRA repo {repo!r} has no file {name!r}")
    except Exception as exc:  # noqa: BLE001 - offline, proxy: one line
        fail(f"LoRA repo {repo!r}: the hub could not be asked ({type(exc).__name__})")
    fail(f"--lora {repo}: the repo holds {len(found)} .safetensors files ({', '.join(found[:4])}); name one as REPO/FILE")


def upload_to(files: dict[str, Path], coordinator: str, token: str | None) -> None:
    """Each client LoRA file as a blob (the coordinator keeps it only when it hashes to its name)."""
    if not files:
        return
    from farm_cli.remote import client
    from farm_cli.session import one_line

    with one_line(), client(coordinator, token) as farm:
        for sha, path in files.items():
            if farm.put_blob(path.read_bytes()) != sha:
                fail(f"LoRA {path}: changed while it was uploaded; submit again")
