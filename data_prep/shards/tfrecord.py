"""TFRecord files of ``tf.train.Example`` records, written and read without TensorFlow.

Framing of one record (the format TensorFlow's ``TFRecordWriter`` writes)::

    uint64 length (little endian) | uint32 masked CRC32C of those 8 bytes
    payload (length bytes)        | uint32 masked CRC32C of the payload

Every shard has a sidecar ``<shard>.index`` of little-endian uint64 byte offsets, one per record,
so a loader can jump to any record (TensorFlow itself only reads sequentially).

The ``tf.train.Example`` protobuf is encoded and decoded here by hand: the messages are tiny
(a map of feature name to a packed ``int64`` list), the hand encoder writes the same bytes as
TensorFlow, and numpy varint coding is several times faster than building protobuf objects.
Wire layout, from tensorflow/core/example/{example,feature}.proto::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }   # map entry: key = 1, value = 2
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    Int64List { repeated int64 value = 1 [packed = true]; }
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import mmap
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from types import TracebackType
from typing import Any, Literal

import google_crc32c
import numpy as np

from experiment.errors import DataError
from experiment.files import atomic_open
from experiment.stages import SHARDS
from experiment.storage import BucketPath, RunPath, as_local, location, read_range

log = logging.getLogger("data_prep.shards.tfrecord")

INDEX_SUFFIX = ".index"
_HEADER = struct.Struct("<QI")  # length, masked crc of the length
_CRC = struct.Struct("<I")  # a masked crc: of the length (in the header) and of the payload (the footer)
_LENGTH = struct.Struct("<Q")
_MASK_DELTA = 0xA282EAD8
_MAX_VARINT_BYTES = 10

# protobuf wire types and the tags (field number << 3 | wire type) that tf.train.Example uses
_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LEN, _WIRE_FIXED32 = 0, 1, 2, 5
_TAG_FEATURES = 0x0A  # Example.features / Features.feature / MapEntry.key / *List.value (packed)
_TAG_MAP_VALUE = 0x12  # MapEntry.value
_KIND_BYTES, _KIND_FLOAT, _KIND_INT64 = 1, 2, 3

OnCorrupt = Literal["error", "skip"]


class CorruptRecordError(DataError):
    """A record whose framing or checksum is wrong: names the file, record number and byte offset."""

    def __init__(self, path: RunPath | str, offset: int, reason: str, record: int | None = None) -> None:
        where = f"record {record} at byte offset {offset}" if record is not None else f"byte offset {offset}"
        super().__init__(f"{path}: corrupt TFRecord {where}: {reason}")
        self.path = location(path)
        self.offset = offset
        self.record = record
        self.reason = reason


# ----------------------------------------------------------------------------------------- CRC32C


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC32C: rotate right by 15 bits and add a constant (mod 2**32)."""
    crc = google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# ------------------------------------------------------------------------------- varints (numpy)


def varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of a flat integer array: the uint8 bytes and the byte count of each value
    (negative int64 take 10 bytes, as in protobuf)."""
    flat = np.ravel(values)
    if flat.size == 0:
        return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.uint8)
    low, high = int(flat.min()), int(flat.max())
    if low >= 0 and high < 128:  # segment ids, small positions: one byte each, the value itself
        return flat.astype(np.uint8), np.ones(flat.size, dtype=np.uint8)
    if low >= 0 and high < (1 << 14):  # token ids of vocabularies up to 16k, positions: two bytes at most
        return _two_byte_varint_bytes(flat.astype(np.uint16, copy=False))
    if low >= 0 and high < (1 << 28):  # larger token ids: 32-bit arithmetic is ~2x faster than int64
        return _small_varint_bytes(flat.astype(np.uint32, copy=False), (high.bit_length() + 6) // 7)
    return _int64_varint_bytes(flat)


def _two_byte_varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of uint16 values below 2**14, built as little-endian uint16 words (byte 0 in the low
    half) and compacted with a mask of the same shape: no strided column writes."""
    more_follow = values >= np.uint16(128)
    more_bits = more_follow.view(np.uint8).astype(np.uint16)
    words = (values & np.uint16(0x7F)) | (more_bits << np.uint16(7)) | ((values >> np.uint16(7)) << np.uint16(8))
    keep = np.uint16(1) | (more_bits << np.uint16(8))  # byte 0 always, byte 1 when a second byte follows
    return words.astype("<u2", copy=False).view(np.uint8)[keep.view(np.bool_)], more_bits.astype(np.uint8) + 1


