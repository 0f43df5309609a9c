"""Grain loaders over the TFRecord shards: an endless, exactly resumable training iterator and
one-pass evaluation batches.

Training order, and what each process reads
------------------------------------------
All training records form one endless stream: epoch ``e`` is a seeded permutation of every
record (Grain's index shuffle, seed ``seed + e``, so each epoch is ordered differently). Global
batch ``k`` is stream positions ``[k*G, (k+1)*G)`` for the global batch size ``G``. With ``P``
processes, process ``p`` reads only positions ``k*G + p + P*j`` for ``j < G/P`` (a strided slice),
so each process decodes only its own rows and the ``P`` parts together are exactly global batch ``k``.

Resume rule
-----------
The iterator state is the number of global batches consumed (plus the seed, the global batch
size and the shard fingerprint it was made for), the same on every process. Restoring it gives
the very batches an uninterrupted run would have produced next, bit for bit. On a different
number of processes (same seed and global batch size) the run continues with exactly the same
global batches, sample for sample; only the assignment of rows to processes (and so the row
order inside the assembled global batch) changes, which leaves the mean loss and its gradient
unchanged up to float summation order. A different global batch size resumes at the same
record position when that position is a whole number of new batches, and is refused otherwise;
a different seed or rebuilt shards are refused, because either would replay or skip data.

Mixtures
--------
``make_mixture_iterator`` mixes several finished shard sets (made with the same tokenizer and
``seq_len``) by weight without re-tokenizing, as Levanter and MaxText do: each set is its own endless
seeded stream (set ``i`` shuffled with ``mixture_seed(seed, i)``), and Grain's ``MapDataset.mix``
interleaves them deterministically, stream position ``n`` -> (set, position in that set) in closed
form, so a set's share of any window of rows is its weight to within a row per set. Everything above
(process slices, the resume rule) applies to the mixed stream unchanged; the state also records the
sets and weights, and restoring it with other weights is refused.

A mixture schedule (``train.mixture_schedule``, Levanter's ``train_weights`` stages) changes the weights at
given steps, piecewise constant (``MixtureSchedule``): stage ``s`` covers stream positions
``[step_s x G, step_(s+1) x G)`` and interleaves the sets as Grain's mix does at its weights, counted from the
stage's start; set ``i``'s position there is the rows it gave in the stages before (a closed form of their
lengths) plus its count within the stage. So every set's stream position stays a closed form of the
global batch, a resumed run reads exactly the batches an uninterrupted one does, and the rows each set gave
to any batch are known without reading it (``TrainIterator.step_rows``: logged as ``data/<set>/share``,
booked as each set's tokens in the cost ledger). The state records the schedule; one with another schedule,
or another global batch size (which would move the change points in the stream), is refused.

Damaged shards
--------------
Every read checks the record's CRCs; under ``shards.on_corrupt=skip`` a corrupt record is logged with its
file and byte offset, counted, and becomes a row of zeros with ``loss_weights`` 0, so no other record is
read in its place (none twice) while batch shapes and resume positions stay the same.

Each shard is also hashed in full against the manifest's sha256, in a background thread (off the step
path), by the processes that ``verify`` (the first process of a job; the others read with the per-record
CRCs alone): a mismatch stops the next batch with one error naming the shard, or is logged under
``shards.on_corrupt=skip``. A training run hashes a shard set once, not at every start: given
``verified_dir`` (the run's ``verified/``), a loader that hashed a shard writes a record there naming the
shard's sha256 and its *generation* (a bucket object's generation or ETag; a local file's size, mtime and
inode), and the run's later loaders trust that record while the shard's generation is unchanged (one
listing tells, no reads). The records live in the reading run's folder, never beside another run's shards.

Shards in a bucket
------------------
The shards folder may be a bucket prefix (``gs://``, ``s3://``). Opening a shard set lists its folder
once (sizes and generations of every object) and reads every shard's index in parallel, so a thousand
shards open in about the time of a few dozen requests. Each record is then read by one ranged request for
exactly its bytes; ``BUCKET_READ_THREADS`` requests are in flight while batches are assembled.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import datetime as dt
import hashlib
import logging
import queue
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from data_prep.shards.tfrecord import (
    INDEX_SUFFIX,
    CorruptRecordError,
    OnCorrupt,
    TFRecordFile,
    decode_record,
    index_path,
    parse_index,
    read_index,
)
from experiment.errors import ConfigError, DataError
from experiment.files import atomic_write_json
from experiment.jsontext import parse_json
from experiment.sections.train import TrainConfig, check_mixture
from experiment.stages import SHARDS
from experiment.storage import BucketPath, ObjectStat, RunPath, is_bucket_url, location, read_range

log = logging.getLogger("data_prep.shards.loader")

STATE_VERSION = 1
LOSS_WEIGHTS = "loss_weights"  # on_corrupt=skip: 0 for the tokens of a corrupt record's row, 1 elsewhere
_ROW_WEIGHT = "_row_weight"


def read_shards_manifest(shards_dir: RunPath | str, *, tokenizer_sha256: str | None = None,
                         seq_len: int | None = None) -> dict[str, Any]:
    """The finished shards' manifest, checked against the tokenizer and sequence length in use.

    Shards made with another tokenizer than the current one, or with a different ``seq_len``,
    end in one clear error instead of a model silently trained on the wrong ids."""
    shards_dir = location(shards_dir)
    manifest = SHARDS.read_manifest(shards_dir)
    if tokenizer_sha256 is not None and manifest.get("tokenizer_sha256") != tokenizer_sha256:
        raise DataError(
            f"shards in {shards_dir} were made with tokenizer {str(manifest.get('tokenizer_sha256'))[:12]}..., "
            f"the current tokenizer is {tokenizer_sha256[:12]}...: {SHARDS.run_again}"
        )
    if seq_len is not None and manifest.get("seq_len") != seq_len:
        raise DataError(
            f"shards in {shards_dir} have seq_len {manifest.get('seq_len')}, the config asks for model.max_seq_len="
            f"{seq_len}: {SHARDS.run_again} (or set model.max_seq_len={manifest.get('seq_len')})"
        )
    return manifest


def _to_model_batch(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows of ``seq_len + 1`` tokens -> ``inputs``/``targets`` (and ``segment_ids``/``positions``) int32,
    and ``loss_weights`` float32 under on_corrupt=skip."""
    ids = rows["input_ids"]
    batch = {"inputs": np.ascontiguousarray(ids[:, :-1]), "targets": np.ascontiguousarray(ids[:, 1:])}
    for name in ("segment_ids", "positions"):
        if name in rows:
            batch[name] = np.ascontiguousarray(rows[name][:, :-1])
    if _ROW_WEIGHT in rows:
        batch[LOSS_WEIGHTS] = np.repeat(rows[_ROW_WEIGHT][:, None], ids.shape[1] - 1, axis=1)
    return batch


