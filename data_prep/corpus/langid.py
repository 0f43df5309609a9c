"""Language identification: a cheap Cyrillic-share prefilter in front of lingua.

lingua works offline and is restricted to a configured set of candidates (Russian and the
Cyrillic languages it is confused with, plus English), which is both faster and more accurate
than asking it about all 75 languages.
"""

from __future__ import annotations

import functools
import re

from lingua import IsoCode639_1, LanguageDetector, LanguageDetectorBuilder

from experiment.errors import ConfigError

_LETTER = re.compile(r"[^\W\d_]")
_CYRILLIC_LETTER = re.compile(r"[\u0400-\u04ff]")


def cyrillic_share(text: str) -> float:
    """Share of letters that are Cyrillic (0 for text without letters)."""
    letters = len(_LETTER.findall(text))
    return len(_CYRILLIC_LETTER.findall(text)) / letters if letters else 0.0


def sample_for_langid(text: str, sample_chars: int) -> str:
    """Up to ``sample_chars`` characters from the start, middle and end, cut at spaces.

    lingua's cost grows with the text; three windows judge a long document as well as all of it.
    """
    if len(text) <= sample_chars:
        return text
    window = sample_chars // 3
    pieces = []
    for start in (0, (len(text) - window) // 2, len(text) - window):
        piece = text[start:start + window]
        if start > 0 and " " in piece:
            piece = piece[piece.index(" ") + 1:]
        if start + window < len(text) and " " in piece:
            piece = piece[:piece.rindex(" ")]
        pieces.append(piece)
    return "\n".join(pieces)


def _iso_code(code: str) -> IsoCode639_1:
    try:
        return IsoCode639_1.from_str(code)
    except ValueError as exc:
        raise ConfigError(f"config key 'corpus.langid.languages': '{code}' is not an ISO 639-1 code "
                          "lingua knows") from exc


@functools.lru_cache(maxsize=4)
def get_detector(languages: tuple[str, ...]) -> LanguageDetector:
    """One detector per process and language set: building it loads the models (seconds)."""
    return LanguageDetectorBuilder.from_iso_codes_639_1(*[_iso_code(c) for c in languages]).build()


def detect_language(text: str, languages: tuple[str, ...], sample_chars: int) -> tuple[str, float]:
    """Return ``(iso code of the most likely language, its confidence)``; ``("unknown", 0.0)`` if none."""
    values = get_detector(languages).compute_language_confidence_values(sample_for_langid(text, sample_chars))
    if not values or values[0].value <= 0.0:
        return "unknown", 0.0
    top = values[0]
    return top.language.iso_code_639_1.name.lower(), float(top.value)
