"""The typed cost summary: what the ledger returns, written to W&B and read back under one table of names."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from cost.ledger import Ledger
from cost.rates import UsdRubRate
from cost.summary import COMPARE_COLUMNS, WANDB_NAMES, CostSummary, experiment_badput_rows, phase_table
from experiment.sections.cost import CostConfig
from tracking.metrics import RUB_SPENT

HOUR = 3600.0


class FakeRun:
    def __init__(self) -> None:
        self.summary: dict[str, Any] = {}
        self.config_values: dict[str, Any] = {}

    @property
    def config(self) -> FakeRun:
        return self

    def update(self, values: dict[str, Any], allow_val_change: bool = False) -> None:
        self.config_values.update(values)


def two_hour_summary(tmp_path: Path, token_budget: int | None = None, chips_in_use: int = 8) -> CostSummary:
    t = [1_000_000.0]
    cfg = CostConfig(accelerator="tpu-v5e", pricing="on-demand", chips=8, usd_rub_rate=100.0,
                     usd_rub_date=dt.date.today().isoformat(), token_budget=token_budget)
    ledger = Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=UsdRubRate(100.0, dt.date.today(), "test"),
                         clock=lambda: t[0], started_at=t[0], background=False, chips_in_use=chips_in_use)
    with ledger.phase("train"):
        t[0] += 2 * HOUR
        ledger.add_tokens(10, 1_000_000_000)
    ledger.close()
    return ledger.summary()


def test_wandb_round_trip_keeps_every_logged_figure(tmp_path: Path) -> None:
    summary = two_hour_summary(tmp_path, token_budget=3_000_000_000)
    run = FakeRun()
    summary.log_to(run)
    assert run.summary["cost/rub_total"] == pytest.approx(2 * 8 * 1.20 * 100)  # the final total's summary name
    assert run.config_values["cost_price_row"]["name"] == "tpu-v5e" and run.config_values["cost_chips"] == 8
    assert "cost/usd_rub_rate" not in run.summary  # the rate is in the config (cost_usd_rub_rate) only
    assert run.summary["cost/chips_in_use"] == 8
    back = CostSummary.from_wandb(run.summary, run.config_values, "run-1")
    assert back == dataclasses.replace(summary, infra=(), rate_notes=())  # the two lists W&B does not get
    assert back.projected_rub_total == pytest.approx(summary.rub_total * 3)  # 1B of 3B tokens so far
    assert CostSummary.logged_in(run.summary)


def test_step_metrics_use_the_history_names_and_leave_unknowns_out(tmp_path: Path) -> None:
    summary = two_hour_summary(tmp_path)
    metrics = summary.step_metrics()
    assert metrics[RUB_SPENT] == pytest.approx(summary.rub_total)
    assert set(metrics) == {step for step, _ in WANDB_NAMES.values() if step} - {"cost/projected_rub_total"}
    assert set(summary.compare_row()) == {c.key for c in COMPARE_COLUMNS}


def test_a_run_logged_before_the_newer_figures_still_reads(tmp_path: Path) -> None:
    older_summary = {"cost/rub_total": 12.5, "cost/usd_total": 0.125, "cost/hours": 1.5, "cost/tokens": 1000,
                     "cost/usd_rub_rate": 100.0, "cost/rub_by_phase/lost": 2.5, RUB_SPENT: {"max": 12.5}}
    older = CostSummary.from_wandb(older_summary, {"cost": {"accelerator": "tpu-v5e", "chips": 4}})
    assert (older.accelerator, older.chips, older.tokens, older.rub_total) == ("tpu-v5e", 4, 1000, 12.5)
    assert older.rub_lost_to_restarts == 2.5 and older.sessions == 0 and older.last_step is None
    assert not CostSummary.logged_in({RUB_SPENT: {"max": 1.0}})  # a run killed before its end has no total


def test_chips_priced_must_be_the_chips_in_use_on_an_accelerator(caplog: pytest.LogCaptureFixture) -> None:
    from cost.chips import reconcile_chips
    from experiment.errors import ConfigError

    assert reconcile_chips(8, 8, "tpu") == 8
    with pytest.raises(ConfigError, match=r"'cost.chips': 8 chip\(s\) priced, but 16 tpu chip\(s\) train this run: "
                                          r"set cost.chips=16"):
        reconcile_chips(8, 16, "tpu")
    with caplog.at_level("INFO", logger="cost.chips"):
        assert reconcile_chips(8, 1, "cpu") == 1  # a CPU host may price as if on the configured slice
    assert caplog.text.count("pricing 8 chip(s) as configured") == 1


def test_the_ledger_records_the_chips_in_use_beside_the_priced_ones(tmp_path: Path) -> None:
    """A CPU rehearsal of an 8-chip bill: 8 chips priced, 1 host training. The two counts differ so that a
    mix-up of them (in the ledger, its summary or the W&B names) shows."""
    summary = two_hour_summary(tmp_path, chips_in_use=1)
    assert (summary.chips, summary.chips_in_use) == (8, 1)
    assert summary.chip_hours == pytest.approx(16.0)  # priced chips x hours: what the bill counts
    run = FakeRun()
    summary.log_to(run)
    assert (run.config_values["cost_chips"], run.summary["cost/chips_in_use"]) == (8, 1)
    back = CostSummary.from_wandb(run.summary, run.config_values, "run-1")
    assert (back.chips, back.chips_in_use) == (8, 1)


def test_badput_in_rubles_by_phase_per_run_and_per_experiment(tmp_path: Path) -> None:
    """A worked run: 0.5 h start-up, 0.25 h compile, 2 h train with 0.25 h of data waits inside it, 0.5 h eval,
    0.25 h checkpoint, 0.25 h idle (3.75 h, 2 h of them badput), on 8 v5e chips (1.2 USD/chip-hour) at 100 RUB/USD:
    960 RUB per hour."""
    t = [1_000_000.0]
    cfg = CostConfig(accelerator="tpu-v5e", pricing="on-demand", chips=8, usd_rub_rate=100.0,
                     usd_rub_date=dt.date.today().isoformat())
    ledger = Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=UsdRubRate(100.0, dt.date.today(), "test"),
                         clock=lambda: t[0], started_at=t[0] - 0.5 * HOUR, background=False)
    for phase, hours in (("compile", 0.25), ("train", 1.75)):
        with ledger.phase(phase):
            t[0] += hours * HOUR
    with ledger.phase("train"), ledger.phase("data"):
        t[0] += 0.25 * HOUR
    ledger.add_tokens(100, 1_000_000)
    for phase, hours in (("eval", 0.5), ("checkpoint", 0.25)):
        with ledger.phase(phase):
            t[0] += hours * HOUR
    t[0] += 0.25 * HOUR  # idle
    ledger.close()
    summary = ledger.summary()
    assert summary.rub_total == pytest.approx(3.75 * 960)
    rows = {row["phase"]: row for row in summary.badput_rows()}
    assert rows["train"]["kind"] == "goodput" and rows["train"]["rub"] == pytest.approx(1.75 * 960)
    assert rows["data"]["rub"] == pytest.approx(0.25 * 960) and rows["data"]["kind"] == "badput"
    # shares as printed, to 0.1% (apportioned: they add up, test_printed_shares_add_up)
    assert rows["badput"]["rub"] == pytest.approx(2 * 960) and rows["badput"]["share"] == pytest.approx(2 / 3.75,
                                                                                                        abs=1e-3)
    assert rows["total"]["usd"] == pytest.approx(3.75 * 9.6) and rows["startup"]["usd"] == pytest.approx(0.5 * 9.6)
    assert [r["phase"] for r in summary.badput_rows()][:10] == ["train", "startup", "compile", "data", "checkpoint",
                                                               "eval", "idle", "lost", "hang", "badput"]
    assert summary.rub_badput == pytest.approx(2 * 960) and summary.badput_share == pytest.approx(2 / 3.75)
    assert summary.goodput_share == pytest.approx(1.75 / 3.75)
    run = FakeRun()
    summary.log_to(run)
    assert run.summary["cost/rub_badput"] == pytest.approx(1920.0)
    assert run.summary["cost/badput_share"] == pytest.approx(2 / 3.75)
    assert run.summary["cost/share_by_phase/eval"] == pytest.approx(0.5 / 3.75)
    assert summary.step_metrics()["cost/badput_share"] == pytest.approx(2 / 3.75)
    row = summary.compare_row()
    assert row["rub_badput"] == pytest.approx(1920.0) and row["usd_total"] == pytest.approx(36.0)
    assert row["rate_label"] == f"100.0000 ({dt.date.today().isoformat()})"
    # an experiment of two such runs, one read back from W&B: the phases add up, the shares stay
    back = CostSummary.from_wandb(run.summary, run.config_values, "run-1")
    combined = {r["phase"]: r for r in experiment_badput_rows([summary, back])}
    assert (combined["total"]["rub"] == pytest.approx(7.5 * 960)
            and combined["badput"]["share"] == pytest.approx(2 / 3.75, abs=1e-3))
    assert combined["data"]["hours"] == pytest.approx(0.5) and combined["total"]["usd"] == pytest.approx(72.0)


def test_printed_shares_add_up() -> None:
    """The demo's ledger of 2026-12-06 as rubles by phase: rounded one by one its shares printed 100.1% in all and
    a badput subtotal of 13.6% under parts of 13.7%; as printed now, the parts add up to both."""
    rub = {"train": 0.127525, "startup": 0.00767121, "compile": 0.00952783, "data": 8.37432e-05,
           "checkpoint": 0.00247211, "eval": 0.0, "idle": 0.00034879, "lost": 0.0, "hang": 0.0}
    rows = phase_table(rub, dict.fromkeys(rub, 1.0), 0.01, sort=False)
    printed = {r["phase"]: round(r["share"] * 1000) for r in rows}  # the tables' {:.1%}, in tenths of a percent
    parts = [printed[p] for p in rub]
    assert sum(parts) == printed["total"] == 1000
    assert printed["badput"] == sum(printed[p] for p in rub if p != "train")
    assert all(abs(r["share"] - rub.get(r["phase"], 0) / sum(rub.values())) <= 1e-3 for r in rows if r["phase"] in rub)
