"""Reading and writing the cleaned corpus: JSON-lines shards of ``{"id", "source", "text"}``.

The corpus folder holds ``docs-NNNNN.jsonl`` files and a ``manifest.json`` written last. Readers
go through ``iter_documents``, which refuses a folder without a finished manifest and checks each
shard's size against it, so a half-written corpus is never read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experiment.errors import DataError
from experiment.manifest import read_manifest

CORPUS_STAGE = "corpus"
CORPUS_RECIPE = "recipes/01_build_corpus.py"


def shard_name(index: int) -> str:
    return f"docs-{index:05d}.jsonl"


def read_corpus_manifest(corpus_dir: Path) -> dict[str, Any]:
    return read_manifest(Path(corpus_dir), CORPUS_STAGE, CORPUS_RECIPE)


def iter_documents(corpus_dir: Path, manifest: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Yield every cleaned document in manifest order."""
    corpus_dir = Path(corpus_dir)
    manifest = manifest or read_corpus_manifest(corpus_dir)
    for shard in manifest["shards"]:
        path = corpus_dir / shard["file"]
        if not path.is_file():
            raise DataError(f"corpus shard {path} listed in the manifest is missing: run {CORPUS_RECIPE} again")
        if path.stat().st_size != shard["bytes"]:
            raise DataError(f"corpus shard {path} has {path.stat().st_size} bytes, the manifest says {shard['bytes']}")
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path} line {line_no}: not valid JSON ({exc.msg})") from exc
                if not isinstance(doc, dict) or not isinstance(doc.get("text"), str) or "id" not in doc:
                    raise DataError(f"{path} line {line_no}: a document needs 'id' and a string 'text'")
                yield doc
