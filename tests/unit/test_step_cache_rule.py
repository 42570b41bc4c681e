"""The step-cache rule (TeaCache as the MLX port runs it): the distance, the port's polynomial, the
accumulate-and-skip decision with the first and last steps computed, and the threshold's refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ltx_engine.rules import step_cache as sc

pytestmark = pytest.mark.timeout(30)


def test_relative_l1_is_the_mean_change_over_the_previous_mean():
    prev = np.array([1.0, -2.0, 3.0, -4.0], np.float32)
    cur = prev + np.array([0.5, 0.5, -0.5, 0.5], np.float32)
    assert sc.relative_l1(cur, prev) == pytest.approx(0.5 / 2.5)
    assert sc.relative_l1(prev, prev) == 0.0
    assert sc.relative_l1(prev, np.zeros(4, np.float32)) == math.inf


def test_rescale_is_the_ports_degree_one_fit():
    assert sc.rescale(0.0) == pytest.approx(0.40915524073366694)
    assert sc.rescale(1.0) == pytest.approx(1.3641334114092996 + 0.40915524073366694)
    assert sc.rescale(2.0, (1.0, 0.0, 0.0)) == 4.0  # highest degree first


def test_first_last_and_no_previous_gate_always_compute():
    for step, distance in ((0, 0.0), (9, 0.0), (4, None)):
        assert sc.decide(step, 10, distance, 0.3, 100.0) == sc.Decision(True, 0.0)


def test_skips_while_the_sum_stays_under_the_threshold_then_computes_and_resets():
    first = sc.decide(1, 10, 0.05, 0.0, 1.0)  # 0.409 + 0.068 < 1
    assert not first.compute and first.accumulated == pytest.approx(sc.rescale(0.05))
    second = sc.decide(2, 10, 0.05, first.accumulated, 1.0)  # 2 x 0.477 < 1: skips again
    assert not second.compute
    third = sc.decide(3, 10, 0.05, second.accumulated, 1.0)  # 3 x 0.477 >= 1: computes, sum reset
    assert third == sc.Decision(True, 0.0)


def test_a_threshold_under_the_constant_term_never_skips():
    assert all(sc.decide(s, 10, 0.0, 0.0, 0.4).compute for s in range(10))


def test_the_decision_is_a_function_of_its_inputs_alone():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 64, 32)).astype(np.float32)
    d1, d2 = sc.relative_l1(b, a), sc.relative_l1(b.copy(), a.copy())
    assert d1 == d2 and sc.decide(3, 8, d1, 0.2, 1.5) == sc.decide(3, 8, d2, 0.2, 1.5)


@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan, -math.inf])
def test_negative_or_non_finite_thresholds_are_refused(bad):
    with pytest.raises(ValueError, match="step-cache threshold .* must be a finite number >= 0"):
        sc.check_threshold(bad)


def test_zero_and_positive_thresholds_pass():
    assert sc.check_threshold(0) == 0.0 and sc.check_threshold("1.5") == 1.5
