"""The cost of a run so far, typed: what the ledger adds up, with its W&B names, columns and rows.

``CostSummary`` is what ``Ledger.summary()`` and ``summarize_ledger`` return. It owns how it is
written and read everywhere else: its W&B names (``step_metrics`` at every log step, ``log_to``
for the run summary and config, ``from_wandb`` to read a run back), its columns in the cost
comparison (``COMPARE_COLUMNS`` / ``compare_row``) and its rows by phase (``phase_rows``).

Goodput and badput in rubles, after MaxText's goodput: the phase ``train`` (steps that survived)
is goodput; every other phase is badput (start-up, compilation, data waits, checkpoint stalls,
evaluation, idle time, work lost to restarts, and hangs), reported as rubles and as a share of the run's
rubles (``badput_rows``; summed over the runs of an experiment by ``experiment_badput_rows``).
Every money column comes in RUB with the USD figure and the dated USD->RUB rate beside it.

W&B names: one table, ``WANDB_NAMES``. A figure logged at every step has a history name; the run
summary holds the final value. The running total's history name, ``cost/rub_spent``, is the
x-axis of the ``by_rub/*`` plots, and W&B keeps a ``{"max": ...}`` aggregate of it in the summary,
so the final total is ``cost/rub_total`` there (``cost/usd_spent`` / ``cost/usd_total`` alike).
The price row, chips priced and the dated rate go to the run config, and only there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cost.catalog import PriceRow
from cost.report import SIG, Column
from tracking.metrics import RUB_SPENT

LOST = "lost"  # the phase of work a later session redid
HANG = "hang"  # a step or checkpoint save that outlived its deadline (trainer/watchdog.py), until the process exited
STEADY_PHASES = ("train", "data", "eval", "checkpoint", "idle")  # phases that scale with tokens, for projections
GOODPUT_PHASE = "train"  # steps that survived: the only time that bought progress
# badput in the order a run meets it; "one_off" (per-GB charges) is neither: it is not time
BADPUT_PHASES = ("startup", "compile", "data", "checkpoint", "eval", "idle", LOST, HANG)

RUB_TOTAL = "cost/rub_total"  # the final total in the run summary
# field -> (W&B name at every log step or None, name in the run summary)
WANDB_NAMES: dict[str, tuple[str | None, str]] = {
    "rub_total": (RUB_SPENT, RUB_TOTAL),
    "usd_total": ("cost/usd_spent", "cost/usd_total"),
    "hours": ("cost/hours", "cost/hours"),
    "tokens": ("cost/tokens", "cost/tokens"),
    "rub_per_1b_tokens": ("cost/rub_per_1b_tokens", "cost/rub_per_1b_tokens"),
    "rub_lost_to_restarts": ("cost/rub_lost_to_restarts", "cost/rub_lost_to_restarts"),
    "projected_rub_total": ("cost/projected_rub_total", "cost/projected_rub_total"),
    "chip_hours": (None, "cost/chip_hours"),
    "projected_rub_to_budget": (None, "cost/projected_rub_to_budget"),
    "sessions": (None, "cost/sessions"),
    "last_step": (None, "cost/last_step"),
    "token_budget": (None, "cost/token_budget"),
    "chips_in_use": (None, "cost/chips_in_use"),
    "rub_badput": ("cost/rub_badput", "cost/rub_badput"),
    "badput_share": ("cost/badput_share", "cost/badput_share"),
    "goodput_share": (None, "cost/goodput_share"),
}
PHASE_PREFIXES = {"rub_by_phase": "cost/rub_by_phase/", "seconds_by_phase": "cost/seconds_by_phase/"}
SHARE_PREFIX = "cost/share_by_phase/"  # each phase's share of the run's rubles (derived: written, not read back)
# field -> W&B run config key (what the run was priced at: known from its start)
CONFIG_NAMES = {"price": "cost_price_row", "chips": "cost_chips", "usd_rub_rate": "cost_usd_rub_rate",
                "rate_date": "cost_rate_date", "rate_source": "cost_rate_source"}

COMPARE_COLUMNS = (
    Column("accelerator", "accelerator"),
    Column("chips", "chips", "{:d}"),
    Column("tokens", "tokens", "{:,.0f}"),
    Column("hours", "hours", SIG),
    Column("rub_total", "rubles", SIG),
    Column("usd_total", "USD", SIG),
    Column("rate_label", "RUB per USD (date)"),
    Column("rub_per_1b_tokens", "RUB / 1B tokens", SIG),
    Column("rub_lost_to_restarts", "RUB lost to restarts", SIG),
    Column("rub_badput", "RUB badput", SIG),
    Column("badput_share", "badput share", "{:.1%}"),
)
PHASE_COLUMNS = (Column("phase", "phase"), Column("kind", "goodput / badput"), Column("hours", "hours", SIG),
                 Column("rub", "rubles", SIG), Column("usd", "USD", SIG), Column("share", "share of rubles", "{:.1%}"))


@dataclass(frozen=True)
class CostSummary:
    """Totals of every session of a run, each priced with its own price row and rate; the price,
    chips and rate fields are the latest session's."""

    run_id: str | None
    sessions: int  # 0: not recorded (a W&B run logged before the count was)
    price: PriceRow  # the accelerator's catalog row, with its USD per chip-hour
    chips: int  # chips priced (cost.chips)
    chips_in_use: int | None  # chips that trained (None: not recorded)
    usd_rub_rate: float
    rate_date: str
    rate_source: str
    hours: float  # wall-clock hours paid, every phase (lost ones included)
    chip_hours: float
    usd_total: float
    rub_total: float
    tokens: int  # tokens of steps that survived (redone steps are counted once)
    last_step: int | None
    token_budget: int | None
    projected_rub_to_budget: float | None  # at the steady phases' rubles per token so far
    seconds_by_phase: Mapping[str, float] = dataclasses.field(default_factory=dict)
    rub_by_phase: Mapping[str, float] = dataclasses.field(default_factory=dict)  # also one_off: per-GB charges
    infra: tuple[Mapping[str, Any], ...] = ()  # catalog rows billed beside the chips, with their quantity
    rate_notes: tuple[str, ...] = ()

    @property
    def accelerator(self) -> str:
        return self.price.name

    @property
    def rub_per_1b_tokens(self) -> float | None:
        return self.rub_total / self.tokens * 1e9 if self.tokens else None

    @property
    def rub_lost_to_restarts(self) -> float:
        return self.rub_by_phase.get(LOST, 0.0)

    @property
    def rub_badput(self) -> float:
        """Rubles of every phase but ``train``: what the run paid for no surviving progress."""
        return sum(self.rub_by_phase.get(phase, 0.0) for phase in BADPUT_PHASES)

    @property
    def badput_share(self) -> float | None:
        return self.rub_badput / self.rub_total if self.rub_total else None

    @property
    def goodput_share(self) -> float | None:
        return self.rub_by_phase.get(GOODPUT_PHASE, 0.0) / self.rub_total if self.rub_total else None

    @property
    def share_by_phase(self) -> dict[str, float]:
        total = self.rub_total
        return {phase: rub / total for phase, rub in self.rub_by_phase.items()} if total else {}

    @property
    def usd_per_rub(self) -> float:
        """USD per ruble over every session (sessions may have been priced at different rates)."""
        return (self.usd_total / self.rub_total if self.rub_total
                else 1.0 / self.usd_rub_rate if self.usd_rub_rate else 0.0)

    @property
    def rate_label(self) -> str:
        """The USD->RUB rate and its date, one glance from a ruble figure (the latest session's)."""
        return f"{self.usd_rub_rate:.4f} ({self.rate_date})" if self.usd_rub_rate else "—"

    @property
    def projected_rub_total(self) -> float | None:
        return None if self.projected_rub_to_budget is None else self.rub_total + self.projected_rub_to_budget

    @staticmethod
    def projection(rub_by_phase: Mapping[str, float], tokens: int, token_budget: int | None) -> float | None:
        """Rubles still to pay for ``token_budget`` at the steady phases' price per token so far."""
        if not token_budget or not tokens:
            return None
        steady_rub = sum(rub_by_phase.get(p, 0.0) for p in STEADY_PHASES)
        return max(token_budget - tokens, 0) * steady_rub / tokens

    # ------------------------------------------------------------------------------------ W&B
    def step_metrics(self) -> dict[str, float]:
        """The running cost to log with every log step (figures not known yet are left out, never 0)."""
        values = {step_name: getattr(self, field) for field, (step_name, _) in WANDB_NAMES.items() if step_name}
        return {name: float(value) for name, value in values.items() if value is not None}

    def to_wandb(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(run summary entries, run config entries)."""
        summary: dict[str, Any] = {name: getattr(self, field) for field, (_, name) in WANDB_NAMES.items()
                                   if getattr(self, field) is not None}
        for field, prefix in PHASE_PREFIXES.items():
            summary.update({f"{prefix}{phase}": value for phase, value in getattr(self, field).items()})
        summary.update({f"{SHARE_PREFIX}{phase}": share for phase, share in self.share_by_phase.items()})
        config = {name: getattr(self, field) for field, name in CONFIG_NAMES.items()}
        config[CONFIG_NAMES["price"]] = price_dict(self.price)
        return summary, config

    def log_to(self, run: Any) -> None:
        """Totals into the run summary; the price row, chips and dated rate into the run config."""
        summary, _ = self.to_wandb()
        for name, value in summary.items():
            run.summary[name] = value
        self.log_config_to(run)

    def log_config_to(self, run: Any) -> None:
        """What the run is priced at, into its config (at the start, too: a run that dies early says it)."""
        _, config = self.to_wandb()
        run.config.update(config, allow_val_change=True)

    @staticmethod
    def logged_in(summary: Mapping[str, Any]) -> bool:
        """Whether a W&B run summary holds a final cost (``log_to`` ran: the run ended)."""
        return RUB_TOTAL in summary

    @classmethod
    def from_wandb(cls, summary: Mapping[str, Any], config: Mapping[str, Any],
                   run_id: str | None = None) -> CostSummary:
        """Read back what ``log_to`` wrote; figures a run did not log (an older run) are None, empty or 0."""
        names = {field: name for field, (_, name) in WANDB_NAMES.items()}

        def number(field: str, default: float | None = 0.0) -> Any:
            value = summary.get(names[field])
            return default if value is None else value

        def optional_int(field: str) -> int | None:
            value = number(field, None)
            return None if value is None else int(value)

        cost_cfg = config.get("cost") or {}
        phases = {field: {name[len(prefix):]: float(value) for name, value in summary.items()
                          if name.startswith(prefix) and isinstance(value, (int, float))}
                  for field, prefix in PHASE_PREFIXES.items()}
        return cls(
            run_id=run_id, sessions=int(number("sessions")),
            price=_price_row(config.get(CONFIG_NAMES["price"]) or {}, cost_cfg),
            chips=int(config.get(CONFIG_NAMES["chips"]) or cost_cfg.get("chips") or 0),
            chips_in_use=optional_int("chips_in_use"),
            usd_rub_rate=float(config.get(CONFIG_NAMES["usd_rub_rate"]) or 0.0),
            rate_date=str(config.get(CONFIG_NAMES["rate_date"]) or ""),
            rate_source=str(config.get(CONFIG_NAMES["rate_source"]) or ""),
            hours=float(number("hours")), chip_hours=float(number("chip_hours")),
            usd_total=float(number("usd_total")), rub_total=float(number("rub_total")),
            tokens=int(number("tokens")), last_step=optional_int("last_step"),
            token_budget=optional_int("token_budget"),
            projected_rub_to_budget=number("projected_rub_to_budget", None),
            **phases,
        )

    # ------------------------------------------------------------------------------------ tables
    def compare_row(self) -> dict[str, Any]:
        """This run's cells of the cost comparison (``COMPARE_COLUMNS``)."""
        return {column.key: getattr(self, column.key) for column in COMPARE_COLUMNS}

    def phase_rows(self) -> list[dict[str, Any]]:
        """Rows by phase, most rubles first, plus the total (``PHASE_COLUMNS``)."""
        return phase_table(self.rub_by_phase, self.seconds_by_phase, self.usd_per_rub, sort=True)

    def badput_rows(self) -> list[dict[str, Any]]:
        """Goodput, then each badput phase in the order a run meets it, then badput and the total:
        rubles, USD and share of the run's rubles (``PHASE_COLUMNS``), MaxText-goodput style."""
        return phase_table(self.rub_by_phase, self.seconds_by_phase, self.usd_per_rub, sort=False)


def phase_kind(phase: str) -> str:
    return "goodput" if phase == GOODPUT_PHASE else "badput" if phase in BADPUT_PHASES else "other"


def phase_table(rub_by_phase: Mapping[str, float], seconds_by_phase: Mapping[str, float], usd_per_rub: float,
                sort: bool) -> list[dict[str, Any]]:
    """Rows of ``PHASE_COLUMNS``; ``sort``: most rubles first, else goodput, the badput phases, a
    badput subtotal, then anything else (per-GB charges)."""
    total = sum(rub_by_phase.values())

    def row(phase: str, rub: float, seconds: float | None, kind: str) -> dict[str, Any]:
        return {"phase": phase, "kind": kind, "hours": None if seconds is None else seconds / 3600, "rub": rub,
                "usd": rub * usd_per_rub, "share": rub / total if total else None}

    if sort:
        phases = sorted(rub_by_phase, key=lambda phase: -rub_by_phase[phase])
        rows = [row(p, rub_by_phase[p], seconds_by_phase.get(p, 0.0), phase_kind(p)) for p in phases]
    else:
        ordered = [GOODPUT_PHASE, *BADPUT_PHASES]
        rows = [row(p, rub_by_phase.get(p, 0.0), seconds_by_phase.get(p, 0.0), phase_kind(p)) for p in ordered]
        rows.insert(len(ordered), row("badput", sum(rub_by_phase.get(p, 0.0) for p in BADPUT_PHASES),
                                      sum(seconds_by_phase.get(p, 0.0) for p in BADPUT_PHASES), "badput"))
        rows += [row(p, rub, seconds_by_phase.get(p), "other") for p, rub in rub_by_phase.items() if p not in ordered]
    rows.append(row("total", total, sum(seconds_by_phase.values()), ""))
    if total:  # the shares as printed (0.1%) add up to the badput subtotal's and to 100.0%
        parts = [r for r in rows if r["phase"] not in ("badput", "total")]
        for part, share in zip(parts, apportion([r["share"] for r in parts], SHARE_STEP), strict=True):
            part["share"] = share
        for r in rows:
            if r["phase"] == "badput":
                r["share"] = round(sum(p["share"] for p in parts if p["kind"] == "badput"), 6)
    return rows


SHARE_STEP = 0.001  # the tables print a share of rubles to 0.1%


def apportion(shares: Sequence[float], step: float) -> list[float]:
    """``shares`` (adding up to 1) rounded to multiples of ``step`` that still add up to 1: each rounded down, and
    the steps left over given to the largest remainders (Hamilton's method), so no printed column of shares sums
    to 100.1% or 99.9% and a subtotal is the sum of the parts printed above it."""
    units = [share / step for share in shares]
    floors = [int(u) for u in units]
    left = round(sum(units)) - sum(floors)
    for index in sorted(range(len(units)), key=lambda i: floors[i] - units[i])[:max(left, 0)]:
        floors[index] += 1
    return [round(f * step, 6) for f in floors]


def experiment_badput_rows(summaries: Sequence[CostSummary]) -> list[dict[str, Any]]:
    """``badput_rows`` of the runs of one experiment added up (each run's rubles as it paid them)."""
    rub: dict[str, float] = {}
    seconds: dict[str, float] = {}
    usd = 0.0
    for summary in summaries:
        for phase, value in summary.rub_by_phase.items():
            rub[phase] = rub.get(phase, 0.0) + value
        for phase, value in summary.seconds_by_phase.items():
            seconds[phase] = seconds.get(phase, 0.0) + value
        usd += summary.usd_total
    total = sum(rub.values())
    return phase_table(rub, seconds, usd / total if total else 0.0, sort=False)


def price_dict(row: PriceRow) -> dict[str, Any]:
    """A price row as the ledger and W&B keep it (without the catalog file it came from)."""
    return {k: v for k, v in row.as_dict().items() if k != "origin"}


def _price_row(row: Mapping[str, Any], cost_cfg: Mapping[str, Any]) -> PriceRow:
    """A stored price row; a run without one is named by its config (its price unknown)."""
    base = {"kind": "accelerator", "name": cost_cfg.get("accelerator", ""), "cloud": cost_cfg.get("cloud", ""),
            "region": cost_cfg.get("region", ""), "pricing": cost_cfg.get("pricing", ""), "usd": None,
            "unit": "", "source": "", "date": ""}
    return PriceRow.stored({**base, **row})
