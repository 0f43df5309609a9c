"""Money in W&B: rubles spent as a metric that loss can be plotted against, totals in the summary.

The trainer calls ``define_cost_metrics(run)`` once, then ``log_step(run, step, metrics, ledger.summary())``
at every log step: it logs the metrics, the running cost under ``cost/``, and a copy of each loss
key under ``by_rub/`` whose x-axis is ``cost/rub_spent`` (so W&B draws loss against rubles by default
while the plain keys keep the step axis). ``log_cost_summary`` puts the totals in the run summary and
the price row and the dated rate in the run config (``log_cost_config`` does the latter alone, for
the start of a run, so a run that dies early still says what it was priced at).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RUB_SPENT = "cost/rub_spent"
BY_RUB_PREFIX = "by_rub/"
DEFAULT_LOSS_KEYS = ("train/loss", "eval/loss", "val/loss")
SUMMARY_KEYS = ("rub_total", "usd_total", "hours", "chip_hours", "tokens", "rub_per_1b_tokens",
                "rub_lost_to_restarts", "projected_rub_to_budget", "projected_rub_total", "usd_rub_rate")


def define_cost_metrics(run: Any) -> None:
    """Declare ``cost/rub_spent`` and make it the x-axis of every ``by_rub/*`` key."""
    run.define_metric(RUB_SPENT, summary="max")
    run.define_metric(f"{BY_RUB_PREFIX}*", step_metric=RUB_SPENT)


def cost_entries(summary: Mapping[str, Any]) -> dict[str, float]:
    """The running cost of a ledger summary as ``cost/*`` metrics (None values are left out)."""
    values = {
        RUB_SPENT: summary.get("rub_total"),
        "cost/usd_spent": summary.get("usd_total"),
        "cost/hours": summary.get("hours"),
        "cost/tokens": summary.get("tokens"),
        "cost/rub_per_1b_tokens": summary.get("rub_per_1b_tokens"),
        "cost/rub_lost_to_restarts": summary.get("rub_lost_to_restarts"),
        "cost/projected_rub_total": summary.get("projected_rub_total"),
    }
    return {key: float(value) for key, value in values.items() if value is not None}


def by_rubles(metrics: Mapping[str, Any], keys: Iterable[str] = DEFAULT_LOSS_KEYS) -> dict[str, Any]:
    return {f"{BY_RUB_PREFIX}{key}": metrics[key] for key in keys if key in metrics}


def log_step(run: Any, step: int, metrics: Mapping[str, Any], ledger_summary: Mapping[str, Any],
             loss_keys: Iterable[str] = DEFAULT_LOSS_KEYS) -> dict[str, Any]:
    """Log ``metrics`` at ``step`` with the running cost and their loss-against-rubles copies."""
    payload = {**metrics, **cost_entries(ledger_summary), **by_rubles(metrics, loss_keys)}
    run.log(payload, step=int(step))
    return payload


def log_cost_summary(run: Any, ledger_summary: Mapping[str, Any]) -> None:
    """Totals into the run summary (``cost/*``); the price row and the dated rate into the run config."""
    for key in SUMMARY_KEYS:
        value = ledger_summary.get(key)
        if value is not None:
            run.summary[f"cost/{key}"] = value
    for phase, rub in ledger_summary.get("rub_by_phase", {}).items():
        run.summary[f"cost/rub_by_phase/{phase}"] = rub
    log_cost_config(run, ledger_summary)


def log_cost_config(run: Any, ledger_summary: Mapping[str, Any]) -> None:
    """The price row, chips and dated USD->RUB rate into the run config (call at the start, too)."""
    run.config.update({"cost_price_row": dict(ledger_summary.get("price", {})),
                       "cost_chips": ledger_summary.get("chips"),
                       "cost_usd_rub_rate": ledger_summary.get("usd_rub_rate"),
                       "cost_rate_date": ledger_summary.get("rate_date"),
                       "cost_rate_source": ledger_summary.get("rate_source")}, allow_val_change=True)
