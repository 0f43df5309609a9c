"""Training mixtures of shard sets: shares match the weights, exact resume mid-mixture, the state pins
the weights, per-set validation bits per byte, and the train.mixture keys."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from data_prep.shards.layout import feature_schema
from data_prep.shards.loader import make_mixture_iterator, make_train_iterator
from data_prep.shards.tfrecord import TFRecordWriter, encode_int64_rows
from experiment.errors import ConfigError, DataError
from experiment.files import sha256_file
from experiment.stages import SHARDS

SEQ_LEN = 4
TOKENIZER = "f" * 64
MARK = 100_000


def write_shard_set(folder: Path, marker: int, train_rows: int, validation_rows: int = 3) -> Path:
    """A finished shard set whose every token is ``marker * MARK + row``: a row tells its set and record."""
    folder.mkdir(parents=True)
    splits = {}
    for split, count in (("train", train_rows), ("validation", validation_rows)):
        ids = (marker * MARK + np.arange(count))[:, None].repeat(SEQ_LEN + 1, axis=1)
        path = folder / f"{split}-00000.tfrecord"
        with TFRecordWriter(path) as writer:
            writer.write_many(encode_int64_rows({"input_ids": ids}))
        shards = [{"file": path.name, "records": count, "tokens": count * SEQ_LEN, "sha256": sha256_file(path)}]
        splits[split] = {"shards": shards, "records": count, "tokens": count * SEQ_LEN}
    SHARDS.write_manifest(folder, {"tokenizer_sha256": TOKENIZER, "seq_len": SEQ_LEN, "packing": "concat",
                                   "feature_schema": feature_schema(SEQ_LEN, "concat"), "validation_percent": 10.0,
                                   "splits": splits, "config": {}})
    return folder


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Path, float]]:
    root = tmp_path_factory.mktemp("mixture")
    # set sizes differ from each other and from the weights, so shares cannot come from the sizes (sets of
    # some thousand rows: each new epoch of a set costs Grain a new permutation, tiny sets read slowly)
    return [("web", write_shard_set(root / "web", 1, 3001), 0.6),
            ("books", write_shard_set(root / "books", 2, 4003), 0.3),
            ("code", write_shard_set(root / "code", 3, 97, validation_rows=0), 0.1)]


def set_of_rows(batches: list[dict[str, np.ndarray]], rows: bool = False) -> np.ndarray:
    """The set of each row (or the row's token, which also names its record)."""
    tokens = np.concatenate([b["inputs"][:, 0] for b in batches])
    return tokens if rows else tokens // MARK


def test_shares_match_the_weights_over_10k_rows(sets: list[tuple[str, Path, float]]) -> None:
    loader = make_mixture_iterator(sets, 100, seed=5, tokenizer_sha256=TOKENIZER, seq_len=SEQ_LEN)
    markers = set_of_rows([next(loader) for _ in range(100)])
    assert markers.size == 10_000
    for marker, (_, _, weight) in enumerate(sets, start=1):
        assert abs(np.mean(markers == marker) - weight) < 0.01
    assert loader.mixture == {"web": 0.6, "books": 0.3, "code": 0.1}


def test_every_set_keeps_its_own_epochs(sets: list[tuple[str, Path, float]]) -> None:
    loader = make_mixture_iterator(sets, 100, seed=5)
    code = set_of_rows([next(loader) for _ in range(20)], rows=True)
    code = code[code // MARK == 3] % MARK
    assert sorted(code[:97].tolist()) == list(range(97))  # a whole permutation of the set first
    assert not np.array_equal(code[:97], code[97:194])  # the next epoch in another order


def test_exact_resume_mid_mixture(sets: list[tuple[str, Path, float]]) -> None:
    first = make_mixture_iterator(sets, 6, seed=2, process_index=1, process_count=2)
    for _ in range(7):
        next(first)
    state = json.loads(json.dumps(first.get_state()))  # what the checkpoint holds
    expected = [next(first) for _ in range(5)]
    resumed = make_mixture_iterator(sets, 6, seed=2, process_index=1, process_count=2)
    resumed.set_state(state)
    for want, got in zip(expected, (next(resumed) for _ in range(5)), strict=True):
        assert np.array_equal(want["inputs"], got["inputs"]) and np.array_equal(want["targets"], got["targets"])
    reweighted = make_mixture_iterator([(n, p, 1.0) for n, p, _ in sets], 6, seed=2)
    with pytest.raises(DataError, match="mixture"):
        reweighted.set_state(state)


def test_one_set_reads_as_the_plain_loader(sets: list[tuple[str, Path, float]]) -> None:
    name, folder, _ = sets[0]
    plain = make_train_iterator(folder, 4, seed=9)
    one = make_train_iterator(folder, 4, seed=9, mixture=[(name, folder, 3.0)])
    for _ in range(12):
        assert np.array_equal(next(plain)["inputs"], next(one)["inputs"])
    assert one.mixture is None and one.get_state() == plain.get_state()


def test_a_set_made_with_another_tokenizer_is_refused(sets: list[tuple[str, Path, float]], tmp_path: Path) -> None:
    other = write_shard_set(tmp_path / "other", 4, 3)
    manifest = json.loads((other / "manifest.json").read_text())
    SHARDS.write_manifest(other, {**manifest, "tokenizer_sha256": "0" * 64})
    with pytest.raises(DataError, match="tokenizer"):
        make_mixture_iterator([*sets, ("other", other, 1.0)], 4, seed=0)


def test_validation_bits_per_byte_per_set(sets: list[tuple[str, Path, float]]) -> None:
    from eval.bpb import sets_validation_bpb

    vocab = 4 * MARK
    uniform = lambda inputs, **_: np.zeros((*inputs.shape, vocab), np.float32)  # noqa: E731
    piece_bytes = np.ones(vocab, np.int32)
    piece_bytes[2 * MARK:3 * MARK] = 2  # the books set's tokens stand for 2 bytes each
    by_set = sets_validation_bpb(uniform, sets, piece_bytes, batch_size=2, tokenizer_sha256=TOKENIZER)
    assert set(by_set) == {"web", "books"}  # "code" has no validation rows
    assert by_set["web"].bits_per_byte == pytest.approx(math.log2(vocab))
    assert by_set["books"].bits_per_byte == pytest.approx(math.log2(vocab) / 2)
    assert by_set["web"].tokens == by_set["books"].tokens == 3 * SEQ_LEN


def test_mixture_keys_are_validated() -> None:
    from experiment.sections.train import MixtureSetConfig, TrainConfig

    TrainConfig(mixture=[MixtureSetConfig("a", "x", 2.0), MixtureSetConfig("b")]).validate("train")
    with pytest.raises(ConfigError, match=r"train.mixture\[1\].name"):
        TrainConfig(mixture=[MixtureSetConfig("a"), MixtureSetConfig("a", "y")]).validate("train")
    with pytest.raises(ConfigError, match=r"train.mixture\[0\].weight"):
        TrainConfig(mixture=[MixtureSetConfig("a", weight=0.0)]).validate("train")


def test_recipe_04_trains_on_a_mixture_and_logs_its_weights(fixture_stages: Path, tmp_path: Path) -> None:
    """The wiring: train.mixture reaches the loader (its state in the checkpoint names the mixture) and W&B."""
    import shutil

    from tests.fixture_run import checkpoint_contents, run_copy
    from tests.recipe_runner import run_recipe
    from tracking.readback import find_offline_runs, read_offline_run

    other = tmp_path / "other-shards"
    shutil.copytree(fixture_stages / "runs" / "tiny" / "shards", other)
    config = run_copy(fixture_stages, tmp_path, train={
        "steps": 2, "checkpoint_every": 2, "warmup_steps": 1, "log_every": 1,
        "mixture": [{"name": "own", "weight": 3.0}, {"name": "other", "shards": str(other), "weight": 1.0}]})
    run_recipe("04_pretrain.py", config)
    run_dir = tmp_path / "runs" / "tiny"
    _, items = checkpoint_contents(run_dir, 2)
    assert items["loader"]["mixture"] == {"own": 3.0, "other": 1.0}
    runs = [read_offline_run(d) for d in find_offline_runs(run_dir / "wandb")]
    (pretrain,) = [r for r in runs if "data/mixture/own" in r.summary]
    assert (pretrain.summary["data/mixture/own"] == 0.75
            and pretrain.config["data_mixture"] == {"own": 3.0, "other": 1.0})


def test_per_set_bits_per_byte_are_flat_metrics() -> None:
    from eval.run import flat_metrics

    flat = flat_metrics({"validation_by_set": {"web": {"bits_per_byte": 1.25}, "books": {"bits_per_byte": 0.5}}})
    assert flat == {"eval/mixture/web/val_bpb": 1.25, "eval/mixture/books/val_bpb": 0.5}
