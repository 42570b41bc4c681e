"""Per-forward settings of the DiT that a render's spec asks for: sparse stage-2 self-attention (one tau
per stage-2 step) and a narrower compute dtype, with the overflow guard.

They are set on the warm model's modules for the one forward and cleared after it (also on error), so
the same warm model serves every render. Sparse attention reaches only the video self-attention (`attn1`)
of blocks SPARSE_DENSE_BLOCKS and up; each forward routes its own tokens (a tile its own), with the
latent frame size read from its positions (`sparse_attention.frame_tokens`).

Guard (the MLX port's): a forward in float16 / bfloat16 whose output is not finite is computed again in
float32 (the default path: nothing was cast in place), with one warning line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ltx_engine.models.compute import dtype_of
from ltx_engine.models.dit_blocks import Attention, FeedForward
from ltx_engine.models.sparse_attention import Routing, frame_tokens
from ltx_engine.rules.forward_rules import SPARSE_DENSE_BLOCKS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardOptions:
    """sparse_tau: this step's tau (None: dense); compute_dtype: "float16" / "bfloat16" (None: float32)."""

    sparse_tau: float | None = None
    compute_dtype: str | None = None

    @property
    def plain(self) -> bool:
        return self.sparse_tau is None and dtype_of(self.compute_dtype) is None


def step_options(taus: tuple[float, ...] | None, sigmas: list[float], sigma: float,
                 compute_dtype: str | None) -> ForwardOptions:
    """The options of the forward at `sigma` of a stage whose steps are `sigmas` (one tau per step)."""
    tau = None
    if taus:
        tau = float(taus[[float(s) for s in sigmas].index(float(sigma))])
    return ForwardOptions(tau, compute_dtype)


def _modules(model) -> Iterator:
    for _, module in model.named_modules():
        if isinstance(module, Attention | FeedForward):
            yield module


@dataclass(frozen=True)
class BlockSettings:
    """What one forward sets on a block's modules; kept on the model too, so a block built during the
    forward (`ltx_engine.loading.streaming` binds them one at a time) gets the same as a resident one."""

    routing: Routing | None = None
    dtype: mx.Dtype | None = None


def configure_block(block, index: int, settings: BlockSettings | None) -> None:
    """Block `index`'s attention / feed-forward modules set for this forward (None clears them)."""
    settings = settings or BlockSettings()
    if "attn1" in block and index >= SPARSE_DENSE_BLOCKS:
        block.attn1._sparse = settings.routing
    for _, module in block.named_modules():
        if isinstance(module, Attention | FeedForward):
            module._compute = settings.dtype


@contextmanager
def applied(model, options: ForwardOptions, positions: np.ndarray | None) -> Iterator[None]:
    """The options set on the model's modules for one forward; video `positions` give the frame size."""
    routing = None
    if options.sparse_tau is not None and positions is not None:
        routing = Routing(float(options.sparse_tau), frame_tokens(positions))
    settings = BlockSettings(routing, dtype_of(options.compute_dtype))
    model._block_settings = settings
    for index, block in enumerate(model.transformer_blocks):
        configure_block(block, index, settings)
    others = [m for name, m in model.named_modules() if isinstance(m, Attention | FeedForward)
              and not name.startswith("transformer_blocks")] if settings.dtype is not None else []
    for module in others:
        module._compute = settings.dtype
    try:
        yield
    finally:
        model._block_settings = None
        for index, block in enumerate(model.transformer_blocks):
            configure_block(block, index, None)
        for module in others:
            module._compute = None


def _finite(outputs: tuple) -> bool:
    return all(o is None or bool(mx.all(mx.isfinite(o)).item()) for o in outputs)


def run(model, call: Callable[[], tuple], options: ForwardOptions | None, positions: np.ndarray | None) -> tuple:
    """`call()` (one forward, outputs evaluated) under the options, with the overflow guard."""
    if options is None or options.plain:
        return call()
    with applied(model, options, positions):
        outputs = call()
    if dtype_of(options.compute_dtype) is None or _finite(outputs):
        return outputs
    log.warning("a %s forward overflowed (non-finite output): computed again in float32", options.compute_dtype)
    with applied(model, ForwardOptions(options.sparse_tau, None), positions):
        return call()