def generation_of(path: RunPath, listed: ObjectStat | None = None) -> str:
    """What changes whenever the shard's bytes may have: a bucket object's generation (or ETag); a local
    file's size, modification time and inode."""
    if isinstance(path, BucketPath):
        found = listed or path.object_stat()
        return "" if found is None else f"{found.size}-{found.generation}"
    info = path.stat()
    return f"{info.st_size}-{info.st_mtime_ns}-{info.st_ino}"


class ShardVerifier:
    """Checks shards against their manifest sha256 in one background thread, each once per shard set.

    A shard with a valid record (``VERIFIED_DIR``) is not read; one without is hashed when ``verify`` is
    set (the first process of a job) and its record written, else left to the per-record CRCs. A daemon
    thread, so that a run that ends (or is preempted) never waits for hashes still running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], concurrent.futures.Future[str | None]] = {}
        self._queue: queue.SimpleQueue[tuple[RunPath, str, RunPath | None, str, bool,
                                             concurrent.futures.Future[str | None]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, path: RunPath, sha256: str, record: RunPath | None, generation: str,
               verify: bool = True) -> concurrent.futures.Future[str | None]:
        """The check of ``path`` (queued now unless it already was): its result is the error, or None."""
        key = (str(path.resolve()), sha256)
        with self._lock:
            if key not in self._jobs:
                self._jobs[key] = concurrent.futures.Future()
                self._queue.put((path, sha256, record, generation, verify, self._jobs[key]))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._work, name="shard-sha256", daemon=True)
                    self._thread.start()
            return self._jobs[key]

    def _work(self) -> None:
        while True:
            path, sha256, record, generation, verify, future = self._queue.get()
            try:
                future.set_result(self._check(path, sha256, record, generation, verify))
            except OSError as exc:
                future.set_result(f"shard {path} cannot be read to check its sha256: {exc}")

    @staticmethod
    def _check(path: RunPath, sha256: str, record: RunPath | None, generation: str, verify: bool) -> str | None:
        if not verify:
            return None  # the first process hashes it; this one trusts the per-record CRCs (and asks no record)
        if record is not None and verified(record, sha256, generation):
            return None
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 22):  # hashlib releases the GIL on large blocks
                digest.update(chunk)
        if digest.hexdigest() == sha256:
            if record is None:
                return None
            with contextlib.suppress(OSError):  # a record that cannot be written: hashed again next time
                atomic_write_json(record, {"sha256": sha256, "generation": generation, "host": socket.gethostname(),
                                           "verified_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
            return None
        return (f"shard {path} does not match its manifest: sha256 {digest.hexdigest()[:12]}..., the manifest says "
                f"{sha256[:12]}... (the file changed after {SHARDS.recipe} wrote it): run it again")


def shard_set_key(shards_dir: RunPath) -> str:
    """The folder name of a shard set's verification records: its location's last part and a hash of all of it."""
    text = str(shards_dir.resolve())
    return f"{shards_dir.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def verified(record: RunPath, sha256: str, generation: str) -> bool:
    """Whether ``record`` says the shard was hashed in full, with this sha256, at this generation."""
    try:
        body = parse_json(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and body.get("sha256") == sha256 and body.get("generation") == generation


SHARD_VERIFIER = ShardVerifier()


OPEN_THREADS = 32  # requests in flight while a shard set opens (its indexes, from a bucket)
BUCKET_READ_THREADS = 32  # records read at once from a bucket (each a ranged request) while batches are assembled


def open_shards(shards_dir: RunPath, manifest: dict[str, Any], entries: list[dict[str, Any]],
                on_corrupt: OnCorrupt) -> list[TFRecordFile]:
    """The manifest's shards of one split, each checked (present, its size, its index's record count), their
    indexes read in parallel; in a bucket one listing gives every size and generation."""
    base, data_uri = shards_dir, manifest.get("data_uri")
    if data_uri and entries and not (shards_dir / entries[0]["file"]).is_file():
        if "://" in data_uri and not is_bucket_url(data_uri):  # a scheme only Beam's filesystems read
            raise DataError(f"shard {entries[0]['file']} is in {data_uri} (shards.output_uri), not in {shards_dir}: "
                            "copy the shards and indexes there, or write them to a gs:// or s3:// bucket, which "
                            "the loader reads in place")
        base = location(data_uri)  # Beam workers wrote the shards there (shards.output_uri): read them in place
    listed = base.list_objects() if isinstance(base, BucketPath) else None

    def open_one(entry: dict[str, Any]) -> TFRecordFile:
        path = base / entry["file"]
        found = listed.get(entry["file"]) if listed is not None else None
        if listed is not None and found is None or listed is None and not path.is_file():
            if base != shards_dir:
                raise DataError(f"shard {entry['file']} is in {data_uri} (shards.output_uri), not in {shards_dir}, "
                                f"and is missing there too: {SHARDS.run_again}")
            raise DataError(f"shard {path} listed in the manifest is missing: {SHARDS.run_again}")
        size = found.size if found is not None else path.stat().st_size
        if "bytes" in entry and size != entry["bytes"]:
            raise DataError(f"shard {path} has {size} bytes, the manifest says {entry['bytes']}: "
                            f"it was truncated or replaced; {SHARDS.run_again}")
        index = listed.get(entry["file"] + INDEX_SUFFIX) if listed is not None else None
        # the listing gave the index's size: one ranged GET (a whole-object read costs s3fs a HEAD and a GET)
        offsets = read_index(path) if index is None else parse_index(read_range(index_path(path), 0, index.size),
                                                                      index_path(path))
        if offsets.size != entry["records"]:
            raise DataError(f"index of {path} lists {offsets.size} records, the manifest says {entry['records']}")
        return TFRecordFile(path, offsets, on_corrupt=on_corrupt, size=size, generation=generation_of(path, found))

    if len(entries) <= 1:
        return [open_one(entry) for entry in entries]
    with concurrent.futures.ThreadPoolExecutor(min(OPEN_THREADS, len(entries)), "open-shards") as pool:
        return list(pool.map(open_one, entries))


class ShardSource:
    """Grain ``RandomAccessDataSource`` over one split's shards: record ``i`` -> dict of int32 rows.

    Records are numbered across the split's shards in manifest order; each read goes through the
    shard's index and checks both CRCs. A corrupt record raises an error naming the shard and byte
    offset, or, with ``on_corrupt="skip"``, is logged, counted in ``skipped`` and read as a row of
    zeros with weight 0 (so batch shapes and the resume position stay the same). Each shard is
    hashed against the manifest in the background (``check_shards``)."""

    def __init__(self, shards_dir: RunPath | str, split: str, manifest: dict[str, Any] | None = None,
                 on_corrupt: OnCorrupt | None = None, verify: bool = True,
                 verified_dir: RunPath | None = None) -> None:
        self.shards_dir = location(shards_dir)
        self.manifest = manifest if manifest is not None else read_shards_manifest(self.shards_dir)
        if split not in self.manifest["splits"]:
            raise DataError(f"{self.shards_dir}: no split '{split}' in the shards manifest "
                            f"(have {', '.join(self.manifest['splits'])})")
        self.split = split
        self.on_corrupt: OnCorrupt = on_corrupt or self.manifest.get("config", {}).get("on_corrupt", "error")
        self.features = sorted(self.manifest["feature_schema"]["features"])
        self.row_len = int(self.manifest["seq_len"]) + 1
        entries = self.manifest["splits"][split]["shards"]
        self.files = open_shards(self.shards_dir, self.manifest, entries, self.on_corrupt)
        records = None if verified_dir is None else location(verified_dir) / shard_set_key(self.shards_dir)
        self._checks = [(SHARD_VERIFIER.submit(f.path, s["sha256"], None if records is None else
                                               records / f"{s['file']}.json", f.generation, verify), f.path)
                        for f, s in zip(self.files, entries, strict=True) if s.get("sha256")]
        self._starts = np.concatenate(([0], np.cumsum([len(f) for f in self.files]))).astype(np.int64).tolist()

    @property
    def in_bucket(self) -> bool:
        return any(isinstance(f.path, BucketPath) for f in self.files)

    def __len__(self) -> int:
        return self._starts[-1]

    def __repr__(self) -> str:
        return f"ShardSource({self.shards_dir}, split={self.split!r}, records={len(self)})"

    @property
    def skipped(self) -> int:
        return sum(f.skipped for f in self.files)

    @property
    def skipped_at(self) -> list[tuple[str, int]]:
        """(file, byte offset) of each skipped read, in the order of the shards."""
        return [where for f in self.files for where in f.skipped_at]

    def check_shards(self, wait: bool = False) -> None:
        """Raise the first finished sha256 mismatch (under on_corrupt=skip: log it once); ``wait`` for all.

        Called before every batch: only the checks still pending or failed are looked at again."""
        pending = []
        for future, path in self._checks:
            if not (wait or future.done()):
                pending.append((future, path))
                continue
            error = future.result()
            if error is None:
                continue
            if self.on_corrupt != "skip":
                raise DataError(error)  # kept in _checks: every later batch stops too
            log.warning("%s (shards.on_corrupt=skip: the run goes on, passing over its corrupt records)", error)
        self._checks = pending

    def _locate(self, index: int) -> tuple[TFRecordFile, int]:
        shard = bisect.bisect_right(self._starts, index) - 1
        return self.files[shard], index - self._starts[shard]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range for {len(self)} records")
        shard, record = self._locate(index)
        payload = shard.read(record)
        if payload is not None:
            try:
                row = self._decode(shard, record, payload)
            except CorruptRecordError as exc:
                if self.on_corrupt != "skip":
                    raise
                shard.skip(exc)
            else:
                return {**row, _ROW_WEIGHT: np.float32(1.0)} if self.on_corrupt == "skip" else row
        # a corrupt record under on_corrupt=skip: a row that trains nothing, in its own place
        return {**{name: np.zeros(self.row_len, np.int32) for name in self.features}, _ROW_WEIGHT: np.float32(0.0)}

    def _decode(self, shard: TFRecordFile, record: int, payload: bytes) -> dict[str, np.ndarray]:
        offset = int(shard.offsets[record])
        example = decode_record(payload, shard.path, offset, record)
        row = {}
        for name in self.features:
            values = example.get(name)
            if not isinstance(values, np.ndarray) or values.shape != (self.row_len,):
                got = "missing" if values is None else f"shape {getattr(values, 'shape', '?')}"
                raise DataError(f"{shard.path}: record {record} at byte offset {offset}: feature '{name}' is {got}, "
                                f"expected {self.row_len} int64 values")
            row[name] = values.astype(np.int32)
        return row


class TrainIterator:
    """Endless iterator of this process's training batches with ``get_state``/``set_state``."""

    def __init__(self, source: ShardSource | Sequence[ShardSource], global_batch_size: int, seed: int,
                 process_index: int, process_count: int, read_threads: int,
                 weights: Sequence[float] | None = None, names: Sequence[str] | None = None,
                 schedule: Sequence[tuple[int, Mapping[str, float]]] = (), stream_start_step: int = 0) -> None:
        self.sources = [source] if isinstance(source, ShardSource) else list(source)
        self.weights = [float(w) for w in weights] if weights is not None else [1.0] * len(self.sources)
        self.names = list(names) if names is not None else [str(s.shards_dir) for s in self.sources]
        if not self.sources or len(self.weights) != len(self.sources) or len(self.names) != len(self.sources):
            raise ConfigError(f"a mixture needs one weight and one name per shard set, got {len(self.sources)} sets, "
                              f"{len(self.weights)} weights, {len(self.names)} names")
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ConfigError(f"process_index {process_index} is not in [0, process_count={process_count})")
        if global_batch_size < 1 or global_batch_size % process_count:
            raise ConfigError(f"global batch size {global_batch_size} is not a positive multiple of the "
                              f"{process_count} processes")
        for part in self.sources:
            if len(part) == 0:
                raise DataError(f"{part.shards_dir}: the train split has no records: "
                                f"run {SHARDS.recipe} with more text")
        self.source = self.sources[0]
        self.global_batch_size = global_batch_size
        self.seed = int(seed)
        self.process_index = process_index
        self.process_count = process_count
        self.batch_size = global_batch_size // process_count
        if any(part.in_bucket for part in self.sources):  # requests wait on the network, not the CPU
            read_threads = max(read_threads, BUCKET_READ_THREADS)
        self._read_options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(2 * read_threads, 2))
        streams = [grain.MapDataset.source(part)
                   .shuffle(seed=mixture_seed(self.seed, i))  # index shuffle: a new permutation per epoch
                   .repeat(None) for i, part in enumerate(self.sources)]
        # a stage's stream begins at its branch step: its batch b is the batch of step stream_start_step + b + 1,
        # and the schedule's steps (the run's steps) are moved to positions in this stream
        self.stream_start_step = int(stream_start_step)
        self.schedule = MixtureSchedule(self.names, self.weights,
                                        [(int(step) - self.stream_start_step, w) for step, w in schedule],
                                        global_batch_size)
        if len(streams) == 1:
            records = streams[0]
        elif len(self.schedule.steps) == 1:  # fixed weights: Grain's mix (the stream the schedule's one stage is)
            records = grain.MapDataset.mix(streams, self.weights)
        else:
            records = ScheduledMix(streams, self.schedule)
        self._batches = (records[process_index::process_count]
                         .batch(self.batch_size, drop_remainder=True)
                         .map(_to_model_batch))
        self._next_batch = 0
        self._iterator: grain.DatasetIterator | None = None

    def __iter__(self) -> TrainIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        for part in self.sources:
            part.check_shards()
        if self._iterator is None:
            self._iterator = iter(self._batches[self._next_batch:].to_iter_dataset(self._read_options))
        batch = next(self._iterator)
        self._next_batch += 1
        return batch

    @property
    def fingerprint(self) -> str:
        """Identifies the shard set the order was made for (rebuilt shards get new hashes)."""
        hashes = ["".join(s["sha256"] for s in part.manifest["splits"][part.split]["shards"]) for part in self.sources]
        return hashlib.sha256("/".join(hashes).encode()).hexdigest()[:16]

    @property
    def mixture(self) -> dict[str, float] | None:
        """``{set name: weight}`` of a mixture (None for one shard set): what the state records and W&B logs."""
        return dict(zip(self.names, self.weights, strict=True)) if len(self.sources) > 1 else None

    @property
    def mixture_schedule(self) -> list[list[Any]] | None:
        """``[[step, {set name: weight}], ...]`` of the weight changes after step 0 (None: fixed weights)."""
        if len(self.sources) == 1 or len(self.schedule.steps) == 1:
            return None
        return [[step + self.stream_start_step, weights] for step, weights in self.schedule.changes()]

    def rows_by_set(self, batches: int) -> dict[str, int]:
        """The rows each set gave to the first ``batches`` global batches (closed form: no row is read)."""
        return dict(zip(self.names, self.schedule.rows_before(batches * self.global_batch_size), strict=True))

    def step_rows(self, step: int) -> tuple[dict[str, int], dict[str, int]] | None:
        """Each set's rows in this stream before the batch of step ``step`` and up to it (the batch's own rows are
        the difference): what the ledger books and train_log shows of a step; None for one set or before the
        stream's first step (a stage's stream begins at its branch step)."""
        batches = step - self.stream_start_step
        if self.mixture is None or batches < 1:
            return None
        return self.rows_by_set(batches - 1), self.rows_by_set(batches)

    def tokens_by_set(self, step: int, tokens_per_step: int) -> dict[str, int] | None:
        """The tokens each set gave to the batch of step ``step`` (``tokens_per_step`` tokens in all); None for one
        set or before the stream's first step."""
        rows = self.step_rows(step)
        if rows is None:
            return None
        before, after = rows
        tokens_per_row = tokens_per_step // self.global_batch_size
        return {name: (after[name] - before[name]) * tokens_per_row for name in self.names}

    def mixture_metrics(self, step: int, tokens_per_step: int) -> dict[str, float]:
        """``data/<set>/share`` (its share of the rows of step ``step``'s batch, as the batch holds them) and
        ``data/<set>/tokens_seen`` (its tokens in this stream's steps up to ``step``: a stage's from its branch
        step); empty for one set or before the stream's first step."""
        rows = self.step_rows(step)
        if rows is None:
            return {}
        before, after = rows
        tokens_per_row = tokens_per_step // self.global_batch_size
        metrics: dict[str, float] = {}
        for name in self.names:
            metrics[f"data/{name}/share"] = (after[name] - before[name]) / self.global_batch_size
            metrics[f"data/{name}/tokens_seen"] = after[name] * tokens_per_row
        return metrics

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable position; identical on every process for the same step."""
        state = {"version": STATE_VERSION, "next_global_batch": self._next_batch, "seed": self.seed,
                 "global_batch_size": self.global_batch_size, "records": sum(len(s) for s in self.sources),
                 "shards_fingerprint": self.fingerprint, "process_count": self.process_count}
        if self.mixture is not None:
            state["mixture"] = self.mixture
        if self.mixture_schedule is not None:
            state["mixture_schedule"] = self.mixture_schedule
        if self.stream_start_step:
            state["stream_start_step"] = self.stream_start_step
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken (see the module's resume rule)."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
        if state["seed"] != self.seed:
            raise DataError(f"loader state was saved with seed {state['seed']}, this run uses {self.seed}: "
                            "resuming would replay or skip data")
        if state.get("mixture") != self.mixture:
            raise DataError("loader state was saved for the mixture "
                            f"{state.get('mixture') or 'of one shard set'}, this "
                            f"run mixes {self.mixture or 'one shard set'}: resuming would replay or skip data "
                            "(keep train.mixture as it was, or start a new run)")
        if state.get("mixture_schedule") != self.mixture_schedule:
            raise DataError("loader state was saved for the mixture schedule "
                            f"{state.get('mixture_schedule') or 'of fixed weights'}, this run has "
                            f"{self.mixture_schedule or 'fixed weights'}: resuming would replay or skip data "
                            "(keep train.mixture_schedule as it was, or start a new run)")
        if self.mixture_schedule is not None and state["global_batch_size"] != self.global_batch_size:
            raise DataError(f"loader state was saved with global batch size {state['global_batch_size']}, this run "
                            f"has {self.global_batch_size}: train.mixture_schedule changes weights at steps, so "
                            "another batch size moves its changes in the stream (resume with the same batch size)")
        if state.get("stream_start_step", 0) != self.stream_start_step:
            raise DataError(f"loader state is of a stream that began at step {state.get('stream_start_step', 0)}, "
                            f"this run's begins at step {self.stream_start_step}: resuming would replay or skip data "
                            "(keep train.branch_data and train.branch_step as they were, or start a new run)")
        records = sum(len(s) for s in self.sources)
        if state["records"] != records or state["shards_fingerprint"] != self.fingerprint:
            raise DataError(f"loader state was saved for other shards ({state['records']} train records, "
                            f"fingerprint {state['shards_fingerprint']}), these have {records} "
                            f"({self.fingerprint}): the shards were rebuilt since the checkpoint")
        consumed = int(state["next_global_batch"]) * int(state["global_batch_size"])
        if consumed % self.global_batch_size:
            raise DataError(f"loader state is at record {consumed} of the stream, not a whole number of "
                            f"global batches of {self.global_batch_size}: resume with global batch size "
                            f"{state['global_batch_size']}")
        if state["global_batch_size"] != self.global_batch_size:
            log.warning("resuming with global batch size %d (was %d) at stream record %d",
                        self.global_batch_size, state["global_batch_size"], consumed)
        if state.get("process_count") not in (None, self.process_count):
            log.info("resuming on %d processes (was %s): same global batches, rows assigned anew",
                     self.process_count, state.get("process_count"))
        self._next_batch = consumed // self.global_batch_size
        self.close()

    def close(self) -> None:
        """Stop the reader threads (a later ``next`` starts them again at the current position)."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    @property
    def skipped_records(self) -> int:
        return sum(s.skipped for s in self.sources)

    @property
    def skipped_at(self) -> list[tuple[str, int]]:
        return [where for s in self.sources for where in s.skipped_at]


