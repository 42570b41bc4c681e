"""User LoRAs on a worker: the files by sha256, and the DiT with the render's set kept warm.

A DiT task's params carry the render's set (`loras`: blob sha256 or pack file name, strength, in the
set's order; `lora_mode`). `LoraSets.view(pack, params)` is the pack as that task sees it:
- **fused** (`FusedLoras`): the set summed in float32 and each targeted weight requantized once
  (`ltx_engine.lora.lora.fuse_loras`, with DFR's detailing LoRA in the same sum when the task has one), a DiT
  of its own in the registry under (pack, `lora_set_identity`): a worker pays the fusion once and keeps
  it warm between tasks and renders with the same set;
- **unfused** (`AdaptedLoras`): the pack's own weights with run-time adapters attached
  (`ltx_engine.lora.lora_adapters`), also its own registry entry.
Files: a blob LoRA is fetched once from the coordinator (`fetch`, the agent's blob transfer, sha256
checked) into `root/<sha256>.safetensors` and kept there; a pack file is read where the pack holds it.
`farm render --local` names the client's own files (`known`). Every build counts in `fusions`, which a
task's metrics report (`lora_fusions`), so a test sees a second render fuse 0 times on a worker that
kept the set. The set's warm name (`params["warm"]`) is reported among the worker's warm models.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ltx_engine.loading.loader import PackError, check_safetensors, read_safetensors
from ltx_engine.lora.dev_distilled import DIT_NAMES, DevWithDistilled, dev_view
from ltx_engine.lora.lora import FUSED, LoraInput, WithLoras, file_sha256, lora_set_identity
from ltx_engine.rules.errors import PermanentTaskError
from protos.lora_set import missing_file

Fetch = Callable[[str], bytes | bytearray | memoryview]


class LoraFileError(PackError):
    """A LoRA file this worker cannot get: the task fails with the reason, the worker's models stay (and
    another worker may have it: worker/faults.py reads `transient`)."""

    transient = True


def _whole(path: Path, label: str) -> None:
    """Refuse a LoRA whose tensors do not all lie inside the file: its sha256 is the one submitted, so
    every worker holds the same cut-short copy and no retry can help (a PermanentTaskError)."""
    try:
        check_safetensors(path)
    except PackError as exc:
        why = str(exc).replace(f"{path}: ", "")
        raise PermanentTaskError(f"LoRA {label}: its data is cut short or damaged ({why}); "
                                 "upload the whole file and submit again") from exc


class FusedLoras(WithLoras):
    """The pack with the render's LoRA set fused into its DiT (and DFR's detailing LoRA after it)."""

    def __init__(self, pack, loras: tuple[tuple[str, float], ...], identity: str, counter: list[int]):
        super().__init__(pack, loras)
        self.identity, self._counter = identity, counter

    @property
    def key(self) -> str:
        return f"{self.pack.key}|loras:{self.identity}"

    def tensors(self, component: str, loras: tuple[tuple[str, float], ...] = ()) -> dict:
        if component in ("transformer", "transformer_dev"):  # the dev DiT: a guided pass's
            self._counter[0] += 1
        return self.pack.tensors(component, loras=self.loras + tuple(loras))


class AdaptedLoras(WithLoras):
    """The pack's own weights under a key of their own: the DiT built from them gets the set's adapters."""

    def __init__(self, pack, loras: tuple[tuple[str, float], ...], identity: str):
        super().__init__(pack, loras)
        self.identity = identity

    @property
    def key(self) -> str:
        return f"{self.pack.key}|adapters:{self.identity}"

    def tensors(self, component: str, loras: tuple[tuple[str, float], ...] = ()) -> dict:
        return self.pack.tensors(component, loras=tuple(loras))

    def stream_parts(self, component: str = "transformer", loras: tuple[tuple[str, float], ...] = ()) -> dict:
        return self.pack.stream_parts(component, loras=tuple(loras))  # streamed: the same own weights


class LoraSets:
    """This worker's LoRA files and the warm names of the sets its registry holds."""

    def __init__(self, root: Path | None = None, fetch: Fetch | None = None):
        self.root, self.fetch = (Path(root) if root else None), fetch
        self.known: dict[str, Path] = {}  # sha256 -> a file already on this machine (render --local)
        self.fusions = [0]  # DiT builds with a set (fused or adapted) in this process
        self._warm: dict[str, str] = {}  # registry pack key -> the set's warm name
        self._shas: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256 of a pack file

    def view(self, pack, params: dict):
        """The pack as this task's DiT sees it: with the set (fused or adapted), or the pack itself; under
        a dev recipe's distilled LoRA when the task names its strength (ltx_engine/lora/dev_distilled.py)."""
        return dev_view(self._user_view(pack, params), params)

    def _user_view(self, pack, params: dict):
        loras = params.get("loras") or ()
        if not loras:
            return pack
        entries = tuple((str(self.path(pack, lora)), float(lora["strength"])) for lora in loras)
        mode = str(params.get("lora_mode") or FUSED)
        identity = lora_set_identity([(self._sha(Path(p)), s) for p, s in entries], mode)
        view = (FusedLoras(pack, entries, identity, self.fusions) if mode == FUSED
                else AdaptedLoras(pack, entries, identity))
        for name in params.get("warm") or ():
            self._warm[view.key] = str(name)
        return view

    def connector_view(self, pack, params: dict):
        """The pack as a text task sees it: with the set fused into the connector when a LoRA of the set
        has factors for it (in either mode: the connector runs once per prompt), else the pack itself."""
        from ltx_engine.loading.loader import read_header
        from ltx_engine.rules.lora_keys import CONNECTOR_PREFIXES

        names = [*CONNECTOR_PREFIXES, "connectors."]  # reference / ComfyUI, kohya (underscored), diffusers
        keys = [k for lora in params.get("loras") or () for k in read_header(self.path(pack, lora))[0]]
        if not any(n in k or n.replace(".", "_") in k for k in keys for n in names):
            return pack
        return self.view(pack, {**params, "lora_mode": FUSED})

    def warm_names(self, has: Callable[[tuple[str, str]], bool]) -> list[str]:
        """The warm names of the sets whose DiT the registry still holds."""
        return sorted({name for key, name in self._warm.items() if has((key, "transformer"))})

    def attach(self, model: Callable[[object, str], object], view, components: tuple[str, ...] = ("transformer",)) -> None:
        """Unfused: the set's adapters on each DiT of `components` the task builds from `view` (the adapted
        pack, DFR's detailing view or a dev recipe's distilled-LoRA view over it: a guided pass's
        `transformer_dev`), once per build (a DiT evicted and built again gets them again). `model` is the
        engine's (view, component) -> DiT, resident or block-streamed as the task runs it."""
        adapted, dev = view, False
        while isinstance(adapted, (WithLoras, DevWithDistilled)) and not isinstance(adapted, AdaptedLoras):
            dev, adapted = dev or isinstance(adapted, DevWithDistilled), adapted.pack
        if not isinstance(adapted, AdaptedLoras):
            return
        for component in (c for c in components if c in DIT_NAMES):
            # the weights the DiT was built from: dev's under the distilled LoRA (both names), else its own
            self._adapt(model(view, component), adapted, "transformer_dev" if dev else component)

    def _adapt(self, model, adapted: AdaptedLoras, weights: str) -> None:
        from ltx_engine.loading.model_classes import model_class
        from ltx_engine.lora.lora_adapters import attach_loras, has_adapters

        if has_adapters(model):
            return
        inputs = [LoraInput(read_safetensors(Path(p)), s, p) for p, s in adapted.loras]
        attach_loras(model, adapted.pack.tensors(weights), inputs, model_class(weights).sanitize,
                     file=adapted.pack.file_label(weights))
        self.fusions[0] += 1

    def path(self, pack, lora: dict) -> Path:
        """Where this worker reads a LoRA of the set: the pack folder's file, a known file, or its blob copy."""
        if lora.get("file"):
            path = Path(pack.root) / str(lora["file"])
            if Path(str(lora["file"])).name != lora["file"] or not path.is_file():
                raise LoraFileError(missing_file(str(lora["file"]), pack.root.name))
            return path
        sha = str(lora["blob"])
        if sha in self.known:
            return self.known[sha]
        if self.root is None or self.fetch is None:
            raise LoraFileError(f"LoRA {lora.get('name') or sha[:12]}: not on this machine and no coordinator to fetch it from")
        path = self.root / f"{sha}.safetensors"
        label = str(lora.get("name") or lora.get("repo") or sha[:12])
        if not path.is_file():
            self._download(sha, path, label)
        _whole(path, label)
        return path

    def _download(self, sha: str, path: Path, label: str) -> None:
        try:
            data = bytes(self.fetch(sha))
        except Exception as exc:  # noqa: BLE001 - the task fails with the reason; the worker goes on
            raise LoraFileError(f"LoRA {label}: fetch of blob {sha[:12]} failed: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != sha:
            raise LoraFileError(f"LoRA {label}: blob {sha[:12]} arrived with other content")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self._shas[self._stat(path)] = sha

    def _stat(self, path: Path) -> tuple[str, int, int]:
        st = path.stat()
        return str(path.resolve()), st.st_size, st.st_mtime_ns

    def _sha(self, path: Path) -> str:
        key = self._stat(path)
        if key not in self._shas:
            self._shas[key] = file_sha256(path)
        return self._shas[key]
