"""Recipe 01: build the cleaned Russian corpus (``build_corpus``) with a local worker pool.

Flow: sources -> raw documents in a global order -> ``clean_document`` in worker processes (normalize,
filter, anonymise, fingerprint) -> back in order, dedup across the whole corpus in this process ->
shards written atomically -> report -> manifest last. The Beam runner (``data_prep.corpus.beam``)
replaces everything up to the report: its workers read, clean, dedup and write the same shards,
and this process gets back only the counts and one summary per shard.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from data_prep.corpus.beam import run_beam
from data_prep.corpus.cleaning import CleanDocument, benchmark_rejection, clean_document
from data_prep.corpus.decontam import BenchmarkIndex
from data_prep.corpus.dedup import ClusterSizes, Deduplicator
from data_prep.corpus.documents import RawDocument
from data_prep.corpus.report import CorpusCounts, log_to_wandb, render_report
from data_prep.corpus.sources import iter_raw_documents
from experiment.config import redact
from experiment.corpus_format import CorpusShardWriter, clear_corpus_folder
from experiment.errors import DataError
from experiment.files import atomic_write_text
from experiment.jsonl import iter_jsonl
from experiment.progress import progress as progress_bar
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.corpus import CorpusConfig
from experiment.stages import CORPUS
from experiment.storage import RunPath
from tracking.artifacts import log_reference

log = logging.getLogger("data_prep.corpus.build")

# (document, duplicate kind or None, id of the earlier document it duplicates or None)
Outcome = tuple[CleanDocument, str | None, str | None]

_worker_cfg: CorpusConfig | None = None
_worker_benchmarks: BenchmarkIndex | None = None


def _init_worker(cfg: CorpusConfig, benchmarks: BenchmarkIndex | None = None) -> None:
    global _worker_cfg, _worker_benchmarks
    _worker_cfg, _worker_benchmarks = cfg, benchmarks


def _clean_in_worker(raw: RawDocument) -> CleanDocument:
    assert _worker_cfg is not None, "worker used before _init_worker"
    return clean_document(raw, _worker_cfg, _worker_benchmarks)


def resolve_workers(requested: int) -> int:
    return requested if requested > 0 else (os.cpu_count() or 1)


def clean_serial(raw_docs: Iterable[RawDocument], cfg: CorpusConfig,
                 benchmarks: BenchmarkIndex | None = None) -> Iterator[CleanDocument]:
    """The plain single-process loop (also the benchmark's baseline)."""
    for raw in raw_docs:
        yield clean_document(raw, cfg, benchmarks)


def clean_with_pool(raw_docs: Iterable[RawDocument], cfg: CorpusConfig, workers: int,
                    chunksize: int = 8, benchmarks: BenchmarkIndex | None = None) -> Iterator[CleanDocument]:
    """``clean_document`` in ``workers`` processes, results in input order.

    Workers are spawned, not forked: the recipe already runs W&B threads, which fork does not copy safely.
    """
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(cfg, benchmarks)) as pool:
        yield from pool.imap(_clean_in_worker, raw_docs, chunksize=chunksize)


def clean_documents(raw_docs: Iterable[RawDocument], cfg: CorpusConfig, workers: int,
                    benchmarks: BenchmarkIndex | None = None) -> Iterator[CleanDocument]:
    return (clean_serial(raw_docs, cfg, benchmarks) if workers <= 1
            else clean_with_pool(raw_docs, cfg, workers, benchmarks=benchmarks))


def dedup_in_order(docs: Iterable[CleanDocument], cfg: CorpusConfig) -> Iterator[Outcome]:
    """Mark exact and near duplicates across the whole corpus; ``docs`` must come in input order."""
    dedup = Deduplicator(cfg.dedup)
    for doc in docs:
        if doc.reject is not None:
            yield doc, None, None
            continue
        kind, earlier = dedup.check(doc.id, doc.exact_key or "", doc.signature)
        yield doc, kind, earlier