def integer_proportions(weights: Sequence[float]) -> tuple[int, ...]:
    """A stage's weights as the integers Grain's mix interleaves by (the least positive weight scaled to 100, the
    others by the same factor, truncated: Grain's own rounding, so a one-stage schedule is Grain's stream); a
    weight of 0 stays 0 (its set gives no row in that stage)."""
    scale = 100 / min(w for w in weights if w > 0)
    return tuple(int(w * scale) for w in weights)


def interleaved_counts(rows: int, proportions: Sequence[int]) -> list[int]:
    """The rows each set gives to the first ``rows`` positions of Grain's interleaving at integer ``proportions``
    (``MapDataset.mix``): set 0 takes ``rows - rows x (P - p0) // P`` of them, the rest split among the others
    the same way. A closed form: the count at any position, without walking the ones before."""
    counts = []
    remaining = sum(proportions)
    for proportion in proportions:
        rest = rows * (remaining - proportion) // remaining if remaining else rows
        counts.append(rows - rest)
        remaining -= proportion
        rows = rest
    return counts


class MixtureSchedule:
    """The weights of a mixture over the stream, piecewise constant: the sets' own weights from step 0, each
    change ``(step, {name: weight})`` from stream position ``step x global_batch_size`` on (see the module's
    Mixtures section). ``rows_before(n)`` and ``locate(n)`` are closed forms of the position ``n``."""

    def __init__(self, names: Sequence[str], weights: Sequence[float],
                 changes: Sequence[tuple[int, Mapping[str, float]]], global_batch_size: int) -> None:
        # changes check_mixture passed (the config's load, or make_mixture_iterator): not checked a third time
        self.names = list(names)
        self.steps = [0, *(int(step) for step, _ in changes)]
        self.weights = [[float(w) for w in weights],
                        *([float(stage.get(name, 0.0)) for name in self.names] for _, stage in changes)]
        self.starts = [step * global_batch_size for step in self.steps]
        self.proportions = [integer_proportions(w) for w in self.weights]
        self.bases = [[0] * len(self.names)]  # each set's rows in the stages before stage s
        for s in range(1, len(self.steps)):
            within = interleaved_counts(self.starts[s] - self.starts[s - 1], self.proportions[s - 1])
            self.bases.append([a + b for a, b in zip(self.bases[-1], within, strict=True)])

    def changes(self) -> list[list[Any]]:
        """The changes after step 0 as ``[[step, {name: weight}], ...]`` (what the loader state and W&B record)."""
        return [[step, dict(zip(self.names, weights, strict=True))]
                for step, weights in zip(self.steps[1:], self.weights[1:], strict=True)]

    def _stage(self, position: int) -> int:
        return bisect.bisect_right(self.starts, position) - 1

    def rows_before(self, position: int) -> list[int]:
        """The rows each set gives to stream positions ``[0, position)``."""
        stage = self._stage(position)
        within = interleaved_counts(position - self.starts[stage], self.proportions[stage])
        return [a + b for a, b in zip(self.bases[stage], within, strict=True)]

    def locate(self, position: int) -> tuple[int, int]:
        """``(set, position in that set's stream)`` of stream position ``position``."""
        stage = self._stage(position)
        local = position - self.starts[stage]
        before = interleaved_counts(local, self.proportions[stage])
        after = interleaved_counts(local + 1, self.proportions[stage])
        for index, (a, b) in enumerate(zip(before, after, strict=True)):
            if b != a:
                return index, self.bases[stage][index] + a
        raise AssertionError(f"stream position {position}: no set gives it")  # the counts grow by one a position


