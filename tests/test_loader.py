"""The Grain loaders: batch layout, epochs and shuffling, per-process slices, exact resume in a
new process with 1 and 2 processes (and across process counts), and the one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from data_prep.shards.build import shard_corpus
from data_prep.shards.loader import iter_eval_batches, make_train_iterator, read_shards_manifest
from data_prep.shards.tfrecord import CorruptRecordError
from experiment.errors import ConfigError, DataError, MissingStageError
from tests.test_shards_common import DisabledRun, built_shards, make_run  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 8


def take(iterator: object, count: int) -> list[dict[str, np.ndarray]]:
    return [next(iterator) for _ in range(count)]  # type: ignore[call-overload]


def all_rows(shards_dir: Path, split: str = "train") -> np.ndarray:
    batches = list(iter_eval_batches(shards_dir, split, batch_size=5))
    return np.concatenate([np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1) for b in batches])


def test_batches_have_the_contract_layout(built_shards: SimpleNamespace) -> None:  # noqa: F811
    batch = next(make_train_iterator(built_shards.run_folder.shards, GLOBAL_BATCH, seed=0))
    assert set(batch) == {"inputs", "targets"}
    assert batch["inputs"].shape == batch["targets"].shape == (GLOBAL_BATCH, 32)
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    assert np.array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


def test_every_epoch_is_a_new_permutation_of_all_records(built_shards: SimpleNamespace) -> None:  # noqa: F811
    rows = all_rows(built_shards.run_folder.shards)
    n = rows.shape[0]
    iterator = make_train_iterator(built_shards.run_folder.shards, 1, seed=3, read_threads=1)
    stream = [np.concatenate([b["inputs"][0], b["targets"][0, -1:]]) for b in take(iterator, 2 * n)]
    epoch1, epoch2 = np.stack(stream[:n]), np.stack(stream[n:])
    as_sorted = lambda a: sorted(map(bytes, a.astype(np.int32)))  # noqa: E731
    assert as_sorted(epoch1) == as_sorted(rows) == as_sorted(epoch2)
    assert not np.array_equal(epoch1, rows) and not np.array_equal(epoch1, epoch2)
    other_seed = next(make_train_iterator(built_shards.run_folder.shards, 1, seed=4))
    assert not np.array_equal(other_seed["inputs"][0], stream[0][:-1])


def test_processes_read_disjoint_parts_of_the_same_global_batch(built_shards: SimpleNamespace) -> None:  # noqa: F811
    shards = built_shards.run_folder.shards
    single = take(make_train_iterator(shards, GLOBAL_BATCH, seed=0), 4)
    parts = [take(make_train_iterator(shards, GLOBAL_BATCH, seed=0, process_index=p, process_count=2), 4)
             for p in range(2)]
    for k in range(4):
        assert parts[0][k]["inputs"].shape == (GLOBAL_BATCH // 2, 32)
        for p in range(2):  # process p's row j is stream position k*G + p + 2*j
            assert np.array_equal(parts[p][k]["inputs"], single[k]["inputs"][p::2])


RESUME_SCRIPT = textwrap.dedent(f"""
    import json, sys
    import numpy as np
    from data_prep.shards.loader import make_train_iterator
    shards, process_index, process_count, state, count, out = sys.argv[1:]
    it = make_train_iterator(shards, {GLOBAL_BATCH}, seed=7, process_index=int(process_index),
                             process_count=int(process_count))
    it.set_state(json.loads(state))
    batches = [next(it) for _ in range(int(count))]
    np.savez(out, **{{f"{{k}}_{{name}}": b[name] for k, b in enumerate(batches) for name in b}})
