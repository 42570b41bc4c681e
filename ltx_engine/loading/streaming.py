"""Block streaming: a DiT forward with only the non-block weights resident and one block bound at a time.

The MLX port's `--low-ram`. A worker whose memory cannot hold a task's transformer runs it through
`StreamedLTX`: the patchify / AdaLN / output weights stay loaded; each transformer block's tensors
are read from the pack's safetensors by byte range when the forward reaches it (the file reopened for
every read, so a file that disappears or is truncated mid-render fails with its name), while a
thread reads the next block's bytes as the current one computes. The LoRA set the resident model
fuses (the distilled LoRA of a dev-only pack, the user's or DFR's) is checked once against the whole
file and each block's share is fused as the block binds, with the same float32 sum and requantization
(`ltx_engine.lora.lora.apply_updates`), so the output is bit-identical to the resident model's: the same
operations on the same bytes, evaluated block by block. An unfused set's run-time adapters
(`ltx_engine.lora.lora_adapters`, `attach_adapters`) wrap each block's layers as it binds, with the factors
the resident attach stacks, so a streamed adapted DiT equals the resident adapted one too. Peak ≈ non-block weights + two blocks
(the bound one and the prefetched bytes) + activations.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np

from ltx_engine.loading.loader import PackError, apply_weights, read_safetensors, strip_prefix
from ltx_engine.loading.pack import Pack
from ltx_engine.lora.lora import Update, apply_updates, check_loras
from ltx_engine.lora.lora_adapters import wrap_layers
from ltx_engine.models.dit_blocks import BasicAVTransformerBlock, BlockSkip, StreamArgs, StreamDims
from ltx_engine.models.forward_options import configure_block
from ltx_engine.models.transformer import LTXModel, TransformerConfig
from ltx_engine.rules.safetensors_header import read_raw_header

STREAMED_SUFFIX = "|streamed"
_BLOCK = re.compile(r"transformer_blocks\.(\d+)\.")
_DTYPES = {"BF16": (np.uint16, mx.bfloat16), "F16": (np.float16, None), "F32": (np.float32, None),
           "F64": (np.float64, None), "U32": (np.uint32, None), "I32": (np.int32, None), "I64": (np.int64, None),
           "U8": (np.uint8, None), "I8": (np.int8, None), "U16": (np.uint16, None), "BOOL": (np.bool_, None)}


@dataclasses.dataclass(frozen=True)
class Span:
    """Where one tensor's bytes lie: its file, absolute byte range, safetensors dtype and shape."""

    path: Path
    start: int
    end: int
    dtype: str
    shape: tuple[int, ...]


def file_spans(path: Path, prefix: str) -> dict[str, Span]:
    """Every tensor of one safetensors file by its key (component prefix stripped) -> its Span."""
    size, header = read_raw_header(path)
    header.pop("__metadata__", None)
    want = prefix.rstrip(".") + "."
    out = {}
    for key, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise PackError(f"{path}: tensor {key!r} has dtype {info['dtype']} that streaming cannot read")
        begin, end = (8 + size + int(o) for o in info["data_offsets"])
        out[key.removeprefix(want)] = Span(path, begin, end, info["dtype"], tuple(info["shape"]))
    return out


def read_spans(spans: dict[str, Span]) -> dict[str, np.ndarray]:
    """The raw bytes of `spans` as numpy arrays (file reads, no MLX: safe on the prefetch thread). A file
    that is gone or shorter than its header says is a PackError naming the file and the tensor."""
    out: dict[str, np.ndarray] = {}
    by_file: dict[Path, list[tuple[str, Span]]] = {}
    for key, span in spans.items():
        by_file.setdefault(span.path, []).append((key, span))
    for path, items in by_file.items():
        try:
            with open(path, "rb") as f:
                for key, span in sorted(items, key=lambda item: item[1].start):
                    f.seek(span.start)
                    data = f.read(span.end - span.start)
                    if len(data) != span.end - span.start:
                        raise PackError(f"{path}: tensor {key!r} ends at byte {span.end} but the file has "
                                        f"{os.fstat(f.fileno()).st_size} (truncated while streaming)")
                    out[key] = np.frombuffer(data, dtype=_DTYPES[span.dtype][0]).reshape(span.shape)
        except OSError as exc:
            raise PackError(f"{path}: cannot read while streaming ({exc.strerror or exc})") from exc
    return out


