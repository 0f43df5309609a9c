"""A corpus source's documents before cleaning: ``RawDocument`` and the numbering every source shares.

A document's id is ``<source>:<position>:<content hash>``, so it is the same on every run over the
same input, and the train/validation split (a hash of the id) never moves a document.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from experiment.sections.corpus import SourceConfig


@dataclass
class RawDocument:
    """One input document before cleaning; ``text`` is None when ``reject`` says why there is none."""

    order: int  # position in the whole input (all sources in config order): the dedup order
    id: str
    source: str
    origin: str  # the file (and line) or dataset row it came from, for error lines and the report
    text: str | None
    reject: str | None = None
    raw_bytes: int = 0


def document_id(source: str, position: int, content: str) -> str:
    digest = hashlib.sha256(content.encode("utf-8", errors="surrogatepass")).hexdigest()[:12]
    return f"{source}:{position:09d}:{digest}"


def keep_for_weight(doc_id: str, weight: float) -> bool:
    """A stable, hash-chosen ``weight`` share of a source's documents (the same on every run)."""
    if weight >= 1.0:
        return True
    bucket = int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "big")
    return bucket / 2**64 < weight


def pack_pieces(pieces: Iterable[str], target_chars: int, separator: str) -> list[str]:
    """Join consecutive pieces into documents of at most about ``target_chars`` characters."""
    documents: list[str] = []
    current: list[str] = []
    size = 0
    for piece in pieces:
        if current and size + len(piece) > target_chars:
            documents.append(separator.join(current))
            current, size = [], 0
        current.append(piece)
        size += len(piece) + len(separator)
    if current:
        documents.append(separator.join(current))
    return documents


class DocumentNumberer:
    """Turns a source's texts into RawDocuments: ids, the mixture weight and the caps."""

    def __init__(self, cfg: SourceConfig, start_order: int) -> None:
        self.cfg = cfg
        self.source = cfg.label
        self.order = start_order
        self.position = 0
        self.bytes = 0

    @property
    def capped(self) -> bool:
        cfg = self.cfg
        return (cfg.max_documents is not None and self.position >= cfg.max_documents) or (
            cfg.max_bytes is not None and self.bytes >= cfg.max_bytes
        )

    def make(self, text: str | None, origin: str, reject: str | None = None,
             raw_bytes: int | None = None) -> RawDocument:
        size = raw_bytes if raw_bytes is not None else len(text.encode("utf-8", errors="replace")) if text else 0
        doc_id = document_id(self.source, self.position, text if text is not None else origin)
        if reject is None and not keep_for_weight(doc_id, self.cfg.weight):
            reject = "mixture_weight"
        doc = RawDocument(self.order, doc_id, self.source, origin, text if reject is None else None, reject, size)
        self.order += 1
        self.position += 1
        self.bytes += size
        return doc