""")


def resume_in_new_process(shards: Path, state: dict, process_index: int, process_count: int, count: int,
                          out: Path) -> list[dict[str, np.ndarray]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, str(shards), str(process_index), str(process_count),
                           json.dumps(state), str(count), str(out)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = np.load(out)
    return [{name: saved[f"{k}_{name}"] for name in ("inputs", "targets")} for k in range(count)]


@pytest.mark.parametrize("process_count", [1, 2])
@pytest.mark.integration
def test_exact_resume_in_a_new_process(built_shards: SimpleNamespace, tmp_path: Path, process_count: int) -> None:  # noqa: F811
    """N batches, save the state, restore it in a new process: the next M batches are bit-identical
    to those of an uninterrupted iterator, on every process. N + M crosses an epoch boundary."""
    shards = built_shards.run_folder.shards
    n_before, n_after = 20, 15
    for p in range(process_count):
        uninterrupted = take(make_train_iterator(shards, GLOBAL_BATCH, 7, p, process_count), n_before + n_after)
        interrupted = make_train_iterator(shards, GLOBAL_BATCH, 7, p, process_count)
        take(interrupted, n_before)
        state = json.loads(json.dumps(interrupted.get_state()))
        assert state["next_global_batch"] == n_before
        resumed = resume_in_new_process(shards, state, p, process_count, n_after, tmp_path / f"p{p}.npz")
        for expected, got in zip(uninterrupted[n_before:], resumed, strict=True):
            assert (np.array_equal(expected["inputs"], got["inputs"])
                    and np.array_equal(expected["targets"], got["targets"]))


def test_resume_on_another_process_count_continues_the_same_global_batches(built_shards: SimpleNamespace) -> None:  # noqa: F811
    shards = built_shards.run_folder.shards
    two = [make_train_iterator(shards, GLOBAL_BATCH, 7, p, 2) for p in range(2)]
    for it in two:
        take(it, 5)
    assert two[0].get_state() == {**two[1].get_state()}
    one = make_train_iterator(shards, GLOBAL_BATCH, 7)
    one.set_state(two[0].get_state())
    for _ in range(3):
        merged = next(one)["inputs"]
        for p, it in enumerate(two):
            assert np.array_equal(next(it)["inputs"], merged[p::2])


def test_resume_with_another_global_batch_size(built_shards: SimpleNamespace) -> None:  # noqa: F811
    shards = built_shards.run_folder.shards
    it = make_train_iterator(shards, 8, 7)
    take(it, 3)  # 24 records consumed
    reference = make_train_iterator(shards, 4, 7)
    take(reference, 6)
    smaller = make_train_iterator(shards, 4, 7)
    smaller.set_state(it.get_state())
    assert np.array_equal(next(smaller)["inputs"], next(reference)["inputs"])
    odd = make_train_iterator(shards, 5, 7)
    with pytest.raises(DataError, match="not a whole number of global batches of 5"):
        odd.set_state(it.get_state())


def test_state_from_another_seed_or_other_shards_is_refused(built_shards: SimpleNamespace) -> None:  # noqa: F811
    shards = built_shards.run_folder.shards
    state = make_train_iterator(shards, 8, 7).get_state()
    with pytest.raises(DataError, match="seed 7, this run uses 8"):
        make_train_iterator(shards, 8, 8).set_state(state)
    with pytest.raises(DataError, match="shards were rebuilt"):
        make_train_iterator(shards, 8, 7).set_state({**state, "shards_fingerprint": "0" * 16})


def test_eval_batches_are_in_file_order_once(built_shards: SimpleNamespace) -> None:  # noqa: F811
    shards = built_shards.run_folder.shards
    records = built_shards.manifest["splits"]["validation"]["records"]
    batches = list(iter_eval_batches(shards, "validation", batch_size=7))
    assert [b["inputs"].shape[0] for b in batches] == [7] * (records // 7) + ([records % 7] if records % 7 else [])
    stream = np.concatenate([np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1) for b in batches]).ravel()
    from tests.test_shard import split_rows

    expected = np.concatenate([r["input_ids"] for r in split_rows(shards, built_shards.manifest, "validation")])
    assert np.array_equal(stream, expected)
    assert len(list(iter_eval_batches(shards, "validation", batch_size=2, max_batches=3))) == 3


def test_document_packing_batches_carry_segments(tmp_path: Path) -> None:
    run = make_run(tmp_path, packing="document")
    shard_corpus(run.cfg, run.run_folder, DisabledRun())
    batch = next(make_train_iterator(run.run_folder.shards, 4, seed=0))
    assert set(batch) == {"inputs", "targets", "segment_ids", "positions"}
    assert batch["segment_ids"].shape == batch["positions"].shape == (4, 32)
    assert batch["segment_ids"].dtype == np.int32 and batch["segment_ids"].min() >= 0
    last = list(iter_eval_batches(run.run_folder.shards, "train", batch_size=1000))[-1]
    assert last["segment_ids"][-1, -1] == 0  # the padded tail of the split


def test_wrong_tokenizer_or_seq_len_is_refused(built_shards: SimpleNamespace) -> None:  # noqa: F811
    shards = built_shards.run_folder.shards
    with pytest.raises(DataError, match=r"made with tokenizer .* the current tokenizer is ffffffffffff"
                                        r".*run recipes/03_shard.py again"):
        make_train_iterator(shards, 8, 0, tokenizer_sha256="f" * 64)
    with pytest.raises(DataError, match=r"have seq_len 32, the config asks for model.max_seq_len=64"):
        next(iter_eval_batches(shards, "validation", 4, seq_len=64))
    assert read_shards_manifest(shards, tokenizer_sha256=built_shards.manifest["tokenizer_sha256"], seq_len=32)
    with pytest.raises(ConfigError, match="not a positive multiple of the 3 processes"):
        make_train_iterator(shards, 8, 0, process_index=0, process_count=3)


def test_missing_shards_name_the_recipe(tmp_path: Path) -> None:
    with pytest.raises(MissingStageError, match="run recipes/03_shard.py first"):
        make_train_iterator(tmp_path, 8, 0)


def test_corrupt_record_errors_or_is_skipped(built_shards: SimpleNamespace, tmp_path: Path) -> None:  # noqa: F811
    shards = tmp_path / "shards"
    shutil.copytree(built_shards.run_folder.shards, shards)
    first = built_shards.manifest["splits"]["validation"]["shards"][0]["file"]
    data = bytearray((shards / first).read_bytes())
    data[100] ^= 0x01  # inside record 0's payload
    (shards / first).write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError,
                       match=rf"{first}: corrupt TFRecord record 0 at byte offset 0: payload checksum"):
        list(iter_eval_batches(shards, "validation", 4))
    batches = list(iter_eval_batches(shards, "validation", 4, on_corrupt="skip"))
    assert sum(b["inputs"].shape[0] for b in batches) == built_shards.manifest["splits"]["validation"]["records"]
    truncated = shards / built_shards.manifest["splits"]["train"]["shards"][0]["file"]
    truncated.write_bytes(truncated.read_bytes()[:-5])
    with pytest.raises(DataError, match="bytes, the manifest says .* truncated or replaced"):
        make_train_iterator(shards, 8, 0)


def damaged_copy(built: SimpleNamespace, tmp_path: Path, split: str, keep_crc: bool = False) -> tuple[Path, Path]:
    """A copy of the shards with record 0 of the split's first shard changed; ``keep_crc`` rewrites its
    checksum so only the manifest's sha256 can tell. Returns (shards folder, damaged file)."""
    from data_prep.shards.tfrecord import masked_crc32c

    shards = tmp_path / "shards"
    shutil.copytree(built.run_folder.shards, shards)
    path = shards / built.manifest["splits"][split]["shards"][0]["file"]
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    end = 12 + length  # header (length, its crc), payload, payload crc
    if keep_crc:
        data[end - 1] ^= 0x01  # the last byte of the last token's varint: another valid token
        data[end:end + 4] = masked_crc32c(bytes(data[12:end])).to_bytes(4, "little")
    else:
        data[100] ^= 0x01
    path.write_bytes(bytes(data))
    return shards, path


