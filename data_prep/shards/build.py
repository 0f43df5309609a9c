"""Recipe 3: tokenize the cleaned corpus and write TFRecord shards with index sidecars and a manifest.

Documents are read in corpus order, encoded in batches by SentencePiece's own thread pool (the
local worker pool; the output does not depend on the thread count) with the run's tokenizer,
trained or adopted (``tokenizer.loaded``), given an EOS, routed to
train or validation by a hash of their id, packed into rows of ``seq_len + 1`` and written as
``tf.train.Example`` records. The manifest is written last; a crash leaves a folder without one,
which the loader refuses.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import numpy as np

from data_prep.shards.beam import run_beam_shards
from data_prep.shards.layout import (
    SPLITS,
    feature_schema,
    row_tokens,
    shard_file_name,
    shard_summary,
    split_of,
)
from data_prep.shards.packing import Packer, PackingStats
from data_prep.shards.tfrecord import INDEX_SUFFIX, TFRecordWriter, encode_int64_rows
from experiment.config import redact
from experiment.corpus_format import iter_documents, read_corpus_manifest, verify_corpus
from experiment.errors import DataError
from experiment.files import remove_file
from experiment.jsontext import parse_json
from experiment.manifest import MANIFEST_NAME, invalidate
from experiment.progress import progress as progress_bar
from experiment.schema import ExperimentConfig
from experiment.sections.shards import ShardsConfig
from experiment.stages import SHARDS
from experiment.storage import BucketPath, RunPath
from tokenizer.loaded import RunTokenizer, load_run_tokenizer
from tracking.artifacts import add_folder, log_reference

log = logging.getLogger("data_prep.shards.build")


@dataclasses.dataclass
class SplitWriter:
    """Writes one split's rows into ``<split>-NNNNN.tfrecord`` files of at most ``records_per_shard`` rows."""

    out_dir: RunPath
    split: str
    records_per_shard: int
    shards: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    _writer: TFRecordWriter | None = dataclasses.field(default=None, init=False, repr=False)
    _tokens_in_shard: int = dataclasses.field(default=0, init=False, repr=False)

    def write_rows(self, rows: dict[str, np.ndarray], pad_mask_key: str | None) -> None:
        payloads = encode_int64_rows(rows)
        tokens = row_tokens(rows, pad_mask_key)
        done = 0
        while done < len(payloads):
            if self._writer is None:
                self._writer = TFRecordWriter(self.out_dir / shard_file_name(self.split, len(self.shards)))
                self._tokens_in_shard = 0
            take = min(len(payloads) - done, self.records_per_shard - self._writer.records)
            self._writer.write_many(payloads[done:done + take])
            self._tokens_in_shard += sum(tokens[done:done + take])
            done += take
            if self._writer.records >= self.records_per_shard:
                self._close_shard()

    def _close_shard(self) -> None:
        assert self._writer is not None
        self._writer.close()
        self.shards.append(shard_summary(self._writer, self._tokens_in_shard))
        self._writer = None

    def close(self) -> None:
        if self._writer is not None:
            self._close_shard()

    def abort(self, exc: BaseException) -> None:
        if self._writer is not None:
            self._writer.abort(exc)
            self._writer = None

    def summary(self, stats: PackingStats) -> dict[str, Any]:
        return {"shards": self.shards, "records": sum(s["records"] for s in self.shards),
                "tokens": sum(s["tokens"] for s in self.shards), "documents": stats.documents,
                "padding_tokens": stats.padding_tokens, "dropped_tokens": stats.dropped_tokens}


def remove_old_shards(out_dir: RunPath) -> None:
    """Delete the shard and index files of an earlier run (the manifest is already gone), the temporary
    files a killed run left behind."""
    if isinstance(out_dir, BucketPath):  # one listing, not a request per object
        files = [out_dir / name for name in out_dir.list_objects() if "/" not in name]
    else:
        files = [path for path in out_dir.iterdir() if path.is_file()]
    for path in files:
        name = path.name
        finished = name.endswith(".tfrecord") or name.endswith(".tfrecord" + INDEX_SUFFIX)
        leftover = name.startswith(".") and ".tfrecord" in name and name.endswith(".tmp")
        if finished or leftover:
            remove_file(path)


