"""The per-document step of corpus building: normalize, filter, anonymise, fingerprint.

``clean_document`` is a pure function of one raw document and the corpus config, so the local
worker pool and the Beam pipeline run exactly the same code. Filters run cheapest first; the first
one that rejects names the document's rejection reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data_prep.corpus.decontam import BenchmarkIndex, decontaminate
from data_prep.corpus.dedup import exact_key, minhash_signature
from data_prep.corpus.documents import RawDocument
from data_prep.corpus.langid import cyrillic_share, detect_language
from data_prep.corpus.normalize import normalize_text
from data_prep.corpus.quality import FINEWEB2_RUS, fineweb2_rejection, quality_rejection, replace_pii
from experiment.sections.corpus import CorpusConfig

PREVIEW_CHARS = 300


@dataclass
class CleanDocument:
    """A document after the per-document step: kept (``text`` set) or rejected (``reject`` set)."""

    order: int
    id: str
    source: str
    origin: str
    bytes_in: int
    text: str | None = None
    reject: str | None = None
    preview: str = ""  # the start of the normalized (or raw) text, for the report's examples
    exact_key: str | None = None
    signature: np.ndarray | None = None
    benchmarks: tuple[str, ...] = ()  # the benchmarks it overlapped (corpus.decontamination), first overlap first
    words_cut: int = 0  # words cut out of it (decontamination action 'cut')

    @property
    def bytes_out(self) -> int:
        return len(self.text.encode("utf-8")) if self.text is not None else 0


def filter_rejection(text: str, cfg: CorpusConfig) -> str | None:
    """The reason normalized ``text`` is rejected by the length, script, language and quality filters."""
    if not text:
        return "empty"
    if len(text) < cfg.min_chars:
        return "too_short"
    if len(text) > cfg.max_chars:
        return "too_long"
    if cyrillic_share(text) < cfg.min_cyrillic_share:
        return "low_cyrillic"
    langid = cfg.langid
    if langid.enabled:
        language, confidence = detect_language(text, tuple(langid.languages), langid.sample_chars)
        if language != langid.target:
            return f"language_{language}"
        fineweb2 = cfg.filters == "fineweb2-rus"
        if confidence < (FINEWEB2_RUS.lingua_min_confidence if fineweb2 else langid.min_confidence):
            return "language_low_confidence"
    if cfg.filters == "fineweb2-rus":
        return fineweb2_rejection(text)
    if cfg.quality.enabled:
        return quality_rejection(text, cfg.quality)
    return None


def benchmark_rejection(benchmark: str) -> str:
    """The rejection reason of a document that overlaps ``benchmark`` (the report's outcome names it)."""
    return f"benchmark:{benchmark}"


def clean_document(raw: RawDocument, cfg: CorpusConfig, benchmarks: BenchmarkIndex | None = None) -> CleanDocument:
    """``benchmarks``: the decontamination index (recipe 01 builds it from the eval files; None: not checked).
    Decontamination runs after the filters (a rejected document costs no lookup) and before the fingerprints (a
    cut document is deduplicated as it is written)."""
    doc = CleanDocument(raw.order, raw.id, raw.source, raw.origin, raw.raw_bytes)
    if raw.reject is not None or raw.text is None:
        doc.reject = raw.reject or "empty_input"
        return doc
    text = normalize_text(raw.text, cfg.repair_mojibake)
    doc.preview = text[:PREVIEW_CHARS]
    doc.reject = filter_rejection(text, cfg)
    if doc.reject is not None:
        return doc
    if cfg.replace_pii:
        text = replace_pii(text, cfg.email_placeholder, cfg.ip_placeholder)
    if benchmarks is not None and not benchmarks.empty:
        action = cfg.decontamination.action
        checked = decontaminate(text, benchmarks, action)
        doc.benchmarks, doc.words_cut = checked.benchmarks, checked.words_cut
        if checked.benchmarks and (action == "remove" or len(checked.text.strip()) < cfg.min_chars):
            doc.reject = benchmark_rejection(checked.benchmarks[0])
            return doc
        text = checked.text
    doc.text = text
    if cfg.dedup.exact:
        doc.exact_key = exact_key(text)
    if cfg.dedup.near:
        doc.signature = minhash_signature(text, cfg.dedup)
    return doc
