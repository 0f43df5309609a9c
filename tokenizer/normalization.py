"""The one character normalization of the project: corpus building, tokenizer training, sharding and
every evaluation input (held-out text files, task items) go through the same rules, and the trained
SentencePiece model carries them compiled in (``normalizer_spec.precompiled_charsmap``), as does its
Hugging Face export (a ``Precompiled`` normalizer), so any consumer of the tokenizer reproduces them.

The rules are a table of source string -> replacement, applied left to right with the longest source
matching at each position: exactly how SentencePiece applies a compiled ``normalization_rule_tsv``.
``normalize_characters`` applies them in Python (NFC first); a SentencePiece model trained with
``rules_tsv()`` gives the same ids for raw text as for its ``normalize_characters`` form.

Decided on purpose, for Russian text:

- no-break and other fixed-width spaces (U+00A0, U+2007, U+202F, U+2000-U+200A, U+205F, U+3000,
  U+1680) become a plain space: typesetters insert them ("т.\u00a0е.", "1\u00a0000") where other texts
  of the same words have a space, so keeping them would split the vocabulary in two and a model trained
  on cleaned text would meet them only as byte pieces. A tab stays: like runs of spaces it is layout,
  which corpus building collapses;
- U+2028/U+2029 and a carriage return (alone or before a newline) become a newline;
- typographic quotes «» „ “ ” stay (the Russian norm, learned as pieces); the single quotes ‘ ’ ‚ ‛
  become the apostrophe ' and ‟ becomes " (rare variants of the same marks);
- the en and em dashes – — stay (Russian punctuation); the hyphen U+2010, the no-break hyphen U+2011
  and the minus sign U+2212 become '-', the figure dash U+2012 '–' and the horizontal bar U+2015 '—';
- combining stress accents (U+0301, U+0300 and their deprecated twins U+0341, U+0340) are dropped, and so
  are the precomposed stressed ѐ ѝ (Ѐ Ѝ): ordinary Russian text does not mark stress, and dictionaries or
  encyclopedias that do ("Москва́") would otherwise cost byte pieces for the same word. Accented Latin
  letters are kept (their composed forms match first);
- ё stays ё (never folded to е) and й stays й; a decomposed ё or й (е + U+0308, и + U+0306) is composed,
  as is every other character with a canonical composition (NFC);
- control characters (but the newline, the tab and NUL), format characters (soft hyphen, zero-width
  spaces and joiners, BOM, bidi marks), BMP private-use characters, tag characters and the musical
  formatting marks are dropped.

Whitespace runs and blank lines are a document's layout, not characters: corpus building collapses
them (``data_prep.corpus.normalize``), evaluation inputs keep them.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from pathlib import Path

# Recorded in the tokenizer (its normalizer_spec.name and its manifest): a change of any rule below
# is a new name, so a model trained under the old rules is recognisably different.
NORMALIZATION_NAME = "ru_text_v1"

SPECIAL_SPACES = "\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"
STRESS_MARKS = "\u0301\u0300\u0341\u0340"
_EXPLICIT: dict[str, str] = {
    "\r\n": "\n", "\r": "\n", "\u2028": "\n", "\u2029": "\n",
    **{space: " " for space in SPECIAL_SPACES},
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u201f": '"',
    "\u2010": "-", "\u2011": "-", "\u2212": "-", "\u2012": "\u2013", "\u2015": "\u2014",
    **{mark: "" for mark in STRESS_MARKS},
    "\u0344": "\u0308",  # COMBINING GREEK DIALYTIKA TONOS is NFC's diaeresis + acute: the acute is a stress mark
    # stressed е and и: precomposed (Ѐ ѐ Ѝ ѝ) and decomposed with either stress mark
    "\u0400": "\u0415", "\u0450": "\u0435", "\u040d": "\u0418", "\u045d": "\u0438",
    **{f"{base}{mark}": base for base in "еЕиИ" for mark in STRESS_MARKS},
}


def _dropped_characters() -> list[str]:
    """Control (not the newline), format, BMP private-use, tag and musical formatting characters. NUL is
    left out: SentencePiece's rule table cannot hold it as a source (corpus building still drops it)."""
    dropped = [chr(c) for c in [*range(0x01, 0x20), *range(0x7F, 0xA0)] if chr(c) not in "\n\t\r"]
    dropped += [chr(c) for c in range(0x10000) if unicodedata.category(chr(c)) == "Cf"]
    dropped += [chr(c) for c in [*range(0xE000, 0xF900), *range(0xE0000, 0xE0080), *range(0x1D173, 0x1D17B)]]
    return dropped


