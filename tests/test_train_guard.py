"""Recipe 04's NaN guard and resume checks end to end on the fixture stages: a diverged run names a
checkpoint a saner rate trains on from, and a rerun refused by a check opens neither W&B nor the ledger."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixture_run import checkpoint_contents, fixture_config, read_train_log, run_copy
from tests.recipe_runner import error_line, run_recipe

# a checkpoint every step: step 2's update at 1e6 ruins the weights (loss ln V after it, NaN gradients at 4)
DIVERGING = {"steps": 6, "checkpoint_every": 1, "warmup_steps": 1, "log_every": 1, "keep_checkpoints": 6,
             "learning_rate": 1e6}


def run_dir(root: Path) -> Path:
    return root / "runs" / "tiny"


def opened(run: Path) -> tuple[int, int]:
    """(W&B run folders, ledger sessions) of a run folder."""
    ledger = run / "ledger" / "ledger.jsonl"
    sessions = sum(json.loads(line).get("e") == "open" for line in ledger.read_text(encoding="utf-8").splitlines())
    return len(list((run / "wandb" / "wandb").glob("offline-run-*"))), sessions


def test_a_diverged_run_names_a_checkpoint_a_saner_rate_trains_on_from(fixture_stages: Path, tmp_path: Path) -> None:
    config = run_copy(fixture_stages, tmp_path, train=DIVERGING)
    run = run_dir(tmp_path)
    proc = run_recipe("04_pretrain.py", config, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "training diverged at step 4" in error_line(proc)
    assert "the last good checkpoint is step 1 (the later step(s) 2, 3 were moved" in error_line(proc)
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]
    assert checkpoint_contents(run, 1)[1]["meta"]["guard"]["finite"] is True
    before = opened(run)

    # the same optimization or nothing: a new rate and another base model are refused before W&B and the ledger
    proc = run_recipe("04_pretrain.py", config, "train.learning_rate=3e-3", check=False)
    assert proc.returncode == 2 and "config key 'train.learning_rate': 1000000.0 -> 0.003" in error_line(proc)
    proc = run_recipe("04_pretrain.py", config, f"model.init_from={tmp_path}", check=False)
    assert proc.returncode == 2 and "config key 'model.init_from'" in error_line(proc), error_line(proc)
    assert opened(run) == before

    run_recipe("04_pretrain.py", config, "train.learning_rate=3e-3", "train.allow_schedule_change=true")
    losses = [r["train/loss"] for r in read_train_log(run)]
    assert [r["train/step"] for r in read_train_log(run)] == [1, 2, 3, 4, 5, 6]
    assert losses[-1] < losses[1] - 0.3  # it trains from checkpoint 1
    meta = checkpoint_contents(run, 6)[1]["meta"]
    assert meta["schedule_changes"] == [{"step": 1, "changed": {"learning_rate": [1e6, 3e-3]}}]
    assert meta["schedule"]["learning_rate"] == 3e-3


def test_skipping_stops_after_max_skipped_steps_and_books_them_as_lost(fixture_stages: Path, tmp_path: Path) -> None:
    from cost.ledger_pricing import summarize_ledger

    config = run_copy(fixture_stages, tmp_path, train={**DIVERGING, "nan_policy": "skip", "max_skipped_steps": 1})
    proc = run_recipe("04_pretrain.py", config, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "diverged at step 5" in error_line(proc) and "more than train.max_skipped_steps=1" in error_line(proc)
    assert "the last good checkpoint is step 1" in error_line(proc)
    assert summarize_ledger(run_dir(tmp_path) / "ledger").seconds_by_phase["lost"] > 0


def test_a_config_or_input_error_leaves_a_new_experiment_folder_empty(fixture_stages: Path, tmp_path: Path) -> None:
    def assert_nothing_left(run: Path) -> None:
        assert not (run / "config.resolved.yaml").exists() and not (run / "configs").exists()
        assert not (run / "wandb").exists() and not (run / "ledger").exists()

    proc = run_recipe("04_pretrain.py", fixture_config(tmp_path / "no-shards"), check=False)
    assert proc.returncode == 2 and "run recipes/03_shard.py first" in error_line(proc), proc.stderr[-2000:]
    assert_nothing_left(run_dir(tmp_path / "no-shards"))
    config = run_copy(fixture_stages, tmp_path / "typo")
    proc = run_recipe("04_pretrain.py", config, "cost.accelerator=tpu-v5e-typo", check=False)
    assert proc.returncode == 2 and "config key 'cost.accelerator'" in error_line(proc), proc.stderr[-2000:]
    assert_nothing_left(run_dir(tmp_path / "typo"))
