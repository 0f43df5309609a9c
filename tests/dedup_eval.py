"""Measuring near-duplicate detection with planted copies: how many are caught, how many clean are lost.

``write_planted_source`` picks documents from the clean sources, lightly edits them (words dropped,
swapped, doubled or misspelt) and writes the copies to a JSON-lines file that goes last in the
config, so every copy comes after its original. After the build, ``planted_rates`` reads the
manifest's per-source counts: the share of planted copies (that passed the filters) removed as
duplicates, and the share of clean documents (that passed the filters) removed as duplicates.

``write_planted_levels`` and ``planted_matches`` check more than "flagged as a duplicate of something":
copies at several edit rates (disjoint originals, one file per rate) and, from the dedup outcomes, whether
each caught copy was matched to its own original; ``lsh_catch_probability`` is what MinHash LSH should
catch at a pair's true shingle Jaccard, so a measured rate can be held against theory.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.corpus.dedup import shingles
from data_prep.corpus.documents import RawDocument
from data_prep.corpus.sources import iter_raw_documents
from experiment.schema import SourceConfig
from experiment.sections.corpus import CorpusConfig

_VOWELS = "аеиоуыэюя"


def light_edit(text: str, rng: random.Random, edit_rate: float = 0.02) -> str:
    """Edit about ``edit_rate`` of the words (at least one): drop, swap with the next, double, or a typo."""
    words = text.split(" ")
    if len(words) < 3:
        return text + " ."
    for _ in range(max(1, int(len(words) * edit_rate))):
        i = rng.randrange(0, len(words) - 1)
        kind = rng.choice(("drop", "swap", "double", "typo"))
        if kind == "drop":
            del words[i]
        elif kind == "swap":
            words[i], words[i + 1] = words[i + 1], words[i]
        elif kind == "double":
            words.insert(i, words[i])
        elif len(words[i]) > 1:
            j = rng.randrange(len(words[i]))
            words[i] = words[i][:j] + rng.choice(_VOWELS) + words[i][j + 1:]
    return " ".join(words)


def _copy_candidates(raw_docs: list[RawDocument], count: int, min_chars: int) -> list[RawDocument]:
    candidates = [doc for doc in raw_docs if doc.text is not None and len(doc.text) >= min_chars]
    if len(candidates) < count:
        raise ValueError(f"only {len(candidates)} documents of {min_chars}+ characters to plant copies of, "
                         f"{count} asked")
    return candidates


def _write_copies(path: Path, originals: list[RawDocument], rng: random.Random, edit_rate: float) -> None:
    """One JSON line per original: its edited text and ``copy_of``, the original's id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for doc in originals:
            handle.write(json.dumps({"text": light_edit(doc.text or "", rng, edit_rate), "copy_of": doc.id},
                                    ensure_ascii=False) + "\n")


def write_planted_source(raw_docs: list[RawDocument], count: int, path: Path, seed: int = 0,
                         edit_rate: float = 0.02, min_chars: int = 500) -> list[str]:
    """Write ``count`` lightly edited copies of random documents to ``path``; return the originals' ids."""
    rng = random.Random(seed)
    originals = rng.sample(_copy_candidates(raw_docs, count, min_chars), count)
    _write_copies(path, originals, rng, edit_rate)
    return [doc.id for doc in originals]


def write_planted_levels(raw_docs: list[RawDocument], count: int, edit_rates: Iterable[float], folder: Path,
                         seed: int = 0, min_chars: int = 500) -> dict[float, Path]:
    """``count`` copies per edit rate, of different originals for each rate (so no copy can match a copy of
    its own original at another rate), one file per rate: ``folder/planted-<percent>.jsonl``."""
    rates = list(edit_rates)
    rng = random.Random(seed)
    originals = rng.sample(_copy_candidates(raw_docs, count * len(rates), min_chars), count * len(rates))
    paths = {}
    for level, rate in enumerate(rates):
        paths[rate] = folder / f"planted-{rate * 100:g}pct.jsonl"
        _write_copies(paths[rate], originals[level * count:(level + 1) * count], rng, rate)
    return paths


def lsh_catch_probability(jaccard: float, bands: int, rows: int) -> float:
    """Chance that MinHash LSH with ``bands`` x ``rows`` puts a pair of this shingle Jaccard in one bucket."""
    return 1.0 - (1.0 - jaccard ** rows) ** bands


def shingle_jaccard(a: str, b: str, ngram: int) -> float:
    """The exact Jaccard of two texts' word n-gram shingle sets (what MinHash estimates)."""
    first, second = set(shingles(a, ngram)), set(shingles(b, ngram))
    return len(first & second) / len(first | second)


@dataclass
class PlantedMatches:
    """Outcomes of one file of planted copies: each copy's own original is known from its ``copy_of``."""

    judged: int = 0  # copies that passed the filters
    rejected: int = 0
    own: int = 0  # caught, matched to its own original
    missed: int = 0
    wrong: list[tuple[str, str, str]] = field(default_factory=list)  # (copy, its original, what it matched)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (copy, original) ids of every judged copy

    @property
    def caught_share(self) -> float:
        return self.own / self.judged if self.judged else 0.0


