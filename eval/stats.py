"""Statistics beside every score: chance level, confidence intervals, Matthews correlation.

A score means little without its uncertainty: 50 RuBLiMP pairs at 0.62 accuracy cannot be told
from chance (0.5), 1000 pairs can. Accuracy gets a Wilson score interval (right near 0 and 1 and
for small n, unlike the normal approximation); MCC gets a seeded percentile bootstrap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; ``successes`` may be fractional (tie credit)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at 0 or n successes the bound is exactly 0 or 1: centre - half leaves a rounding residue (3e-18) that
    # would read as 'above' a baseline scoring 0
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return (low, high)


def matthews_corrcoef(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """MCC of binary labels; 0.0 when a row or column of the confusion matrix is empty (sklearn's rule)."""
    t = np.asarray(y_true, dtype=np.int64)
    p = np.asarray(y_pred, dtype=np.int64)
    tp = float(np.sum((t == 1) & (p == 1)))
    tn = float(np.sum((t == 0) & (p == 0)))
    fp = float(np.sum((t == 0) & (p == 1)))
    fn = float(np.sum((t == 1) & (p == 0)))
    denom = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denom == 0 else (tp * tn - fp * fn) / denom


def bootstrap_interval(aggregate: Callable[[list[int]], float], n: int, seed: int = 0, resamples: int = 1000,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of a score over ``n`` items: ``aggregate`` of the item indices drawn with
    replacement, ``resamples`` times with a fixed seed (deterministic)."""
    if n == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    values = np.array([aggregate(list(row)) for row in rng.integers(0, n, size=(resamples, n))])
    alpha = (1.0 - level) / 2
    return (float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha)))


def chance_accuracy(choice_counts: Sequence[int]) -> float:
    """Expected accuracy of uniform guessing: the mean of 1/choices over items."""
    if not choice_counts:
        return 0.0
    return float(np.mean([1.0 / c for c in choice_counts]))


def tie_aware_correct(scores: Sequence[float], gold: int) -> float:
    """Credit for one item: 1 if gold alone scores highest, 1/k if it ties with k-1 others, else 0.

    Plain argmax would hand every tie to the first choice; RuBLiMP's gold is always the first
    sentence, so a model that scores both sentences the same would look perfect.
    """
    best = max(scores)
    if scores[gold] < best:
        return 0.0
    tied = sum(1 for s in scores if s == best)
    return 1.0 / tied
