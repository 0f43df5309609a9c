"""Recipe 3 as an Apache Beam pipeline (optional ``beam`` extra): the same shards, byte for byte.

The local path packs one stream per split in corpus order. To write the same rows from many
workers without funnelling every token through one of them, the pipeline computes where each
document's tokens land in that stream:

1. Read the corpus files (one element per file) and tokenize each document (+ EOS) on the workers;
   each document knows its start and ordinal within its file's part of its split.
2. Per split and corpus file, combine only (token count, document count); a prefix sum over the
   files in corpus order gives each file's start offset and first ordinal in the split's stream:
   a side input of one entry per corpus file, whatever the number of documents.
3. Each document cuts its tokens into pieces at shard boundaries (``records_per_shard`` rows of
   ``seq_len + 1`` tokens) and sends each piece to its (split, shard number).
4. Each shard's worker orders its pieces, rebuilds the rows with ``rows_from_stream`` (the local
   packer's code), handles the split's tail as the local path does (dropped in concat mode, padded
   in document mode), and writes ``<split>-NNNNN.tfrecord`` and its index with our writer.

Every step that touches tokens runs on the workers; the driver reads back one summary line per
shard and per split. Shards are written straight into the shards folder, so workers need a shared
filesystem with the driver (DirectRunner, or a cluster with one mounted). ``shards.beam_options`` are ordinary Beam
flags, e.g. ``["--runner=DirectRunner", "--direct_num_workers=2",
"--direct_running_mode=multi_processing"]``.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.beam_common import import_beam, join_uri, recording_opener, run_staged
from data_prep.shards.layout import SPLITS, row_tokens, shard_file_name, shard_summary, split_of
from data_prep.shards.packing import rows_from_stream
from data_prep.shards.tfrecord import TFRecordWriter, encode_int64_rows
from experiment.corpus_format import parse_document_lines
from experiment.errors import DataError
from experiment.sections.shards import ShardsConfig
from experiment.stages import CORPUS
from tokenizer.loaded import encode_one, tokenizer_from_source

# ---------------------------------------------------------------- per-element functions (pure, testable)

def file_offsets(totals: Iterable[tuple[tuple[str, int], tuple[int, int]]]) -> dict[str, dict[str, Any]]:
    """Per split: each corpus file's first token offset and document ordinal in the split's stream
    (a prefix sum over the files in corpus order), and the split's totals: one entry per file."""
    layout: dict[str, dict[str, Any]] = {}
    for (split, file_number), (tokens, documents) in sorted(totals):
        entry = layout.setdefault(split, {"files": {}, "total": 0, "documents": 0})
        entry["files"][file_number] = (entry["total"], entry["documents"])
        entry["total"] += tokens
        entry["documents"] += documents
    return layout


def add_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[int, int]:
    tokens, documents = 0, 0
    for more_tokens, more_documents in pairs:
        tokens, documents = tokens + more_tokens, documents + more_documents
    return tokens, documents


def shard_pieces(element: tuple[str, int, int, int, np.ndarray], layout: dict[str, dict[str, Any]],
                 shard_tokens: int) -> Iterator[tuple[tuple[str, int], tuple[int, int, np.ndarray]]]:
    """Cut one document at shard boundaries: ``((split, shard), (start in shard, ordinal, tokens))``.

    ``element`` is ``(split, corpus file, start in that file's part of the split, ordinal there, tokens)``.
    """
    split, file_number, start_in_file, ordinal_in_file, ids = element
    first_token, first_ordinal = layout[split]["files"][file_number]
    position, ordinal = first_token + start_in_file, first_ordinal + ordinal_in_file
    done = 0
    while done < ids.size:
        shard = position // shard_tokens
        take = min(ids.size - done, (shard + 1) * shard_tokens - position)
        yield (split, shard), (position - shard * shard_tokens, ordinal, ids[done:done + take])
        position += take
        done += take


