"""The corpus pipeline on Apache Beam (optional ``beam`` extra): same per-document code, same result.

Stages (each a Beam transform, so Dataflow/Flink/Spark spread them over workers):

1. ``clean_document`` on every raw document (normalize, filter, anonymise, MinHash).
2. Exact dedup: group kept documents by the hash of their text; the lowest input order survives.
3. Near dedup at scale: each survivor emits one ``(band key, document)`` pair per LSH band; grouping
   by band key forms the buckets; inside a bucket every document is compared with the lower-ordered
   members (verified by estimated Jaccard if ``dedup.min_jaccard`` is set); a document matched in any
   bucket is a near duplicate. This is the local rule ("an earlier document shares a bucket")
   computed per bucket instead of in one pass, so both runners mark the same documents.
4. Outcomes are staged as JSON lines and written by ``write_corpus`` like the local path's.

Runners: ``corpus.beam_options`` are ordinary Beam flags, e.g. ``["--runner=DirectRunner",
"--direct_num_workers=2", "--direct_running_mode=multi_processing"]``; on Dataflow add
``--runner=DataflowRunner --project=... --region=... --temp_location=gs://...`` and ship the
package with ``--setup_file=./setup.py`` or a container image (see docs/corpus.md).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.beam_common import import_beam
from data_prep.corpus.cleaning import CleanDocument, clean_document
from data_prep.corpus.dedup import band_keys, estimated_jaccard
from data_prep.corpus.documents import RawDocument
from experiment.sections.corpus import CorpusConfig, DedupConfig

log = logging.getLogger("data_prep.corpus.beam")

Outcome = tuple[CleanDocument, str | None, str | None]


# ---------------------------------------------------------------- per-group functions (pure, testable)

def exact_group_outcomes(docs: Iterable[CleanDocument]) -> Iterator[tuple[CleanDocument, str | None, str | None]]:
    """In one exact-key group the lowest order survives; the rest are exact duplicates of it."""
    ordered = sorted(docs, key=lambda d: d.order)
    yield ordered[0], None, None
    for doc in ordered[1:]:
        yield doc, "exact", ordered[0].id


def bucket_matches(members: Iterable[tuple[int, str, np.ndarray]], cfg: DedupConfig) -> Iterator[tuple[str, str]]:
    """``(id, earlier id)`` for each bucket member that matches a lower-ordered member."""
    ordered = sorted(members, key=lambda m: m[0])
    for i, (_order, doc_id, signature) in enumerate(ordered[1:], 1):
        for _, earlier_id, earlier_signature in ordered[:i]:
            if cfg.min_jaccard <= 0 or estimated_jaccard(signature, earlier_signature) >= cfg.min_jaccard:
                yield doc_id, earlier_id


def outcome_to_json(outcome: Outcome) -> str:
    doc, kind, earlier = outcome
    return json.dumps({
        "order": doc.order, "id": doc.id, "source": doc.source, "origin": doc.origin, "bytes_in": doc.bytes_in,
        "text": doc.text, "reject": doc.reject, "preview": doc.preview, "duplicate": kind, "duplicate_of": earlier,
    }, ensure_ascii=False)


def outcome_from_json(line: str) -> Outcome:
    row = json.loads(line)
    doc = CleanDocument(row["order"], row["id"], row["source"], row["origin"], row["bytes_in"], row["text"],
                        row["reject"], row["preview"])
    return doc, row["duplicate"], row["duplicate_of"]


# ---------------------------------------------------------------- the pipeline

def _join_near(element: tuple[str, dict[str, list[Any]]]) -> Outcome:
    _doc_id, grouped = element
    (doc,) = grouped["doc"]
    matches = sorted(grouped["match"])
    return (doc, "near", matches[0]) if matches else (doc, None, None)


def build_pipeline(pipeline: Any, raw_docs: Iterable[RawDocument], cfg: CorpusConfig, staging: Path) -> None:
    beam = import_beam("corpus.runner")
    dedup = cfg.dedup
    cleaned = (pipeline
               | "Read" >> beam.Create(list(raw_docs), reshuffle=True)
               | "Clean" >> beam.Map(clean_document, cfg))
    rejected = (cleaned
                | "Rejected" >> beam.Filter(lambda d: d.reject is not None)
                | "AsOutcome" >> beam.Map(lambda d: (d, None, None)))
    kept = cleaned | "Kept" >> beam.Filter(lambda d: d.reject is None)
    if dedup.exact:
        exact = (kept
                 | "ByExactKey" >> beam.Map(lambda d: (d.exact_key, d))
                 | "GroupExact" >> beam.GroupByKey()
                 | "ExactOutcomes" >> beam.FlatMap(lambda kv: exact_group_outcomes(kv[1])))
        exact_dups = exact | "ExactDups" >> beam.Filter(lambda o: o[1] is not None)
        survivors = exact | "Survivors" >> beam.FlatMap(lambda o: [o[0]] if o[1] is None else [])
    else:
        exact_dups = pipeline | "NoExactDups" >> beam.Create([])
        survivors = kept
    if dedup.near:
        matches = (survivors
                   | "BandKeys" >> beam.FlatMap(
                       lambda d: [(key, (d.order, d.id, d.signature)) for key in band_keys(d.signature, dedup)])
                   | "GroupBuckets" >> beam.GroupByKey()
                   | "BucketMatches" >> beam.FlatMap(lambda kv: bucket_matches(kv[1], dedup)))
        by_id = survivors | "ById" >> beam.Map(lambda d: (d.id, d))
        final = ({"doc": by_id, "match": matches}
                 | "JoinMatches" >> beam.CoGroupByKey()
                 | "NearOutcomes" >> beam.Map(_join_near))
    else:
        final = survivors | "KeptOutcome" >> beam.Map(lambda d: (d, None, None))
    ((rejected, exact_dups, final)
     | "All" >> beam.Flatten()
     | "ToJson" >> beam.Map(outcome_to_json)
     | "Stage" >> beam.io.WriteToText(str(staging / "outcomes"), file_name_suffix=".jsonl"))


def run_beam(raw_docs: Iterable[RawDocument], cfg: CorpusConfig, staging_parent: Path | None = None) -> list[Outcome]:
    """Run the pipeline (DirectRunner unless ``cfg.beam_options`` say otherwise); outcomes in input order."""
    beam = import_beam("corpus.runner")
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(cfg.beam_options or ["--runner=DirectRunner"])
    logging.getLogger("apache_beam").setLevel(logging.WARNING)  # its INFO lines drown the recipe's own
    staging = Path(tempfile.mkdtemp(prefix="beam-corpus-", dir=staging_parent))
    try:
        log.info("running the corpus pipeline on Beam (%s)", " ".join(cfg.beam_options) or "DirectRunner")
        with beam.Pipeline(options=options) as pipeline:
            build_pipeline(pipeline, raw_docs, cfg, staging)
        outcomes = []
        for path in sorted(staging.glob("outcomes*.jsonl")):
            with path.open(encoding="utf-8") as handle:
                outcomes.extend(outcome_from_json(line) for line in handle if line.strip())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    outcomes.sort(key=lambda outcome: outcome[0].order)
    return outcomes
