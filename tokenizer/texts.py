"""What the tokenizer is trained and measured on, read from the corpus: the train side's lines and texts,
and a sample of held-out documents per source.

Documents are split at newlines because "\\n" (and by default "\\n\\n") are user-defined symbols, which
always stand alone, so no learned piece could span a newline anyway, and short lines keep every
paragraph under ``max_sentence_length``. Over-long lines are cut at spaces rather than dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment.corpus_format import iter_documents, read_corpus_manifest
from experiment.progress import progress
from experiment.split import is_validation

NEWLINE = "\n"


@dataclass
class CorpusSplit:
    """What one pass over the corpus found: train-side totals and a sample of held-out documents."""

    train_documents: int = 0
    train_chars: int = 0
    heldout_documents: int = 0
    heldout: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # source -> documents

    def heldout_docs(self) -> list[dict[str, Any]]:
        return [doc for docs in self.heldout.values() for doc in docs]


def is_heldout(doc: dict[str, Any], validation_percent: float, heldout_sources: Collection[str] = ()) -> bool:
    """A document the tokenizer never trains on: the validation split, or a source held out whole."""
    return str(doc.get("source", "")) in heldout_sources or is_validation(str(doc["id"]), validation_percent)


def split_corpus(corpus_dir: Path, validation_percent: float, max_heldout_per_source: int,
                 heldout_sources: Collection[str] = ()) -> CorpusSplit:
    """Count the train side and keep up to ``max_heldout_per_source`` held-out documents per source
    (``heldout_sources``: sources held out whole, measured as text unlike anything trained on)."""
    manifest = read_corpus_manifest(corpus_dir)
    split = CorpusSplit()
    docs = progress(iter_documents(corpus_dir, manifest), total=manifest.get("documents"), desc="reading corpus",
                unit="doc", leave=False)
    for doc in docs:
        if is_heldout(doc, validation_percent, heldout_sources):
            split.heldout_documents += 1
            kept = split.heldout.setdefault(str(doc.get("source", "")), [])
            if len(kept) < max_heldout_per_source:
                kept.append(doc)
        else:
            split.train_documents += 1
            split.train_chars += len(doc["text"])
    return split


def cut_long_line(line: str, max_bytes: int) -> Iterator[str]:
    """Cut a line into pieces of at most ``max_bytes`` UTF-8 bytes, at spaces where possible."""
    if len(line.encode("utf-8")) <= max_bytes:
        yield line
        return
    chunk: list[str] = []
    size = 0
    for word in re.split(r"(?<= )", line):  # keep the space with the word before it
        word_bytes = len(word.encode("utf-8"))
        if chunk and size + word_bytes > max_bytes:
            yield "".join(chunk)
            chunk, size = [], 0
        while word_bytes > max_bytes:  # one giant "word": cut it by characters
            head = word.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
            yield head
            word = word[len(head):]
            word_bytes = len(word.encode("utf-8"))
        chunk.append(word)
        size += word_bytes
    if chunk:
        yield "".join(chunk)


def training_texts(documents: Iterable[dict[str, Any]], validation_percent: float,
                   heldout_sources: Collection[str] = ()) -> Iterator[str]:
    """The text of every train-side document (held-out ones are never trained on)."""
    for doc in documents:
        if not is_heldout(doc, validation_percent, heldout_sources):
            yield doc["text"]


def text_lines(texts: Iterable[str], max_bytes: int) -> Iterator[str]:
    """Non-empty lines of ``texts``, each at most ``max_bytes`` bytes."""
    for text in texts:
        for line in text.split(NEWLINE):
            if line:
                yield from cut_long_line(line, max_bytes)


def training_lines(documents: Iterable[dict[str, Any]], validation_percent: float, max_bytes: int,
                   heldout_sources: Collection[str] = ()) -> Iterator[str]:
    """Non-empty lines of the train-side documents, each at most ``max_bytes`` bytes."""
    return text_lines(training_texts(documents, validation_percent, heldout_sources), max_bytes)