class ScheduledMix(grain.MapDataset):
    """The endless mixed stream of a ``MixtureSchedule``: position ``n`` is row ``locate(n)`` of its set's stream."""

    def __init__(self, streams: Sequence[grain.MapDataset], schedule: MixtureSchedule) -> None:
        super().__init__(list(streams))
        self._schedule = schedule

    def __len__(self) -> int:
        return sys.maxsize  # every set's stream repeats without end

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        part, position = self._schedule.locate(int(index))
        return self.parents[part][position]

    def __str__(self) -> str:
        return f"ScheduledMix[{len(self.parents)} sets, changes at steps {self._schedule.steps[1:]}]"


def mixture_seed(seed: int, index: int) -> int:
    """The shuffle seed of mixture set ``index``: set 0 keeps the run's seed (one set reads as before), the
    others get their own permutations."""
    if index == 0:
        return int(seed) % 2**32
    digest = hashlib.sha256(f"{int(seed)}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def make_train_iterator(shards_dir: RunPath | str, global_batch_size: int, seed: int, process_index: int = 0,
                        process_count: int = 1, *, tokenizer_sha256: str | None = None, seq_len: int | None = None,
                        on_corrupt: OnCorrupt | None = None, read_threads: int = 4,
                        mixture: Sequence[tuple[str, RunPath | str, float]] = (),
                        schedule: Sequence[tuple[int, Mapping[str, float]]] = (),
                        verified_dir: RunPath | None = None, stream_start_step: int = 0) -> TrainIterator:
    """The training batches of process ``process_index`` (see the module docstring for the order).

    ``tokenizer_sha256`` and ``seq_len``, when given, are checked against the shards' manifest. A
    ``mixture`` of ``(name, shards folder, weight)`` reads those sets instead (``make_mixture_iterator``), with
    its weights changed at the steps of ``schedule``. ``stream_start_step``: the step the stream begins at (a
    stage's branch step; its first batch is that step's + 1)."""
    if mixture:
        return make_mixture_iterator(mixture, global_batch_size, seed, process_index, process_count,
                                     tokenizer_sha256=tokenizer_sha256, seq_len=seq_len, on_corrupt=on_corrupt,
                                     read_threads=read_threads, verified_dir=verified_dir, schedule=schedule,
                                     stream_start_step=stream_start_step)
    manifest = read_shards_manifest(shards_dir, tokenizer_sha256=tokenizer_sha256, seq_len=seq_len)
    source = ShardSource(shards_dir, "train", manifest, on_corrupt=on_corrupt, verify=process_index == 0,
                         verified_dir=verified_dir)
    log.info("train loader: %d records, global batch %d = %d processes x %d, seed %d",
             len(source), global_batch_size, process_count, global_batch_size // max(process_count, 1), seed)
    return TrainIterator(source, global_batch_size, seed, process_index, process_count, read_threads,
                         stream_start_step=stream_start_step)


def make_mixture_iterator(sets: Sequence[tuple[str, RunPath | str, float]], global_batch_size: int, seed: int,
                          process_index: int = 0, process_count: int = 1, *, tokenizer_sha256: str | None = None,
                          seq_len: int | None = None, on_corrupt: OnCorrupt | None = None,
                          read_threads: int = 4, verified_dir: RunPath | None = None,
                          schedule: Sequence[tuple[int, Mapping[str, float]]] = (),
                          stream_start_step: int = 0) -> TrainIterator:
    """The training batches of a weighted mixture of shard sets ``(name, shards folder, weight)``, the weights
    changed at the steps of ``schedule`` (``(step, {name: weight})``: ``MixtureSchedule``).

    Every set must have the same tokenizer, ``seq_len`` and features (rows are mixed, never re-tokenized);
    a set that differs is one error naming it. One set reads exactly as ``make_train_iterator``."""
    if not sets:
        raise ConfigError("a mixture needs at least one shard set")
    stages = [(step, dict(w)) for step, w in schedule]  # checked before any shard set opens
    check_mixture([name for name, _, _ in sets], [float(w) for _, _, w in sets], stages, first=stream_start_step)
    sources = []
    for name, shards_dir, _ in sets:
        manifest = read_shards_manifest(shards_dir, tokenizer_sha256=tokenizer_sha256, seq_len=seq_len)
        if tokenizer_sha256 is None:  # no tokenizer given: the sets must at least agree with each other
            tokenizer_sha256, seq_len = manifest["tokenizer_sha256"], manifest["seq_len"]
        source = ShardSource(shards_dir, "train", manifest, on_corrupt=on_corrupt, verify=process_index == 0,
                             verified_dir=verified_dir)
        if sources and source.features != sources[0].features:
            raise DataError(f"mixture set '{name}' ({shards_dir}) has features {source.features}, set "
                            f"'{sets[0][0]}' has {sources[0].features}: make both with the same shards.packing")
        sources.append(source)
    names = [name for name, _, _ in sets]
    weights = [float(weight) for _, _, weight in sets]
    log.info("train loader: mixture of %s, global batch %d, seed %d",
             ", ".join(f"{n} {w / sum(weights):.1%} ({len(s)} records)" for n, w, s in zip(names, weights, sources,
                                                                                          strict=True)),
             global_batch_size, seed)
    if schedule:
        log.info("train loader: mixture weights change at steps %s", ", ".join(str(step) for step, _ in schedule))
    return TrainIterator(sources, global_batch_size, seed, process_index, process_count, read_threads,
                         weights=weights, names=names, schedule=schedule, stream_start_step=stream_start_step)


def iter_eval_batches(shards_dir: RunPath | str, split: str, batch_size: int, max_batches: int | None = None, *,
                      tokenizer_sha256: str | None = None, seq_len: int | None = None,
                      on_corrupt: OnCorrupt | None = None, read_threads: int = 4) -> Iterator[dict[str, np.ndarray]]:
    """Every record of ``split`` once, in file order, as batches (the last one possibly smaller)."""
    if batch_size < 1:
        raise ConfigError(f"eval batch size must be at least 1, got {batch_size}")
    manifest = read_shards_manifest(shards_dir, tokenizer_sha256=tokenizer_sha256, seq_len=seq_len)
    source = ShardSource(shards_dir, split, manifest, on_corrupt=on_corrupt)
    if len(source) == 0:
        return
    batches = grain.MapDataset.source(source).batch(batch_size, drop_remainder=False).map(_to_model_batch)
    if max_batches is not None:
        batches = batches[:max_batches]
    read_options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(2 * read_threads, 2))
    for batch in batches.to_iter_dataset(read_options):
        source.check_shards()
        yield batch
    source.check_shards(wait=True)  # a short pass: every shard it read is checked before it ends