def test_skipped_record_is_logged_counted_and_no_record_read_twice(
        built_shards: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    from data_prep.shards.loader import ShardSource

    clean = [row.tobytes() for row in all_rows(built_shards.run_folder.shards, "train")]
    shards, path = damaged_copy(built_shards, tmp_path, "train")
    source = ShardSource(shards, "train", on_corrupt="skip")
    rows = [source[i] for i in range(len(source))]
    assert source.skipped == 1 and source.skipped_at == [(str(path), 0)]
    assert f"{path}: corrupt TFRecord record 0 at byte offset 0: payload checksum mismatch; skipped" in caplog.text
    # one epoch of the training stream: the corrupt record's place holds a row that trains nothing
    records = len(clean)
    loader = make_train_iterator(shards, GLOBAL_BATCH, seed=3, on_corrupt="skip")
    batches = take(loader, -(-records // GLOBAL_BATCH))
    loader.close()
    inputs = np.concatenate([b["inputs"] for b in batches])[:records]
    targets = np.concatenate([b["targets"] for b in batches])[:records]
    weights = np.concatenate([b["loss_weights"] for b in batches])[:records]
    assert weights.shape == inputs.shape and set(np.unique(weights)) == {0.0, 1.0}
    kept = weights[:, 0] == 1.0
    assert (~kept).sum() == 1 and (weights[~kept] == 0).all() and (weights[kept] == 1).all()
    read = [np.concatenate([i, t[-1:]]).tobytes() for i, t in zip(inputs[kept], targets[kept], strict=True)]
    assert sorted(read) == sorted(clean[1:])  # every other record exactly once: none read twice
    assert rows[0]["_row_weight"] == 0.0 and all(r["_row_weight"] == 1.0 for r in rows[1:])


def test_shard_changed_behind_its_checksums_stops_the_run_naming_it(
        built_shards: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    shards, path = damaged_copy(built_shards, tmp_path, "train", keep_crc=True)
    loader = make_train_iterator(shards, GLOBAL_BATCH, seed=0)
    assert loader.source[0]["input_ids"].shape  # the record still reads: only the sha256 (in the background) tells
    with pytest.raises(DataError, match=rf"shard {path} does not match its manifest: sha256 .* run it again"):
        loader.source.check_shards(wait=True)
    with pytest.raises(DataError, match=rf"shard {path} does not match its manifest"):
        next(loader)  # the next batch stops the run
    loader.close()
    skipping = make_train_iterator(shards, GLOBAL_BATCH, seed=0, on_corrupt="skip")
    skipping.source.check_shards(wait=True)
    skipping.source.check_shards(wait=True)
    assert caplog.text.count(f"shard {path} does not match its manifest") == 1  # logged once, run goes on
    next(skipping)
    skipping.close()


def test_a_shard_verified_once_is_not_read_again_while_its_generation_holds(tmp_path: Path) -> None:
    """A run's record of a shard it hashed (``verified_dir``): trusted while the storage's generation of the shard is
    the one recorded, so a later start reads nothing; a new generation (the file replaced) is hashed again."""
    import hashlib

    from data_prep.shards.loader import ShardVerifier, generation_of

    shard = tmp_path / "train-00000.tfrecord"
    shard.write_bytes(b"x" * 1000)
    sha = hashlib.sha256(shard.read_bytes()).hexdigest()
    record = tmp_path / "verified" / "train-00000.tfrecord.json"
    generation = generation_of(shard)
    assert ShardVerifier._check(shard, sha, record, generation, verify=True) is None
    assert json.loads(record.read_text())["generation"] == generation
    shard.unlink()  # were the shard read again, this would raise
    assert ShardVerifier._check(shard, sha, record, generation, verify=True) is None
    shard.write_bytes(b"y" * 1000)  # replaced, same size: another generation, hashed again and refused
    error = ShardVerifier._check(shard, sha, record, generation_of(shard), verify=True)
    assert error is not None and "does not match its manifest" in error
    assert ShardVerifier._check(shard, sha, None, generation_of(shard), verify=False) is None, \
        "a process that does not verify trusts the per-record CRCs"
