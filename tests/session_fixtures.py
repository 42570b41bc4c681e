"""What a test session makes once and many modules read: tiny packs, packs folders linked from them, and
`farm render --local` references of the tiny pack.

Writing the tiny LTX-2.5 pack costs seconds each time; a dozen modules used to write their own identical
copy (seed 0). A module that needs a packs folder of its own (an extra pack beside tiny25, or a pack with a
file missing) links these instead of writing again. The session's packs are never written to: a module
that changes a pack's files copies it first. A reference render depends only on its spec and the pack, so
modules that render the same spec share one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny25_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LTX-2.5 pack (seed 0), as `write_tiny_pack(..., variant="2.5")` writes it."""
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    return write_tiny_pack(tmp_path_factory.mktemp("session-tiny25") / "tiny25", seed=0, variant="2.5")


@pytest.fixture(scope="session")
def tiny_dev_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pack in the dev-only layout (seed 0): a dev DiT and the distilled LoRA, for the guided recipes."""
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    return write_tiny_pack(tmp_path_factory.mktemp("session-dev") / "dev", seed=0, layout="dev-only")


@pytest.fixture(scope="session")
def packs25(tiny25_pack: Path, tiny_packs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packs folder holding `tiny25` and the 2.3 `tiny` (links to the session's packs)."""
    return link_packs(tmp_path_factory.mktemp("session-packs25"), tiny25=tiny25_pack, tiny=tiny_packs / "tiny")


@pytest.fixture(scope="session")
def runner25(packs25: Path):
    """One in-process Runner over `packs25` for the session's `--local` references: models stay warm."""
    from worker.runner import Runner

    return Runner(packs25)


@pytest.fixture(scope="session")
def local_reference(local_runner, tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict], tuple]:
    """spec -> `render_local`'s (mp4, task outputs, blobs) on the session's tiny packs, rendered once per
    spec in the session (the session's `local_runner`); callers never change what it returns."""
    from farm_cli.local import render_local

    folder, cache = tmp_path_factory.mktemp("session-local"), {}

    def reference(spec: dict) -> tuple:
        key = json.dumps(spec, sort_keys=True)
        if key not in cache:
            cache[key] = render_local(dict(spec), folder / f"{len(cache)}.mp4", local_runner)
        return cache[key]

    return reference


def link_packs(folder: Path, **packs: Path) -> Path:
    """`folder` with each name a link to its pack folder; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in packs.items():
        (folder / name).symlink_to(target, target_is_directory=True)
    return folder


def pack_without(folder: Path, pack: Path, *missing: str) -> Path:
    """`folder` made a pack of `pack`'s files (links) less the named ones: a pack lacking a component."""
    folder.mkdir(parents=True)
    for f in pack.iterdir():
        if f.name not in missing:
            (folder / f.name).symlink_to(f)
    return folder
