"""The fleet as the planner asks about it: the registered workers' capabilities, typed once. Pure.

Why a record: the planner's checks ask the same few questions of the workers (who holds the pack; what
they say of its components, generation, features and bytes; their memory and chips; which text encoders
they hold), and as a list of capability dicts each check re-read the keys with its own `or {}`.
`Fleet.of` builds the record once where the planner is entered (Submit, the reducer's second phase,
`farm plan`, `--local`, the benches) from the capability dicts the store keeps, a fleet file describes
or a test writes. A question no worker answers is None (the check that needs it passes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


def _frozen(value: object) -> Mapping:
    return MappingProxyType(dict(value)) if isinstance(value, Mapping) else MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Worker:
    """One registered worker's capabilities as the planner reads them (0 / empty: not said)."""

    chip: str = ""
    memory_bytes: int = 0
    packs: frozenset[str] = frozenset()
    pack_bytes: Mapping[str, int] = field(default_factory=dict)
    pack_generation: Mapping[str, str] = field(default_factory=dict)
    pack_components: Mapping[str, frozenset[str]] = field(default_factory=dict)  # only the packs it describes
    pack_features: Mapping[str, frozenset[str]] = field(default_factory=dict)
    pack_problems: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    text_encoders: frozenset[str] | None = None  # None: it does not say which it holds

    @classmethod
    def of(cls, caps: Mapping) -> Worker:
        """A capability dict (a registration as stored, a fleet file's row) read once."""
        encoders = caps.get("text_encoders")

        def sets(key: str) -> Mapping[str, frozenset[str]]:
            return _frozen({p: frozenset(c) for p, c in _frozen(caps.get(key)).items() if c is not None})

        return cls(chip=str(caps.get("chip") or ""), memory_bytes=int(caps.get("memory_bytes") or 0),
                   packs=frozenset(caps.get("packs") or ()),
                   pack_bytes=_frozen({p: int(b or 0) for p, b in _frozen(caps.get("pack_bytes")).items()}),
                   pack_generation=_frozen(caps.get("pack_generation")), pack_components=sets("pack_components"),
                   pack_features=sets("pack_features"),
                   pack_problems=_frozen({p: _frozen(v) for p, v in _frozen(caps.get("pack_problems")).items()}),
                   text_encoders=frozenset(encoders) if isinstance(encoders, Mapping) else None)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The registered workers (empty: nobody registered yet, so the render waits for workers)."""

    workers: tuple[Worker, ...] = ()

    @classmethod
    def of(cls, fleet: Fleet | Iterable[Mapping]) -> Fleet:
        """The record, from capability dicts (a Fleet already built is kept)."""
        return fleet if isinstance(fleet, Fleet) else cls(tuple(Worker.of(caps) for caps in fleet))

    def __bool__(self) -> bool:
        return bool(self.workers)

    def __len__(self) -> int:
        return len(self.workers)

    def holders(self, pack: str) -> Fleet:
        """The workers holding the pack."""
        return Fleet(tuple(w for w in self.workers if pack in w.packs))

    def pack_bytes(self, pack: str) -> int | None:
        """The pack's weight bytes as its holders report them, or None when none does."""
        sizes = [w.pack_bytes.get(pack, 0) for w in self.workers]
        return max(sizes) if any(sizes) else None

    def generations(self, pack: str) -> set[str]:
        """The LTX generations the workers report for the pack (two: they hold different packs)."""
        return {w.pack_generation[pack] for w in self.workers if pack in w.pack_generation}

    def components(self, pack: str) -> frozenset[str] | None:
        """The pack's components some worker holds; None when no worker describes them."""
        described = [w.pack_components[pack] for w in self.workers if pack in w.pack_components]
        return frozenset().union(*described) if described else None

    def problem(self, pack: str, component: str) -> str | None:
        """Why a describing worker cannot serve a component (its own line), if one says."""
        for w in self.workers:
            if pack in w.pack_components:
                said = w.pack_problems.get(pack) or {}
                if said.get(component) or said.get("pack"):
                    return said.get(component) or said.get("pack")
        return None

    def features(self, pack: str) -> frozenset[str] | None:
        """The pack features some holder reports (DFR's upsampler, keyframes); None when none says."""
        described = [w.pack_features[pack] for w in self.workers if pack in w.packs and pack in w.pack_features]
        return frozenset().union(*described) if described else None

    def text_encoders(self) -> frozenset[str] | None:
        """The names of the separate text encoders some worker holds; None when no worker says."""
        said = [w.text_encoders for w in self.workers if w.text_encoders is not None]
        return frozenset().union(*said) if said else None

    def memories(self) -> tuple[int, ...]:
        """Each worker's memory bytes that it reported (unknown ones left out)."""
        return tuple(w.memory_bytes for w in self.workers if w.memory_bytes > 0)

    def largest_memory(self) -> int:
        """The most memory one worker has (0: none said)."""
        return max(self.memories(), default=0)
