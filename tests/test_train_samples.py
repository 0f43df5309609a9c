"""Samples during training: at each eval the model continues fixed Russian prompts, and the completions are read
back from the run folder and from the offline W&B run (a table: step, rubles spent, prompt, completion)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixture_run import run_copy
from tests.recipe_runner import run_recipe
from tracking.readback import find_offline_runs, read_offline_run

PROMPTS = ["Москва — столица", "Однажды зимним вечером"]


def test_each_eval_writes_the_completions_of_the_fixed_prompts_to_the_run_and_to_wandb(fixture_stages: Path,
                                                                                       tmp_path: Path) -> None:
    config = run_copy(fixture_stages, tmp_path,
                      train={"steps": 4, "warmup_steps": 1, "eval_every": 2, "checkpoint_every": 4},
                      eval={"train_tasks": [], "sample_prompts": PROMPTS, "sample_max_new_tokens": 6})
    run_recipe("04_pretrain.py", config)
    run_dir = tmp_path / "runs" / "tiny"
    by_step = {}
    for step in (2, 4):
        rows = [json.loads(line) for line in (run_dir / "samples" / f"step_{step:07d}.jsonl").read_text(
            encoding="utf-8").splitlines()]
        assert [row["prompt"] for row in rows] == PROMPTS
        assert all(row["step"] == step and 0 < row["new_tokens"] <= 6 and row["rub_spent"] > 0 for row in rows)
        by_step[step] = rows
    assert by_step[4][0]["rub_spent"] > by_step[2][0]["rub_spent"]  # the bill runs on between the two evals

    (wandb_run,) = find_offline_runs(run_dir / "wandb")
    # W&B flattens a logged table into <key>._type, <key>.path, ... and writes the table beside the run
    logged = [row for row in read_offline_run(wandb_run).history
              if row.get("samples/completions._type") == "table-file"]
    assert [int(row["_step"]) for row in logged] == [2, 4]
    for row in logged:
        table = json.loads((wandb_run / "files" / row["samples/completions.path"]).read_text(encoding="utf-8"))
        assert table["columns"] == ["step", "rub_spent", "prompt", "completion"]
        expected = by_step[int(row["_step"])]
        assert [r[2:] for r in table["data"]] == [[e["prompt"], e["completion"]] for e in expected]
        assert [r[:2] for r in table["data"]] == [[e["step"], e["rub_spent"]] for e in expected]


def test_sample_settings_out_of_range_are_one_error_line_naming_the_key() -> None:
    import pytest

    from experiment.errors import ConfigError
    from experiment.sections.eval import EvalConfig

    with pytest.raises(ConfigError, match="'eval.sample_max_new_tokens': must be >= 0"):
        EvalConfig(sample_max_new_tokens=-1).validate("eval")
    with pytest.raises(ConfigError, match="'eval.sample_prompts': a prompt is empty"):
        EvalConfig(sample_prompts=["Москва", "  "]).validate("eval")
    EvalConfig(sample_max_new_tokens=0).validate("eval")  # 0 turns the samples off


def test_the_runs_wandb_summary_is_the_cost_it_ended_with(fixture_pretrained: Path) -> None:
    """W&B holds a row logged at an explicit step until the next step or the end: the last step's row, with its
    running cost, used to land after the final cost summary and overwrite its hours and badput share (the demo's
    summary said 0.02159 hours beside 0.02166 chip-hours on one chip)."""
    (wandb_run,) = [run for run in find_offline_runs(fixture_pretrained.parent / "runs" / "tiny" / "wandb")
                    if read_offline_run(run).job_type == "pretrain"]
    summary = read_offline_run(wandb_run).summary
    assert summary["cost/chips_in_use"] == 1
    assert summary["cost/hours"] == summary["cost/chip_hours"]
    assert summary["cost/badput_share"] == summary["cost/rub_badput"] / summary["cost/rub_total"]
