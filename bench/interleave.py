"""Interleaved rounds for the benchmarks: every side runs once per round and the order rotates, so a slow
spell of a shared machine hits every side and no side always goes first (or always runs on a warm cache).

A ratio between two sides is the median of the per-round ratios, with every round's ratio beside it: the
spread says how much one run of this machine can be trusted.

Imported by the scripts in this folder as ``from interleave import ...`` (a script's own folder is on
``sys.path`` when it runs).
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def interleaved_rounds(sides: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Call each side once per round, round ``r`` starting at side ``r mod n``; each side's results in order."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(sides)
    results: dict[str, list[T]] = {name: [] for name in names}
    for round_number in range(rounds):
        first = round_number % len(names)
        for name in names[first:] + names[:first]:
            results[name].append(sides[name]())
    return results


def median_ratio(numerators: Sequence[float], denominators: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """Median, range and list of the per-round ratios numerator / denominator."""
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return {"median": round(statistics.median(ratios), digits), "min": round(min(ratios), digits),
            "max": round(max(ratios), digits), "rounds": [round(r, digits) for r in ratios]}


def medians(results: Mapping[str, Sequence[float]], digits: int = 4) -> dict[str, float]:
    """Each side's median over the rounds."""
    return {name: round(statistics.median(values), digits) for name, values in results.items()}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), which every benchmark records beside its figures."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