def planted_matches(outcomes: Iterable[tuple[Any, str | None, str | None]], planted: dict[float, Path]
                    ) -> dict[float, PlantedMatches]:
    """Sort the dedup outcomes (document, duplicate kind, id of the earlier document) of the planted files'
    documents: caught and matched to its own original, matched to anything else, missed, or rejected."""
    copy_of: dict[str, tuple[float, str]] = {}  # a copy's origin ("path:line") -> (its rate, its original's id)
    for rate, path in planted.items():
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                copy_of[f"{path}:{line_no}"] = (rate, json.loads(line)["copy_of"])
    results = {rate: PlantedMatches() for rate in planted}
    for doc, kind, earlier in outcomes:
        if doc.origin not in copy_of:
            continue
        rate, original = copy_of[doc.origin]
        result = results[rate]
        if doc.reject is not None:
            result.rejected += 1
            continue
        result.judged += 1
        result.pairs.append((doc.id, original))
        if kind is None:
            result.missed += 1
        elif earlier == original:
            result.own += 1
        else:
            result.wrong.append((doc.id, original, earlier or ""))
    return results


def planted_rates(manifest: dict[str, Any], planted_source: str) -> dict[str, float | int]:
    """Caught share of planted copies and removed share of clean documents, from the corpus manifest."""
    sources = {s["name"]: s for s in manifest["sources"]}
    planted = sources[planted_source]
    planted_judged = planted["documents_in"] - planted["rejected"]
    clean = [s for name, s in sources.items() if name != planted_source]
    clean_judged = sum(s["kept"] + s["duplicates"] for s in clean)
    clean_removed = sum(s["duplicates"] for s in clean)
    return {
        "planted": planted["documents_in"],
        "planted_past_filters": planted_judged,
        "planted_caught": planted["duplicates"],
        "caught_share": planted["duplicates"] / planted_judged if planted_judged else 0.0,
        "clean_past_filters": clean_judged,
        "clean_removed_as_duplicates": clean_removed,
        "clean_removed_share": clean_removed / clean_judged if clean_judged else 0.0,
    }


def measure_planted_levels(corpus: CorpusConfig, count: int, edit_rates: Iterable[float], work: Path,
                           seed: int = 0) -> dict[str, Any]:
    """Recipe 01's cleaning and dedup (in this process) on ``corpus.sources`` plus ``count`` copies per edit
    rate of documents that pass the filters: which clean documents are flagged (with the flagged pair's true
    shingle Jaccard), and per rate how many copies are matched to their own original, to something else, or
    missed, next to what the bands x rows S-curve predicts at the copies' true Jaccard (mean and sigma)."""
    from data_prep.corpus.build import clean_serial, dedup_in_order
    from data_prep.corpus.cleaning import clean_document

    dedup = corpus.dedup
    raw = list(iter_raw_documents(corpus.sources, work / ".cache"))
    cleaned = {doc.id: doc for doc in clean_serial(raw, corpus)}
    passing = [doc for doc in raw if cleaned[doc.id].reject is None]
    planted = write_planted_levels(passing, count, edit_rates, work / "planted", seed=seed)
    with_copies = dataclasses.replace(corpus, sources=[*corpus.sources, *(
        SourceConfig(kind="files", name=f"planted-{rate * 100:g}pct", paths=[str(path)])
        for rate, path in planted.items())])
    docs = [cleaned.get(doc.id) or clean_document(doc, with_copies)
            for doc in iter_raw_documents(with_copies.sources, work / ".cache")]
    outcomes = list(dedup_in_order(docs, with_copies))
    texts = {doc.id: doc.text or "" for doc in docs}
    clean_flagged = [{"document": doc.id, "matched": earlier,
                      "jaccard": round(shingle_jaccard(texts[doc.id], texts[earlier or ""], dedup.ngram), 4)}
                     for doc, kind, earlier in outcomes if doc.id in cleaned and kind is not None]
    levels = {}
    for rate, result in planted_matches(outcomes, planted).items():
        chances = [lsh_catch_probability(shingle_jaccard(texts[copy], texts[original], dedup.ngram), dedup.bands,
                                         dedup.rows) for copy, original in result.pairs]
        levels[f"{rate:g}"] = {
            "judged": result.judged, "rejected": result.rejected, "own_original": result.own,
            "missed": result.missed, "wrong_match": result.wrong, "caught_share": round(result.caught_share, 4),
            "expected_by_lsh": round(sum(chances), 2),
            "sigma_by_lsh": round(sum(p * (1 - p) for p in chances) ** 0.5, 2)}
    return {"clean_judged": sum(doc.reject is None for doc in cleaned.values()), "clean_flagged": clean_flagged,
            "lsh": f"{dedup.bands} bands x {dedup.rows} rows, word {dedup.ngram}-grams", "levels": levels}