def _small_varint_bytes(values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Varints of non-negative uint32 values that all fit in ``width`` (3-4) bytes."""
    nbytes = np.ones(values.size, dtype=np.uint8)
    for k in range(1, width):
        nbytes += values >= (1 << (7 * k))
    return _pack_varints(lambda k: values >> (7 * k), nbytes, width), nbytes


def _int64_varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of any int64 values, negative ones included."""
    # int64 arithmetic: numpy compares and shifts uint64 against scalars far more slowly
    signed = np.ascontiguousarray(values, dtype=np.int64).ravel()
    nbytes = np.ones(signed.shape, dtype=np.uint8)
    for k in range(1, _MAX_VARINT_BYTES - 1):
        longer = signed >= (1 << (7 * k))
        if not longer.any():
            break
        nbytes += longer
    nbytes[signed < 0] = _MAX_VARINT_BYTES  # two's complement: all 64 bits are significant

    def bits(k: int) -> np.ndarray:
        # bits 7k..7k+6; the arithmetic shift agrees with a logical one there except for bit 63
        return (signed >> (7 * k)) if k < _MAX_VARINT_BYTES - 1 else (signed.view(np.uint64) >> np.uint64(63))

    return _pack_varints(bits, nbytes, int(nbytes.max())), nbytes


def _pack_varints(bits: Callable[[int], np.ndarray], nbytes: np.ndarray, width: int) -> np.ndarray:
    """Lay out varint byte k of every value (7 bits from ``bits(k)``, the top bit set when more
    bytes follow) as a [values, width] table, then keep the ``nbytes`` bytes each value has."""
    table = np.empty((nbytes.size, width), dtype=np.uint8)
    keep = np.empty((nbytes.size, width), dtype=np.bool_)
    for k in range(width):
        seven_bits = bits(k).astype(np.uint8) & np.uint8(0x7F)  # the uint8 cast keeps the low byte
        table[:, k] = seven_bits | ((nbytes > k + 1).view(np.uint8) << np.uint8(7))
        keep[:, k] = nbytes > k
    return table.ravel()[keep.ravel()]


def encode_varints(values: np.ndarray) -> bytes:
    """Protobuf varints of an integer array, as one packed run."""
    return varint_bytes(values)[0].tobytes()


def decode_varints(data: bytes | memoryview) -> np.ndarray:
    """Decode a run of packed protobuf varints into int64 values; raises ValueError if malformed."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw[-1] & 0x80:
        raise ValueError("packed varints end in the middle of a value")
    last_byte = raw < 0x80
    if last_byte.all():  # every value below 128: one byte each
        return raw.astype(np.int64)
    starts = np.flatnonzero(np.concatenate(([True], last_byte[:-1])))
    group = np.cumsum(np.concatenate(([0], last_byte[:-1].astype(np.int64))))
    position = np.arange(raw.size) - starts[group]
    if position.max() >= _MAX_VARINT_BYTES:
        raise ValueError("a varint is longer than 10 bytes")
    parts = (raw & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)  # the 7-bit parts never overlap: sum == or


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift >= 64:
            raise ValueError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


# ------------------------------------------------------------------------------- tf.train.Example

FeatureValue = np.ndarray | list[bytes]


def _length_delimited(tag: int, body: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(body)) + body


def _feature_entry(name: str, kind: int, body: bytes) -> bytes:
    """One ``Features.feature`` map entry: key ``name``, value a Feature of ``kind`` holding ``body``."""
    feature = _length_delimited((kind << 3) | _WIRE_LEN, body)
    entry = (_length_delimited(_TAG_FEATURES, name.encode("utf-8")) + bytes((_TAG_MAP_VALUE,))
             + _varint(len(feature)) + feature)
    return _length_delimited(_TAG_FEATURES, entry)


def _packed(values: bytes) -> bytes:
    """A list message whose packed field 1 holds ``values`` (empty lists are written as nothing)."""
    return _length_delimited(_TAG_FEATURES, values) if values else b""


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a ``tf.train.Example``: integer arrays become ``int64_list``, float arrays
    ``float_list``, lists of bytes ``bytes_list``. Keys are written in sorted order (deterministic)."""
    entries = []
    for name in sorted(features):
        value = features[name]
        if isinstance(value, list) and all(isinstance(v, bytes) for v in value):
            entries.append(_feature_entry(name, _KIND_BYTES,
                                          b"".join(_length_delimited(_TAG_FEATURES, v) for v in value)))
            continue
        array = np.asarray(value)
        if array.ndim != 1:
            raise ValueError(f"feature '{name}' must be one-dimensional, got shape {array.shape}")
        if np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
            entries.append(_feature_entry(name, _KIND_INT64, _packed(encode_varints(array.astype(np.int64)))))
        elif np.issubdtype(array.dtype, np.floating):
            entries.append(_feature_entry(name, _KIND_FLOAT, _packed(array.astype("<f4").tobytes())))
        else:
            raise ValueError(f"feature '{name}' has unsupported dtype {array.dtype}")
    return _length_delimited(_TAG_FEATURES, b"".join(entries))


def encode_int64_rows(rows: Mapping[str, np.ndarray]) -> list[bytes]:
    """``encode_example`` for every row of ``{name: int array [n, L]}`` at once (varints coded in
    one numpy pass per feature, which is what makes shard writing keep up with the tokenizer)."""
    names = sorted(rows)
    count = rows[names[0]].shape[0] if names else 0
    if count == 0:
        return []
    coded = []
    for name in names:
        out, nbytes = varint_bytes(rows[name])
        ends = np.cumsum(nbytes.reshape(count, -1).sum(axis=1)).tolist()
        coded.append((name, out.tobytes(), [0, *ends]))
    examples = []
    for r in range(count):
        body = b"".join(_int64_entry_prefix(name, bounds[r + 1] - bounds[r]) + data[bounds[r]:bounds[r + 1]]
                        for name, data, bounds in coded)
        examples.append(bytes((_TAG_FEATURES,)) + _varint(len(body)) + body)
    return examples


@functools.lru_cache(maxsize=1 << 16)  # (feature, packed size) pairs: at most a few per token of row width
def _int64_entry_prefix(name: str, packed_size: int) -> bytes:
    """The bytes of an int64 feature entry before its packed values (rows of one width share it)."""
    marker = b"\x00" * packed_size
    return _feature_entry(name, _KIND_INT64, _packed(marker))[:-packed_size or None]


def _fields(buf: memoryview) -> Iterator[tuple[int, int, memoryview | int]]:
    """(field number, wire type, value) of each field of one protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == _WIRE_VARINT:
            value, pos = _read_varint(buf, pos)
            yield field, wire, value
        elif wire == _WIRE_LEN:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError(f"field {field} runs past the end of its message")
            yield field, wire, buf[pos:pos + size]
            pos += size
        elif wire in (_WIRE_FIXED64, _WIRE_FIXED32):
            width = 8 if wire == _WIRE_FIXED64 else 4
            if pos + width > len(buf):
                raise ValueError(f"field {field} runs past the end of its message")
            yield field, wire, buf[pos:pos + width]
            pos += width
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _decode_feature(buf: memoryview) -> FeatureValue:
    for kind, _wire, value_list in _fields(buf):
        if not isinstance(value_list, memoryview):
            raise ValueError("a Feature's value list is not length-delimited")
        if kind == _KIND_INT64:
            chunks = []
            for _f, wire, value in _fields(value_list):
                chunks.append(decode_varints(value) if wire == _WIRE_LEN
                              else np.array([value], dtype=np.uint64).view(np.int64))
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
        if kind == _KIND_FLOAT:
            chunks = [np.frombuffer(value, dtype="<f4") for _f, _w, value in _fields(value_list)]
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        if kind == _KIND_BYTES:
            return [bytes(value) for _f, _w, value in _fields(value_list)]
    return np.zeros(0, dtype=np.int64)  # a Feature with no kind set


def decode_example(payload: bytes | memoryview) -> dict[str, FeatureValue]:
    """Parse a serialized ``tf.train.Example`` into ``{name: int64 array | float32 array | [bytes]}``.

    Raises ValueError on malformed bytes (callers add the file and offset)."""
    features: dict[str, FeatureValue] = {}
    for field, _wire, features_msg in _fields(memoryview(payload)):
        if field != 1 or not isinstance(features_msg, memoryview):
            continue
        for entry_field, _w, entry in _fields(features_msg):
            if entry_field != 1 or not isinstance(entry, memoryview):
                continue
            name, value = "", np.zeros(0, dtype=np.int64)
            for part_field, _pw, part in _fields(entry):
                if part_field == 1 and isinstance(part, memoryview):
                    name = bytes(part).decode("utf-8")
                elif part_field == 2 and isinstance(part, memoryview):
                    value = _decode_feature(part)
            features[name] = value
    return features


# ------------------------------------------------------------------------------------ writing


def index_path(shard_path: RunPath | str) -> RunPath:
    path = location(shard_path)
    return path.with_name(path.name + INDEX_SUFFIX)


class TFRecordWriter:
    """Write one TFRecord shard and its ``.index`` sidecar, both atomically.

    Nothing appears under the final names until ``close()`` (or a clean ``with`` exit); an
    exception inside the ``with`` block leaves neither file behind."""

    def __init__(self, path: RunPath | str, opener: Callable[[str], Any] | None = None) -> None:
        """``opener(uri)``: a context manager giving a binary handle that puts the file in place on a clean
        exit (a Beam worker's ``data_prep.beam_common.atomic_create``, for gs:// and the like); default:
        ``atomic_open`` (a local file, or a bucket object published when complete)."""
        # a Beam worker's URI may be of any scheme its filesystems know: only its name matters here
        self.path = location(path) if opener is None else PurePosixPath(str(path))
        self._uri, self._opener = str(path), opener or (lambda uri: atomic_open(uri, "wb"))
        self._stack = contextlib.ExitStack()
        self._handle = self._stack.enter_context(self._opener(self._uri))
        self._offsets: list[int] = []
        self._position = 0
        self._digest = hashlib.sha256()
        self.payload_bytes = 0

    @property
    def records(self) -> int:
        return len(self._offsets)

    @property
    def sha256(self) -> str:
        """SHA-256 of the shard's bytes written so far (the whole file once closed)."""
        return self._digest.hexdigest()

    @property
    def bytes_written(self) -> int:
        return self._position

    def write(self, payload: bytes) -> int:
        """Append one record; returns its byte offset."""
        offset = self._position
        self.write_many([payload])
        return offset

    def write_many(self, payloads: Sequence[bytes]) -> None:
        """Append records; framed into one buffer, so the file write and the hash run once per batch."""
        parts = []
        for payload in payloads:
            self._offsets.append(self._position)
            length = _LENGTH.pack(len(payload))
            parts += (length, _CRC.pack(masked_crc32c(length)), payload, _CRC.pack(masked_crc32c(payload)))
            self._position += record_size(len(payload))
            self.payload_bytes += len(payload)
        framed = b"".join(parts)
        self._handle.write(framed)
        self._digest.update(framed)

    def close(self) -> None:
        self._stack.close()  # renames the shard into place
        with self._opener(f"{self._uri}{INDEX_SUFFIX}") as handle:
            handle.write(np.asarray(self._offsets, dtype="<u8").tobytes())

    def abort(self, exc: BaseException) -> None:
        self._stack.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:
            self.abort(exc)


# ------------------------------------------------------------------------------------ reading


def read_index(shard_path: RunPath | str) -> np.ndarray:
    """The record offsets of a shard from its sidecar; DataError if missing or malformed."""
    path = index_path(shard_path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DataError(f"index {path} is missing: {SHARDS.run_again}") from exc
    return parse_index(raw, path)


def parse_index(raw: bytes, path: RunPath) -> np.ndarray:
    """The record offsets in a sidecar's bytes; DataError naming ``path`` if malformed."""
    if len(raw) % 8:
        raise DataError(f"index {path} has {len(raw)} bytes, not a multiple of 8")
    offsets = np.frombuffer(raw, dtype="<u8").astype(np.int64)
    if offsets.size and (offsets[0] != 0 or np.any(np.diff(offsets) <= 0)):
        raise DataError(f"index {path} does not hold increasing record offsets starting at 0")
    return offsets


class TFRecordFile:
    """Random access to the records of one shard through its index, CRCs checked on every read.

    A local file is memory-mapped on first use (the object pickles without the map, for Grain workers); a
    shard in a bucket is read record by record, each record one ranged request for exactly its bytes (from
    its offset to the next record's, or to ``size``, the file's size), never the whole object."""

    def __init__(self, path: RunPath | str, offsets: np.ndarray | None = None, on_corrupt: OnCorrupt = "error",
                 size: int | None = None, generation: str = "") -> None:
        self.path = location(path)
        self.offsets = read_index(self.path) if offsets is None else offsets
        self.size = size
        self.generation = generation  # what the loader's verification record names (data_prep.shards.loader)
        self.on_corrupt = on_corrupt
        self.skipped = 0
        self.skipped_at: list[tuple[str, int]] = []  # (file, byte offset) of each skipped read
        self._map: mmap.mmap | None = None

    def __len__(self) -> int:
        return int(self.offsets.size)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_map"] = None
        return state

    def _buffer(self) -> mmap.mmap:
        if self._map is None:
            try:
                with open(as_local(self.path, "an mmapped shard"), "rb") as handle:
                    self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            except FileNotFoundError as exc:
                raise DataError(f"shard {self.path} is missing: {SHARDS.run_again}") from exc
            except ValueError as exc:  # mmap of an empty file
                raise DataError(f"shard {self.path} is empty") from exc
        return self._map

    def _ranged(self, record: int) -> bytes:
        """Record ``record``'s bytes from a bucket: one request for ``[offset, next offset)``."""
        start = int(self.offsets[record])
        if record + 1 < self.offsets.size:
            end = int(self.offsets[record + 1])
        elif self.size is not None:
            end = self.size
        else:
            end = self.size = int(self.path.stat().st_size)
        try:
            return read_range(self.path, start, end)
        except FileNotFoundError as exc:
            raise DataError(f"shard {self.path} is missing: {SHARDS.run_again}") from exc

    def read(self, record: int) -> bytes | None:
        """The payload of record ``record``; None if it is corrupt and ``on_corrupt='skip'``."""
        offset = int(self.offsets[record])
        try:
            if isinstance(self.path, BucketPath):
                return read_record_at(self._ranged(record), 0, self.path, record, base=offset)
            return read_record_at(self._buffer(), offset, self.path, record)
        except CorruptRecordError as exc:
            if self.on_corrupt == "skip":
                self.skip(exc)
                return None
            raise

    def skip(self, error: CorruptRecordError) -> None:
        """Count and log a corrupt record passed over (on_corrupt='skip'), naming its file and offset."""
        self.skipped += 1
        self.skipped_at.append((str(self.path), error.offset))
        log.warning("%s; skipped (shards.on_corrupt=skip)", error)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


def record_size(payload_len: int) -> int:
    """Bytes a record of ``payload_len`` payload bytes takes in the file (header, payload, footer)."""
    return _HEADER.size + payload_len + _CRC.size


def read_record_at(buf: mmap.mmap | bytes, offset: int, path: RunPath | str, record: int | None = None,
                   base: int = 0) -> bytes:
    """Read and check the record starting at ``offset`` of ``buf``; CorruptRecordError if anything is off.
    ``base``: where ``buf`` starts in the file (a ranged read), for the offset errors name."""
    if base:
        try:
            return read_record_at(buf, offset, path, record)
        except CorruptRecordError as exc:
            raise CorruptRecordError(path, base + exc.offset, exc.reason, record) from None
    size = len(buf)
    if offset + _HEADER.size > size:
        raise CorruptRecordError(path, offset, f"truncated header ({size - offset} of {_HEADER.size} bytes)", record)
    length, length_crc = _HEADER.unpack_from(buf, offset)
    if masked_crc32c(buf[offset:offset + 8]) != length_crc:
        raise CorruptRecordError(path, offset, "length checksum mismatch", record)
    start = offset + _HEADER.size
    end = start + length
    if end + _CRC.size > size:
        raise CorruptRecordError(path, offset, f"truncated payload (record says {length} bytes, file ends first)",
                                 record)
    payload = buf[start:end]
    (payload_crc,) = _CRC.unpack_from(buf, end)
    if masked_crc32c(payload) != payload_crc:
        raise CorruptRecordError(path, offset, "payload checksum mismatch", record)
    return payload


def decode_record(payload: bytes, path: RunPath | str, offset: int,
                  record: int | None = None) -> dict[str, FeatureValue]:
    """``decode_example`` with a DataError naming the file and offset for a malformed Example."""
    try:
        return decode_example(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(path, offset, f"not a valid tf.train.Example ({exc})", record) from exc
