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
from experiment.config import build_config
from experiment.errors import ConfigError
from experiment.runfolder import RunFolder
from experiment.sweep import expand_variants

ANNEAL: dict[str, Any] = {"parent": "long", "step": 100, "steps": 20, "seeds": [0, 1],
                          "sets": {"web": "", "books": "/data/books/shards"},
                          "control": {"web": 1}, "candidates": {"books-25": {"web": 3, "books": 1}}}


def test_an_anneal_expands_into_branches_of_one_checkpoint_with_the_same_steps_and_decay() -> None:
    variants = expand_variants(None, None, ANNEAL, "/runs")
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
    reordered = expand_variants(None, None, {**ANNEAL, "candidates": {"b": {"books": 1, "web": 3}}}, "/runs")
    assert [s["name"] for s in reordered[3].overrides["train.mixture"]] == ["web", "books"]
    # a parent given as a folder: its own shards/
    folder = expand_variants(None, None, {**ANNEAL, "parent": "/elsewhere/long"}, "/runs")
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
    assert books["difference_high"] < 0 and books["verdict"] == "candidate better"
    assert rows["web"]["difference_low"] > 0 and rows["web"]["verdict"] == "candidate worse"
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