def describe_previous(out_dir: RunPath, tokenizer_sha256: str, seq_len: int) -> None:
    """Say plainly when this run replaces shards built with another tokenizer or sequence length."""
    path = out_dir / MANIFEST_NAME
    if not path.is_file():
        return
    try:
        old = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if old.get("tokenizer_sha256") != tokenizer_sha256:
        log.warning("replacing shards built with tokenizer %s... by tokenizer %s...",
                    str(old.get("tokenizer_sha256"))[:12], tokenizer_sha256[:12])
    if old.get("seq_len") != seq_len:
        log.warning("replacing shards with seq_len %s by seq_len %s", old.get("seq_len"), seq_len)


def encode_threads(requested: int) -> int:
    return requested if requested > 0 else (os.cpu_count() or 1)


def shard_corpus(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any) -> dict[str, Any]:
    """Tokenize ``run_folder.corpus`` with ``run_folder.tokenizer`` into ``run_folder.shards``."""
    shards_cfg, seq_len = cfg.shards, cfg.model.max_seq_len  # rows of the model's one sequence length
    tokenizer = load_run_tokenizer(run_folder.tokenizer)
    tok_manifest = tokenizer.manifest
    corpus_manifest = read_corpus_manifest(run_folder.corpus)
    if cfg.shards.runner != "beam":  # before the old shards go: an edited corpus keeps them
        verify_corpus(run_folder.corpus, corpus_manifest)
    # (on Beam the driver reads no data: each worker checks its file's size and sha256 before tokenizing it,
    # data_prep.shards.beam.read_corpus_shard)
    eos_id, pad_id = tokenizer.eos_id, tokenizer.pad_id

    out_dir = run_folder.shards
    out_dir.mkdir(parents=True, exist_ok=True)
    describe_previous(out_dir, tok_manifest["sha256"], seq_len)
    invalidate(out_dir)
    remove_old_shards(out_dir)

    threads = encode_threads(shards_cfg.num_threads)
    log.info("tokenizing %d documents with %d thread(s), packing '%s' into rows of %d tokens",
             corpus_manifest["documents"], threads, shards_cfg.packing, seq_len + 1)
    started = time.perf_counter()
    if shards_cfg.runner == "beam":
        result, references = run_beam_shards(run_folder.corpus, corpus_manifest, tokenizer.source, out_dir,
                                             shards_cfg, seq_len, eos_id=eos_id, pad_id=pad_id)
    else:
        references = None  # W&B checksums the local shards itself
        result = write_splits(iter_documents(run_folder.corpus, corpus_manifest), tokenizer, out_dir, shards_cfg,
                              seq_len, eos_id=eos_id, pad_id=pad_id, threads=threads,
                              total=corpus_manifest["documents"])
    seconds = time.perf_counter() - started

    payload = {
        "tokenizer_sha256": tok_manifest["sha256"],
        "tokenizer_kind": tokenizer.kind,
        "vocab_size": tok_manifest["vocab_size"],
        "special_ids": {"eos": eos_id, "pad": pad_id},
        "seq_len": seq_len,
        "packing": shards_cfg.packing,
        "feature_schema": feature_schema(seq_len, shards_cfg.packing),
        "validation_percent": shards_cfg.validation_percent,
        "split_rule": "experiment.split.is_validation(doc_id, validation_percent): sha256 of the document id",
        "splits": result,
        "corpus": {"documents": corpus_manifest["documents"], "bytes": corpus_manifest.get("bytes"),
                   "shards_sha256": [s.get("sha256") for s in corpus_manifest["shards"]]},
        "config": redact(dataclasses.asdict(shards_cfg)),
        **({"data_uri": shards_cfg.output_uri} if shards_cfg.output_uri else {}),  # Beam wrote the files there
    }
    tokens = sum(split["tokens"] for split in result.values())
    log.info("wrote %d train and %d validation records (%d tokens) in %.1f s: %.0f tokens/s",
             result["train"]["records"], result["validation"]["records"], tokens, seconds, tokens / max(seconds, 1e-9))
    if result["train"]["records"] == 0:
        raise DataError(f"the corpus in {run_folder.corpus} gives no full training row of {seq_len + 1} "
                        "tokens: lower model.max_seq_len or add text")
    if result["validation"]["records"] == 0 and shards_cfg.validation_percent > 0:
        log.warning("the validation split is empty: raise shards.validation_percent or add text")
    SHARDS.write_manifest(out_dir, payload)
    if wandb_run is not None:  # None: library use without tracking (benchmarks)
        log_to_wandb(wandb_run, cfg, run_folder, payload, seconds, references)
    return payload


