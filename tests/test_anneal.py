"""Anneal comparisons (``experiment.anneal``): the runs they expand into, their config errors, the interval math
and the rubles of a run, and recipe 08 running one on the fixture run and printing its table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from cost.anneal import AnnealRun, comparison_rows, ledger_rubles, paired_differences, t_interval, verdict
from experiment.checkpoint_steps import CHECKSUMMED, CHECKSUMS, COMMIT_MARKER, finished_steps
from experiment.config import build_config, build_dataclass
from experiment.errors import ConfigError
from experiment.files import atomic_write_text
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.storage import BucketPath, RunPath
from experiment.sweep import AnnealConfig, expand_variants

ANNEAL: dict[str, Any] = {"parent": "long", "step": 100, "steps": 20, "seeds": [0, 1],
                          "sets": {"web": "", "books": "/data/books/shards"},
                          "control": {"web": 1}, "candidates": {"books-25": {"web": 3, "books": 1}}}


def anneal_section(**change: Any) -> AnnealConfig:
    """``ANNEAL`` with ``change``, built as the config's loader builds the section."""
    return build_dataclass(AnnealConfig, {**ANNEAL, **change}, "experiment.anneal")


def test_an_anneal_expands_into_branches_of_one_checkpoint_with_the_same_steps_and_decay() -> None:
    variants = expand_variants(None, None, anneal_section(), "/runs")
    assert [v.name for v in variants] == ["control-seed0", "control-seed1", "books-25-seed0", "books-25-seed1"]
    sets = {"web": "/runs/long/shards", "books": "/data/books/shards"}  # "": the parent's shards
    for variant in variants:
        o = variant.overrides
        assert (o["train.branch_from"], o["train.branch_step"], o["train.branch_data"]) == ("long", 100, "own")
        assert (o["train.steps"], o["train.schedule"], o["train.decay_steps"], o["train.decay"]) == \
            (120, "wsd", 20, "linear")
        assert o["eval.validation_sets"] == sets  # every run measured on every set
        assert o["experiment.seed"] == int(variant.name[-1])
    assert variants[0].overrides["train.mixture"] == [{"name": "web", "shards": sets["web"], "weight": 1}]
    assert variants[3].overrides["train.mixture"] == [{"name": "web", "shards": sets["web"], "weight": 3},
                                                      {"name": "books", "shards": sets["books"], "weight": 1}]
    # a mixture's sets in the order of sets: a set keeps its place (its shuffle) in every mixture that has it
    reordered = expand_variants(None, None, anneal_section(candidates={"b": {"books": 1, "web": 3}}), "/runs")
    assert [s["name"] for s in reordered[3].overrides["train.mixture"]] == ["web", "books"]
    # a parent given as a folder: its own shards/
    folder = expand_variants(None, None, anneal_section(parent="/elsewhere/long"), "/runs")
    assert folder[0].overrides["train.mixture"][0]["shards"] == "/elsewhere/long/shards"


def test_a_sweep_config_with_an_anneal_loads_and_its_runs_are_named_by_mixture_and_seed() -> None:
    cfg = build_config({"experiment": {"name": "an", "run_root": "/runs", "anneal": ANNEAL}})
    assert cfg.experiment.anneal.candidates == {"books-25": {"web": 3.0, "books": 1.0}}
    assert build_config({"experiment": {"name": "an"}}).experiment.anneal.declared() is False


