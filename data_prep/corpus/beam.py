"""The corpus pipeline on Apache Beam (optional ``beam`` extra): same per-document code, same corpus.

Every step that touches data runs on the workers; the driver lists the input files (names only),
builds the graph, and at the end reads back two kinds of small records: one summary per written
corpus shard and the merged outcome counts. Nothing it holds grows with the corpus.

Stages (each a Beam transform, so Dataflow/Flink/Spark spread them over workers):

1. Read, twice, one input file per element (``ReadUnit``; a source that is not a list of files, such
   as the Debian demo or a hub dataset without parquet files, is one element read whole). The first
   pass only counts each file's documents and bytes; a prefix sum over those counts (one number per
   file: a small side input) gives each file its first global order, source position and source bytes,
   so the second pass numbers documents exactly as the local reader does (same ids, same caps).
   Reading twice costs one more read of the input; shuffling the raw text instead would cost its size.
2. ``clean_document`` on every raw document (normalize, filters, anonymise, MinHash): the local code.
3. Exact dedup: group kept documents by the hash of their text; the lowest input order survives.
4. Near dedup: each survivor emits one ``(band key, document)`` pair per LSH band; grouping by band
   key forms the buckets; inside a bucket every document is compared with the lower-ordered members
   (verified by estimated Jaccard if ``dedup.min_jaccard`` is set); a document matched in any bucket
   is a near duplicate: the local rule ("an earlier document shares a bucket") computed per bucket.
5. Shards: survivors and their matches are joined per block of ``BLOCK_DOCS`` input orders; the kept
   count per block (survivors minus matched ones, a small side input) gives each kept document its
   rank in the corpus, hence its shard, ``rank // docs_per_shard``. Each shard's worker writes the
   whole ``docs-NNNNN.jsonl`` (the local runner's names and bytes) and returns its summary.
6. Counts for the manifest and report: a combine over every outcome (combined on the workers first).

Runners: ``corpus.beam_options`` are ordinary Beam flags, e.g. ``["--runner=DirectRunner",
"--direct_num_workers=2", "--direct_running_mode=multi_processing"]``; on Dataflow add
``--runner=DataflowRunner --project=... --region=... --temp_location=gs://...`` and ship the
package with ``--setup_file=./setup.py`` or a container image (see docs/corpus.md). Workers read
the inputs and write the shards through Beam's FileSystems, so inputs (``corpus.sources[].paths``)
and the shards (``corpus.output_uri``) may be local paths or ``gs://``/``s3://``/``hdfs://`` URLs;
each shard is written under a temporary name and renamed into place under its deterministic name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.beam_common import import_beam, join_uri, recording_opener, run_staged
from data_prep.corpus.cleaning import CleanDocument, clean_document
from data_prep.corpus.decontam import BenchmarkIndex
from data_prep.corpus.dedup import ClusterSizes, band_keys, estimated_jaccard
from data_prep.corpus.documents import DocumentNumberer, RawDocument
from data_prep.corpus.report import CorpusCounts, SourceCounts
from data_prep.corpus.sources import expand_paths, hub_parquet_files, read_one_file, source_reader
from experiment.corpus_format import document_line, shard_name
from experiment.sections.corpus import CorpusConfig, DedupConfig

log = logging.getLogger("data_prep.corpus.beam")

Outcome = tuple[CleanDocument, str | None, str | None]
COUNTERS = ("rejected", "rejected_bytes", "duplicates", "duplicate_bytes", "benchmark_documents")
BLOCK_DOCS = 8192  # input orders per join block: bounds one group's memory; blocks/corpus = side-input size


@dataclasses.dataclass(frozen=True)
class ReadUnit:
    """One element of the read stage: one input file of a source, or (``path`` None) a whole source."""

    index: int  # position in the local reader's order (sources in config order, files sorted)
    source_index: int
    path: str | None


# ---------------------------------------------------------------- reading (driver lists, workers read)

def plan_units(cfg: CorpusConfig) -> list[ReadUnit]:
    """The read stage's elements, in the local reader's order; lists files, opens none."""
    units: list[ReadUnit] = []
    for source_index, source in enumerate(cfg.sources):
        key = f"corpus.sources[{source_index}]"
        source_reader(source, key)  # an unknown kind fails here, on the driver
        if source.kind == "files":
            paths: list[str | None] = [str(p) for p in expand_paths(source.paths, f"{key}.paths")]
        elif source.kind == "hub" and not source.paths:
            paths = list(hub_parquet_files(source)) or [None]
        else:
            paths = [None]
        first = len(units)
        units.extend([ReadUnit(first + i, source_index, path) for i, path in enumerate(paths)])
    return units


def read_unit(unit: ReadUnit, cfg: CorpusConfig, numberer: DocumentNumberer, cache_root: str) -> Iterator[RawDocument]:
    source = cfg.sources[unit.source_index]
    key = f"corpus.sources[{unit.source_index}]"
    if unit.path is None:
        yield from source_reader(source, key)(source, numberer, key, Path(cache_root))
    else:
        yield from read_one_file(unit.path, numberer)


def count_unit(unit: ReadUnit, cfg: CorpusConfig, cache_root: str) -> tuple[int, int, int]:
    """``(unit index, documents, bytes)`` of one unit, caps not applied (the first read)."""
    numberer = DocumentNumberer(cfg.sources[unit.source_index], 0)
    for _ in read_unit(unit, cfg, numberer, cache_root):
        pass
    return unit.index, numberer.position, numberer.bytes


def unit_offsets(counts: Iterable[tuple[int, int, int]], units: list[ReadUnit]) -> dict[int, tuple[int, int, int]]:
    """Per unit: (first global order, first position in its source, bytes of its source before it).

    Orders skip what caps will drop, so they can differ from the local run's numbers, never from its
    order; positions and bytes within a source are exact, so ids and caps match the local reader.
    """
    by_unit = {index: (docs, size) for index, docs, size in counts}
    offsets, order, position, size, source = {}, 0, 0, 0, -1
    for unit in units:
        if unit.source_index != source:
            position, size, source = 0, 0, unit.source_index
        offsets[unit.index] = (order, position, size)
        docs, unit_bytes = by_unit[unit.index]
        order, position, size = order + docs, position + docs, size + unit_bytes
    return offsets


def numbered_documents(unit: ReadUnit, offsets: dict[int, tuple[int, int, int]], cfg: CorpusConfig,
                       cache_root: str) -> Iterator[RawDocument]:
    """The unit's documents numbered as the local reader numbers them, its caps applied (the second read)."""
    order, position, size = offsets[unit.index]
    numberer = DocumentNumberer(cfg.sources[unit.source_index], order)
    numberer.position, numberer.bytes = position, size
    if numberer.capped:  # the local reader stopped this source in an earlier file
        return
    for doc in read_unit(unit, cfg, numberer, cache_root):
        yield doc
        if numberer.capped:
            return