def mixture_sets(mixture: Sequence[Any], own_shards: RunPath | str) -> list[tuple[str, RunPath, float]]:
    """``train.mixture`` entries as ``(name, shards folder, weight)``; an empty ``shards`` is this run's folder."""
    return [(m.name, location(m.shards, "train.mixture") if m.shards else location(own_shards), float(m.weight))
            for m in mixture]


def mixture_changes(stages: Sequence[Any]) -> list[tuple[int, dict[str, float]]]:
    """``train.mixture_schedule`` entries as ``(step, {name: weight})``."""
    return [(int(stage.step), {name: float(w) for name, w in stage.weights.items()}) for stage in stages]


def log_mixture(wandb_run: Any, mixture: dict[str, float] | None,
                schedule: list[list[Any]] | None = None) -> None:
    """The mixture's weights in the W&B config (``data_mixture``, and ``data_mixture_schedule``: its changes) and
    each set's share of the rows at step 0 in the summary (``data/mixture/<set>``; the rows of each step are
    ``data/<set>/share``); nothing for one shard set or a disabled run."""
    if not mixture or wandb_run is None or getattr(wandb_run, "disabled", False):
        return
    total = sum(mixture.values())
    wandb_run.config.update({"data_mixture": mixture}, allow_val_change=True)
    if schedule:
        wandb_run.config.update({"data_mixture_schedule": schedule}, allow_val_change=True)
    for name, weight in mixture.items():
        wandb_run.summary[f"data/mixture/{name}"] = weight / total


