"""The benchmarks' interleaving: every side once per round, the first side rotating; ratios per round."""

from __future__ import annotations

import pytest

from bench.interleave import interleaved_rounds, median_ratio, medians


def test_every_side_runs_once_per_round_and_each_goes_first_in_turn() -> None:
    calls: list[str] = []
    results = interleaved_rounds({name: lambda name=name: calls.append(name) or len(calls) for name in "abc"}, 4)
    assert calls == list("abc" "bca" "cab" "abc")
    assert results == {"a": [1, 6, 8, 10], "b": [2, 4, 9, 11], "c": [3, 5, 7, 12]}
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleaved_rounds({"a": lambda: 0}, 0)


def test_ratio_is_the_median_of_per_round_ratios_not_the_ratio_of_medians() -> None:
    ratio = median_ratio([10.0, 1.0, 4.0], [1.0, 2.0, 8.0])
    assert ratio == {"median": 0.5, "min": 0.5, "max": 10.0, "rounds": [10.0, 0.5, 0.5]}
    assert medians({"x": [10.0, 1.0, 4.0], "y": [1.0, 2.0, 8.0]}) == {"x": 4.0, "y": 2.0}  # their ratio would say 2
