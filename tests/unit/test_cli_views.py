"""Terminal text of renders: piped progress lines and the rows of the one list view (`farm ls`, `farm status`)."""

from __future__ import annotations

from farm_cli.manage import DEFAULT_COLUMNS, table
from farm_cli.remote import progress_printer
from farm_cli.views import duration


def test_progress_lines_read_the_nested_progress_and_skip_empty_beats(capsys) -> None:
    show = progress_printer()
    show({"type": "task_progress", "task": "r1.decode", "progress": {}})  # a heartbeat before any step
    show({"type": "task_progress", "task": "r1.stage1", "progress": {"step": 3, "total": 8}})
    err = capsys.readouterr().err
    assert err.strip() == "stage1: step 3/8" and "None" not in err


def test_list_rows_show_stage_progress_eta_submitter_and_prompt() -> None:
    running = {"id": "r1", "state": "running", "current_stage": "stage2", "current_stage_label": "Stage 2",
               "progress": 0.5, "eta_s": 75, "age_s": 3700, "submitter": "ana@studio", "prompt": "a fox " * 20}
    done = {"id": "r2", "state": "done", "current_stage": "mux", "progress": 1.0}
    header, row, finished = table([running, done], DEFAULT_COLUMNS.split(","))
    assert header.split() == ["id", "state", "stage", "progress", "eta", "age", "by", "prompt"]
    assert "Stage 2" in row and " 50%" in row and "1m15s" in row and "1h01m" in row and "ana@studio" in row
    assert row.endswith("a fox a fox") and duration(None) == "-"
    assert "Mux" not in finished and "100%" in finished


def test_batches_are_prompts_times_seeds_in_one_group(tmp_path) -> None:
    import pytest
    import typer

    from farm_cli.manage import batch_specs, parse_seeds

    assert parse_seeds("1-3,7") == [1, 2, 3, 7]
    with pytest.raises(typer.Exit):
        parse_seeds("3-1")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a fox\n# skipped\n\na heron\n")
    specs = batch_specs({"prompt": "", "seed": 1, "pack": "tiny"}, "5-6", prompts)
    assert [(s["prompt"], s["seed"]) for s in specs] == [("a fox", 5), ("a fox", 6), ("a heron", 5), ("a heron", 6)]
    assert len({s["group"] for s in specs}) == 1 and specs[0]["group"].startswith("g")
