"""Every planner corpus case (tests/planner_corpus) plans today as it was recorded: the same tasks, field for
field, and the same stored spec; or the same one-line refusal. Pure: no Redis, no gRPC; the fleets' pack
facts are read from the session's tiny packs on disk, the media from small files written here.

A deliberate planner change re-records the corpus: `python -m tests.planner_corpus --write`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.planner_corpus.corpus import CASES, Planner
from tests.planner_corpus.record import explain, load
from tests.session_fixtures import link_packs

RECORD = load()


@pytest.fixture(scope="module")
def planner(tiny_packs: Path, tiny25_pack: Path, tiny_dev_pack: Path, tmp_path_factory) -> Planner:
    packs = link_packs(tmp_path_factory.mktemp("corpus-packs"), tiny=tiny_packs / "tiny", tiny25=tiny25_pack,
                       dev=tiny_dev_pack)
    return Planner(packs, tmp_path_factory.mktemp("corpus-media"))


@pytest.mark.timeout(30)
def test_the_record_holds_every_case_and_no_other():
    assert list(RECORD) == list(CASES), "re-record: python -m tests.planner_corpus --write"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_case_plans_as_recorded(name: str, planner: Planner):
    problem = explain(name, RECORD.get(name) or {}, planner.outcome(CASES[name]))
    assert problem is None, problem