def check_batch_records(cfg: Any, run_folder: Any) -> str | None:
    """The stage check of recipe 04 (experiment/check.py): a global batch (``train.batch_size``) that is more than
    every training record recipe 03 wrote would repeat records within each step (and a batch of millions of
    rows grinds in host memory before the first step). Checked against the run's finished shards; a mixture's
    sets, or shards not made yet, are left to the loader, which the note says.

    A run that trains more rows than the shards hold (``train.steps x train.batch_size`` above the training
    records) is allowed, but said in one warning line before training: the loader then goes over its data
    again (each epoch a new permutation), which a corpus sized in bytes for a token budget does silently when
    its bytes per token were guessed (bench/bytes_per_token.py measures them). A mixture's sets are each
    compared with their weight's share of the rows (``check_mixture_epochs``)."""
    if cfg.train.mixture:
        return check_mixture_epochs(cfg, run_folder)
    manifest = SHARDS.read_manifest_if_present(run_folder.shards)
    if manifest is None:
        return "train.batch_size: no shards yet, so the batch is not compared with the training records"
    records = int((manifest["splits"].get("train") or {}).get("records", 0))
    if cfg.train.batch_size > records:
        raise ConfigError(f"config key 'train.batch_size': {cfg.train.batch_size:,} sequences a step, but "
                          f"{run_folder.shards} holds {records:,} training records: every step would repeat "
                          "records; lower the batch or build a larger corpus")
    steps, steps_key = stream_steps(cfg.train)
    rows = steps * cfg.train.batch_size
    if rows > records:
        seq_len = int(manifest["seq_len"])
        shard_tokens = int((manifest["splits"].get("train") or {}).get("tokens", 0))
        log.warning("%s x train.batch_size x model.max_seq_len = %s x %s x %s = %s tokens, but the "
                    "training shards in %s hold %s records (%s tokens): the run goes over its training data "
                    "%.2f times (epochs); to see each record once, build a larger corpus "
                    "(corpus.sources[].max_bytes) or lower train.steps", steps_key, f"{steps:,}",
                    f"{cfg.train.batch_size:,}", f"{seq_len:,}", f"{rows * seq_len:,}", run_folder.shards,
                    f"{records:,}", f"{shard_tokens:,}", rows / records)
    return None