def write_shard(element: tuple[tuple[str, int], Iterable[tuple[int, int, np.ndarray]]], out_dir: str,
                row_len: int, records_per_shard: int, packing: str, pad_id: int) -> Iterator[str]:
    """Rebuild one shard's rows from its pieces and write it through Beam's filesystems (``out_dir``: a
    folder or a gs://... URL; temporary names renamed into place); yields its manifest entry as JSON,
    with the W&B reference entries of the shard and its index (size, MD5) under ``references``."""
    (split, shard), pieces = element
    ordered = sorted(pieces, key=lambda piece: piece[0])
    tokens = np.concatenate([piece[2] for piece in ordered])
    doc_index = np.concatenate([np.full(piece[2].size, piece[1], dtype=np.int64) for piece in ordered])
    if ordered[0][0] != 0 or tokens.size > records_per_shard * row_len:
        raise RuntimeError(f"{split} shard {shard}: pieces do not tile the shard (a bug in the layout)")
    tail = tokens.size % row_len  # only the split's last shard can end in a partial row
    if tail and packing == "concat":
        tokens, doc_index = tokens[:-tail], doc_index[:-tail]
    elif tail:
        tokens = np.concatenate([tokens, np.full(row_len - tail, pad_id, dtype=np.int64)])
        doc_index = np.concatenate([doc_index, np.full(row_len - tail, -1, dtype=np.int64)])
    if tokens.size == 0:
        return
    rows = rows_from_stream(tokens, doc_index if packing == "document" else None, row_len)
    references: list[dict[str, Any]] = []
    with TFRecordWriter(join_uri(out_dir, shard_file_name(split, shard)), recording_opener(references)) as writer:
        writer.write_many(encode_int64_rows(rows))
    pad_mask_key = "segment_ids" if packing == "document" else None
    yield json.dumps({"split": split, "number": shard, **shard_summary(writer, sum(row_tokens(rows, pad_mask_key))),
                      "references": references})


class TokenizeFile:
    """Beam DoFn body: one corpus file's documents, tokenized (+ EOS) and routed to their split, with
    their start and ordinal within the file's part of each split. The run's tokenizer (SentencePiece
    or an adopted tokenizer.json) is rebuilt once per worker from ``source``, its (kind, model bytes)
    (``tokenizer.loaded.RunTokenizer.source``)."""

    def __init__(self, corpus_dir: str, manifest: dict[str, Any], source: tuple[str, bytes], eos_id: int,
                 validation_percent: float) -> None:
        self.corpus_dir, self.manifest = manifest.get("data_uri") or corpus_dir, manifest  # where recipe 01 wrote them
        self.source, self.eos_id, self.validation_percent = source, eos_id, validation_percent
        self._tokenizer: Any = None

    def __call__(self, file_number: int) -> Iterator[tuple[str, int, int, int, np.ndarray]]:
        if self._tokenizer is None:
            self._tokenizer = tokenizer_from_source(*self.source)
        starts = dict.fromkeys(SPLITS, 0)
        ordinals = dict.fromkeys(SPLITS, 0)
        eos = np.array([self.eos_id], dtype=np.int32)
        for doc in read_corpus_shard(self.corpus_dir, self.manifest["shards"][file_number]):
            ids = np.concatenate((encode_one(self._tokenizer, doc["text"]), eos))
            split = split_of(doc["id"], self.validation_percent)
            yield split, file_number, starts[split], ordinals[split], ids
            starts[split] += ids.size
            ordinals[split] += 1


