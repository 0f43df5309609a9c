"""TensorFlow reads our shards and we read TensorFlow's (optional `tf` extra; CI runs it).

Run: .venvs/tf/bin/python -m pytest tests/test_tfrecord_tf.py -q  (a venv with
`pip install -e .[tf,test]`). Skipped where TensorFlow is not importable."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import import_extra

tf = import_extra("tensorflow", "tf")

from data_prep.shards.build import shard_corpus  # noqa: E402
from data_prep.shards.loader import ShardSource  # noqa: E402
from data_prep.shards.tfrecord import (  # noqa: E402
    CorruptRecordError,
    TFRecordFile,
    TFRecordWriter,
    decode_example,
    encode_example,
)
from tests.test_shards_common import DisabledRun, make_run  # noqa: E402
from tests.tfrecord_scan import iter_records  # noqa: E402


@pytest.fixture(scope="module")
def document_shards(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    run = make_run(tmp_path_factory.mktemp("tfshards"), packing="document")
    run.manifest = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    return run


def tf_examples(files: list[str], features: list[str], row_len: int) -> list[dict[str, np.ndarray]]:
    spec = {name: tf.io.FixedLenFeature([row_len], tf.int64) for name in features}
    dataset = tf.data.TFRecordDataset(files).map(lambda record: tf.io.parse_single_example(record, spec))
    return list(dataset.as_numpy_iterator())


def test_tensorflow_parses_every_record_with_the_same_tokens(document_shards: SimpleNamespace) -> None:
    shards_dir = document_shards.run_folder.shards
    for split in ("train", "validation"):
        source = ShardSource(shards_dir, split)
        assert source.features == ["input_ids", "positions", "segment_ids"]
        parsed = tf_examples([str(f.path) for f in source.files], source.features, source.row_len)
        assert len(parsed) == len(source) == document_shards.manifest["splits"][split]["records"] > 0
        for index, example in enumerate(parsed):
            ours = source[index]
            for name in source.features:
                assert np.array_equal(example[name], ours[name]), (split, index, name)


def test_one_flipped_byte_is_caught_by_tensorflow_and_by_us(document_shards: SimpleNamespace, tmp_path: Path) -> None:
    shard = document_shards.run_folder.shards / document_shards.manifest["splits"]["train"]["shards"][0]["file"]
    broken = tmp_path / shard.name
    shutil.copy(shard, broken)
    shutil.copy(f"{shard}.index", f"{broken}.index")
    offsets = TFRecordFile(broken).offsets
    data = bytearray(broken.read_bytes())
    data[int(offsets[3]) + 40] ^= 0x10  # a payload byte of record 3
    broken.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset([str(broken)]).as_numpy_iterator())
    with pytest.raises(CorruptRecordError, match=rf"record 3 at byte offset {int(offsets[3])}: payload checksum"):
        TFRecordFile(broken).read(3)


def test_our_writer_is_byte_identical_to_tensorflow_and_reads_its_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(0, 50_000, 65), "segment_ids": np.repeat([1, 2], [30, 35])} for _ in range(5)]
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "theirs.tfrecord"
    with TFRecordWriter(ours) as writer:
        for row in rows:
            writer.write(encode_example(row))
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for row in rows:
            example = tf.train.Example(features=tf.train.Features(feature={
                name: tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist()))
                for name, values in row.items()}))
            writer.write(example.SerializeToString(deterministic=True))
    assert ours.read_bytes() == theirs.read_bytes()
    read_back = [decode_example(payload) for _offset, payload in iter_records(theirs)]
    assert all(np.array_equal(got[name], row[name]) for got, row in zip(read_back, rows, strict=True) for name in row)
