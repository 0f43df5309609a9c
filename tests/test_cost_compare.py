"""Recipe 06 end to end on offline W&B runs (and a ledger-only experiment as the fallback)."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from cost.compare import rub_per_eval_point
from cost.ledger import Ledger
from cost.ledger_pricing import summarize_ledger
from cost.rates import UsdRubRate
from cost.summary import CostSummary
from experiment.config import build_dataclass
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from tests.fake_clock import HOUR, FakeClock
from tests.recipe_runner import run_recipe
from tracking.metrics import define_cost_metrics, log_step
from tracking.wandb_run import open_run


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


@pytest.mark.integration
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


@pytest.mark.integration
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

    offline = [RunRecord("a", "x-pretrain", "x", "pretrain", "finished"),
               RunRecord("me", "x-compare", "x", "compare", "")]
    monkeypatch.setattr(compare, "resolve_mode", lambda mode: "online")
    monkeypatch.setattr(compare, "read_online_runs", api_down)
    monkeypatch.setattr(compare, "read_offline_runs", lambda folder, group, exclude_ids: offline)
    cfg = experiment_cfg(tmp_path, "x")
    with caplog.at_level("WARNING", logger="cost.compare"):
        runs = compare.read_runs(cfg, RunFolder.for_config(cfg), "x", exclude_id="me")
    assert [r.run_id for r in runs] == ["a"]
    assert "W&B API unavailable (api.wandb.ai unreachable)" in caplog.text


# ------------------------------------------------------------------------------ rubles to a target quality
def test_rubles_to_target_hand_worked() -> None:
    """4 v5e chips at 1.20 USD x 100 RUB = 480 RUB per hour, 1M tokens per hour; eval every 2 hours:
    bits per byte 2.4 (2 h), 2.0 (4 h), 1.7 (6 h). Target 1.8 is crossed 2/3 of the way from the 4 h eval
    to the 6 h one: 4 h + 2/3 x 2 h = 5 h 20 min, 1920 + 2/3 x 960 = 2560 RUB, 5.333M tokens."""
    from cost.target import EvalPoint, Target, cost_to_target

    points = [EvalPoint(2, 2.4, 960.0, 2.0, 2e6), EvalPoint(4, 2.0, 1920.0, 4.0, 4e6),
              EvalPoint(6, 1.7, 2880.0, 6.0, 6e6)]
    crossing = cost_to_target(points, Target("eval/val_bpb", 1.8, lower_is_better=True))
    assert crossing.reached and crossing.interpolated
    assert crossing.rub == pytest.approx(2560.0)
    assert crossing.hours == pytest.approx(16 / 3) and crossing.tokens == pytest.approx(16e6 / 3)
    assert crossing.step == pytest.approx(16 / 3) and crossing.best == 1.7
    missed = cost_to_target(points, Target("eval/val_bpb", 1.5, lower_is_better=True))
    assert not missed.reached and missed.rub is None and missed.best == 1.7
    assert missed.status(Target("eval/val_bpb", 1.5, True)) == "not reached (best 1.7)"
    first = cost_to_target(points, Target("eval/val_bpb", 2.5, lower_is_better=True))
    assert first.rub == 960.0 and not first.interpolated  # the first eval is past it: nothing earlier measured
    # a score target (higher is better) the same way: 0.5 -> 0.7 crosses 0.65 three quarters of the way
    scores = [EvalPoint(10, 0.5, 100.0, 1.0, 1e6), EvalPoint(20, 0.7, 300.0, 3.0, 3e6)]
    assert cost_to_target(scores, Target("eval/rublimp/acc", 0.65, False)).rub == pytest.approx(250.0)


def sweep_yaml(tmp_path: Path, **cost: object) -> Path:
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({
        "experiment": {"name": "sw", "run_root": str(tmp_path / "runs"),
                       "variants": [{"name": "fast", "train.learning_rate": 1e-2}, {"train.learning_rate": 1e-3}]},
        "cost": {"accelerator": "tpu-v5e", "chips": 4, "usd_rub_rate": 100.0,
                 "usd_rub_date": dt.date.today().isoformat(), **cost},
        "wandb": {"mode": "offline", "project": "cmp"},
    }), encoding="utf-8")
    return config


def fake_training_with_evals(cfg: ExperimentConfig, bpb: dict[int, float]) -> None:
    """``fake_training``'s hours, with eval points logged as the trainer's eval hook does (same step, running cost)."""
    clock = FakeClock()
    folder = RunFolder.for_config(cfg)
    with open_run(cfg, folder, job_type="pretrain") as run:
        ledger = Ledger.open(folder.ledger, cfg.cost, run.id, clock=clock, started_at=clock(), background=False,
                             rate=UsdRubRate(100.0, dt.date.today(), "test"))
        define_cost_metrics(run)
        for step in range(1, max(bpb) + 1):
            with ledger.phase("train"):
                clock.t += HOUR
                ledger.add_tokens(step, 1_000_000)
            log_step(run, step, {"train/step": step, "train/loss": 6.0 - step / 10}, ledger.summary().step_metrics())
            if step in bpb:
                log_step(run, step, {"train/step": step, "eval/val_bpb": bpb[step]}, ledger.summary().step_metrics())
        summary = ledger.summary()
        ledger.close()
        summary.log_to(run)


@pytest.mark.integration
def test_sweep_comparison_rubles_to_target_frontier_and_wandb_table(tmp_path: Path, restore_wandb_env: None) -> None:
    """Recipe 06 on a sweep's config compares its variants (one W&B group), with the rubles when each first
    reached cost.target_bpb, a frontier plot, and a W&B table read back from the offline run with wandb's log reader."""
    import json
    import subprocess

    from experiment.config import load_config
    from tracking.readback import find_offline_runs, inspect_command, read_offline_run

    config = sweep_yaml(tmp_path, target_bpb=1.8)
    fast = load_config(config, ["experiment.variant=fast"])
    slow = load_config(config, ["experiment.variant=learning_rate-0.001"])
    assert (fast.experiment.name, fast.experiment.group, fast.train.learning_rate) == ("sw-fast", "sw", 1e-2)
    fake_training_with_evals(fast, {2: 2.4, 4: 2.0, 6: 1.7})  # the hand-worked example above
    fake_training_with_evals(slow, {2: 2.6, 4: 2.3})
    (tmp_path / "runs" / "sw").mkdir(parents=True)
    run_recipe("06_compare_costs.py", config, timeout=240)

    reports = tmp_path / "runs" / "sw" / "reports"
    rows = {r["experiment"]: r for r in csv.DictReader((reports / "costs.csv").open(encoding="utf-8"))}
    assert list(rows) == ["sw-fast", "sw-learning_rate-0.001"]
    assert float(rows["sw-fast"]["rub_to_target"]) == pytest.approx(2560.0)
    assert float(rows["sw-fast"]["chip_hours_to_target"]) == pytest.approx(4 * 16 / 3)
    assert float(rows["sw-fast"]["hours_to_target"]) == pytest.approx(16 / 3)
    assert rows["sw-fast"]["variant"] == "train.learning_rate=0.01"
    assert rows["sw-learning_rate-0.001"]["rub_to_target"] == ""
    assert rows["sw-learning_rate-0.001"]["target_status"] == "not reached (best 2.3)"
    assert (reports / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "RUB to target" in (reports / "costs.md").read_text(encoding="utf-8")

    runs = [read_offline_run(d) for name in ("sw", "sw-fast", "sw-learning_rate-0.001")
            for d in find_offline_runs(tmp_path / "runs" / name / "wandb")]
    assert {r.group for r in runs} == {"sw"}  # one W&B group: the variants and the comparison
    pretrain = {r.name: r for r in runs if r.job_type == "pretrain"}
    assert pretrain["sw-fast-pretrain"].config["variant"] == {"name": "fast", "train.learning_rate": 0.01}
    bpb_by_rub = [(h["cost/rub_spent"], h["by_rub/eval/val_bpb"]) for h in pretrain["sw-fast-pretrain"].history
                  if "by_rub/eval/val_bpb" in h]  # eval scores against rubles
    assert [b for _, b in bpb_by_rub] == [2.4, 2.0, 1.7]
    assert [r for r, _ in bpb_by_rub] == pytest.approx([960.0, 1920.0, 2880.0])
    (compare_dir,) = find_offline_runs(tmp_path / "runs" / "sw" / "wandb")
    summary = json.loads(subprocess.run(inspect_command(compare_dir, summary=True), capture_output=True,
                                        text=True, check=True).stdout)["summary"]
    assert summary["costs/table"]["_type"] == "table-file" and summary["costs/table"]["nrows"] == 2
    assert summary["costs/frontier"]["_type"] == "image-file"
    table = json.loads((compare_dir / "files" / summary["costs/table"]["path"]).read_text(encoding="utf-8"))
    column = table["columns"].index("rub_to_target")
    assert sorted(r[column] is None for r in table["data"]) == [False, True]


# ------------------------------------------------------------------------------ the printed table and the score plot
def sweep_rows(d_models: tuple[int, ...]) -> list[dict]:
    """Rows as recipe 06 makes them for sweep variants that differ only in d_model (the figures are made up:
    the layout is under test, not the money)."""
    rows = []
    for i, d_model in enumerate(d_models):
        name = f"demo-sweep-d_model-{d_model}"
        rows.append({"experiment": name, "variant": f"model.d_model={d_model}", "run": f"{name}-pretrain",
                     "accelerator": "cpu-e2-standard-2", "chips": 1, "tokens": 245_760, "hours": 0.02 + i / 100,
                     "rub_total": 0.14 + i / 10, "rub_per_1b_tokens": 570.0 + i, "final_loss": 6.1 - i / 10,
                     "eval_score": 0.6, "rub_per_eval_point": 0.0023, "usd_total": 0.0014,
                     "rate": "101.68 (2025-01-01)",
                     "target_status": "reached" if i else "not reached", "rub_to_target": 0.1 if i else None,
                     "hours_to_target": 0.01 if i else None, "cost_source": f"W&B run run{i}"})
    return rows


def test_the_printed_table_fits_80_columns_and_names_every_row_in_every_block() -> None:
    """Three variants that differ only in d_model: at 80 columns every line fits, the variant column comes first
    and repeats in each block the wider columns wrap into, and no cell is cut, so the rows stay told apart."""
    from rich.cells import cell_len

    from cost.compare import columns_for, terminal_order
    from cost.report import to_terminal
    from cost.target import Target

    rows = sweep_rows((128, 192, 256))
    columns = terminal_order(rows, columns_for(Target("eval/val_bpb", 1.9, lower_is_better=True)))
    text = to_terminal(rows, columns, "Experiment costs in rubles", width=80)
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    headers = [line for line in lines if line.startswith("┃")]
    blocks = [line for line in headers if line.split("┃")[1].strip() == "variant"]
    assert len(blocks) >= 2 and len(blocks) == len(headers), "a header row per block, the variant column first"
    for row in rows:  # each variant's full name on one line per block
        assert sum(f"│ {row['variant']} " in line for line in lines) == len(blocks), row["variant"]
    for column in (c for c in columns if c.terminal):
        assert column.title in text, column.title  # every column printed whole somewhere
    for row in rows:
        assert f" {row['rub_per_1b_tokens']:,.0f} " in text and row["experiment"] in text


def test_terminal_width_reads_columns_and_falls_back_to_100(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from cost.report import FALLBACK_WIDTH, terminal_width

    monkeypatch.setenv("COLUMNS", "80")
    assert terminal_width() == 80
    monkeypatch.delenv("COLUMNS")

    def no_terminal(fd: int = 1) -> os.terminal_size:
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert terminal_width() == FALLBACK_WIDTH == 100


def write_eval_results(folder: Path, step: int, correct: int, items: int) -> None:
    """An eval/step_N.json holding an accuracy and its Wilson interval, as recipe 05 writes them."""
    from eval.stats import wilson_interval

    folder.mkdir(parents=True, exist_ok=True)
    acc = {"value": correct / items, "ci95": list(wilson_interval(correct, items)), "chance": 0.5, "n": items}
    (folder / f"step_{step:07d}.json").write_text(
        json.dumps({"step": step, "tasks": {"rublimp": {"metrics": {"acc": acc}}}}), encoding="utf-8")


def test_eval_plot_shows_each_score_with_its_interval_on_the_whole_accuracy_range(tmp_path: Path) -> None:
    """Scores of 10 items each (0.5, 0.6, 0.7): their intervals overlap, so the plot must not zoom in on them.
    The error bars are the Wilson intervals recipe 05 wrote, the y-range is all of [0, 1], chance is drawn."""
    from cost.compare import plot_eval_vs_rubles, score_axis, score_interval, score_points
    from eval.stats import wilson_interval

    rows = sweep_rows((128, 192, 256))
    for i, row in enumerate(rows):
        eval_dir = tmp_path / row["experiment"] / "eval"
        write_eval_results(eval_dir, 100, 3, 10)  # an older step: the score's own step must win
        write_eval_results(eval_dir, 120, 5 + i, 10)
        row["eval_score"] = (5 + i) / 10
        row["_eval_interval"] = score_interval(eval_dir, "eval/rublimp/acc", row["eval_score"])
    points = score_points(rows)
    assert [p.name for p in points] == [r["variant"] for r in rows]
    for point, correct in zip(points, (5, 6, 7), strict=True):
        low, high = wilson_interval(correct, 10)
        assert point.error_bar == pytest.approx((correct / 10 - low, high - correct / 10))
        assert point.chance == 0.5
    assert points[0].high > points[2].low  # the intervals overlap: no ranking to show
    assert score_axis(points) == (0.0, 1.0)
    assert score_interval(tmp_path / "nowhere", "eval/rublimp/acc", 0.5) is None
    # not a logged score
    assert score_interval(tmp_path / rows[0]["experiment"] / "eval", "eval/rublimp/acc", 0.55) is None
    assert plot_eval_vs_rubles(rows, "eval/rublimp/acc", tmp_path / "eval.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_plot_range_of_a_score_beyond_0_1_covers_every_interval() -> None:
    from cost.compare import ScorePoint, score_axis

    points = [ScorePoint("a", 1.0, 12.0, 10.0, 14.0), ScorePoint("b", 2.0, 13.0, 12.5, 13.5)]
    low, high = score_axis(points)
    assert low <= 10.0 - 4.0 and high >= 14.0 + 4.0  # padded by at least the widest interval


def test_without_wandb_runs_the_loss_and_score_come_from_the_run_folder(tmp_path: Path) -> None:
    """The W&B folder deleted (or W&B never ran): rubles from the ledger, the final loss from train_log.jsonl,
    the eval score and its interval from the newest eval/step_N.json."""
    from cost.compare import compare_costs
    from tracking.wandb_run import SilentRun

    cfg = experiment_cfg(tmp_path, "gone")
    folder = RunFolder.for_config(cfg)
    fake_training(cfg, None, [6.0])
    (folder.root / "train_log.jsonl").write_text("".join(json.dumps({"train/step": s, "train/loss": loss}) + "\n"
                                                         for s, loss in ((5, 5.5), (10, 4.25))), encoding="utf-8")
    write_eval_results(folder.eval, 5, 3, 10)
    write_eval_results(folder.eval, 10, 7, 10)  # the newest step is the score
    (row,) = compare_costs(cfg, folder, SilentRun())
    assert row["cost_source"].startswith("ledger") and row["rub_total"] == pytest.approx(480.0)
    assert row["final_loss"] == 4.25 and row["eval_score"] == 0.7
    assert row["_eval_interval"] is not None and row["rub_per_eval_point"] == pytest.approx(480.0 / 70)
