"""Recipe 06 end to end on offline W&B runs (and a ledger-only experiment as the fallback)."""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import pytest
import yaml

from cost.compare import rub_per_eval_point
from cost.ledger import Ledger, summarize_ledger
from cost.rates import UsdRubRate
from cost.summary import CostSummary
from experiment.config import build_dataclass
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from tests.recipe_runner import run_recipe
from tracking.metrics import define_cost_metrics, log_step
from tracking.wandb_run import open_run

HOUR = 3600.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def experiment_cfg(tmp_path: Path, name: str) -> ExperimentConfig:
    return build_dataclass(ExperimentConfig, {
        "experiment": {"name": name, "run_root": str(tmp_path / "runs")},
        "cost": {"accelerator": "tpu-v5e", "chips": 4, "usd_rub_rate": 100.0,
                 "usd_rub_date": dt.date.today().isoformat()},
        "wandb": {"mode": "offline", "project": "cmp"},
    })


def fake_training(cfg: ExperimentConfig, run: object | None, losses: list[float]) -> CostSummary:
    """A 'training' of one hour per logged step on 4 v5e chips (480 RUB/hour), logged like the trainer does."""
    clock = FakeClock()
    ledger = Ledger.open(RunFolder.for_config(cfg).ledger, cfg.cost, "fake", clock=clock, started_at=clock(),
                         background=False, rate=UsdRubRate(100.0, dt.date.today(), "test"))
    if run is not None:
        define_cost_metrics(run)
    for step, loss in enumerate(losses, start=1):
        with ledger.phase("train"):
            clock.t += HOUR
            ledger.add_tokens(step, 1_000_000)
        if run is not None:
            log_step(run, step, {"train/loss": loss}, ledger.summary().step_metrics())
    summary = ledger.summary()
    ledger.close()
    if run is not None:
        summary.log_to(run)
    return summary


def test_rub_per_eval_point() -> None:
    assert rub_per_eval_point(620.0, 0.62) == pytest.approx(10.0)  # per accuracy percentage point
    assert rub_per_eval_point(100.0, None) is None and rub_per_eval_point(None, 0.5) is None


def test_compare_recipe_offline_runs_and_ledger_fallback(tmp_path: Path, restore_wandb_env: None) -> None:
    main = experiment_cfg(tmp_path, "main")
    folder = RunFolder.for_config(main)
    with open_run(main, folder, job_type="pretrain") as run:
        fake_training(main, run, [6.0, 5.0, 4.5])
    with open_run(main, folder, job_type="eval") as run:
        run.summary["eval/rublimp/acc"] = 0.625
    cheap = experiment_cfg(tmp_path, "cheap")  # no W&B at all: the ledger is all there is
    ledger_only = fake_training(cheap, None, [6.0])

    config = tmp_path / "main.yaml"
    config.write_text(yaml.safe_dump({
        "experiment": {"name": "main", "run_root": str(tmp_path / "runs")},
        "cost": {"usd_rub_rate": 100.0, "usd_rub_date": dt.date.today().isoformat(),
                 "compare_experiments": ["cheap"]},
        "wandb": {"mode": "offline", "project": "cmp"},
    }), encoding="utf-8")
    proc = run_recipe("06_compare_costs.py", config, timeout=240)

    reports = folder.reports
    rows = {r["experiment"]: r for r in csv.DictReader((reports / "costs.csv").open(encoding="utf-8"))}
    main_row = rows["main"]
    assert main_row["cost_source"].startswith("W&B run")
    assert float(main_row["rub_total"]) == pytest.approx(3 * 480.0)  # 3 hours x 4 chips x 1.20 USD x 100
    assert float(main_row["tokens"]) == 3_000_000
    assert float(main_row["final_loss"]) == 4.5
    assert float(main_row["eval_score"]) == 0.625
    assert float(main_row["rub_per_eval_point"]) == pytest.approx(1440.0 / 62.5)
    cheap_row = rows["cheap"]
    assert cheap_row["cost_source"].startswith("ledger")
    assert float(cheap_row["rub_total"]) == pytest.approx(ledger_only.rub_total) == pytest.approx(480.0)
    assert summarize_ledger(RunFolder.for_config(cheap).ledger).tokens == 1_000_000
    assert "Experiment costs in rubles" in proc.stdout and "main" in proc.stdout
    md = (reports / "costs.md").read_text(encoding="utf-8")
    assert "| experiment | variant | run | accelerator |" in md and "eval/rublimp/acc" in md
    for png in ("loss_vs_rubles.png", "eval_vs_rubles.png"):
        assert (reports / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_before_pretraining_names_the_recipe(tmp_path: Path) -> None:
    from tests.recipe_runner import error_line, tiny_config

    proc = run_recipe("06_compare_costs.py", tiny_config(tmp_path), timeout=120, check=False)
    assert proc.returncode == 2
    assert error_line(proc).startswith("error: experiment 'tiny': no cost found")
    assert error_line(proc).endswith("run recipes/04_pretrain.py first")


def test_online_failure_falls_back_to_offline_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    import cost.compare as compare
    from tracking.readback import RunRecord

    def api_down(*args: object) -> list:
        raise ConnectionError("api.wandb.ai unreachable")

    offline = [RunRecord("a", "x-pretrain", "x", "pretrain", "finished"), RunRecord("me", "x-compare", "x", "compare", "")]
    monkeypatch.setattr(compare, "resolve_mode", lambda mode: "online")
    monkeypatch.setattr(compare, "read_online_runs", api_down)
    monkeypatch.setattr(compare, "read_offline_runs", lambda folder, group, exclude_ids: offline)
    cfg = experiment_cfg(tmp_path, "x")
    with caplog.at_level("WARNING", logger="cost.compare"):
        runs = compare.read_runs(cfg, RunFolder.for_config(cfg), "x", exclude_id="me")
    assert [r.run_id for r in runs] == ["a"]
    assert "W&B API unavailable (api.wandb.ai unreachable)" in caplog.text
