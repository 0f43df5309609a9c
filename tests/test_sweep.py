"""Sweeps: variants of one experiment declared in its config, run by recipe 08 under one W&B group, compared."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from experiment.config import build_config
from experiment.errors import ConfigError
from experiment.sweep import expand_variants, variant_name


def test_variants_and_grid_are_named_by_what_differs() -> None:
    variants = expand_variants([{"model.d_model": 128}, {"name": "wide", "model.d_model": 512, "model.d_ff": 1376}],
                               {"train.learning_rate": [1e-3, 3e-3], "train.warmup_steps": [10]})
    assert [v.name for v in variants] == ["d_model-128", "wide", "learning_rate-0.001_warmup_steps-10",
                                          "learning_rate-0.003_warmup_steps-10"]
    assert variants[3].overrides == {"train.learning_rate": 3e-3, "train.warmup_steps": 10}
    assert variant_name({"train.schedule": "wsd", "model.qk_norm": True}) == "schedule-wsd_qk_norm-true"


def test_a_variant_config_is_the_yaml_with_its_overrides() -> None:
    tree = {"experiment": {"name": "sw", "variants": [{"model.d_model": 128}, {"model.d_model": 256}],
                           "variant": "d_model-256"}, "model": {"d_model": 64}}
    cfg = build_config(tree)
    assert (cfg.experiment.name, cfg.experiment.group, cfg.model.d_model) == ("sw-d_model-256", "sw", 256)
    assert "model.d_model" in cfg.explicit_keys  # a variant's key counts as set by the user
    reloaded = build_config({"experiment": {**tree["experiment"], "name": cfg.experiment.name, "group": "sw"},
                             "model": {"d_model": 64}})
    assert reloaded.experiment.name == "sw-d_model-256"  # a resolved config loads to the same run
    assert build_config({"experiment": tree["experiment"] | {"variant": ""}}).experiment.name == "sw"


@pytest.mark.parametrize(("experiment", "message"), [
    ({"variants": [{"d_model": 1}]}, "'experiment.variants[0]': 'd_model' is not a dotted config key"),
    ({"variants": [{"experiment.seed": 1}]}, "experiment.seed cannot vary"),
    ({"variants": [{"name": "a", "model.d_model": 1}, {"name": "a", "model.d_model": 2}]},
     "two variants are named 'a'"),
    ({"grid": {"train.learning_rate": []}}, "'experiment.grid.train.learning_rate': expected a non-empty list"),
    ({"variants": [{"model.d_model": 1}], "variant": "nope"}, "no variant named 'nope'; the variants: d_model-1"),
    ({"variant": "x"}, "no variant named 'x'; the variants: none declared (experiment.variants / experiment.grid / "
                          "experiment.anneal)"),
])
def test_bad_sweeps_are_one_config_error(experiment: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config({"experiment": {"name": "sw", **experiment}})


@pytest.mark.integration
def test_a_stage_runs_in_its_own_process_and_its_failure_names_it(tmp_path: Path) -> None:
    """The sweep's launcher as a user meets it: the recipe in a process of its own, its exit code a RecipeError
    naming the recipe, the overrides and how to resume (the group test below runs the stages in process)."""
    from experiment.errors import RecipeError
    from experiment.stages import EVAL
    from tracking.sweep import run_stage

    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(RecipeError, match=re.escape("recipes/05_evaluate.py experiment.variant=x exited 2; rerun "
                                                    "recipes/08_sweep.py with the same arguments to resume")):
        run_stage(EVAL, str(missing), ["experiment.variant=x"])


def test_recipe_08_runs_a_group_of_variants_resumably_and_compares(tmp_path: Path, fixture_stages: Path,
                                                                    restore_wandb_env: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tiny learning-rate variants on the fixture data: two pretrain+eval run pairs in one W&B group,
    a comparison with rubles to target and a frontier plot; a rerun skips what is done and redoes what is not.
    Recipe 08 runs its stages in this process (their own processes: the test above): each would otherwise
    pay a fresh interpreter's imports and W&B service."""
    import sys

    from cost.target import Target, cost_to_target, eval_points, read_train_log
    from experiment.stages import EVAL
    from tests.fixture_run import fixture_config, run_copy
    from tests.recipe_runner import run_in_process, run_recipe
    from tracking.readback import find_offline_runs, read_offline_run

    def stage_in_process(recipe: str, argv: list[str]) -> int:
        proc = run_in_process(Path(recipe).name, argv)
        print(proc.stdout, end="")
        print(proc.stderr, end="", file=sys.stderr)  # recipe 08's captured output, shown if it fails
        return proc.returncode

    monkeypatch.setattr("tracking.sweep.recipe_exit_code", stage_in_process)

    # runs/tiny: corpus, tokenizer and shards the variants share (re-sharded: the fixture's validation split is empty)
    run_recipe("03_shard.py", run_copy(fixture_stages, tmp_path, shards={"validation_percent": 40.0}))
    config = fixture_config(
        tmp_path,
        experiment={"name": "sw", "data_from": "tiny", "grid": {"train.learning_rate": [1e-3, 1e-2]}},
        shards={"validation_percent": 40.0},
        train={"steps": 4, "eval_every": 2, "checkpoint_every": 2, "log_every": 1, "warmup_steps": 1},
        eval={"tasks": [], "train_tasks": [], "max_validation_batches": 2, "train_validation_batches": 2},
        cost={"target_bpb": 1000.0})  # reached at the first eval point: its rubles, read from the log below
    run_recipe("08_sweep.py", config, timeout=600)

    runs = tmp_path / "runs"
    names = ["sw-learning_rate-0.001", "sw-learning_rate-0.01"]
    records = [read_offline_run(d) for name in [*names, "sw"] for d in find_offline_runs(runs / name / "wandb")]
    assert {r.group for r in records} == {"sw"}
    assert sorted((r.config["experiment"]["name"], r.job_type) for r in records if r.job_type != "compare") == \
        sorted((name, job) for name in names for job in ("pretrain", "eval"))
    lr_of = {r.config["experiment"]["name"]: r.config["variant"]["train.learning_rate"] for r in records
             if r.job_type == "pretrain"}
    assert lr_of == dict(zip(names, [1e-3, 1e-2], strict=True))
    assert all(r.config["train"]["learning_rate"] == lr_of[r.config["experiment"]["name"]] for r in records
               if r.job_type != "compare")

    rows = {r["experiment"]: r for r in csv.DictReader((runs / "sw" / "reports" / "costs.csv").open(encoding="utf-8"))}
    assert list(rows) == names
    target = Target("eval/val_bpb", 1000.0, lower_is_better=True)
    for name in names:
        first_eval = cost_to_target(eval_points(read_train_log(runs / name), target.metric), target)
        assert first_eval.step == 2 and float(rows[name]["rub_to_target"]) == pytest.approx(first_eval.rub)
        assert rows[name]["variant"].startswith("train.learning_rate=")
    assert (runs / "sw" / "reports" / "frontier.png").is_file()
    (compare,) = [r for r in records if r.job_type == "compare"]
    assert compare.summary["costs/table.nrows"] == 2 and compare.summary["costs/frontier._type"] == "image-file"

    # the sweep figures (tools/readme_figures.py) read from this folder: the crossings above, the fields README records
    from tests.test_readme_figures import keys_of
    from tools.readme_figures import SWEEP, recorded_figures, sweep_figures

    figures = sweep_figures(runs / "sw")
    assert [v["experiment"] for v in figures["variants"]] == names and figures["target_bpb"] == 1000.0
    assert all(v["reached"] and v["step_at_target"] == 2 for v in figures["variants"])
    assert [v["rub_to_target"] for v in figures["variants"]] == pytest.approx(
        [float(rows[n]["rub_to_target"]) for n in names])
    assert keys_of(figures) == keys_of(recorded_figures()[SWEEP])

    # a variant interrupted after training (no eval yet) is finished by the rerun; the others are skipped
    (runs / names[0] / "eval" / "manifest.json").unlink()
    from tracking.sweep import run_sweep

    done = run_sweep(str(config), [], compare=False)
    assert done == {"learning_rate-0.001": "ran", "learning_rate-0.01": "skipped"}
    assert EVAL.read_manifest(runs / names[0] / "eval")["latest_step"] == 4
    assert json.loads((runs / names[0] / "checkpoints" / "wandb_run.json").read_text(encoding="utf-8"))["run_id"]
