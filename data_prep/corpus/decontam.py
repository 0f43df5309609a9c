"""Benchmark decontamination of the corpus: an n-gram index of the benchmarks' items, and the per-document check.

Words are normalized before n-grams are taken: lower case, ``ё`` read as ``е``, punctuation and underscores
dropped (a word is a run of letters and digits), so "Ёлка, — сказал он" and "елка сказал он" share their 3-grams.
An item's text is its segments (eval/decontam.py: the record's own text with the prompt template's words left
out); a segment of at least ``ngram`` words gives each of its ``ngram``-grams, a shorter one of at least
``min_words`` words is one gram of its own length (the whole segment must occur), a shorter one is not checked.
That is the rule of GPT-3's contamination study (Brown et al. 2020, "Language Models are Few-Shot Learners",
appendix C: 13-grams at most, the whole example where it is shorter, never fewer than 8 words).

An n-gram is kept as a 64-bit hash: each index word has a 64-bit id (BLAKE2b of the word, the same in every
process, so the Beam workers and the local pool agree), a window's hash is the sum of its word ids times fixed
odd 64-bit multipliers, one per position, modulo 2^64 (numpy's unsigned arithmetic). A word the index lacks has
id 0: a window holding one matches nothing but by a 2^-64 chance per index entry. A document's windows are
hashed with a few vectorized numpy operations and looked up in the sorted hash arrays (``np.searchsorted``),
so the per-document cost is a regular expression, one dictionary lookup per word and some array passes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from data_prep.corpus.normalize import normalize_text

WORD = re.compile(r"[^\W_]+")


def normalize_words_text(text: str) -> str:
    """``text`` lower-cased with ``ё`` as ``е``, character for character (a character whose lower case is longer,
    such as 'İ', stays as it is), so the word offsets found in it are the offsets in ``text``."""
    lowered = text.lower()
    if len(lowered) != len(text):
        lowered = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    return lowered.replace("ё", "е")


def normalized_words(text: str) -> list[str]:
    """The words n-grams are taken over (see the module docstring)."""
    return WORD.findall(normalize_words_text(text))


def word_id(word: str) -> int:
    """A word's 64-bit id in the index (never 0: 0 stands for every word the index lacks)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "big") or 1


_MASK = (1 << 64) - 1


def _multipliers(count: int) -> np.ndarray:
    """One odd 64-bit multiplier per position in a window, the same everywhere (derived from fixed labels)."""
    values = [int.from_bytes(hashlib.blake2b(f"ngram-position-{i}".encode(), digest_size=8).digest(), "big") | 1
              for i in range(count)]
    return np.array(values, dtype=np.uint64)


def window_hashes(ids: np.ndarray, length: int, multipliers: np.ndarray) -> np.ndarray:
    """The hash of every window of ``length`` consecutive word ids (``len(ids) - length + 1`` values)."""
    count = len(ids) - length + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    hashes = ids[:count] * multipliers[0]
    for position in range(1, length):
        hashes += ids[position:position + count] * multipliers[position]
    return hashes


@dataclass
class BenchmarkSummary:
    """What the index holds of one benchmark (the manifest's entry under ``decontamination.benchmarks``)."""

    source: str  # the file (or hub split) eval reads it from
    items: int = 0
    items_indexed: int = 0  # items with at least one gram; the rest are too short to check (< min_words words)
    ngrams: int = 0


@dataclass
class Hit:
    """One matched window of a document: its first word, its length in words and the benchmarks it belongs to."""

    start: int
    length: int
    benchmarks: tuple[str, ...]
    items: tuple[int, ...]  # global item numbers (the overlap report counts items)