def write_corpus(outcomes: Iterable[Outcome], cfg: CorpusConfig, corpus_dir: RunPath, wandb_run: Any,
                 started: float, extra_manifest: dict[str, Any] | None = None,
                 benchmarks: BenchmarkIndex | None = None) -> dict[str, Any]:
    """Write kept documents to shards, count every outcome, then the report and the manifest (last)."""
    counts = CorpusCounts(max_examples=cfg.report_examples)
    clusters = ClusterSizes()
    with CorpusShardWriter(corpus_dir, cfg.docs_per_shard) as writer:
        for doc, duplicate_kind, duplicate_of in outcomes:
            if doc.reject is not None:
                counts.add_rejected(doc)
            elif duplicate_kind is not None:
                counts.add_duplicate(doc, duplicate_kind, duplicate_of or "")
                clusters.add_duplicate(doc.id, duplicate_of or "")
            else:
                counts.add_kept(doc)
                writer.write(doc.id, doc.source, doc.text or "")
        extra_copies = write_rehydrated_copies(writer, clusters) if cfg.dedup.rehydrate else 0
    return finish_corpus(counts, writer.shards, cfg, corpus_dir, wandb_run, started, extra_manifest, extra_copies,
                         benchmarks=benchmarks)


def finish_corpus(counts: CorpusCounts, shards: list[dict[str, Any]], cfg: CorpusConfig, corpus_dir: RunPath,
                  wandb_run: Any, started: float, extra_manifest: dict[str, Any] | None = None,
                  extra_copies: int = 0, references: list[dict[str, Any]] | None = None,
                  benchmarks: BenchmarkIndex | None = None) -> dict[str, Any]:
    """Check the counts, then write the report and the manifest (last); the shards are written.
    ``references``: the shards' W&B entries measured by the Beam workers that wrote them (none read here).
    ``benchmarks``: the decontamination index the documents were checked against (None: not checked)."""
    counts.check()
    if counts.kept == 0:
        top = ", ".join(f"{reason} {n}" for reason, n in counts.rejected.most_common(3)) or "no input documents"
        raise DataError(f"the corpus is empty after filtering ({counts.documents_in} documents in; "
                        f"top reasons: {top}): check corpus.sources and the filter thresholds")
    seconds = time.perf_counter() - started
    decontamination = decontamination_record(cfg, counts, benchmarks)
    atomic_write_text(corpus_dir / "report.md", render_report(counts, shards, seconds, decontamination))
    if wandb_run is not None:
        log_to_wandb(wandb_run, counts)
    payload = {
        "shards": shards,
        "documents": counts.kept + extra_copies,  # what the shards hold
        "rehydrated_copies": extra_copies,  # corpus.dedup.rehydrate: copies beyond the first of each document
        "bytes": sum(shard["bytes"] for shard in shards),
        "sources": [
            {"name": s.label, "kind": s.kind, **dataclasses.asdict(counts.per_source[s.label])} for s in cfg.sources
        ],
        "counts": counts.manifest_counts(),
        "input_bytes": counts.manifest_bytes(),
        "seconds": round(seconds, 2),
        "decontamination": decontamination,
        **(extra_manifest or {}),
        "config": redact(dataclasses.asdict(cfg)),  # a credential as its ${VAR}
    }
    CORPUS.write_manifest(corpus_dir, payload)
    # the corpus by reference (each file's path, size and checksum), never a second copy of its bytes
    log_reference(wandb_run, f"{corpus_dir.parent.name}-corpus", "corpus", corpus_dir,
                  {"documents": payload["documents"], "bytes": payload["bytes"],
                   "shards_sha256": [shard["sha256"] for shard in shards]}, files=references)
    log.info("corpus: %d of %d documents kept (%.1f MB of text) in %d shard(s), %.0f s; report: %s",
             counts.kept, counts.documents_in, counts.bytes_kept / 1e6, len(shards), seconds,
             corpus_dir / "report.md")
    return payload


