"""The corpus file format: JSON-lines shards of ``{"id", "source", "text"}``, written by recipe 01
(``data_prep.corpus``) and read by the tokenizer and shard stages, which therefore need not import data_prep.

The corpus folder holds ``docs-NNNNN.jsonl`` files and a ``manifest.json`` written last. Readers
go through ``iter_documents``, which refuses a folder without a finished manifest and checks each
shard's size against it, so a half-written corpus is never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from experiment.errors import DataError
from experiment.files import atomic_open, remove_file, sha256_file
from experiment.jsonl import iter_jsonl
from experiment.manifest import invalidate
from experiment.stages import CORPUS
from experiment.storage import RunPath, location


def shard_name(index: int) -> str:
    return f"docs-{index:05d}.jsonl"


def read_corpus_manifest(corpus_dir: RunPath) -> dict[str, Any]:
    return CORPUS.read_manifest(location(corpus_dir))


def iter_documents(corpus_dir: RunPath, manifest: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Yield every cleaned document in manifest order."""
    corpus_dir = location(corpus_dir)
    manifest = manifest or read_corpus_manifest(corpus_dir)
    for shard in manifest["shards"]:
        path = corpus_dir / shard["file"]
        if not path.is_file() and manifest.get("data_uri"):  # written by Beam workers elsewhere (corpus.output_uri)
            raise DataError(f"corpus shard {shard['file']} is in {manifest['data_uri']}, not in {corpus_dir}: copy "
                            "the shards into that folder or mount that storage there "
                            "(recipe 03 on Beam reads them in place)")
        if not path.is_file():
            raise DataError(f"corpus shard {path} listed in the manifest is missing: {CORPUS.run_again}")
        if path.stat().st_size != shard["bytes"]:
            raise DataError(f"corpus shard {path} has {path.stat().st_size} bytes, the manifest says {shard['bytes']}")
        with path.open(encoding="utf-8") as handle:
            yield from parse_document_lines(handle, str(path))


def verify_corpus(corpus_dir: RunPath, manifest: dict[str, Any]) -> None:
    """Check every local corpus shard against the manifest's sha256 (sizes alone miss a same-size edit);
    one DataError naming the first that differs. Shards that Beam workers left elsewhere are read there."""
    corpus_dir = location(corpus_dir)
    for shard in manifest["shards"]:
        path = corpus_dir / shard["file"]
        if not shard.get("sha256") or not path.is_file() and manifest.get("data_uri"):
            continue
        try:
            digest = sha256_file(path)
        except OSError as exc:
            raise DataError(f"corpus shard {path} listed in the manifest cannot be read ({exc}): "
                            f"{CORPUS.run_again}") from exc
        if digest != shard["sha256"]:
            raise DataError(f"corpus shard {path} does not match its manifest: sha256 {digest[:12]}..., the manifest "
                            f"says {shard['sha256'][:12]}... (the file changed after {CORPUS.recipe} wrote it): "
                            f"{CORPUS.run_again}")


def parse_document_lines(lines: Iterable[str], name: str) -> Iterator[dict[str, Any]]:
    """The documents of one shard's lines, each checked; ``name`` is the shard's path or URI for errors.

    Shards are renamed into place only when complete, so a torn last line is damage, not a writer at work."""
    for record in iter_jsonl(lines, name, torn_tail="error"):
        doc = record.value
        if not isinstance(doc, dict) or not isinstance(doc.get("text"), str) or "id" not in doc:
            raise DataError(f"{name} line {record.line}: a document needs 'id' and a string 'text'")
        yield doc


def document_line(doc_id: str, source: str, text: str) -> bytes:
    """One document as its shard line (UTF-8 JSON, ``ensure_ascii=False``, newline-terminated)."""
    return (json.dumps({"id": doc_id, "source": source, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")


class CorpusShardWriter:
    """Writes documents into ``docs-NNNNN.jsonl`` shards, each renamed into place only when complete.

    A crash leaves at most a hidden temporary file and no manifest, so no later stage trusts it.
    Use as a context manager; ``shards`` lists ``{"file", "documents", "bytes", "sha256"}``.
    """

    def __init__(self, corpus_dir: RunPath, docs_per_shard: int, first_index: int = 0) -> None:
        self.corpus_dir = location(corpus_dir)
        self.first_index = first_index  # a Beam worker writes shard N alone
        self.docs_per_shard = docs_per_shard
        self.shards: list[dict[str, Any]] = []
        self._stack = contextlib.ExitStack()
        self._handle: Any = None
        self._digest: Any = None
        self._documents = 0
        self._bytes = 0

    def __enter__(self) -> CorpusShardWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._close_shard()
        self._stack.__exit__(exc_type, exc, tb)

    def write(self, doc_id: str, source: str, text: str) -> None:
        if self._handle is None:
            self._handle = self._stack.enter_context(
                atomic_open(self.corpus_dir / shard_name(self.first_index + len(self.shards)), "wb", encoding=None)
            )
            self._digest, self._documents, self._bytes = hashlib.sha256(), 0, 0
        line = document_line(doc_id, source, text)
        self._handle.write(line)
        self._digest.update(line)
        self._documents += 1
        self._bytes += len(line)
        if self._documents >= self.docs_per_shard:
            self._close_shard()

    def finish_shard(self) -> None:
        """Put the shard being written in place now, so it can be read back; the next write starts another."""
        self._close_shard()

    def _close_shard(self) -> None:
        if self._handle is None:
            return
        self._stack.close()  # renames the finished shard into place
        self.shards.append({"file": shard_name(self.first_index + len(self.shards)), "documents": self._documents,
                            "bytes": self._bytes, "sha256": self._digest.hexdigest()})
        self._handle = None


def clear_corpus_folder(corpus_dir: RunPath) -> None:
    """Remove a previous run's manifest first, then its shards, report and temporary files."""
    corpus_dir = location(corpus_dir)
    invalidate(corpus_dir)
    for pattern in ("docs-*.jsonl", ".docs-*.tmp", "report.md", ".report.md.*.tmp"):
        for path in corpus_dir.glob(pattern):
            remove_file(path)