# ---------------------------------------------------------------- dedup and shard layout (pure, testable)

def exact_group_outcomes(docs: Iterable[CleanDocument]) -> Iterator[Outcome]:
    """In one exact-key group the lowest order survives; the rest are exact duplicates of it."""
    ordered = sorted(docs, key=lambda d: d.order)
    yield ordered[0], None, None
    for doc in ordered[1:]:
        yield doc, "exact", ordered[0].id


def bucket_matches(members: Iterable[tuple[int, str, np.ndarray]],
                   cfg: DedupConfig) -> Iterator[tuple[int, str, int]]:
    """``(order, earlier id, earlier order)`` for each bucket member that matches a lower-ordered member."""
    ordered = sorted(members, key=lambda m: m[0])
    for i, (order, _doc_id, signature) in enumerate(ordered[1:], 1):
        for earlier_order, earlier_id, earlier_signature in ordered[:i]:
            if cfg.min_jaccard <= 0 or estimated_jaccard(signature, earlier_signature) >= cfg.min_jaccard:
                yield order, earlier_id, earlier_order


def exact_links(docs: Iterable[CleanDocument]) -> Iterator[tuple[int, int]]:
    """``(order, order of the document it duplicates)`` inside one exact-key group (rehydration's links)."""
    orders = sorted(doc.order for doc in docs)
    for order in orders[1:]:
        yield order, orders[0]