def _compositions() -> dict[str, str]:
    """NFC as rules: each precomposed character from its full and its one-step canonical decomposition,
    and each character NFC replaces by another (singletons such as U+212B ANGSTROM SIGN). Hangul
    syllables are left out: Russian text has none, and they would double the table."""
    rules: dict[str, str] = {}
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF or 0xAC00 <= code <= 0xD7A3:
            continue
        char = chr(code)
        composed = unicodedata.normalize("NFC", char)
        if composed != char:
            rules[char] = composed
            continue
        full = unicodedata.normalize("NFD", char)
        if full != char:
            rules[full] = char
            one_step = unicodedata.decomposition(char)
            if one_step and not one_step.startswith("<"):
                rules["".join(chr(int(h, 16)) for h in one_step.split())] = char
    return rules


@functools.cache
def character_rules() -> dict[str, str]:
    """Source string -> replacement, every rule of the normalization (explicit rules win over NFC)."""
    rules = _compositions()
    rules.update({char: "" for char in _dropped_characters()})
    rules.update(_EXPLICIT)
    return rules


@functools.cache
def _marks_pattern() -> re.Pattern[str]:
    """Runs of the characters that continue some longer source (combining marks): with the character
    before a run, the only places where a rule longer than one character can apply (CR LF aside)."""
    marks = {c for s in character_rules() if len(s) > 1 and s != "\r\n" for c in s[1:]}
    return re.compile(f"[{re.escape(''.join(sorted(marks)))}]+")


@functools.cache
def _single_table() -> dict[int, str]:
    return {ord(s): d for s, d in character_rules().items() if len(s) == 1}


@functools.cache
def _longest_source() -> int:
    return max(len(s) for s in character_rules())


def _longest_match(segment: str) -> str:
    """SentencePiece's rule application on one segment: at each position the longest source, else the
    character itself."""
    rules, out, i = character_rules(), [], 0
    while i < len(segment):
        for j in range(min(len(segment), i + _longest_source()), i, -1):
            if segment[i:j] in rules:
                out.append(rules[segment[i:j]])
                i = j
                break
        else:
            out.append(segment[i])
            i += 1
    return "".join(out)


def apply_rules(text: str) -> str:
    """The rules alone, as the tokenizer's compiled normalizer applies them (longest source first at
    each position). Outside a run of marks only one-character rules can apply, so those stretches go
    through ``str.translate``; no replacement is itself a source, so nothing is mapped twice."""
    text = text.replace("\r\n", "\n")
    table, pieces, done = _single_table(), [], 0
    for run in _marks_pattern().finditer(text):
        start = max(run.start() - 1, done)  # the base character the marks sit on
        pieces += [text[done:start].translate(table), _longest_match(text[start:run.end()])]
        done = run.end()
    pieces.append(text[done:].translate(table))
    return "".join(pieces)


def normalize_characters(text: str) -> str:
    """NFC, then the rules: what every text is before it is tokenized, trained on or measured."""
    return apply_rules(unicodedata.normalize("NFC", text))


def rules_tsv() -> str:
    """The rules in SentencePiece's ``normalization_rule_tsv`` format: hex code points, tab, hex code points."""
    def hex_points(text: str) -> str:
        return " ".join(f"{ord(c):X}" for c in text)

    return "".join(f"{hex_points(src)}\t{hex_points(dst)}\n" for src, dst in sorted(character_rules().items()))


def rules_sha256() -> str:
    return hashlib.sha256(rules_tsv().encode("utf-8")).hexdigest()


def write_rules_tsv(path: Path) -> Path:
    """The rules file SentencePiece's trainer compiles (its path is not kept in the model)."""
    path.write_text(rules_tsv(), encoding="utf-8")
    return path


def normalization_record() -> dict[str, str]:
    """What a tokenizer manifest records about the normalization its model carries."""
    return {"name": NORMALIZATION_NAME, "rules_sha256": rules_sha256()}
