"""How lingua's confidence threshold maps to FineWeb-2's GlotLID language score >= 0.9 for Russian.

GlotLID's model is not installable here, so the threshold is set by what it is for: keep Russian text,
drop the Cyrillic neighbours. Documents: Russian prose from the shared ruslit corpus (chunks of ~800
characters) and Ukrainian, Belarusian, Bulgarian, Serbian, Macedonian and Kazakh sentences from the
gettext catalogs of this machine (/usr/share/locale/<lang>/LC_MESSAGES/*.mo, grouped into ~800-character
documents). For each threshold: the share of Russian documents kept and of the others accepted as Russian.

    python bench/fineweb2_langid.py [--per-language 150] [--out bench/results/fineweb2_langid.json]
"""

from __future__ import annotations

import argparse
import gettext
import os
import random
from pathlib import Path

from data_prep.corpus.langid import detect_language
from experiment.files import atomic_write_json
from experiment.progress import progress
from experiment.sections.corpus import LangIdConfig

NEIGHBOURS = ("uk", "be", "bg", "sr", "mk", "kk")
THRESHOLDS = (0.5, 0.65, 0.8, 0.9, 0.95, 0.99)


def grouped(pieces: list[str], chars: int, count: int) -> list[str]:
    docs, current = [], ""
    for piece in pieces:
        current = f"{current} {piece}".strip()
        if len(current) >= chars:
            docs.append(current)
            current = ""
        if len(docs) == count:
            break
    return docs


def russian_docs(root: Path, count: int, rng: random.Random) -> list[str]:
    files = sorted((root / "prose").rglob("*.txt"))
    paragraphs = [p.strip() for f in rng.sample(files, min(40, len(files)))
                  for p in f.read_text(encoding="utf-8").split("\n\n") if len(p.strip()) > 100]
    rng.shuffle(paragraphs)
    return grouped(paragraphs, 800, count)


def catalog_docs(language: str, count: int, rng: random.Random) -> list[str]:
    messages = []
    for mo in sorted(Path("/usr/share/locale", language, "LC_MESSAGES").glob("*.mo")):
        with open(mo, "rb") as handle:
            try:
                catalog = gettext.GNUTranslations(handle)._catalog  # noqa: SLF001 (the msgstr table)
            except (OSError, UnicodeDecodeError):
                continue
        messages += [v.replace("%s", "").replace("\n", " ") for k, v in catalog.items()
                     if isinstance(v, str) and k and len(v) > 30]
    rng.shuffle(messages)
    return grouped(messages, 800, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-language", type=int, default=150)
    parser.add_argument("--out", default="bench/results/fineweb2_langid.json")
    args = parser.parse_args()
    rng = random.Random(0)
    cfg = LangIdConfig()
    shared = Path(os.environ.get("RU_SHARED_DATA", "../shared/data")) / "text" / "ruslit"
    sets = {"ru": russian_docs(shared, args.per_language, rng),
            **{lang: catalog_docs(lang, args.per_language, rng) for lang in NEIGHBOURS}}
    # where thresholds matter: short Russian documents, and Russian mixed with a neighbour (a quarter or half)
    sets["ru_short"] = [d[:160].rsplit(" ", 1)[0] for d in russian_docs(shared, args.per_language, rng)]
    for share in (0.25, 0.5):
        sets[f"ru+uk_{share}"] = [ru[:int(800 * (1 - share))] + " " + uk[:int(800 * share)]
                                  for ru, uk in zip(sets["ru"], sets["uk"], strict=False)]
    results = {}
    for lang, docs in sets.items():
        scores = [detect_language(d, tuple(cfg.languages), cfg.sample_chars)
                  for d in progress(docs, desc=lang, unit="doc", leave=False)]
        results[lang] = {"documents": len(docs),
                         "accepted_as_ru": {str(t): (sum(code == "ru" and c >= t for code, c in scores)
                                                     / max(len(docs), 1))
                                            for t in THRESHOLDS}}
    atomic_write_json(Path(args.out), {"lingua_languages": cfg.languages, "results": results})
    print("documents  " + "  ".join(f"{r['documents']:9d}" for r in results.values()))
    print("threshold  " + "  ".join(f"{lang:>9}" for lang in results))
    for t in THRESHOLDS:
        print(f"{t:9.2f}  " + "  ".join(f"{r['accepted_as_ru'][str(t)]:9.3f}" for r in results.values()))


if __name__ == "__main__":
    main()
