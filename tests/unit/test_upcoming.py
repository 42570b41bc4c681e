"""Upcoming guesses: each busy worker warms its cache for a different ready task."""

from __future__ import annotations

import pytest

from coordinator.views.upcoming import GUESS_TTL_S, UpcomingGuesses

pytestmark = pytest.mark.timeout(10)
QUEUE = [("t1", ["a"]), ("t2", ["b"]), ("t3", ["c"])]


def test_each_worker_is_told_a_different_task_then_none():
    guesses = UpcomingGuesses(clock=lambda: 0.0)
    assert [guesses.pick(w, QUEUE) for w in ("w1", "w2", "w3", "w4")] == [["a"], ["b"], ["c"], []]


def test_a_workers_new_guess_releases_its_old_one():
    guesses = UpcomingGuesses(clock=lambda: 0.0)
    assert guesses.pick("w1", QUEUE) == ["a"]
    assert guesses.pick("w1", QUEUE[1:]) == ["b"]  # t1 was leased meanwhile: w1 now warms for t2
    assert guesses.pick("w2", QUEUE) == ["a"]  # w1's old guess is free again


def test_a_stale_guess_is_free_again():
    now = [0.0]
    guesses = UpcomingGuesses(clock=lambda: now[0])
    assert guesses.pick("w1", QUEUE) == ["a"]
    now[0] = GUESS_TTL_S + 1
    assert guesses.pick("w2", QUEUE) == ["a"]