def cluster_extras(links: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """``(order of a kept document, copies beyond its first)`` for every duplicate cluster that rehydration
    grows: the local ``ClusterSizes`` fed the links in input order (a link's target comes before it)."""
    clusters = ClusterSizes()
    for order, earlier in sorted(links):
        clusters.add_duplicate(order, earlier)  # type: ignore[arg-type]  (orders stand for ids: both unique)
    for root in clusters.sizes:
        if clusters.copies(root) > 1:
            yield root, clusters.copies(root) - 1  # type: ignore[misc]


def copy_rows(element: tuple[int, Iterable[tuple[int, int, tuple[int, str, str, str]]]], offsets: dict[int, int],
              kept_total: int, docs_per_shard: int) -> Iterator[tuple[int, tuple[int, str, str, str]]]:
    """One rank block's rehydration copies as shard rows: the local writer's order (after every
    deduplicated document, in a new shard; each document's copies together, documents in rank order)."""
    block, items = element
    position = offsets.get(block, 0)  # copies written before this block's
    first_shard = -(-kept_total // docs_per_shard)
    for _rank, extra, (_, doc_id, source, text) in sorted(items, key=lambda item: item[0]):
        for _ in range(extra):
            yield first_shard + position // docs_per_shard, (kept_total + position, doc_id, source, text)
            position += 1


def block_of(order: int) -> int:
    return order // BLOCK_DOCS


def rank_offsets(kept_per_block: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Per block: how many kept documents come before it (a prefix sum over the blocks in order)."""
    offsets, total = {}, 0
    for block, kept in sorted(kept_per_block):
        offsets[block] = total
        total += kept
    return offsets


def block_outcomes(element: tuple[int, dict[str, list[Any]]], offsets: dict[int, int],
                   docs_per_shard: int, rehydrate: bool = False) -> Iterator[Any]:
    """One block's survivors in order: near duplicates as outcomes, kept ones also as shard rows.

    Main output: outcomes (for the counts). Tagged ``rows``: ``(shard, (rank, id, source, text))``; with
    ``rehydrate`` also ``links`` (``(order, earlier order)`` per near duplicate) and ``kept``
    (``(order, row)``), for the copies.
    """
    beam = import_beam("corpus.runner")
    block, grouped = element
    earliest: dict[int, tuple[str, int]] = {}
    for order, earlier_id, earlier_order in grouped["match"]:
        # the local rule: lowest id
        earliest[order] = min((earlier_id, earlier_order), earliest.get(order, (earlier_id, earlier_order)))
    rank = offsets.get(block, 0)
    for doc in sorted(grouped["doc"], key=lambda d: d.order):
        if doc.order in earliest:
            yield _without_text((doc, "near", earliest[doc.order][0]))
            if rehydrate:
                yield beam.pvalue.TaggedOutput("links", (doc.order, earliest[doc.order][1]))
            continue
        row = (rank, doc.id, doc.source, doc.text)
        yield beam.pvalue.TaggedOutput("rows", (rank // docs_per_shard, row))
        if rehydrate:
            yield beam.pvalue.TaggedOutput("kept", (doc.order, row))
        yield dataclasses.replace(doc, text=None, signature=None), None, doc.bytes_out
        rank += 1


def write_shard(element: tuple[int, Iterable[tuple[int, str, str, str]]], data_dir: str) -> Iterator[dict[str, Any]]:
    """Write one whole corpus shard through Beam's filesystems (temporary name, then renamed into
    place) and yield its manifest entry, with its W&B reference entry (size, MD5) under ``reference``."""
    number, rows = element
    name, digest, documents = shard_name(number), hashlib.sha256(), 0
    references: list[dict[str, Any]] = []
    with recording_opener(references)(join_uri(data_dir, name)) as handle:
        for _rank, doc_id, source, text in sorted(rows):
            line = document_line(doc_id, source, text)
            handle.write(line)
            digest.update(line)
            documents += 1
    yield {"number": number, "file": name, "documents": documents, "bytes": references[0]["size"],
           "sha256": digest.hexdigest(), "reference": references[0]}


# ---------------------------------------------------------------- counts (combined on the workers)

def merge_counts(into: CorpusCounts, other: CorpusCounts) -> CorpusCounts:
    for name in ("documents_in", "bytes_in", "kept", "bytes_kept", "words_cut"):
        setattr(into, name, getattr(into, name) + getattr(other, name))
    for name in COUNTERS:
        getattr(into, name).update(getattr(other, name))
    for source, counts in other.per_source.items():
        mine = into.per_source[source]
        for field in dataclasses.fields(SourceCounts):
            setattr(mine, field.name, getattr(mine, field.name) + getattr(counts, field.name))
    for bucket, examples in other.examples.items():
        # the lowest input orders, as the local runner (which sees documents in order) keeps
        into.examples[bucket] = sorted(into.examples[bucket] + examples, key=lambda e: e["order"])[:into.max_examples]
    return into


def count_outcome(counts: CorpusCounts, outcome: tuple[CleanDocument, str | None, Any]) -> CorpusCounts:
    """Add one outcome through ``CorpusCounts``' own methods; examples carry their order for merging."""
    doc, kind, detail = outcome
    before = {bucket: len(items) for bucket, items in counts.examples.items()}
    if doc.reject is not None:
        counts.add_rejected(doc)
    elif kind is not None:
        counts.add_duplicate(doc, kind, detail or "")
    else:
        counts.add_kept(doc)
        counts.bytes_kept += detail - doc.bytes_out  # the text stayed with the shard rows; its size came along
        counts.per_source[doc.source].bytes_kept += detail - doc.bytes_out
    for bucket, items in counts.examples.items():
        if len(items) > before.get(bucket, 0):
            items[-1]["order"] = doc.order
    return counts


def counts_to_json(counts: CorpusCounts) -> dict[str, Any]:
    row = {field.name: getattr(counts, field.name) for field in dataclasses.fields(counts)}
    row["per_source"] = {name: dataclasses.asdict(c) for name, c in counts.per_source.items()}
    row["examples"] = dict(counts.examples)
    return row


def counts_from_json(row: dict[str, Any], source_order: list[str]) -> CorpusCounts:
    counts = CorpusCounts(max_examples=row["max_examples"])
    for name in ("documents_in", "bytes_in", "kept", "bytes_kept", "words_cut"):
        setattr(counts, name, row[name])
    for name in COUNTERS:
        setattr(counts, name, Counter(row[name]))
    for name in sorted(row["per_source"],
                       key=lambda n: source_order.index(n) if n in source_order else len(source_order)):
        counts.per_source[name] = SourceCounts(**row["per_source"][name])
    counts.examples = defaultdict(list, {bucket: [{k: v for k, v in e.items() if k != "order"} for e in items]
                                         for bucket, items in row["examples"].items()})
    return counts


def _counts_combine_fn(max_examples: int) -> Any:
    beam = import_beam("corpus.runner")

    class CountOutcomes(beam.CombineFn):  # type: ignore[misc,name-defined]
        def create_accumulator(self) -> CorpusCounts:
            return CorpusCounts(max_examples=max_examples)

        def add_input(self, counts: CorpusCounts, outcome: Any) -> CorpusCounts:
            return count_outcome(counts, outcome)

        def merge_accumulators(self, accumulators: Iterable[CorpusCounts]) -> CorpusCounts:
            merged = self.create_accumulator()
            for counts in accumulators:
                merge_counts(merged, counts)
            return merged

        def extract_output(self, counts: CorpusCounts) -> str:
            return json.dumps(counts_to_json(counts), ensure_ascii=False)

    return CountOutcomes()


# ---------------------------------------------------------------- the pipeline

def _without_text(outcome: Outcome) -> Outcome:
    doc, kind, earlier = outcome
    return dataclasses.replace(doc, text=None, signature=None), kind, earlier


def build_pipeline(pipeline: Any, units: list[ReadUnit], cfg: CorpusConfig, data_dir: str, cache_root: Path,
                   staging: str, benchmarks: BenchmarkIndex | None = None) -> None:
    beam = import_beam("corpus.runner")
    dedup = cfg.dedup
    root = str(cache_root)
    unit_elements = pipeline | "Units" >> beam.Create(units, reshuffle=True)
    offsets = (unit_elements
               | "CountUnits" >> beam.Map(count_unit, cfg, root)
               | "AllCounts" >> beam.combiners.ToList()
               | "UnitOffsets" >> beam.Map(unit_offsets, units))
    cleaned = (unit_elements
               | "ReadUnits" >> beam.FlatMap(numbered_documents, beam.pvalue.AsSingleton(offsets), cfg, root)
               | "SpreadDocuments" >> beam.Reshuffle()  # one big file must not stay on one worker
               # the decontamination index reaches the workers as a side input (pickled once, not per document)
               | "Clean" >> beam.Map(clean_document, cfg, beam.pvalue.AsSingleton(
                   pipeline | "BenchmarkIndex" >> beam.Create([benchmarks]))))
    rejected = (cleaned
                | "Rejected" >> beam.Filter(lambda d: d.reject is not None)
                | "AsOutcome" >> beam.Map(lambda d: (d, None, None)))
    kept = cleaned | "Kept" >> beam.Filter(lambda d: d.reject is None)
    links = []  # (order, earlier order) of every duplicate, for rehydration
    if dedup.exact:
        exact_groups = (kept
                        | "ByExactKey" >> beam.Map(lambda d: (d.exact_key, d))
                        | "GroupExact" >> beam.GroupByKey())
        exact = exact_groups | "ExactOutcomes" >> beam.FlatMap(lambda kv: exact_group_outcomes(kv[1]))
        if dedup.rehydrate:
            links.append(exact_groups | "ExactLinks" >> beam.FlatMap(lambda kv: exact_links(kv[1])))
        exact_dups = (exact
                      | "ExactDups" >> beam.Filter(lambda o: o[1] is not None)
                      | "DropText" >> beam.Map(_without_text))
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
    else:
        matches = pipeline | "NoMatches" >> beam.Create([])
    matched_per_block = (matches
                         | "MatchedOrders" >> beam.Map(lambda m: m[0])
                         | "OncePerDocument" >> beam.Distinct()
                         | "MatchedBlock" >> beam.Map(lambda order: (block_of(order), -1)))
    survivors_per_block = survivors | "SurvivorBlock" >> beam.Map(lambda d: (block_of(d.order), 1))
    kept_per_block = ((survivors_per_block, matched_per_block)
                      | "BlockTallies" >> beam.Flatten()
                      | "KeptPerBlock" >> beam.CombinePerKey(sum)
                      | "AllBlocks" >> beam.combiners.ToList())
    ranks = kept_per_block | "RankOffsets" >> beam.Map(rank_offsets)
    joined = ({"doc": survivors | "DocBlock" >> beam.Map(lambda d: (block_of(d.order), d)),
               "match": matches | "MatchBlock" >> beam.Map(lambda m: (block_of(m[0]), m))}
              | "JoinBlocks" >> beam.CoGroupByKey()
              | "BlockOutcomes" >> beam.FlatMap(block_outcomes, beam.pvalue.AsSingleton(ranks), cfg.docs_per_shard,
                                                dedup.rehydrate).with_outputs("rows", "links", "kept", main="outcomes"))
    rows = joined.rows
    if dedup.rehydrate:
        rows = (rows, _rehydration_rows(beam, [*links, joined.links], joined.kept, kept_per_block, cfg)) | (
            "WithCopies" >> beam.Flatten())
    (rows
     | "GroupShards" >> beam.GroupByKey()
     | "WriteShards" >> beam.FlatMap(write_shard, data_dir)
     | "ShardJson" >> beam.Map(json.dumps)
     | "StageShards" >> beam.io.WriteToText(join_uri(staging, "shards"), file_name_suffix=".jsonl"))
    ((rejected, exact_dups, joined.outcomes)
     | "AllOutcomes" >> beam.Flatten()
     | "Counts" >> beam.CombineGlobally(_counts_combine_fn(cfg.report_examples))
     | "StageCounts" >> beam.io.WriteToText(join_uri(staging, "counts"), file_name_suffix=".jsonl"))


def _rehydration_rows(beam: Any, links: list[Any], kept: Any, kept_per_block: Any, cfg: CorpusConfig) -> Any:
    """FineWeb-2's rehydration on the workers: the copies of each kept document of a duplicate cluster,
    as shard rows after the deduplicated ones. Cluster sizes need every duplicate link (two numbers
    each) on one worker, in input order; the copies' positions are a prefix sum over rank blocks."""
    extras = (links
              | "AllLinks" >> beam.Flatten()
              | "OneKey" >> beam.Map(lambda link: (0, link))
              | "GroupLinks" >> beam.GroupByKey()
              | "ClusterExtras" >> beam.FlatMap(lambda kv: cluster_extras(kv[1])))
    with_extra = ({"row": kept, "extra": extras}
                  | "JoinExtras" >> beam.CoGroupByKey()
                  | "KeptWithExtra" >> beam.FlatMap(
                      lambda kv: [(row[0], extra, row) for row in kv[1]["row"] for extra in kv[1]["extra"]]))
    copy_offsets = (with_extra
                    | "ExtraBlock" >> beam.Map(lambda item: (block_of(item[0]), item[1]))
                    | "ExtrasPerBlock" >> beam.CombinePerKey(sum)
                    | "AllExtraBlocks" >> beam.combiners.ToList()
                    | "CopyOffsets" >> beam.Map(rank_offsets))
    kept_total = kept_per_block | "KeptTotal" >> beam.Map(lambda blocks: sum(kept for _, kept in blocks))
    return (with_extra
            | "ByRankBlock" >> beam.Map(lambda item: (block_of(item[0]), item))
            | "GroupRankBlocks" >> beam.GroupByKey()
            | "CopyRows" >> beam.FlatMap(copy_rows, beam.pvalue.AsSingleton(copy_offsets),
                                         beam.pvalue.AsSingleton(kept_total), cfg.docs_per_shard))


def run_beam(cfg: CorpusConfig, corpus_dir: Path, cache_root: Path, benchmarks: BenchmarkIndex | None = None,
             ) -> tuple[CorpusCounts, list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the pipeline (DirectRunner unless ``cfg.beam_options`` say otherwise): the workers write the
    shards into ``cfg.output_uri`` (or ``corpus_dir``); returns the merged counts, the shards' manifest
    entries in shard order, and their W&B reference entries (``beam_common.file_reference``)."""
    beam = import_beam("corpus.runner")
    units = plan_units(cfg)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)  # its INFO lines drown the recipe's own
    data_dir = cfg.output_uri or str(corpus_dir)
    log.info("running the corpus pipeline on Beam (%s) over %d input unit(s), shards to %s",
             " ".join(cfg.beam_options) or "DirectRunner", len(units), data_dir)
    staged = run_staged(beam, cfg.beam_options, data_dir, lambda pipeline, staging: build_pipeline(
        pipeline, units, cfg, data_dir, cache_root, staging, benchmarks), ("shards", "counts"))
    numbered = sorted(staged["shards"], key=lambda row: row["number"])
    (counts_row,) = staged["counts"]
    shards = [{k: v for k, v in row.items() if k not in ("number", "reference")} for row in numbered]
    return counts_from_json(counts_row, [s.label for s in cfg.sources]), shards, [row["reference"] for row in numbered]
