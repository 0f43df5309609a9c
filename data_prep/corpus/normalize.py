"""Text normalization: decoding, mojibake repair, Unicode NFC, control characters, whitespace.

Every function here is pure (text in, text out) so the local pool and the Beam pipeline call the
same code and produce the same documents.
"""

from __future__ import annotations

import re
import unicodedata

import ftfy
import ftfy.badness

from tokenizer.normalization import normalize_characters

# ftfy with the settings a pretraining corpus needs: NFC (so a decomposed й or ё composes), curly
# quotes and «ёлочки» kept, HTML entities left to the HTML reader, full-width forms untouched.
_FTFY_CONFIG = ftfy.TextFixerConfig(
    unescape_html=False,
    uncurl_quotes=False,
    fix_character_width=False,
    fix_line_breaks=True,
    normalization="NFC",
    explain=False,
)

_CYRILLIC = re.compile(r"[\u0400-\u04FF]")
# The fifteen most frequent lowercase Russian letters (~70% of letters in running text). A right
# decoding of Russian bytes is about half these; a wrong codec gives capitals and rare letters.
_RUSSIAN_FREQUENT = frozenset("оеаинтсрвлкмдпу")
_LATIN1_HIGH = re.compile(r"[\u00C0-\u00FF]")
_LEGACY_ENCODINGS = ("cp1251", "koi8_r")
_SPACES = re.compile(r"[^\S\n]+")  # any whitespace except a newline
_MANY_BLANK_LINES = re.compile(r"\n{3,}")


def russian_letter_score(text: str) -> float:
    """Share of characters that are frequent lowercase Russian letters: high for a right decoding.

    Text without spaces between words (binary data, random bytes) scores 0.
    """
    if not text or text.count(" ") + text.count("\n") < 0.05 * len(text):
        return 0.0
    return sum(ch in _RUSSIAN_FREQUENT for ch in text) / len(text)


def decode_bytes(data: bytes) -> tuple[str | None, str | None]:
    """Decode file bytes: UTF-8 (BOM allowed), else cp1251 or koi8-r when one reads as Russian.

    Returns ``(text, None)`` or ``(None, reason)`` with reason ``binary`` or ``invalid_utf8``.
    """
    if b"\x00" in data[:65536]:
        return None, "binary"
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError:
        pass
    best, best_score = None, 0.0
    for encoding in _LEGACY_ENCODINGS:
        candidate = data.decode(encoding, errors="replace")
        score = russian_letter_score(candidate[:20000])
        if score > best_score:
            best, best_score = candidate, score
    # Russian prose decoded right scores about 0.45; a wrong codec, another language or random bytes
    # score far below.
    if best is not None and best_score >= 0.25:
        return best, None
    return None, "invalid_utf8"


def repair_legacy_mojibake(text: str) -> str:
    """Undo cp1251/koi8-r bytes that were read as latin-1/cp1252 ("Ïðèâåò" -> "Привет").

    ftfy repairs UTF-8 read in the wrong codec; this covers the single-byte Cyrillic codecs it leaves.
    Only text with many latin-1 letters and next to no Cyrillic is tried, and a candidate is kept only
    if it reads as Russian.
    """
    high = len(_LATIN1_HIGH.findall(text))
    if high < 8 or high < 0.2 * sum(ch.isalpha() for ch in text) or _CYRILLIC.search(text):
        return text
    best, best_score = text, russian_letter_score(text)
    for source_codec in ("cp1252", "latin-1"):
        try:
            raw = text.encode(source_codec)
        except UnicodeEncodeError:
            continue
        for encoding in _LEGACY_ENCODINGS:
            candidate = raw.decode(encoding, errors="replace")
            score = russian_letter_score(candidate)
            if score > best_score + 0.15:
                best, best_score = candidate, score
    return best


def _control_character_class() -> re.Pattern[str]:
    """Control (but not newline and tab), format, surrogate and private-use characters, as one regex.

    A regex instead of a per-character ``unicodedata.category`` loop: ~20x faster on long documents.
    Format characters are listed by scanning the BMP; beyond it only the tag block and the musical
    formatting marks exist in practice.
    """
    fmt = "".join(re.escape(chr(c)) for c in range(0x10000) if unicodedata.category(chr(c)) == "Cf")
    return re.compile(
        "[\x00-\x08\x0b-\x1f\x7f-\x9f" + fmt + "\ud800-\uf8ff\U000f0000-\U0010ffff"
        "\U000e0000-\U000e007f\U0001d173-\U0001d17a]"
    )


_CONTROL = _control_character_class()


def strip_control_characters(text: str) -> str:
    """Drop control, format (soft hyphen, zero-width, BOM), private-use and surrogate characters."""
    return _CONTROL.sub("", text)


def normalize_whitespace(text: str) -> str:
    """One space between words, no trailing spaces, lines kept, paragraphs separated by one blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _MANY_BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()


def normalize_text(text: str, repair_mojibake: bool = True) -> str:
    """The canonical form of a document: repaired, NFC, ё kept, the tokenizer's character rules (special
    spaces, quotes, dashes, stress marks: ``tokenizer.normalization``), no control characters, clean spacing."""
    if repair_mojibake:
        # ftfy's own cheap detector first: fixing is slow and clean text is the common case
        if ftfy.badness.is_bad(text):
            text = ftfy.fix_text(text, config=_FTFY_CONFIG)
        text = repair_legacy_mojibake(text)
    text = normalize_characters(text)  # NFC and the rules the tokenizer carries (tokenizer.normalization)
    text = strip_control_characters(text)
    return normalize_whitespace(text)
