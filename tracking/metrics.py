"""Money in W&B: rubles spent as a metric that loss can be plotted against.

The trainer calls ``define_cost_metrics(run)`` once, then ``log_step(run, step, metrics, cost_metrics)``
at every log step, where ``cost_metrics`` are the running cost's ``cost/*`` entries (the cost
package's ``CostSummary.step_metrics()``, which owns those names; tracking does not know the
ledger). It logs the metrics, the running cost, and a copy of each loss key under ``by_rub/``
whose x-axis is ``cost/rub_spent`` (so W&B draws loss against rubles by default while the plain
keys keep the step axis).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RUB_SPENT = "cost/rub_spent"
BY_RUB_PREFIX = "by_rub/"
DEFAULT_LOSS_KEYS = ("train/loss", "eval/loss", "val/loss")


def define_cost_metrics(run: Any) -> None:
    """Declare ``cost/rub_spent`` and make it the x-axis of every ``by_rub/*`` key."""
    run.define_metric(RUB_SPENT, summary="max")
    run.define_metric(f"{BY_RUB_PREFIX}*", step_metric=RUB_SPENT)


def by_rubles(metrics: Mapping[str, Any], keys: Iterable[str] = DEFAULT_LOSS_KEYS) -> dict[str, Any]:
    return {f"{BY_RUB_PREFIX}{key}": metrics[key] for key in keys if key in metrics}


def log_step(run: Any, step: int, metrics: Mapping[str, Any], cost_metrics: Mapping[str, float],
             loss_keys: Iterable[str] = DEFAULT_LOSS_KEYS) -> dict[str, Any]:
    """Log ``metrics`` at ``step`` with the running cost and their loss-against-rubles copies."""
    payload = {**metrics, **cost_metrics, **by_rubles(metrics, loss_keys)}
    run.log(payload, step=int(step))
    return payload