@pytest.mark.parametrize(("change", "message"), [
    ({"parent": ""}, "'experiment.anneal.parent': an anneal comparison starts from a parent run's checkpoint"),
    ({"step": 0}, "'experiment.anneal.step': must be >= 1, got 0"),
    ({"steps": -5}, "'experiment.anneal.steps': must be >= 1, got -5"),
    ({"seeds": [3]}, "'experiment.anneal.seeds': give at least two seeds"),
    ({"seeds": [1, 1]}, "'experiment.anneal.seeds': distinct seeds >= 0, got [1, 1]"),
    ({"sets": {}}, "'experiment.anneal.sets': name the data sets"),
    ({"sets": {"web": "", "my books": "/b"}}, "'experiment.anneal.sets.my books': a set's name may hold only"),
    ({"control": {}}, "'experiment.anneal.control': the control mixture"),
    ({"candidates": {}}, "'experiment.anneal.candidates': name at least one candidate mixture"),
    ({"candidates": {"control": {"books": 1}}}, "'experiment.anneal.candidates.control': a candidate's name"),
    ({"candidates": {"same": {"web": 1}}}, "'experiment.anneal.candidates.same': the same mixture as the control"),
    ({"candidates": {"c": {"code": 1}}}, "'experiment.anneal.candidates.c.code': not a set of experiment.anneal.sets "
                                         "(web, books)"),
    ({"control": {"web": 0}}, "'experiment.anneal.control.web': a weight must be positive, got 0"),
    ({"seed": [0, 1]}, "unknown config key 'experiment.anneal.seed'; did you mean 'experiment.anneal.seeds'?"),
    ({"steps": "many"}, "experiment.anneal.steps"),
])
def test_a_bad_anneal_is_one_config_error_naming_its_key(change: dict, message: str) -> None:
    anneal = {**ANNEAL, **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config({"experiment": {"name": "an", "anneal": anneal}})
    # a run of the comparison meets the same line (its YAML is expanded before the sections are built)
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config({"experiment": {"name": "an", "anneal": anneal, "variant": "control-seed0"}})


def test_an_anneal_makes_its_own_runs() -> None:
    with pytest.raises(ConfigError, match=re.escape("config key 'experiment.anneal': an anneal comparison makes its "
                                                    "own runs; leave experiment.variants and experiment.grid empty")):
        build_config({"experiment": {"name": "an", "anneal": ANNEAL, "grid": {"train.learning_rate": [1e-3]}}})
    with pytest.raises(ConfigError, match=re.escape("config key 'experiment.anneal': expected a mapping")):
        build_config({"experiment": {"name": "an", "anneal": [1, 2], "variant": "control-seed0"}})


def test_the_t_interval_is_scipys_one_sample_interval() -> None:
    values = [1.712, 1.698, 1.705, 1.721]
    interval = t_interval(values)
    expected = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert (interval.low, interval.high) == pytest.approx((expected.low, expected.high), rel=1e-12)
    assert interval.mean == pytest.approx(np.mean(values)) and interval.n == 4
    # two values: mean +- t(0.975, 1) x s / sqrt(2), t(0.975, 1) = 12.7062 (any table of Student's t)
    two = t_interval([1.0, 3.0])
    assert (two.low, two.high) == pytest.approx((2.0 - 12.7062, 2.0 + 12.7062), abs=1e-4)
    assert two.text() == "2.0000 ± 12.7062" and two.text(signed=True) == "+2.0000 ± 12.7062"
    one = t_interval([1.5])  # no spread to measure: no interval, and the table says so
    assert one.mean == 1.5 and np.isnan(one.low) and one.text() == "1.5000"
    assert verdict(one) == "one seed: no interval"


def test_the_paired_difference_is_scipys_related_samples_interval() -> None:
    control = {0: 1.80, 1: 1.74, 2: 1.77, 5: 9.99}  # seed 5 has no candidate run: left out of the pairs
    candidate = {0: 1.79, 1: 1.725, 2: 1.768}
    interval = paired_differences(candidate, control)
    expected = stats.ttest_rel([1.79, 1.725, 1.768], [1.80, 1.74, 1.77]).confidence_interval(0.95)
    assert (interval.low, interval.high) == pytest.approx((expected.low, expected.high), rel=1e-12)
    assert interval.n == 3 and interval.mean == pytest.approx(np.mean([-0.01, -0.015, -0.002]))


def run(mixture: str, seed: int, web: float, books: float, rub: float = 1.0) -> AnnealRun:
    return AnnealRun(mixture, seed, f"an-{mixture}-seed{seed}", {"web": web, "books": books}, rub, rub + 10.0)


def test_pairing_by_seed_sees_a_difference_the_seeds_spread_hides() -> None:
    """Seeds move both mixtures' bits per byte together (the same data order of the shared set): the candidate is
    0.01-0.012 better on books at every seed, which the paired interval finds and the two means' intervals, which
    overlap, do not."""
    runs = [run("control", 0, 1.70, 2.40, rub=0.5), run("control", 1, 1.74, 2.46, rub=0.7),
            run("control", 2, 1.72, 2.43, rub=0.6),
            run("books-25", 0, 1.705, 2.39), run("books-25", 1, 1.744, 2.448), run("books-25", 2, 1.726, 2.419)]
    rows = {r["data_set"]: r for r in comparison_rows(runs, ["books-25"], ["web", "books"])}
    books = rows["books"]
    assert books["candidate_low"] < books["control_high"]  # the unpaired intervals overlap
    assert books["difference_high"] < 0 and books["verdict"] == "better"
    assert rows["web"]["difference_low"] > 0 and rows["web"]["verdict"] == "worse"
    assert books["control_bpb"] == t_interval([2.40, 2.46, 2.43]).text()
    assert books["seeds"] == 3
    assert (books["rub_control"], books["rub_candidate"], books["rub_candidate_total"]) == pytest.approx((0.6, 1.0,
                                                                                                           11.0))


def test_a_branch_runs_own_rubles_leave_out_what_it_inherited(tmp_path: Path) -> None:
    """The parent trains 2 h and saves at step 100; its branch trains 0.5 h more: its own rubles are the half hour's,
    its total 2.5 h's."""
    from cost.ledger_pricing import summarize_ledger_at
    from tests.fake_clock import FakeClock
    from tests.test_ledger import RUB_PER_HOUR, open_fake

    clock = FakeClock()
    parent = open_fake(tmp_path / "parent", clock)
    with parent.phase("train"):
        clock.advance(2.0)
        parent.add_tokens(100, 1000)
    item = parent.checkpoint_record(100)
    with parent.phase("train"):
        clock.advance(1.0)  # the parent's steps after the checkpoint are not the branch's
        parent.add_tokens(150, 500)
    parent.close()
    branch = open_fake(tmp_path / "branch", clock)
    branch.inherit(summarize_ledger_at(tmp_path / "parent" / "ledger", item), str(tmp_path / "parent"), 100)
    with branch.phase("train"):
        clock.advance(0.5)
        branch.add_tokens(120, 200)
    branch.close()
    own, total = ledger_rubles(RunFolder(tmp_path / "branch"))
    assert (own, total) == pytest.approx((0.5 * RUB_PER_HOUR, 2.5 * RUB_PER_HOUR))
    assert ledger_rubles(RunFolder(tmp_path / "parent")) == pytest.approx((3.0 * RUB_PER_HOUR,) * 2)  # no parent


def test_eval_measures_its_validation_sets_beside_the_mixtures(tmp_path: Path) -> None:
    from eval.run import measured_sets

    def config(validation_sets: dict[str, str]) -> Any:
        return build_config({"experiment": {"name": "r", "run_root": str(tmp_path)},
                             "train": {"mixture": [{"name": "web", "shards": "/a"}, {"name": "own", "weight": 2}]},
                             "eval": {"validation_sets": validation_sets}})

    folder = RunFolder(tmp_path / "r")
    found = measured_sets(config({"web": "/a", "books": "/b", "mine": ""}), folder)
    assert [(name, str(path), weight) for name, path, weight in found] == [
        ("web", "/a", 1.0), ("own", str(folder.shards), 2.0), ("books", "/b", 0.0), ("mine", str(folder.shards), 0.0)]
    with pytest.raises(ConfigError, match=re.escape("config key 'eval.validation_sets.web': /c is not the shards "
                                                    "folder train.mixture names for the set 'web' (/a)")):
        measured_sets(config({"web": "/c"}), folder)


def sharded_parent(tmp_path: Path, fixture_stages: Path) -> RunFolder:
    """A copy of the fixture run ``tiny`` under ``tmp_path/runs`` sharded with 2 of its 7 documents held out."""
    from tests.fixture_run import run_copy
    from tests.recipe_runner import run_recipe

    run_recipe("03_shard.py", run_copy(fixture_stages, tmp_path, shards={"validation_percent": 30.0}))
    return RunFolder(tmp_path / "runs" / "tiny")


def suite_bits_per_byte(cfg: ExperimentConfig, run: RunFolder, tokenizer: Path) -> tuple[dict[str, Any], int]:
    """Recipe 05's bits per byte of ``run`` (its suite, no task; one batch a folder) and the batches the model
    scored: a uniform model, so every measurement of one folder gives the same numbers."""
    import jax.numpy as jnp

    from eval.run import measured_sets, run_suite
    from tokenizer.loaded import load_run_tokenizer

    tok = load_run_tokenizer(tokenizer)
    scored = []

    def uniform(tokens: Any) -> Any:
        scored.append(tokens.shape)
        return jnp.zeros((*tokens.shape, tok.vocab_size))

    results = run_suite(uniform, tok, cfg.eval, run, max_len=cfg.model.max_seq_len, tasks=[], max_items=None,
                        validation_batches=1, mixture=measured_sets(cfg, run))
    return results, len(scored)


def test_recipe_05_measures_each_data_set_of_an_anneal_run_once(tmp_path: Path, fixture_stages: Path) -> None:
    """An anneal run's shards/ links to its parent's (recipe 04 reads their manifest); the set the comparison names
    "" is that folder too. Recipe 05's suite measures it once, under the set's name (what cost/anneal.py reads),
    not again as the run's own validation."""
    from eval.run import measured_sets
    from experiment.links import link_stages, resolved
    from experiment.stages import SHARDS

    parent = sharded_parent(tmp_path, fixture_stages)  # its validation split: 2 of the 7 documents
    books = fixture_stages / "runs" / "tiny" / "shards"  # an empty validation split: left out with a warning
    anneal = {**ANNEAL, "parent": "tiny", "step": 3, "steps": 2, "sets": {"web": "", "books": str(books)}}
    cfg = build_config({"experiment": {"name": "an", "run_root": str(tmp_path / "runs"), "anneal": anneal,
                                       "variant": "control-seed0"}, "train": {"warmup_steps": 1}})
    run = RunFolder.for_config(cfg)
    link_stages(run, parent, (SHARDS,), "as recipe 08 links an anneal run's shards")
    results, batches = suite_bits_per_byte(cfg, run, parent.tokenizer)

    measured = [resolved(run.shards)] if "validation" in results else []
    measured += [resolved(folder) for name, folder, _ in measured_sets(cfg, run)
                 if name in results["validation_by_set"]]
    assert measured == [resolved(parent.shards)]  # the parent's shards once: as the set web
    assert list(results["validation_by_set"]) == ["web"] and batches == 1
    assert results["validation_skipped"].startswith("eval.validate_run_shards is false")


def test_recipe_05_reads_a_folder_that_several_names_give_once(tmp_path: Path, fixture_stages: Path) -> None:
    """Any run: its own shards as its validation, a mixture set "" and an eval.validation_sets name of the same
    folder are one measurement, reported under each name."""
    parent = sharded_parent(tmp_path, fixture_stages)
    cfg = build_config({"experiment": {"name": "tiny", "run_root": str(tmp_path / "runs")},
                        "train": {"warmup_steps": 1, "mixture": [{"name": "own"}]},
                        "eval": {"validation_sets": {"mine": "", "also": str(parent.shards)}}})
    results, batches = suite_bits_per_byte(cfg, parent, parent.tokenizer)
    assert batches == 1  # was 4: validation, then own, mine and also, each read again
    assert list(results["validation_by_set"]) == ["own", "mine", "also"]
    whole = {k: v for k, v in results["validation"].items() if k != "seconds"}
    assert whole["tokens"] > 0 and all(results["validation_by_set"][name] == whole for name in ("own", "mine", "also"))


def parent_step(checkpoints: RunPath, step: int, *, committed: bool, checksums: bool) -> None:
    """Step ``step`` of a parent's checkpoint folder as Orbax and the trainer leave it: a bucket step's objects are
    written in place and committed by Orbax's marker written last (a disk step's folder appears whole when Orbax
    renames it); then the trainer writes its checksums (a kill before then leaves none)."""
    step_dir = checkpoints / str(step)
    if isinstance(step_dir, Path):
        (step_dir / "params").mkdir(parents=True)
    atomic_write_text(step_dir / "params" / "_METADATA", "{}")
    if committed and isinstance(step_dir, BucketPath):
        atomic_write_text(step_dir / COMMIT_MARKER, "")
    if checksums:
        atomic_write_text(step_dir / CHECKSUMS, "{}")


def anneal_configs(run_root: str, step: int) -> tuple[ExperimentConfig, ExperimentConfig]:
    """The config of an anneal comparison of run ``long``'s ``step`` under ``run_root``, and of its first run."""
    experiment = {"name": "an", "run_root": run_root, "anneal": {**ANNEAL, "step": step}}
    return build_config({"experiment": experiment}), \
        build_config({"experiment": {**experiment, "variant": "control-seed0"}})


def check_anneal_parent(run_root: str, step: int) -> str:
    """The line check_anneal_inputs refuses the anneal of ``step`` with (the parent has no shards: a step it
    accepts is refused by the check of the sets after it)."""
    from experiment.errors import RecipeError
    from tracking.sweep import check_anneal_inputs

    with pytest.raises(RecipeError) as refused:
        check_anneal_inputs(*anneal_configs(run_root, step))
    return str(refused.value)


def test_an_anneal_from_a_step_whose_save_did_not_finish_is_refused_in_one_line(any_root: RunPath) -> None:
    """A crash mid-save leaves a step folder without its commit marker (a bucket) or, killed between Orbax's commit
    and the trainer's checksums, one without checksums: every run of the comparison would fail on it one by one."""
    checkpoints = any_root / "long" / "checkpoints"
    parent_step(checkpoints, 100, committed=True, checksums=True)
    atomic_write_text(checkpoints / CHECKSUMMED, "")  # this version's folder: its steps carry checksums
    parent_step(checkpoints, 120, committed=not isinstance(checkpoints, BucketPath), checksums=False)
    assert finished_steps(checkpoints) == [100]
    assert check_anneal_parent(str(any_root), 120) == (
        f"config key 'experiment.anneal.step': the checkpoint of step 120 in {checkpoints} did not finish (its save "
        "was interrupted: no commit marker or checksums); its finished steps: 100 (resume the parent with "
        "recipes/04_pretrain.py, or name a finished step)")
    assert check_anneal_parent(str(any_root), 130).startswith(
        f"config key 'experiment.anneal.step': no checkpoint of step 130 in {checkpoints}; its finished steps: 100 ")
    assert check_anneal_parent(str(any_root), 100).startswith("config key 'experiment.anneal.sets.web': ")


def test_a_bucket_step_without_its_commit_marker_is_not_finished_in_an_older_folder(bucket: BucketPath) -> None:
    """A folder an older version wrote has no checksums, so its steps are read unverified; a bucket step of it
    without Orbax's commit marker is still a save that never finished (Orbax does not list it either)."""
    checkpoints = bucket / "long" / "checkpoints"
    parent_step(checkpoints, 100, committed=True, checksums=False)
    parent_step(checkpoints, 120, committed=False, checksums=False)
    assert finished_steps(checkpoints) == [100]
    assert check_anneal_parent(str(bucket), 120).startswith(
        f"config key 'experiment.anneal.step': the checkpoint of step 120 in {checkpoints} did not finish")


def anneal_sweep(tmp_path: Path, fixture_stages: Path, fixture_pretrained: Path, **anneal: Any) -> Path:
    """An anneal comparison of the fixture run's checkpoint 3 (a copy in ``tmp_path``): 2 steps on set ``a`` (the
    control) and on ``a`` + ``b``, seeds 0 and 1; both sets are the fixture corpus sharded with the parent's tokenizer
    at two validation splits (its own shards have an empty one): 2 of its 7 documents held out, and 5 (those 2 among
    them), so the sets' bits per byte differ. Returns the sweep's config."""
    from tests.fixture_run import fixture_config, pretrained_copy, run_copy
    from tests.recipe_runner import run_recipe

    pretrained_copy(fixture_pretrained, tmp_path)
    sets = {}
    for name, percent in (("a", 30.0), ("b", 80.0)):
        run_recipe("03_shard.py", run_copy(fixture_stages, tmp_path / f"set-{name}", shards={"validation_percent":
                                                                                              percent}))
        sets[name] = str(tmp_path / f"set-{name}" / "runs" / "tiny" / "shards")
    return fixture_config(
        tmp_path,
        experiment={"name": "an", "anneal": {"parent": "tiny", "step": 3, "steps": 2, "seeds": [0, 1], "sets": sets,
                                             "control": {"a": 1}, "candidates": {"ab": {"a": 1, "b": 1}}, **anneal}},
        train={"checkpoint_every": 2, "log_every": 1, "warmup_steps": 1},
        eval={"tasks": [], "train_tasks": [], "max_validation_batches": 2})


@pytest.mark.integration
def test_recipe_08_runs_an_anneal_comparison_and_prints_its_table_with_intervals(
        tmp_path: Path, fixture_stages: Path, fixture_pretrained: Path, restore_wandb_env: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import csv
    import json
    import sys

    from cost.ledger_pricing import summarize_ledger
    from tests.recipe_runner import run_in_process, run_recipe

    def stage_in_process(recipe: str, argv: list[str]) -> int:  # as tests/test_sweep.py: recipe 08's stages in here
        proc = run_in_process(Path(recipe).name, argv)
        print(proc.stdout, end="")
        print(proc.stderr, end="", file=sys.stderr)
        return proc.returncode

    monkeypatch.setattr("tracking.sweep.recipe_exit_code", stage_in_process)
    config = anneal_sweep(tmp_path, fixture_stages, fixture_pretrained)
    printed = run_recipe("08_sweep.py", config, timeout=600).stdout  # recipe 06's print, in recipe 08's output

    runs = tmp_path / "runs"
    reports = runs / "an" / "reports"
    per_run = list(csv.DictReader((reports / "anneal_runs.csv").open(encoding="utf-8")))
    names = ["an-control-seed0", "an-control-seed1", "an-ab-seed0", "an-ab-seed1"]
    assert [r["experiment"] for r in per_run] == names
    parent_total = summarize_ledger(runs / "tiny" / "ledger").rub_total
    inherited = []
    for row in per_run:
        results = json.loads((runs / row["experiment"] / "eval" / "step_0000005.json").read_text(encoding="utf-8"))
        for name in ("a", "b"):  # every run measured on both sets, the control's too
            assert float(row[f"bpb_{name}"]) == results["validation_by_set"][name]["bits_per_byte"]
        assert row["bpb_a"] != row["bpb_b"]
        total = summarize_ledger(runs / row["experiment"] / "ledger").rub_total
        assert float(row["rub_total"]) == pytest.approx(total)
        assert 0 < float(row["rub_own"]) < total
        inherited.append(total - float(row["rub_own"]))
    # every run inherited the same rubles: the parent's up to its checkpoint 3, less than its whole 6 steps
    assert inherited == pytest.approx([inherited[0]] * 4) and inherited[0] < parent_total
    bpb = {(r["experiment"], name): float(r[f"bpb_{name}"]) for r in per_run for name in ("a", "b")}
    assert bpb["an-control-seed0", "a"] != bpb["an-control-seed1", "a"]  # the seeds read the data in other orders

    rows = list(csv.DictReader((reports / "anneal.csv").open(encoding="utf-8")))
    assert [(r["candidate"], r["data_set"]) for r in rows] == [("ab", "a"), ("ab", "b")]
    for row in rows:
        name = row["data_set"]
        control = [bpb[f"an-control-seed{seed}", name] for seed in (0, 1)]
        candidate = [bpb[f"an-ab-seed{seed}", name] for seed in (0, 1)]
        paired = stats.ttest_rel(candidate, control).confidence_interval(0.95)
        assert (float(row["difference_low"]), float(row["difference_high"])) == pytest.approx((paired.low,
                                                                                               paired.high))
        own = stats.ttest_1samp(control, 0.0).confidence_interval(0.95)
        assert (float(row["control_low"]), float(row["control_high"])) == pytest.approx((own.low, own.high))
        assert float(row["control_low"]) < float(row["control_mean"]) < float(row["control_high"])
        assert float(row["rub_candidate"]) == pytest.approx(np.mean([float(r["rub_own"]) for r in per_run[2:]]))
    # the table in the log, as a CI log shows it, and in Markdown
    assert "Anneal comparison: 2 seeds, 2 steps from tiny step 3" in printed
    assert "difference ± 95%" in printed and rows[0]["difference"].split(" ± ")[0] in printed
    assert "| ab | a |" in (reports / "anneal.md").read_text(encoding="utf-8")


@pytest.mark.integration
def test_an_anneal_from_a_missing_or_unfinished_step_or_set_writes_nothing(
        tmp_path: Path, fixture_stages: Path, fixture_pretrained: Path) -> None:
    from experiment.errors import RecipeError
    from tracking.sweep import run_sweep

    config = anneal_sweep(tmp_path, fixture_stages, fixture_pretrained, step=4)
    with pytest.raises(RecipeError, match=re.escape("config key 'experiment.anneal.step': no checkpoint of step 4 in "
                                                    f"{tmp_path / 'runs' / 'tiny' / 'checkpoints'}")):
        run_sweep(str(config), [])
    # the parent's step 6 as a kill between Orbax's commit and the trainer's checksums leaves it: not finished
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"
    (checkpoints / "6" / CHECKSUMS).unlink()
    with pytest.raises(RecipeError, match=re.escape(f"config key 'experiment.anneal.step': the checkpoint of step 6 in "
                                                    f"{checkpoints} did not finish")):
        run_sweep(str(config), ["experiment.anneal.step=6"])
    # a set whose shards were never made
    nowhere = tmp_path / "nowhere" / "shards"
    with pytest.raises(RecipeError, match=re.escape(f"config key 'experiment.anneal.sets.b': no finished shards in "
                                                    f"{nowhere}")):
        run_sweep(str(config), ["experiment.anneal.step=3", f"experiment.anneal.sets.b={nowhere}"])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["tiny"]  # no sweep or run folder
