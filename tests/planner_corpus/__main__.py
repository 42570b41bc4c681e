"""`python -m tests.planner_corpus --write`: re-record expected.json from the current planner.

Why: a deliberate planner change is re-recorded here and reviewed as the diff of expected.json; without
--write, the cases that plan differently from the record are listed (the test does the same).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests.planner_corpus.corpus import CASES, Planner
from tests.planner_corpus.record import EXPECTED, dumps, explain, load
from tests.planner_corpus.run import write_packs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.planner_corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="re-record expected.json from the current planner")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="planner-corpus-") as tmp:
        planner = Planner(write_packs(Path(tmp) / "packs"), Path(tmp) / "media")
        records = {name: planner.outcome(case) for name, case in CASES.items()}
    if args.write:
        EXPECTED.write_text(dumps(records))
        tally = Counter(r["recipe"] for r in records.values())
        refused = sum("refusal" in r for r in records.values())
        print(f"wrote {EXPECTED}: {len(records)} cases ({refused} refused); by recipe: {dict(sorted(tally.items()))}")
        return 0
    want = load()
    problems = [line for name in CASES if (line := explain(name, want.get(name) or {}, records[name]))]
    print("\n".join(problems) or f"all {len(records)} cases plan as recorded")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
