"""The whole corpus, and its outcomes on the current planner as the record holds them."""

from __future__ import annotations

from pathlib import Path

from tests.planner_corpus.cases import PLANNED
from tests.planner_corpus.refusals import REFUSED
from tests.planner_corpus.run import MEDIA, PACKS, case_digest, normalized, pack_facts, plan_case, write_media

CASES = {c["name"]: c for c in [*PLANNED, *REFUSED]}
assert len(CASES) == len(PLANNED) + len(REFUSED), "two corpus cases share a name"


class Planner:
    """Plans corpus cases against one packs folder and one media folder (written once, when first needed)."""

    def __init__(self, packs_dir: Path, media_dir: Path) -> None:
        self.packs_dir, self.media_dir = packs_dir, media_dir
        self._facts, self._media = None, None

    def facts(self):
        if self._facts is None:
            self._facts = pack_facts(self.packs_dir)
        return self._facts

    def media(self) -> dict[str, Path]:
        if self._media is None:
            self._media = write_media(self.media_dir)
        return self._media

    def outcome(self, case: dict) -> dict:
        """The case's record: its digest with the planner's outcome, paths replaced by placeholders."""
        disk = any(row.get("disk") for row in case.get("fleet") or [])
        got = plan_case(case, self.facts() if disk else None, self.media() if case.get("media") else None)
        roots = {str(self.packs_dir.resolve()): PACKS, str(self.packs_dir): PACKS,
                 str(self.media_dir.resolve()): MEDIA, str(self.media_dir): MEDIA}
        return {"digest": case_digest(case), "recipe": case["recipe"], **normalized(got, roots)}