def to_mlx(raw: dict[str, np.ndarray], spans: dict[str, Span]) -> dict[str, mx.array]:
    """Numpy bytes -> MLX arrays of the stored dtype (bfloat16 travels as uint16 and is viewed back)."""
    out = {}
    for key, array in raw.items():
        view = _DTYPES[spans[key].dtype][1]
        value = mx.array(array)
        out[key] = value.view(view) if view is not None else value
    return out


class StreamedLTX(LTXModel):
    """An `LTXModel` without resident blocks: `_run_blocks` binds block i from the pack's files (its
    LoRA share fused, its adapters attached), runs it, evaluates its outputs and drops it, block i + 1's
    bytes read meanwhile."""

    def __init__(self, config: TransformerConfig, spans: dict[str, dict[str, Span]], updates: list[Update],
                 label: str):
        super().__init__(dataclasses.replace(config, num_layers=0))
        self.config = config
        self._spans, self._updates, self._label = spans, updates, label
        self._dims = _dims(config)
        object.__setattr__(self, "_adapters", {})  # not a child: the factors are no parameters of the pack

    @property
    def adapters(self) -> dict[str, tuple[mx.array, mx.array]]:
        """The attached set's stacked factors of the blocks' layers, by module path."""
        return self._adapters

    def attach_adapters(self, factors: dict[str, tuple[mx.array, mx.array]], *, file: str) -> None:
        """An unfused set: the resident layers' adapters now, the blocks' each time a block binds."""
        blocks = {path: ab for path, ab in factors.items() if _BLOCK.match(path + ".")}
        wrap_layers(self, {path: ab for path, ab in factors.items() if path not in blocks}, file=file)
        self._adapters.update(blocks)
        object.__setattr__(self, "_first", None)  # the gate's block 0 binds again, with its adapters

    @property
    def num_blocks(self) -> int:
        return self.config.num_layers

    def _block_updates(self, index: int) -> list[Update]:
        head = f"transformer_blocks.{index}."
        return [u for u in self._updates if u.target.startswith(head)]

    def _fetch(self, index: int) -> dict[str, np.ndarray]:
        """Block `index`'s bytes (on the prefetch thread: numpy only, since an MLX array made on another
        thread belongs to that thread's stream)."""
        return read_spans(self._spans[index])

    def bind(self, index: int, raw: dict[str, np.ndarray]) -> BasicAVTransformerBlock:
        """Block `index` built and loaded strictly from its bytes, its LoRA updates fused, adapters attached."""
        head = f"transformer_blocks.{index}."
        weights = apply_updates(to_mlx(raw, self._spans[index]), self._block_updates(index))
        c, (video, audio) = self.config, self._dims
        block = BasicAVTransformerBlock(video, audio, rope_type=c.rope_type, norm_eps=c.norm_eps,
                                        gated=c.apply_gated_attention, cross_attention_adaln=c.cross_attention_adaln)
        block = apply_weights(block, {k.removeprefix(head): v for k, v in weights.items()},
                              file=f"{self._label} [{head}*]")
        mine = {path.removeprefix(head): ab for path, ab in self._adapters.items() if path.startswith(head)}
        wrap_layers(block, mine, file=self._label)
        return block

    def first_block(self) -> BasicAVTransformerBlock:
        """Block 0 for the step cache's gate (its AdaLN table is all the gate reads), bound once."""
        if getattr(self, "_first", None) is None:
            object.__setattr__(self, "_first", self.bind(0, self._fetch(0)))  # not a child: no parameters
        return self._first

    def bound_blocks(self) -> Iterator[BasicAVTransformerBlock]:
        """Each block bound (its settings applied) when the forward reaches it, the next one's bytes read
        meanwhile; the caller evaluates a block's outputs before taking the next (then it is dropped)."""
        if self.num_blocks == 0:
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="block-prefetch") as pool:
            pending: Future = pool.submit(self._fetch, 0)
            for index in range(self.num_blocks):
                raw = pending.result()
                if index + 1 < self.num_blocks:
                    pending = pool.submit(self._fetch, index + 1)
                block = self.bind(index, raw)
                configure_block(block, index, getattr(self, "_block_settings", None))  # sparse / compute dtype
                del raw
                yield block
                del block

    def _run_blocks(self, v: StreamArgs | None, a: StreamArgs | None, skips: list[BlockSkip]) -> tuple:
        for block, skip in zip(self.bound_blocks(), skips, strict=True):
            v, a = block(v, a, skip)
            mx.eval([s.x for s in (v, a) if s is not None])
        return v, a