def read_corpus_shard(corpus_dir: str, shard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One corpus shard's documents, read through Beam's filesystems (a folder or a gs://... URL) whole,
    its size and SHA-256 checked against the corpus manifest before any document is used."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    uri = join_uri(corpus_dir, shard["file"])
    try:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            data = handle.read()
    except OSError as exc:
        raise DataError(f"corpus shard {uri} listed in the manifest cannot be read ({str(exc).splitlines()[0]}): "
                        f"{CORPUS.run_again}") from exc
    if len(data) != shard["bytes"] or hashlib.sha256(data).hexdigest() != shard["sha256"]:
        raise DataError(f"corpus shard {uri} has {len(data)} bytes and another SHA-256 than the manifest says "
                        f"({shard['bytes']} bytes): {CORPUS.run_again}")
    yield from parse_document_lines(io.StringIO(data.decode("utf-8"), newline="\n"), uri)


# ---------------------------------------------------------------- the pipeline

def build_pipeline(pipeline: Any, corpus_dir: Path, manifest: dict[str, Any], source: tuple[str, bytes], out_dir: str,
                   shards_cfg: ShardsConfig, seq_len: int, eos_id: int, pad_id: int, staging: str) -> None:
    beam = import_beam("shards.runner")
    row_len = seq_len + 1
    tokenized = (pipeline
                 | "CorpusFiles" >> beam.Create(list(range(len(manifest["shards"]))), reshuffle=True)
                 | "TokenizeFiles" >> beam.FlatMap(TokenizeFile(str(corpus_dir), manifest, source, eos_id,
                                                                shards_cfg.validation_percent)))
    layout = (tokenized
              | "FileLengths" >> beam.Map(lambda t: ((t[0], t[1]), (int(t[4].size), 1)))
              | "FileTotals" >> beam.CombinePerKey(add_pairs)
              | "AllFiles" >> beam.combiners.ToList()
              | "FileOffsets" >> beam.Map(file_offsets))
    (tokenized
     | "Pieces" >> beam.FlatMap(shard_pieces, beam.pvalue.AsSingleton(layout), shards_cfg.records_per_shard * row_len)
     | "GroupShards" >> beam.GroupByKey()
     | "WriteShards" >> beam.FlatMap(write_shard, out_dir, row_len, shards_cfg.records_per_shard,
                                     shards_cfg.packing, pad_id)
     | "Stage" >> beam.io.WriteToText(join_uri(staging, "shards"), file_name_suffix=".jsonl"))
    (layout
     | "LayoutSummary" >> beam.FlatMap(lambda splits: [json.dumps({"split": split, "total": entry["total"],
                                                                    "documents": entry["documents"]})
                                                        for split, entry in splits.items()])
     | "StageLayout" >> beam.io.WriteToText(join_uri(staging, "layout"), file_name_suffix=".jsonl"))


def run_beam_shards(corpus_dir: Path, manifest: dict[str, Any], source: tuple[str, bytes], out_dir: Path,
                    shards_cfg: ShardsConfig, seq_len: int, *, eos_id: int,
                    pad_id: int) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Run the pipeline; the workers write into ``shards_cfg.output_uri`` (or ``out_dir``). Returns the
    manifest's ``splits`` section, equal to the local path's, and the W&B reference entries of every
    file the workers wrote (``beam_common.file_reference``)."""
    beam = import_beam("shards.runner")
    data_dir = shards_cfg.output_uri or str(out_dir)
    staged = run_staged(beam, shards_cfg.beam_options, data_dir, lambda pipeline, staging: build_pipeline(
        pipeline, corpus_dir, manifest, source, data_dir, shards_cfg, seq_len, eos_id, pad_id, staging),
        ("shards", "layout"))
    shard_rows = staged["shards"]
    layout = {row["split"]: row for row in staged["layout"]}
    row_len = seq_len + 1
    result = {}
    for split in SPLITS:
        shards = sorted((row for row in shard_rows if row["split"] == split), key=lambda row: row["number"])
        total = layout.get(split, {}).get("total", 0)
        tail = total % row_len
        result[split] = {
            "shards": [{k: v for k, v in row.items() if k not in ("split", "number", "references")} for row in shards],
            "records": sum(row["records"] for row in shards), "tokens": sum(row["tokens"] for row in shards),
            "documents": layout.get(split, {}).get("documents", 0),
            "padding_tokens": (row_len - tail) if tail and shards_cfg.packing == "document" else 0,
            "dropped_tokens": tail if shards_cfg.packing == "concat" else 0,
        }
    ordered = sorted(shard_rows, key=lambda row: (SPLITS.index(row["split"]), row["number"]))
    return result, [reference for row in ordered for reference in row["references"]]