def decontamination_record(cfg: CorpusConfig, counts: CorpusCounts,
                           benchmarks: BenchmarkIndex | None) -> dict[str, Any]:
    """What the manifest says of decontamination: the index (n, action, each benchmark's source and items), the
    documents that overlapped each benchmark, and the benchmarks it was not decontaminated against, and why."""
    if benchmarks is None:
        reason = ("corpus.decontamination.enabled is off" if not cfg.decontamination.enabled
                  else "built without a benchmark index (recipe 01 builds one; a library call passes benchmarks=)")
        return {"enabled": False, "reason": reason}
    record = benchmarks.manifest(cfg.decontamination.action)
    for name, entry in record["benchmarks"].items():
        entry["documents"] = counts.benchmark_documents.get(name, 0)
        entry["documents_removed"] = counts.rejected.get(benchmark_rejection(name), 0)
    record["words_cut"] = counts.words_cut
    return record


def write_rehydrated_copies(writer: CorpusShardWriter, clusters: ClusterSizes) -> int:
    """FineWeb-2's rehydration: each kept document of a duplicate cluster written again until it appears
    ``rehydration_copies(cluster size)`` times; the copies (same id, so the same split) go to the shards
    after the deduplicated ones, and recipe 03's loader shuffles rows anyway. Returns the copies added."""
    if not clusters.sizes:
        return 0
    writer.finish_shard()
    added = 0
    for shard in list(writer.shards):
        path = writer.corpus_dir / shard["file"]
        with path.open(encoding="utf-8") as handle:
            for line in iter_jsonl(handle, str(path), torn_tail="error"):  # a shard this run just completed
                record = line.value
                for _ in range(clusters.copies(record["id"]) - 1):
                    writer.write(record["id"], record["source"], record["text"])
                    added += 1
    log.info("rehydration: %d copies of %d duplicated documents added", added, len(clusters.sizes))
    return added


def cache_root_for(run_folder: RunFolder) -> Path:
    """Downloads shared by every experiment under the same run root (runs/.cache), on this host's disk (for a
    run folder in a bucket, beside its host-local files: RunFolder.local)."""
    return run_folder.local.parent / ".cache"


def build_corpus(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any,
                 benchmarks: BenchmarkIndex | None = None) -> dict[str, Any]:
    """Recipe 01 entry point: ``fn(cfg, run_folder, wandb_run)``; returns the manifest payload. ``benchmarks``:
    the decontamination index (recipe 01 builds it with eval/decontam.py: eval sits above this package)."""
    corpus_cfg: CorpusConfig = cfg.corpus
    corpus_dir = run_folder.corpus
    started = time.perf_counter()
    clear_corpus_folder(corpus_dir)
    if corpus_cfg.runner == "beam":  # workers read the inputs and write the shards; this process plans
        counts, shards, references = run_beam(corpus_cfg, corpus_dir, cache_root_for(run_folder), benchmarks)
        if counts.documents_in == 0:
            raise DataError("corpus.sources gave no documents at all: check the paths and datasets")
        # data_uri: where the workers wrote the shards when not here (iter_documents names it if they are missing)
        extra = {"runner": "beam", **({"data_uri": corpus_cfg.output_uri} if corpus_cfg.output_uri else {})}
        copies = sum(shard["documents"] for shard in shards) - counts.kept  # corpus.dedup.rehydrate's
        return finish_corpus(counts, shards, corpus_cfg, corpus_dir, wandb_run, started, extra, copies, references,
                             benchmarks)
    raw_docs = iter_raw_documents(corpus_cfg.sources, cache_root_for(run_folder))
    # read the first document here, so a bad source fails before any worker starts
    first = next(raw_docs, None)
    if first is None:
        raise DataError("corpus.sources gave no documents at all: check the paths and datasets")
    raw_docs = itertools.chain([first], raw_docs)
    workers = resolve_workers(corpus_cfg.workers)
    log.info("cleaning documents with %s", f"{workers} worker processes" if workers > 1 else "one process")
    progress = progress_bar(clean_documents(raw_docs, corpus_cfg, workers, benchmarks), desc="documents", unit="doc",
                            mininterval=2)
    try:
        return write_corpus(dedup_in_order(progress, corpus_cfg), corpus_cfg, corpus_dir, wandb_run, started,
                            {"runner": "local", "workers": workers}, benchmarks)
    finally:
        progress.close()  # now, so that an error line is the last thing on the terminal
