"""Mixture schedules (train.mixture_schedule): the weights change at the steps named, counted from the rows the
batches hold; a resume before, at or after a change reads the uninterrupted run's batches bit for bit; the state
pins the schedule; the keys are checked at load; the ledger books and prices each set's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import grain
import numpy as np
import pytest

from data_prep.shards.loader import MixtureSchedule, make_mixture_iterator
from experiment.errors import ConfigError, DataError
from tests.test_loader_mixture import MARK, SEQ_LEN, TOKENIZER, set_of_rows, write_shard_set

BATCH = 20
# web alone for 5 steps, then web 1 : code 3 for 5 steps, then books and code evenly
CHANGES = [(5, {"web": 1.0, "code": 3.0}), (10, {"books": 1.0, "code": 1.0})]


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Path, float]]:
    root = tmp_path_factory.mktemp("schedule")
    return [("web", write_shard_set(root / "web", 1, 301), 1.0),
            ("books", write_shard_set(root / "books", 2, 203), 0.0),  # brought in by the schedule (Levanter's way)
            ("code", write_shard_set(root / "code", 3, 47, validation_rows=0), 0.0)]


def loader(sets: list[tuple[str, Path, float]], **kwargs: object):  # noqa: ANN201 (a TrainIterator)
    return make_mixture_iterator(sets, BATCH, seed=3, tokenizer_sha256=TOKENIZER, seq_len=SEQ_LEN,
                                 schedule=kwargs.pop("schedule", CHANGES), **kwargs)


def test_the_shares_change_at_the_steps_named_counted_from_the_batches(sets: list[tuple[str, Path, float]]) -> None:
    it = loader(sets)
    batches = [next(it) for _ in range(16)]
    per_step = [np.bincount(set_of_rows([b]), minlength=4)[1:] / BATCH for b in batches]  # web, books, code
    web, books, code = np.array(per_step).T
    assert web[:5].tolist() == [1.0] * 5
    assert web[5:10].tolist() == [0.25] * 5 and code[5:10].tolist() == [0.75] * 5 and not books[5:10].any()
    assert books[10:].tolist() == [0.5] * 6 and code[10:].tolist() == [0.5] * 6 and not web[10:].any()
    # the loader's closed form says the same, batch by batch, without reading a row
    for step in range(1, 17):
        metrics = it.mixture_metrics(step, BATCH * SEQ_LEN)
        for name, shares in (("web", web), ("books", books), ("code", code)):
            assert metrics[f"data/{name}/share"] == shares[step - 1]
            assert metrics[f"data/{name}/tokens_seen"] == round(sum(shares[:step]) * BATCH * SEQ_LEN)
    assert it.tokens_by_set(6, BATCH * SEQ_LEN) == {"web": 5 * SEQ_LEN, "books": 0, "code": 15 * SEQ_LEN}


def test_the_ledger_tokens_and_the_logged_shares_are_the_same_rows_of_a_step(
        sets: list[tuple[str, Path, float]]) -> None:
    """What the ledger books per set (``tokens_by_set``) and what train_log shows (``mixture_metrics``) are one count
    of each step's rows: equal at every step, and nothing before the stream's first step (a stage's stream begins
    at its branch step)."""
    tokens_per_step = BATCH * SEQ_LEN
    for start in (0, 4):
        it = loader(sets, schedule=[(start + step, weights) for step, weights in CHANGES], stream_start_step=start)
        for step in range(start + 17):
            metrics = it.mixture_metrics(step, tokens_per_step)
            booked = it.tokens_by_set(step, tokens_per_step)
            if step <= start:
                assert (metrics, booked) == ({}, None), step
                continue
            assert booked == {name: round(metrics[f"data/{name}/share"] * tokens_per_step) for name, _, _ in sets}
            assert sum(booked.values()) == tokens_per_step


def test_each_set_reads_on_in_its_own_stream_across_a_change(sets: list[tuple[str, Path, float]]) -> None:
    """A set's rows after a change continue its stream where the stage before left it: code's 47 records come
    as one permutation over steps 6-10 and the start of step 11 (none twice before all were read)."""
    it = loader(sets)
    rows = set_of_rows([next(it) for _ in range(16)], rows=True)
    code = rows[rows // MARK == 3] % MARK
    assert sorted(code[:47].tolist()) == list(range(47))


@pytest.mark.parametrize("resume_at", [3, 5, 7, 10, 12])  # before, at and after each change
@pytest.mark.parametrize("processes", [1, 2])
def test_a_resume_reads_the_uninterrupted_batches_bit_for_bit(sets: list[tuple[str, Path, float]], resume_at: int,
                                                              processes: int) -> None:
    for process in range(processes):
        whole = loader(sets, process_index=process, process_count=processes)
        expected = [next(whole) for _ in range(16)]
        first = loader(sets, process_index=process, process_count=processes)
        for _ in range(resume_at):
            next(first)
        state = json.loads(json.dumps(first.get_state()))  # what the checkpoint holds
        assert state["mixture_schedule"] == [[5, {"web": 1.0, "books": 0.0, "code": 3.0}],
                                             [10, {"web": 0.0, "books": 1.0, "code": 1.0}]]
        resumed = loader(sets, process_index=process, process_count=processes)
        resumed.set_state(state)
        for want, got in zip(expected[resume_at:], (next(resumed) for _ in range(16 - resume_at)), strict=True):
            assert want.keys() == got.keys()
            for key in want:
                assert want[key].tobytes() == got[key].tobytes(), key


def test_the_state_pins_the_schedule_and_the_batch_size(sets: list[tuple[str, Path, float]]) -> None:
    it = loader(sets)
    next(it)
    state = it.get_state()
    with pytest.raises(DataError, match="mixture schedule"):
        loader(sets, schedule=[(6, {"web": 1.0, "code": 3.0}), CHANGES[1]]).set_state(state)
    evenly = [(name, folder, 1.0) for name, folder, _ in sets]
    with pytest.raises(DataError, match="mixture schedule"):
        loader(evenly, schedule=[]).set_state(loader(evenly).get_state())
    other_batch = make_mixture_iterator(sets, BATCH // 2, seed=3, schedule=CHANGES)
    with pytest.raises(DataError, match="global batch size 20"):
        other_batch.set_state(state)
    fixed_state = loader(evenly, schedule=[]).get_state()
    assert "mixture_schedule" not in fixed_state  # a fixed mixture's state is as it was before schedules
    with pytest.raises(DataError, match="mixture schedule"):
        loader(evenly).set_state(fixed_state)
    with pytest.raises(ConfigError, match=r"train.mixture\[1\].weight': must be positive, got 0.0"):
        loader(sets, schedule=[])  # books and code would never be read: refused before any shard opens


@pytest.mark.parametrize("weights", [[0.6, 0.3, 0.1], [0.7, 0.3], [3.0, 1.0], [1 / 3, 1 / 3, 1 / 3]])
def test_one_stage_is_grains_mix(weights: list[float]) -> None:
    """A schedule's stage interleaves as Grain's mix does (fixed mixtures keep Grain's stream: old checkpoints)."""
    streams = [grain.MapDataset.range(i * MARK, (i + 1) * MARK) for i in range(len(weights))]
    mixed = grain.MapDataset.mix(streams, weights)
    schedule = MixtureSchedule([str(i) for i in range(len(weights))], weights, [], BATCH)
    located = [schedule.locate(n) for n in range(3000)]
    assert [mixed[n] for n in range(3000)] == [part * MARK + position for part, position in located]
    assert schedule.rows_before(3000) == np.bincount([p for p, _ in located], minlength=len(weights)).tolist()


@pytest.mark.parametrize(("stages", "key"), [
    ([{"step": 0, "weights": {"a": 1.0}}], r"train.mixture_schedule\[0\].step"),
    ([{"step": 5, "weights": {"a": 1.0}}, {"step": 5, "weights": {"b": 1.0}}], r"train.mixture_schedule\[1\].step"),
    ([{"step": 100, "weights": {"a": 1.0}}], r"train.mixture_schedule\[0\].step': 100 is never reached"),
    ([{"step": 5, "weights": {"c": 1.0}}], r"train.mixture_schedule\[0\].weights.c': not a set of train.mixture"),
    ([{"step": 5, "weights": {"a": -1.0}}], r"train.mixture_schedule\[0\].weights.a': must be >= 0"),
    ([{"step": 5, "weights": {"a": 0.0}}], r"train.mixture_schedule\[0\].weights': at least one"),
])
def test_schedule_keys_are_checked_at_load(stages: list[dict], key: str) -> None:
    from experiment.sections.train import MixtureSetConfig, MixtureStageConfig, TrainConfig

    mixture = [MixtureSetConfig("a"), MixtureSetConfig("b", "x")]
    schedule = [MixtureStageConfig(5, {"b": 1.0})]
    TrainConfig(steps=50, warmup_steps=1, mixture=mixture, mixture_schedule=schedule).validate("train")
    with pytest.raises(ConfigError, match=key):
        TrainConfig(steps=50, warmup_steps=1, mixture=mixture,
                     mixture_schedule=[MixtureStageConfig(**s) for s in stages]).validate("train")
    with pytest.raises(ConfigError, match="train.mixture, which is empty"):
        TrainConfig(steps=50, warmup_steps=1, mixture_schedule=[MixtureStageConfig(5, {"b": 1.0})]).validate("train")
    # a set may start at 0 only when a stage brings it in; some set must read at step 0
    brought_in = [MixtureSetConfig("a"), MixtureSetConfig("b", "x", 0.0)]
    TrainConfig(steps=50, warmup_steps=1, mixture=brought_in, mixture_schedule=schedule).validate("train")
    with pytest.raises(ConfigError, match=r"train.mixture\[1\].weight': must be positive, got 0.0 \(0 only"):
        TrainConfig(steps=50, warmup_steps=1, mixture=brought_in).validate("train")
    with pytest.raises(ConfigError, match=r"train.mixture': at least one set needs a positive weight at step 0"):
        TrainConfig(steps=50, warmup_steps=1, mixture=[MixtureSetConfig("a", weight=0.0), brought_in[1]],
                     mixture_schedule=[MixtureStageConfig(5, {"a": 1.0, "b": 1.0})]).validate("train")


def test_an_infinite_weight_is_one_line_at_load() -> None:
    """YAML's .inf passed every check, then the loader's integer proportions overflowed after the run opened."""
    from experiment.sections.train import MixtureSetConfig, MixtureStageConfig, TrainConfig

    inf = float("inf")
    with pytest.raises(ConfigError, match=r"^config key 'train.mixture\[0\].weight': must be finite, got inf$"):
        TrainConfig(steps=50, warmup_steps=1, mixture=[MixtureSetConfig("a", weight=inf), MixtureSetConfig("b", "x")]
                    ).validate("train")
    with pytest.raises(ConfigError, match=r"^config key 'train.mixture_schedule\[0\].weights.b': must be finite"):
        TrainConfig(steps=50, warmup_steps=1, mixture=[MixtureSetConfig("a"), MixtureSetConfig("b", "x")],
                    mixture_schedule=[MixtureStageConfig(5, {"b": inf})]).validate("train")


def test_a_schedule_key_in_yaml_is_one_line_before_anything_opens(tmp_path: Path) -> None:
    """The same check through the config loader (a YAML typo: a set name the mixture lacks)."""
    from experiment.config import load_config
    from tests.recipe_runner import tiny_config

    config = tiny_config(tmp_path, train={"steps": 20, "mixture": [{"name": "own"}, {"name": "web", "shards": "x"}],
                                          "mixture_schedule": [{"step": 10, "weights": {"own": 1, "wbe": 2}}]})
    with pytest.raises(ConfigError, match=r"^config key 'train.mixture_schedule\[0\].weights.wbe': not a set"):
        load_config(config)


SCHEDULED_TRAIN = {"steps": 6, "checkpoint_every": 2, "warmup_steps": 1, "log_every": 1,
                   "mixture_schedule": [{"step": 3, "weights": {"own": 1.0, "other": 1.0}}]}


@pytest.mark.integration
def test_recipe_04_follows_the_schedule_resumes_exactly_and_prices_each_set(fixture_stages: Path,
                                                                            tmp_path: Path) -> None:
    """Recipe 04 on own 3 : other 1, then 1 : 1 from step 3 (batch 8): train_log's data/<set>/share is 0.75 for
    steps 1-3 and 0.5 after; runs resumed from checkpoint 2 (before the change) and 4 (after it) log the same steps
    and end with checkpoint 6 bitwise the uninterrupted run's; the ledger's rubles by data set add up to its rubles."""
    import shutil

    from cost.ledger_pricing import summarize_ledger
    from cost.ledger_report import REPORT_FILE, _rows, data_set_rows
    from cost.ledger_sessions import tally_on_disk
    from tests.fixture_run import (
        assert_same_checkpoint,
        assert_same_log,
        checkpoint_contents,
        fixture_config,
        log_records,
        run_copy,
    )
    from tests.recipe_runner import run_recipe
    from tracking.readback import find_offline_runs, read_offline_run

    other = tmp_path / "other-shards"
    shutil.copytree(fixture_stages / "runs" / "tiny" / "shards", other)
    train = {**SCHEDULED_TRAIN, "mixture": [{"name": "own", "weight": 3.0},
                                            {"name": "other", "shards": str(other), "weight": 1.0}]}
    whole_root = tmp_path / "whole"
    run_recipe("04_pretrain.py", run_copy(fixture_stages, whole_root, train=train))
    whole = whole_root / "runs" / "tiny"
    records = log_records(whole)
    assert [r["data/own/share"] for r in records] == [0.75] * 3 + [0.5] * 3
    assert [r["data/other/share"] for r in records] == [0.25] * 3 + [0.5] * 3
    assert records[-1]["data/own/tokens_seen"] == (3 * 6 + 3 * 4) * 64  # rows x max_seq_len
    assert records[-1]["data/other/tokens_seen"] == (3 * 2 + 3 * 4) * 64
    _, items = checkpoint_contents(whole, 2)
    assert items["loader"]["mixture_schedule"] == [[3, {"own": 1.0, "other": 1.0}]]
    (run,) = [read_offline_run(d) for d in find_offline_runs(whole / "wandb")]  # W&B's rows: the same shares
    shares = [(row["_step"], row["data/own/share"]) for row in run.history if "data/own/share" in row]
    assert shares == [(step, 0.75 if step <= 3 else 0.5) for step in range(1, 7)]
    assert run.config["data_mixture_schedule"] == [[3, {"own": 1.0, "other": 1.0}]]

    for resume_from in (2, 4):
        root = tmp_path / f"from-{resume_from}"
        shutil.copytree(whole_root / "runs", root / "runs")
        for step in (4, 6):
            if step > resume_from:
                shutil.rmtree(root / "runs" / "tiny" / "checkpoints" / str(step))
        proc = run_recipe("04_pretrain.py", fixture_config(root, train=train))
        assert f"resumed from the checkpoint of step {resume_from}" in proc.stderr
        resumed = root / "runs" / "tiny"
        assert_same_log(resumed, whole, 6)
        for key in ("data/own/share", "data/other/share", "data/own/tokens_seen", "data/other/tokens_seen"):
            assert [r[key] for r in log_records(resumed)] == [r[key] for r in records], key
        assert_same_checkpoint(resumed, whole, 6)

    ledger = whole / "ledger"
    from cost.ledger_format import read_sessions

    sessions = read_sessions(ledger)
    tallies = tally_on_disk(sessions)
    total = summarize_ledger(ledger).rub_total
    table = {row["data_set"]: row for row in data_set_rows(_rows(sessions, tallies), tallies, total)}
    assert set(table) == {"own", "other", "total"}
    assert table["own"]["tokens"] == 30 * 64 and table["other"]["tokens"] == 18 * 64
    assert table["own"]["rub"] + table["other"]["rub"] == pytest.approx(total) and total > 0
    assert "## Rubles by data set" in (ledger / REPORT_FILE).read_text(encoding="utf-8")


def test_weights_too_far_apart_are_one_line_at_load() -> None:
    """Finite weights a loader cannot scale to integers (1e300 beside 1e-300 overflowed after the run had opened) are
    refused where the config loads, naming the key; a hundred million to one still interleaves."""
    from experiment.sections.train import check_mixture

    with pytest.raises(ConfigError, match=r"^config key 'train.mixture': the largest weight \(1e\+300\)"):
        check_mixture(["a", "b"], [1e-300, 1e300], [])
    with pytest.raises(ConfigError, match=r"^config key 'train.mixture_schedule\[0\].weights': the largest"):
        check_mixture(["a", "b"], [1.0, 1.0], [(5, {"a": 1e-12, "b": 1.0})])
    check_mixture(["a", "b"], [1.0, 1e8], [])
