"""What a test needs from outside the project: a system program, a Python module or reference package, a
service, a privilege.

Locally a test whose need is missing skips and says what is missing. Under CI=true `.ci/run` has
provisioned every one of them, so a skip for a missing need means a part of the suite did not run:
tests/conftest.py turns it into a failure naming the need. The rule reads the skip's reason, so every
such skip goes through these helpers (or pytest.importorskip, whose reason the rule also knows).
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

KINDS = ("program", "module", "package", "service", "privilege")
# The one list of reasons that mean "a need is missing": ours, and pytest.importorskip's own wording.
MISSING_REASONS = (
    re.compile(rf"^missing ({'|'.join(KINDS)}): (?P<what>[^ ]+)"),
    re.compile(r"^could not import '(?P<what>[^']+)'"),
)


def missing_need(reason: str) -> str | None:
    """The need a skip reason names as missing, or None when the skip is for something else."""
    for pattern in MISSING_REASONS:
        found = pattern.match(reason)
        if found:
            return found.group("what")
    return None


def on_ci() -> bool:
    """CI provisions every need (.ci/run): there a missing one is a failure, not a skip."""
    return os.environ.get("CI") == "true"


def skip_missing(kind: str, what: str, why: str) -> None:
    """Skip this test for a missing need, in the wording the CI rule reads."""
    if kind not in KINDS:
        raise ValueError(f"unknown need kind {kind!r}; one of {', '.join(KINDS)}")
    pytest.skip(f"missing {kind}: {what} ({why})")


def require_program(name: str, *alternatives: str) -> str:
    """The path of a system program (or of its first alternative found); tests never install one."""
    for candidate in (name, *alternatives):
        found = shutil.which(candidate)
        if found:
            return found
    skip_missing("program", name, ".ci/run provisions it; tests never install system packages")
    raise AssertionError("unreachable: pytest.skip raises")
