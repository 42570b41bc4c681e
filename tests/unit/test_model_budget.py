"""The worker's model budget: FARM_MODEL_BUDGET_MB when set, else ~60 % of memory; a bad value is one line."""

from __future__ import annotations

import pytest

from worker.memory import device_memory_bytes, model_budget_bytes


def test_budget_from_the_environment_or_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_MODEL_BUDGET_MB", "3")
    assert model_budget_bytes() == 3 * 2**20
    monkeypatch.delenv("FARM_MODEL_BUDGET_MB")
    assert model_budget_bytes() == int(device_memory_bytes() * 0.6)


def test_a_budget_that_is_no_number_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_MODEL_BUDGET_MB", "lots")
    with pytest.raises(SystemExit, match="FARM_MODEL_BUDGET_MB='lots' is not a number of megabytes"):
        model_budget_bytes()