@dataclass
class BenchmarkIndex:
    """The hashed grams of every benchmark item, by gram length, with the item each came from."""

    ngram: int
    min_words: int
    benchmarks: list[str]  # in index order; a benchmark's number is its position
    summaries: dict[str, BenchmarkSummary]
    not_indexed: dict[str, str]  # benchmark -> why it could not be read (corpus.decontamination.missing: record)
    item_benchmark: np.ndarray  # item number -> benchmark number
    vocab: dict[str, int] = field(default_factory=dict)  # index word -> its id
    hashes: dict[int, np.ndarray] = field(default_factory=dict)  # gram length -> sorted gram hashes
    owners: dict[int, np.ndarray] = field(default_factory=dict)  # gram length -> item number of each hash

    def __post_init__(self) -> None:
        self._multipliers = _multipliers(max(self.ngram, 1))

    def __getstate__(self) -> dict[str, Any]:  # pickled to the local pool's workers and Beam's
        return {k: v for k, v in self.__dict__.items() if k != "_multipliers"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._multipliers = _multipliers(max(self.ngram, 1))

    @property
    def empty(self) -> bool:
        return not self.hashes

    def word_ids(self, words: Sequence[str]) -> np.ndarray:
        return np.array(list(map(self.vocab.get, words, itertools.repeat(0))), dtype=np.uint64)

    def hits(self, words: Sequence[str]) -> list[Hit]:
        """Every window of ``words`` (normalized) that is a gram of the index, in document order."""
        if not self.hashes or not words:
            return []
        ids = self.word_ids(words)
        found: list[Hit] = []
        names = self.benchmarks
        for length, table in self.hashes.items():
            if len(ids) < length:
                continue
            windows = window_hashes(ids, length, self._multipliers)
            left = np.searchsorted(table, windows, side="left")
            inside = left < len(table)
            matched = np.flatnonzero(inside & (table[np.minimum(left, len(table) - 1)] == windows))
            if not len(matched):
                continue
            right = np.searchsorted(table, windows[matched], side="right")
            owners = self.owners[length]
            for start, lo, hi in zip(matched.tolist(), left[matched].tolist(), right.tolist(), strict=True):
                items = tuple(sorted(set(owners[lo:hi].tolist())))
                benchmarks = tuple(sorted({names[self.item_benchmark[i]] for i in items}))
                found.append(Hit(start, length, benchmarks, items))
        found.sort(key=lambda hit: (hit.start, hit.length))
        return found

    def manifest(self, action: str) -> dict[str, Any]:
        """The index as the corpus manifest records it (the removals are added by the corpus counts)."""
        return {"enabled": True, "ngram": self.ngram, "min_words": self.min_words, "action": action,
                "normalization": "lower case, ё as е, punctuation dropped (words: runs of letters and digits)",
                "benchmarks": {name: dataclasses.asdict(summary) for name, summary in self.summaries.items()},
                "not_decontaminated": dict(self.not_indexed)}


class IndexBuilder:
    """Collects benchmark items (each a list of text segments) into a ``BenchmarkIndex``."""

    def __init__(self, ngram: int, min_words: int) -> None:
        self.ngram, self.min_words = ngram, min_words
        self.benchmarks: list[str] = []
        self.summaries: dict[str, BenchmarkSummary] = {}
        self.not_indexed: dict[str, str] = {}
        self.item_benchmark: list[int] = []
        self.vocab: dict[str, int] = {}
        self._grams: dict[int, list[np.ndarray]] = {}
        self._owners: dict[int, list[np.ndarray]] = {}
        self._multipliers = [int(m) for m in _multipliers(ngram)]

    def _ids(self, words: list[str]) -> list[int]:
        vocab = self.vocab
        return [vocab.get(w) or vocab.setdefault(w, word_id(w)) for w in words]

    def _hashes(self, ids: list[int], length: int) -> list[int]:
        """``window_hashes`` in Python integers: item text is short, and numpy's call overhead would dominate."""
        pairs = list(zip(self._multipliers[:length], range(length), strict=True))
        return [sum(ids[start + i] * m for m, i in pairs) & _MASK for start in range(len(ids) - length + 1)]

    def skip(self, benchmark: str, reason: str) -> None:
        self.not_indexed[benchmark] = reason

    def add_benchmark(self, benchmark: str, source: str, items: Iterable[Sequence[str]]) -> None:
        number = len(self.benchmarks)
        self.benchmarks.append(benchmark)
        summary = self.summaries[benchmark] = BenchmarkSummary(source)
        for segments in items:
            item = len(self.item_benchmark)
            self.item_benchmark.append(number)
            summary.items += 1
            grams = 0
            for segment in segments:
                # the form recipe 01 gives a document before it is checked (NFC, the tokenizer's character rules:
                # stress marks dropped, quotes and dashes unified), so both sides split into the same words
                words = normalized_words(normalize_text(segment, repair_mojibake=False))
                if len(words) < self.min_words:
                    continue
                length = min(len(words), self.ngram)
                hashes = np.array(self._hashes(self._ids(words), length), dtype=np.uint64)
                self._grams.setdefault(length, []).append(hashes)
                self._owners.setdefault(length, []).append(np.full(len(hashes), item, dtype=np.int64))
                grams += len(hashes)
            summary.ngrams += grams
            summary.items_indexed += grams > 0

    def build(self) -> BenchmarkIndex:
        hashes, owners = {}, {}
        for length in sorted(self._grams):
            values = np.concatenate(self._grams[length])
            items = np.concatenate(self._owners[length])
            order = np.argsort(values, kind="stable")
            hashes[length], owners[length] = values[order], items[order]
        return BenchmarkIndex(self.ngram, self.min_words, self.benchmarks, self.summaries, self.not_indexed,
                              np.array(self.item_benchmark, dtype=np.int64), self.vocab, hashes, owners)


@dataclass
class Decontaminated:
    """The outcome of one document: its text (cut, or unchanged), the benchmarks it overlapped, in order of
    first overlap, and the number of words cut (``cut`` action)."""

    text: str
    benchmarks: tuple[str, ...] = ()
    words_cut: int = 0


def overlapping_benchmarks(hits: Sequence[Hit]) -> tuple[str, ...]:
    """The benchmarks of ``hits`` in order of their first hit (names sorted within one window)."""
    seen: dict[str, None] = {}
    for hit in hits:
        for name in hit.benchmarks:
            seen.setdefault(name, None)
    return tuple(seen)


def decontaminate(text: str, index: BenchmarkIndex, action: str) -> Decontaminated:
    """Check one document: ``remove`` reports the overlapping benchmarks (the caller drops the document);
    ``cut`` also removes every overlapping span, from the first character of its first word to the last of its
    last (overlapping windows merge into one span)."""
    normalized = normalize_words_text(text)
    if action == "cut":
        spans = [m.span() for m in WORD.finditer(normalized)]
        words = [normalized[a:b] for a, b in spans]
    else:
        words = WORD.findall(normalized)
    hits = index.hits(words)
    if not hits:
        return Decontaminated(text)
    benchmarks = overlapping_benchmarks(hits)
    if action != "cut":
        return Decontaminated(text, benchmarks)
    merged: list[list[int]] = []
    for hit in hits:
        end = hit.start + hit.length
        if merged and hit.start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([hit.start, end])
    pieces, previous = [], 0
    for first, end in merged:
        pieces.append(text[previous:spans[first][0]])
        previous = spans[end - 1][1]
    pieces.append(text[previous:])
    return Decontaminated("".join(pieces), benchmarks, sum(end - first for first, end in merged))
