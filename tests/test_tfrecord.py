"""Our TFRecord framing and tf.train.Example coding, checked against protobuf's own serializer
(a descriptor built from TensorFlow's example.proto, so no TensorFlow is needed) and against
hand-made corruption of every part of a record."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from data_prep.shards.tfrecord import (
    CorruptRecordError,
    TFRecordFile,
    TFRecordWriter,
    decode_example,
    decode_varints,
    encode_example,
    encode_int64_rows,
    encode_varints,
    index_path,
    masked_crc32c,
    read_index,
)
from experiment.errors import DataError
from tests.tfrecord_scan import iter_records


def example_message_class() -> type:
    """``tensorflow.Example`` built from a descriptor equal to tensorflow/core/example/*.proto."""
    fd = descriptor_pb2.FileDescriptorProto(name="example_under_test.proto", package="tensorflow", syntax="proto3")
    repeated, optional = (descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                          descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    t = descriptor_pb2.FieldDescriptorProto
    for name, ftype in (("BytesList", t.TYPE_BYTES), ("FloatList", t.TYPE_FLOAT), ("Int64List", t.TYPE_INT64)):
        msg = fd.message_type.add(name=name)
        field = msg.field.add(name="value", number=1, label=repeated, type=ftype)
        if ftype != t.TYPE_BYTES:
            field.options.packed = True
    feature = fd.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (fname, tname) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                             ("int64_list", "Int64List")), 1):
        feature.field.add(name=fname, number=number, label=optional, type=t.TYPE_MESSAGE,
                          type_name=f".tensorflow.{tname}", oneof_index=0)
    features = fd.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=optional, type=t.TYPE_STRING)
    entry.field.add(name="value", number=2, label=optional, type=t.TYPE_MESSAGE, type_name=".tensorflow.Feature")
    features.field.add(name="feature", number=1, label=repeated, type=t.TYPE_MESSAGE,
                       type_name=".tensorflow.Features.FeatureEntry")
    example = fd.message_type.add(name="Example")
    example.field.add(name="features", number=1, label=optional, type=t.TYPE_MESSAGE, type_name=".tensorflow.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


EXAMPLE = example_message_class()


def protobuf_example(features: dict[str, np.ndarray | list[bytes]]) -> bytes:
    msg = EXAMPLE()
    for name, values in features.items():
        feature = msg.features.feature[name]
        if isinstance(values, list):
            feature.bytes_list.value.extend(values)
        elif np.issubdtype(values.dtype, np.floating):
            feature.float_list.value.extend(values.tolist())
        else:
            feature.int64_list.value.extend(values.tolist())
    return msg.SerializeToString(deterministic=True)


@pytest.mark.parametrize("values", [
    np.array([], dtype=np.int64),
    np.array([0, 1, 127, 128, 255, 16383, 16384, 2**31 - 1, 2**40, 2**63 - 1]),
    np.array([-1, -2, -(2**63)]),
    np.random.default_rng(0).integers(0, 60_000, 4097),
])
def test_varints_round_trip(values: np.ndarray) -> None:
    encoded = encode_varints(values)
    assert np.array_equal(decode_varints(encoded), values)


def reference_varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int, one value at a time."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes([*out, value])


@pytest.mark.parametrize("high", [1, 128, 16_384, 2**21, 2**28 - 1, 2**28, 2**35])
def test_every_varint_width_path_writes_protobuf_bytes(high: int) -> None:
    # one-byte, 32-bit and int64 paths of varint_bytes, each against the one-value-at-a-time coder
    edges = np.array([0, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28 - 1, high - 1])
    values = np.concatenate([np.random.default_rng(high).integers(0, high, 500), edges[edges < high]])
    assert encode_varints(values) == b"".join(reference_varint(int(v)) for v in values)
    assert np.array_equal(decode_varints(encode_varints(values)), values)


def test_malformed_varints_are_refused() -> None:
    with pytest.raises(ValueError, match="middle"):
        decode_varints(b"\x81\x82")
    with pytest.raises(ValueError, match="10 bytes"):
        decode_varints(b"\xff" * 11 + b"\x01")


def test_example_encoding_is_byte_identical_to_protobuf() -> None:
    rng = np.random.default_rng(1)
    features = {"input_ids": rng.integers(0, 32_000, 129), "segment_ids": np.repeat([1, 2, 3], 43),
                "positions": np.arange(129) % 50, "empty": np.zeros(0, dtype=np.int64),
                "negative": np.array([-5, 3]), "weights": np.array([0.5, -1.25], dtype=np.float32),
                "text": ["Съешь ещё этих мягких французских булок".encode(), b""]}
    ours = encode_example(features)
    assert ours == protobuf_example(features)
    parsed = EXAMPLE.FromString(ours)
    assert list(parsed.features.feature["input_ids"].int64_list.value) == features["input_ids"].tolist()


def test_batched_row_encoding_equals_one_by_one() -> None:
    rng = np.random.default_rng(2)
    rows = {"input_ids": rng.integers(0, 70_000, (5, 33)), "segment_ids": rng.integers(0, 3, (5, 33)),
            "positions": np.tile(np.arange(33), (5, 1))}
    expected = [encode_example({name: values[r] for name, values in rows.items()}) for r in range(5)]
    assert encode_int64_rows(rows) == expected
    assert encode_int64_rows({"input_ids": np.zeros((0, 33), dtype=np.int64)}) == []


def test_decode_reads_protobuf_output_including_unpacked_lists() -> None:
    features = {"input_ids": np.arange(300) * 1000, "text": [b"abc"]}
    decoded = decode_example(protobuf_example(features))
    assert np.array_equal(decoded["input_ids"], features["input_ids"]) and decoded["text"] == [b"abc"]
    # proto2-style writers may emit one tag per value instead of a packed run
    unpacked_list = b"".join(b"\x08" + encode_varints(np.array([v])) for v in (5, 300, 70000))
    feature = b"\x1a" + bytes([len(unpacked_list)]) + unpacked_list
    entry = b"\x0a\x01x" + b"\x12" + bytes([len(feature)]) + feature
    payload = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert decode_example(payload)["x"].tolist() == [5, 300, 70000]


def test_masked_crc_uses_crc32c_and_the_tfrecord_mask() -> None:
    # CRC-32C check value of "123456789" (RFC 3720 B.4), then TFRecord's mask: rotate right 15, add 0xA282EAD8.
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc32c(b"") == 0xA282EAD8  # crc32c("") is 0, so only the mask delta is left


def write_shard(path: Path, payloads: list[bytes]) -> list[int]:
    with TFRecordWriter(path) as writer:
        return [writer.write(p) for p in payloads]


def test_writer_and_reader_round_trip(tmp_path: Path) -> None:
    payloads = [encode_example({"input_ids": np.arange(n)}) for n in (1, 50, 0, 700)]
    path = tmp_path / "train-00000.tfrecord"
    offsets = write_shard(path, payloads)
    assert read_index(path).tolist() == offsets
    shard = TFRecordFile(path)
    assert [shard.read(i) for i in range(len(shard))] == payloads
    assert [p for _o, p in iter_records(path)] == payloads
    assert path.stat().st_size == sum(len(p) + 16 for p in payloads)


def test_writer_leaves_nothing_on_error(tmp_path: Path) -> None:
    path = tmp_path / "train-00000.tfrecord"
    with pytest.raises(RuntimeError), TFRecordWriter(path) as writer:
        writer.write(b"x")
        raise RuntimeError("crash mid-shard")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("position", "reason"), [
    (0, "length checksum"), (9, "length checksum"), (12, "payload checksum"), (-2, "payload checksum"),
])
def test_flipped_byte_names_shard_and_offset(tmp_path: Path, position: int, reason: str) -> None:
    payloads = [encode_example({"input_ids": np.arange(20) + i}) for i in range(3)]
    path = tmp_path / "train-00000.tfrecord"
    offsets = write_shard(path, payloads)
    data = bytearray(path.read_bytes())
    record_end = offsets[2] if position < 0 else offsets[1]  # corrupt record 1
    where = record_end + position if position < 0 else offsets[1] + position
    data[where] ^= 0x40
    path.write_bytes(bytes(data))
    shard = TFRecordFile(path)
    assert shard.read(0) == payloads[0] and shard.read(2) == payloads[2]
    with pytest.raises(CorruptRecordError,
                       match=rf"train-00000.tfrecord: corrupt TFRecord record 1 at byte offset {offsets[1]}: "
                             rf"{reason}"):
        shard.read(1)
    skipping = TFRecordFile(path, on_corrupt="skip")
    assert skipping.read(1) is None and skipping.skipped == 1
    assert isinstance(CorruptRecordError(path, 0, "x"), DataError)


def test_truncated_shard_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "validation-00000.tfrecord"
    offsets = write_shard(path, [b"a" * 100, b"b" * 100])
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptRecordError, match=rf"record 1 at byte offset {offsets[1]}: truncated payload"):
        TFRecordFile(path).read(1)
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(iter_records(path))
    assert len(list(iter_records(path, on_corrupt="skip"))) == 1


def test_bad_index_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "train-00000.tfrecord"
    write_shard(path, [b"a", b"b"])
    index_path(path).write_bytes(b"\x00" * 12)
    with pytest.raises(DataError, match="not a multiple of 8"):
        read_index(path)
    index_path(path).unlink()
    with pytest.raises(DataError, match="index .* is missing"):
        read_index(path)
