"""Harmony's regrouping rules: 5 % similarity for replacements, no regrouping under 5 % gain, the
fewest jobs moved unless 5 % better; and the policy applying them on completions."""
from __future__ import annotations

import pytest

from rm.policies.harmony_regroup import fewest_within, replacement, similar, worth_regrouping


def test_similar_means_iteration_time_and_comp_share_within_five_percent():
    finished = (4.0, 1.0)                          # 5 s, 80 % COMP
    assert similar((4.1, 1.05), finished)          # 5.15 s (+3 %), 79.6 % COMP
    assert not similar((4.4, 1.1), finished)       # 5.5 s: +10 %
    assert not similar((3.5, 1.5), finished)       # 5 s but 70 % COMP
    assert similar((4.0, 1.0), finished, tolerance=0.0)


def test_replacement_prefers_the_closest_single_job_then_a_bundle():
    finished = (4.0, 1.0)
    candidates = [("far", (1.0, 1.0)), ("near", (4.1, 1.0)), ("nearest", (4.0, 1.01))]
    assert replacement(finished, candidates) == ["nearest"]
    # No single job is close, but two halves together are.
    halves = [("x", (1.0, 3.0)), ("a", (2.0, 0.5)), ("b", (2.02, 0.49))]
    assert replacement(finished, halves) == ["a", "b"]
    assert replacement(finished, [("x", (1.0, 3.0))]) is None


def test_no_regrouping_under_a_five_percent_gain():
    assert not worth_regrouping(0.80, 0.83)
    assert worth_regrouping(0.80, 0.84 + 1e-9)
    assert worth_regrouping(0.0, 0.1)
    assert not worth_regrouping(0.0, 0.0)


def test_the_fewest_jobs_win_unless_more_jobs_are_five_percent_better():
    assert fewest_within([(2, 0.80), (5, 0.83), (9, 0.835)]) == 0
    assert fewest_within([(2, 0.80), (5, 0.85), (9, 0.86)]) == 1
    with pytest.raises(ValueError):
        fewest_within([])
