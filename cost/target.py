"""Rubles to reach a quality: what a run had spent when its validation metric first reached a target.

The comparison's formula is the one public TPU/GPU cost comparisons use (MLPerf Training's
time-to-train, https://mlcommons.org/benchmarks/training/, times the price): the money, chip-hours,
wall time and tokens of the run at the moment its quality first reached the target. Quality is
measured only at eval points (``train.eval_every``), so the moment is interpolated linearly between
the last eval point short of the target and the first one past it, in every figure alike (rubles,
hours, tokens, step). A run whose first eval point is already past the target is read at that point
(nothing earlier was measured). A run that never reaches it is "not reached", with its best value.

The eval points come from the run's logged history (W&B, or ``train_log.jsonl`` in its run folder):
rows holding the metric and ``cost/rub_spent``, ``cost/hours``, ``cost/tokens`` (the trainer logs
eval results with the running cost).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiment.errors import DataError
from experiment.jsonl import read_jsonl
from experiment.sections.cost import CostConfig
from experiment.storage import location
from tracking.metrics import RUB_SPENT

TRAIN_LOG = "train_log.jsonl"  # the trainer's one JSON line per log step, in the run folder
BPB_METRIC = "eval/val_bpb"  # validation bits per byte during training (eval.run.evaluate_model)
HOURS, TOKENS = "cost/hours", "cost/tokens"  # cost.summary.WANDB_NAMES' step names
STEP_KEYS = ("train/step", "_step")


@dataclass(frozen=True)
class Target:
    metric: str  # a history key, e.g. eval/val_bpb or eval/rublimp/acc
    value: float
    lower_is_better: bool

    def reached(self, value: float) -> bool:
        return value <= self.value if self.lower_is_better else value >= self.value

    def better(self, a: float, b: float) -> float:
        return min(a, b) if self.lower_is_better else max(a, b)

    @property
    def label(self) -> str:
        return f"{self.metric} {'<=' if self.lower_is_better else '>='} {self.value:g}"


@dataclass(frozen=True)
class EvalPoint:
    """One eval during training with the run's running cost at that moment."""

    step: float
    value: float
    rub: float
    hours: float
    tokens: float


@dataclass(frozen=True)
class TargetCrossing:
    reached: bool
    best: float | None  # the best value of any eval point (None: no eval point)
    rub: float | None = None  # at the crossing; None when not reached
    hours: float | None = None
    tokens: float | None = None
    step: float | None = None
    interpolated: bool = False  # False: read at an eval point (the first one was already past the target)

    def status(self, target: Target) -> str:
        if self.best is None:
            return f"no eval point with {target.metric}"
        if self.reached:
            return f"at step {self.step:,.0f} ({'interpolated' if self.interpolated else 'first eval'})"
        return f"not reached (best {self.best:.4g})"


def target_of(cost_cfg: CostConfig, eval_metric: str | None) -> Target | None:
    """``cost.target_bpb`` (validation bits per byte, lower is better) or ``cost.target_score`` (higher is
    better) on ``cost.target_metric``, else the comparison's eval metric; None: no target configured."""
    if cost_cfg.target_bpb is not None:
        return Target(BPB_METRIC, float(cost_cfg.target_bpb), lower_is_better=True)
    if cost_cfg.target_score is not None:
        metric = cost_cfg.target_metric or eval_metric
        if not metric:
            raise DataError("config key 'cost.target_score': no eval metric found to reach it: set "
                            "cost.target_metric (e.g. eval/rublimp/acc) and train.eval_every")
        return Target(metric, float(cost_cfg.target_score), lower_is_better=False)
    return None


def _number(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def eval_points(history: Iterable[Mapping[str, Any]], metric: str) -> list[EvalPoint]:
    """The history rows with ``metric`` and the running cost, by step (a retraced step: its last row)."""
    by_step: dict[float, EvalPoint] = {}
    for row in history:
        value, rub = _number(row, metric), _number(row, RUB_SPENT)
        step = next((s for s in (_number(row, k) for k in STEP_KEYS) if s is not None), None)
        if value is None or rub is None or step is None:
            continue
        by_step[step] = EvalPoint(step, value, rub, _number(row, HOURS) or 0.0, _number(row, TOKENS) or 0.0)
    return [by_step[s] for s in sorted(by_step)]


def cost_to_target(points: Sequence[EvalPoint], target: Target) -> TargetCrossing:
    """Rubles, hours, tokens and step when ``points`` (in step order) first reach ``target``."""
    if not points:
        return TargetCrossing(False, None)
    best = points[0].value
    for value in (p.value for p in points[1:]):
        best = target.better(best, value)
    for index, point in enumerate(points):
        if not target.reached(point.value):
            continue
        if index == 0:
            return TargetCrossing(True, best, point.rub, point.hours, point.tokens, point.step, interpolated=False)
        before = points[index - 1]
        # the share of the way from the last point short of the target to the first one past it
        share = (before.value - target.value) / (before.value - point.value)

        def at(a: float, b: float, share: float = share) -> float:
            return a + share * (b - a)

        return TargetCrossing(True, best, at(before.rub, point.rub), at(before.hours, point.hours),
                              at(before.tokens, point.tokens), at(before.step, point.step), interpolated=True)
    return TargetCrossing(False, best)


def best_so_far(points: Sequence[EvalPoint], lower_is_better: bool) -> list[tuple[float, float]]:
    """(rubles, best value reached up to then) at each eval point: a run's quality-for-money curve."""
    pick = min if lower_is_better else max
    curve: list[tuple[float, float]] = []
    for point in points:
        curve.append((point.rub, point.value if not curve else pick(curve[-1][1], point.value)))
    return curve


def read_train_log(run_root: Path) -> list[dict[str, Any]]:
    """``train_log.jsonl`` of a run folder (empty when absent). A torn last line is a record being
    written (compare and plan read runs still training) and is ignored; a damaged line before it is a
    DataError naming the file and line."""
    return read_jsonl(location(run_root) / TRAIN_LOG, torn_tail="ignore", missing_ok=True).values
