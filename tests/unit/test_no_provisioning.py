"""A test never changes the machine: system tools the suite drives are provisioned by `.ci/run`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLERS = re.compile(r"""["'](apt-get|apt|dpkg|brew|dnf|yum|apk|snap)["']|pip["']?,\s*["']install""")


def test_no_test_runs_a_package_manager() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name != Path(__file__).name
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if INSTALLERS.search(line)
    ]
    assert offenders == [], f"tests that run a package manager: {offenders}"


def test_ci_provisions_the_tools_tests_skip_without() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for tool in ("chromium", "tmux"):
        assert f"missing+=({tool})" in ci, tool
        assert tool in readme.split("## Using it")[0], f"README's test notes do not name {tool}"
    assert "set -euo pipefail" in ci
    readme_cmd = next(line.strip() for line in readme.splitlines() if "pytest -q" in line)
    assert readme_cmd in ci, "the tests command in .ci/run must be the README's"
