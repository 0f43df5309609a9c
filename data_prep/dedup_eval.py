"""Measuring near-duplicate detection with planted copies: how many are caught, how many clean are lost.

``write_planted_source`` picks documents from the clean sources, lightly edits them (words dropped,
swapped, doubled or misspelt) and writes the copies to a JSON-lines file that goes last in the
config, so every copy comes after its original. After the build, ``planted_rates`` reads the
manifest's per-source counts: the share of planted copies (that passed the filters) removed as
duplicates, and the share of clean documents (that passed the filters) removed as duplicates.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from data_prep.sources import RawDocument

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


def write_planted_source(raw_docs: list[RawDocument], count: int, path: Path, seed: int = 0,
                         edit_rate: float = 0.02, min_chars: int = 500) -> list[str]:
    """Write ``count`` lightly edited copies of random documents to ``path``; return the originals' ids."""
    rng = random.Random(seed)
    candidates = [doc for doc in raw_docs if doc.text is not None and len(doc.text) >= min_chars]
    if len(candidates) < count:
        raise ValueError(f"only {len(candidates)} documents of {min_chars}+ characters to plant copies of, {count} asked")
    originals = rng.sample(candidates, count)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for doc in originals:
            handle.write(json.dumps({"text": light_edit(doc.text or "", rng, edit_rate), "copy_of": doc.id},
                                    ensure_ascii=False) + "\n")
    return [doc.id for doc in originals]


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
