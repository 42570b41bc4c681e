"""The recipe fact pages (docs/recipes/facts/), written from the rows `farm recipes` prints.

Why generated: a recipe's flags, components, modifiers and cost are data in
`coordinator/plan/recipes/` and the cost model; a hand-kept copy drifts. `python -m
farm_cli.recipe_pages --write` rewrites the pages; a unit test holds the files on disk to what this
writes, so a changed recipe or cost fails until the pages are regenerated.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from farm_cli.recipes import cost_words, recipe_rows

FOLDER = Path(__file__).resolve().parents[1] / "docs" / "recipes" / "facts"
HEADER = "<!-- written by `python -m farm_cli.recipe_pages --write` from coordinator/plan/recipes/: do not edit -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _codes(items: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in items) or "none"


def page(row: dict[str, Any], data: dict[str, Any]) -> str:
    """One recipe's page."""
    cost = row["wall_s"]
    return "\n".join([
        HEADER, "", f"# {row['name']}", "", row["purpose"][0].upper() + row["purpose"][1:] + ".", "",
        f"- Pick it: `{row['flag']}`",
        f"- Its flags: {_codes(row['flags'])}",
        f"- Pack components: {_codes(row['components'])}",
        f"- Modifiers it takes: {_codes(row['modifiers'])}",
        f"- Cost ({data['render']}, predicted wall seconds): {cost_words(cost['1'])} on one Mac, "
        f"{cost_words(cost['4'])} on four; each Mac an {data['mac']}",
        f"- Upstream: {row['upstream']}", "",
        "The hand-written guide to this recipe is in [recipes](../README.md); every recipe's facts: "
        "[index](README.md).", ""])


def index(data: dict[str, Any]) -> str:
    """The index table of every recipe."""
    lines = [HEADER, "", "# Recipe facts", "",
             "Each recipe's facts as `farm recipes` prints them, read from `coordinator/plan/recipes/`. Costs: "
             f"the recipe's default {data['render']} render, predicted wall seconds (`farm plan`'s cost model) "
             f"on one and on four Macs, each an {data['mac']}.", "",
             "| Recipe | Pick it | What it is for | 1 Mac | 4 Macs |", "|---|---|---|---|---|"]
    for row in data["recipes"]:
        cost = row["wall_s"]
        lines.append(f"| [{row['name']}]({row['name']}.md) | `{row['flag']}` | {_cell(row['purpose'])} | "
                     f"{cost_words(cost['1'])} | {cost_words(cost['4'])} |")
    return "\n".join([*lines, ""])


def pages() -> dict[str, str]:
    """Every page's file name and text."""
    data = recipe_rows()
    out = {"README.md": index(data)}
    out.update({f"{row['name']}.md": page(row, data) for row in data["recipes"]})
    return out


def write(folder: Path = FOLDER) -> list[Path]:
    """Write the pages (and remove a page of a recipe that is gone); the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = pages()
    for stale in set(p.name for p in folder.glob("*.md")) - set(texts):
        (folder / stale).unlink()
    for name, text in texts.items():
        (folder / name).write_text(text)
    return [folder / name for name in texts]


def main(argv: list[str]) -> int:
    """`--write` rewrites the pages; without it, exit 1 when a page on disk differs from what is written."""
    if "--write" in argv:
        for path in write():
            print(f"wrote {path}")
        return 0
    stale = [name for name, text in pages().items()
             if not (FOLDER / name).exists() or (FOLDER / name).read_text() != text]
    for name in stale:
        print(f"stale: docs/recipes/facts/{name} (run python -m farm_cli.recipe_pages --write)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
