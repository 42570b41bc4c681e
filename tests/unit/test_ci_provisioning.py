"""System tools the suite drives are provisioned by `.ci/run` (which also refuses a test that runs a
package manager); the README says so and its test command is the one CI runs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_provisions_the_tools_tests_skip_without() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for tool in ("chromium", "tmux"):
        assert f"missing+=({tool})" in ci, tool
        assert tool in readme.split("## Using it")[0], f"README's test notes do not name {tool}"
    assert "set -euo pipefail" in ci
    readme_cmd = next(line.strip() for line in readme.splitlines() if "pytest -q" in line)
    assert readme_cmd in ci, "the tests command in .ci/run must be the README's"