def write_splits(documents: Any, tokenizer: RunTokenizer, out_dir: RunPath, shards_cfg: ShardsConfig, seq_len: int, *,
                 eos_id: int, pad_id: int, threads: int, total: int | None = None) -> dict[str, dict[str, Any]]:
    """Encode, split, pack and write every document; returns the manifest's ``splits`` section."""
    packers = {split: Packer(seq_len, shards_cfg.packing, pad_id) for split in SPLITS}
    writers = {split: SplitWriter(out_dir, split, shards_cfg.records_per_shard) for split in SPLITS}
    pad_mask_key = "segment_ids" if shards_cfg.packing == "document" else None
    try:
        batch: list[dict[str, Any]] = []
        with progress_bar(total=total, unit="doc", desc="shards", mininterval=2.0) as progress:
            for doc in documents:
                batch.append(doc)
                if len(batch) >= shards_cfg.encode_batch_documents:
                    _encode_batch(batch, tokenizer, packers, writers, shards_cfg, eos_id, threads, pad_mask_key)
                    progress.update(len(batch))
                    batch = []
            if batch:
                _encode_batch(batch, tokenizer, packers, writers, shards_cfg, eos_id, threads, pad_mask_key)
                progress.update(len(batch))
        for split in SPLITS:
            writers[split].write_rows(packers[split].finish(), pad_mask_key)
            writers[split].close()
    except BaseException as exc:
        for writer in writers.values():
            writer.abort(exc)
        raise
    return {split: writers[split].summary(packers[split].stats) for split in SPLITS}


def _encode_batch(batch: list[dict[str, Any]], tokenizer: RunTokenizer, packers: dict[str, Packer],
                  writers: dict[str, SplitWriter], shards_cfg: ShardsConfig, eos_id: int, threads: int,
                  pad_mask_key: str | None) -> None:
    encoded = tokenizer.encode_batch([doc["text"] for doc in batch], threads=threads)
    eos = np.array([eos_id], dtype=np.int32)
    by_split: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
    for doc, ids in zip(batch, encoded, strict=True):
        by_split[split_of(doc["id"], shards_cfg.validation_percent)].append(np.concatenate((ids, eos)))
    for split, docs in by_split.items():
        if docs:
            writers[split].write_rows(packers[split].add(docs), pad_mask_key)


def log_to_wandb(wandb_run: Any, cfg: ExperimentConfig, run_folder: Any, payload: dict[str, Any], seconds: float,
                 references: list[dict[str, Any]] | None = None) -> None:
    """Summary numbers, and the shards folder as an artifact that names its tokenizer (``references``:
    the shard files' entries measured by the Beam workers that wrote them, so none is read here)."""
    import wandb

    splits = payload["splits"]
    tokens = sum(split["tokens"] for split in splits.values())
    for split, info in splits.items():
        wandb_run.summary[f"shards/{split}_records"] = info["records"]
        wandb_run.summary[f"shards/{split}_tokens"] = info["tokens"]
    wandb_run.summary["shards/tokens_per_second"] = tokens / max(seconds, 1e-9)
    tokenizer_artifact = f"{cfg.experiment.name}-tokenizer"
    metadata = {"tokenizer_sha256": payload["tokenizer_sha256"], "tokenizer_artifact": tokenizer_artifact,
                "seq_len": payload["seq_len"], "packing": payload["packing"],
                **{f"{split}_tokens": info["tokens"] for split, info in splits.items()}}
    if (run_folder.tokenizer / MANIFEST_NAME).is_file():
        # The same folder content gives the same digest as the artifact recipe 2 logged, so W&B links
        # this run to that version. Offline runs cannot declare inputs; the metadata keeps the link.
        used = wandb.Artifact(tokenizer_artifact, type="tokenizer")
        add_folder(used, run_folder.tokenizer)
        try:
            wandb_run.use_artifact(used)
        except TypeError as exc:
            log.info("W&B lineage to %s kept in metadata only (%s)", tokenizer_artifact, exc)
    # a reference (path, size and checksum of each file), not a staged copy: a real corpus's shards
    # would otherwise take their size again on disk; the shards' own manifest holds their sha256
    log_reference(wandb_run, f"{cfg.experiment.name}-shards", "shards", run_folder.shards, metadata, files=references)
