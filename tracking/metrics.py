"""Money in W&B: rubles spent as a metric that every logged series can be plotted against.

The trainer calls ``define_cost_metrics(run)`` once, then ``log_step(run, step, metrics, cost_metrics)``
at every log step, where ``cost_metrics`` are the running cost's ``cost/*`` entries (the cost
package's ``CostSummary.step_metrics()``, which owns those names; tracking does not know the
ledger). It logs the metrics, the running cost, and a copy of each series (``train/*``, ``eval/*``:
loss, eval scores, bits per byte) under ``by_rub/`` whose step metric is ``cost/rub_spent`` (a W&B
metric has one x-axis: the plain keys keep the step, their copies plot against rubles by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RUB_SPENT = "cost/rub_spent"
BY_RUB_PREFIX = "by_rub/"
SERIES_PREFIXES = ("train/", "eval/", "val/")  # what the trainer logs per step; cost/* is the x-axis itself
STEP_KEYS = ("train/step",)  # counters, not series


def define_cost_metrics(run: Any) -> None:
    """Declare ``cost/rub_spent`` and make it the x-axis of every ``by_rub/*`` key."""
    run.define_metric(RUB_SPENT, summary="max")
    run.define_metric(f"{BY_RUB_PREFIX}*", step_metric=RUB_SPENT)


def series_keys(metrics: Mapping[str, Any]) -> list[str]:
    """The numeric series among ``metrics`` (losses, eval scores, rates), step counters left out."""
    return [key for key, value in metrics.items()
            if key.startswith(SERIES_PREFIXES) and key not in STEP_KEYS
            and isinstance(value, (int, float)) and not isinstance(value, bool)]


def by_rubles(metrics: Mapping[str, Any], keys: Iterable[str] | None = None) -> dict[str, Any]:
    """``by_rub/<key>`` copies of ``keys`` (default: every series in ``metrics``)."""
    keys = series_keys(metrics) if keys is None else keys
    return {f"{BY_RUB_PREFIX}{key}": metrics[key] for key in keys if key in metrics}


def log_step(run: Any, step: int, metrics: Mapping[str, Any], cost_metrics: Mapping[str, float],
             loss_keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Log ``metrics`` at ``step`` with the running cost and their against-rubles copies (every series
    unless ``loss_keys`` names some)."""
    payload = {**metrics, **cost_metrics, **(by_rubles(metrics, loss_keys) if RUB_SPENT in cost_metrics else {})}
    run.log(payload, step=int(step))
    return payload


def commit_step(run: Any, step: int) -> None:
    """Send the row of ``step`` now. W&B holds a row logged with an explicit step until a later step or the run's
    end, so the last step's row, with its running cost, would land after the final cost summary and overwrite the
    summary's keys it shares (hours, badput share) with older values."""
    run.log({}, step=int(step), commit=True)