def stream_steps(train_cfg: TrainConfig) -> tuple[int, str]:
    """The steps whose batches this run's stream gives, and how to name them: ``train.steps``, less a stage's
    ``train.branch_step`` (its stream begins there; a decay branch reads on in its parent's stream from 0)."""
    if train_cfg.stream_start_step:
        return train_cfg.steps - train_cfg.stream_start_step, "(train.steps - train.branch_step)"
    return train_cfg.steps, "train.steps"


def check_mixture_epochs(cfg: Any, run_folder: Any) -> str | None:
    """``check_batch_records``'s epoch warning for ``train.mixture``: set ``i`` gives ``weight_i / sum(weights)`` of
    the run's rows (under ``train.mixture_schedule``, the rows its stages give it), so a set that holds fewer records
    than its share is gone over again; one line names every such set with its epochs. A set in a bucket that this
    check may not read, or not sharded yet, is the note."""
    from experiment.check import reads_buckets

    sets = mixture_sets(cfg.train.mixture, run_folder.shards)
    total_weight = sum(weight for _, _, weight in sets)
    steps, steps_key = stream_steps(cfg.train)
    rows = steps * cfg.train.batch_size
    shares = {name: weight / total_weight for name, _, weight in sets}
    if cfg.train.mixture_schedule and rows:
        start = cfg.train.stream_start_step  # the schedule names the run's steps; its stream begins here
        schedule = MixtureSchedule([n for n, _, _ in sets], [w for _, _, w in sets],
                                   [(step - start, w) for step, w in mixture_changes(cfg.train.mixture_schedule)],
                                   cfg.train.batch_size)
        shares = {name: count / rows for name, count in zip(shares, schedule.rows_before(rows), strict=True)}
    looping: list[str] = []
    unread: list[str] = []  # sets not compared: the note (the others are still compared and warned about)
    seq_len = 0
    for name, shards_dir, _ in sets:
        if isinstance(shards_dir, BucketPath) and not reads_buckets():
            unread.append(f"set '{name}' is in a bucket, not read here")
            continue
        manifest = SHARDS.read_manifest_if_present(shards_dir)
        if manifest is None:
            unread.append(f"set '{name}' has no shards yet")
            continue
        records = int((manifest["splits"].get("train") or {}).get("records", 0))
        seq_len = int(manifest["seq_len"])
        share = shares[name]
        if records and rows * share > records:  # an empty set is the loader's error
            looping.append(f"'{name}' {rows * share / records:.2f} epochs ({records:,} records for {share:.0%} of "
                           "the rows)")
    if looping:
        log.warning("%s x train.batch_size x model.max_seq_len = %s x %s x %s = %s tokens, but the run "
                    "goes over train.mixture's sets more than once: %s; to see each record once, build larger sets "
                    "or lower train.steps or their weights", steps_key, f"{steps:,}", f"{cfg.train.batch_size:,}",
                    f"{seq_len:,}", f"{rows * seq_len:,}", ", ".join(looping))
    if unread:
        return f"train.mixture: {'; '.join(unread)}, so its records are not compared with its rows"
    return None
