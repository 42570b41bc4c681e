"""`farm recipes` through the CLI (every recipe with its flag, components and a 4-Mac cost no larger
than the 1-Mac one), and the recipe fact pages on disk exactly what their writer writes from the data."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from coordinator.plan.recipes import SHOWN
from farm_cli import recipe_pages
from farm_cli.main import app


def test_farm_recipes_lists_every_recipe_with_its_flag_components_and_cost() -> None:
    text = CliRunner().invoke(app, ["recipes"])
    assert text.exit_code == 0, text.output
    for recipe in SHOWN:
        assert f"{recipe.name}: {recipe.purpose}" in text.output and f"pick it:    {recipe.flag}" in text.output
        assert f"components: {', '.join(recipe.components)}" in text.output
    result = CliRunner().invoke(app, ["recipes", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["render"] == "768x512x49" and "M4 Pro" in data["mac"]
    rows = {row["name"]: row for row in data["recipes"]}
    assert list(rows) == [r.name for r in SHOWN]
    for recipe in SHOWN:
        row = rows[recipe.name]
        assert row["flag"] == recipe.flag and row["components"] == list(recipe.components)
        one, four = row["wall_s"]["1"], row["wall_s"]["4"]
        if isinstance(one, float) and isinstance(four, float):
            assert 0 < four <= one, recipe.name
    assert rows["distilled"]["wall_s"]["1"] > 0 and rows["one-stage"]["wall_s"]["4"] < rows["one-stage"]["wall_s"]["1"]


def test_the_recipe_pages_on_disk_are_what_the_writer_writes() -> None:
    written = recipe_pages.pages()
    on_disk = {p.name: p.read_text() for p in recipe_pages.FOLDER.glob("*.md")}
    assert set(on_disk) == set(written) == {"README.md", *(f"{r.name}.md" for r in SHOWN)}
    stale = [name for name, text in written.items() if on_disk[name] != text]
    assert not stale, f"run python -m farm_cli.recipe_pages --write: {stale} differ from the recipe data"