def _dims(c: TransformerConfig) -> tuple[StreamDims | None, StreamDims | None]:
    """The block widths `LTXModel.__init__` gives its blocks."""
    video = audio = None
    if c.has_video:
        video = StreamDims(c.num_attention_heads * c.attention_head_dim, c.num_attention_heads,
                           c.attention_head_dim, c.cross_attention_dim, ff_bias=c.ff_bias)
    if c.has_audio:
        audio = StreamDims(c.audio_num_attention_heads * c.audio_attention_head_dim, c.audio_num_attention_heads,
                           c.audio_attention_head_dim, c.audio_cross_attention_dim, ff_bias=c.audio_ff_bias)
    return video, audio


def build_streamed(pack, component: str = "transformer") -> StreamedLTX:
    """The pack's DiT (`transformer`, or a guidance pass's `transformer_dev`) as a `StreamedLTX`: config
    from the (lazily mapped) tensors' shapes as the resident build reads it, the LoRA set checked against
    every weight, the non-block weights loaded."""
    parts = pack.stream_parts(component)
    spans: dict[str, Span] = {}
    lazy: dict[str, mx.array] = {}
    for path in parts["files"]:
        spans.update(file_spans(path, parts["prefix"]))
        lazy.update(strip_prefix(read_safetensors(path), parts["prefix"], file=str(path)))
    sanitize = LTXModel.sanitize
    updates = check_loras(lazy, parts["loras"], sanitize, file=parts["label"]) if parts["loras"] else []
    config = TransformerConfig.from_weights(pack.component_config(component), lazy)
    per_block: dict[int, dict[str, Span]] = {i: {} for i in range(config.num_layers)}
    resident_keys = []
    for key, span in spans.items():
        match = _BLOCK.match(key)
        if match:
            per_block[int(match.group(1))][key] = span
        else:
            resident_keys.append(key)
    model = StreamedLTX(config, per_block, updates, parts["label"])
    resident = {k: lazy[k] for k in resident_keys}
    rest = [u for u in updates if not _BLOCK.match(u.target)]
    apply_weights(model, apply_updates(resident, rest), file=parts["label"])
    return model


def can_stream(pack) -> bool:
    """Whether `pack` (through LoRA views) is a pack folder streaming can read; a single-file checkpoint
    (its keys routed and renamed on load) runs resident."""
    while not isinstance(pack, Pack) and "pack" in getattr(pack, "__dict__", {}):
        pack = vars(pack)["pack"]
    return isinstance(pack, Pack)


class StreamedPack:
    """A pack seen with its transformer streamed, under its own registry key (a worker may hold the
    resident and the streamed one of a pack for different tasks; both give the same bits)."""

    streamed = True

    def __init__(self, pack):
        self.pack = pack

    def __getattr__(self, name: str):
        return getattr(self.pack, name)

    @property
    def key(self) -> str:
        return self.pack.key + STREAMED_SUFFIX

    def stream_parts(self, component: str = "transformer", loras: tuple[tuple[str, float], ...] = ()) -> dict:
        return self.pack.stream_parts(component, loras=loras)
