"""Document quality filters (Gopher- and FineWeb-style, Russian thresholds) and PII placeholders.

``quality_rejection`` returns the name of the first rule a document breaks, or None; the names are
the rejection reasons counted in the corpus manifest. Each rule is a small function of the text so
that a test can check it alone.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from experiment.sections.corpus import QualityConfig

# Frequent Russian function words; real Russian prose of 50+ words nearly always has several, while
# word lists, code, tables and other Cyrillic languages written without them do not.
_STOP_WORDS_TEXT = """
и в во не что на я с со он как а то все она так его но да ты к у же вы за бы по только ее её мне было
вот от меня еще ещё нет о из ему теперь когда даже ну ли если уже или ни быть был него до вас нибудь
опять уж вам ведь там потом себя ничего ей может они тут где есть надо ней для мы тебя их чем была сам
чтоб без будто чего раз тоже себе под будет тогда кто этот того потому этого какой совсем ним здесь
этом один почти мой тем чтобы нее неё сейчас были куда зачем всех никогда можно при наконец два об
другой хоть после над больше тот через эти нас про всего них какая много разве три эту моя впрочем
хорошо свою этой перед иногда лучше чуть том нельзя такой им более всегда конечно всю между это
"""
RUSSIAN_STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

TERMINAL_PUNCTUATION = (".", "!", "?", "…", '"', "»", "“", "”", "'")
# Not dashes: a Russian line starting with "–" or "—" is dialogue, not a list item.
BULLETS = ("•", "●", "○", "■", "□", "▪", "▫", "◦", "‣", "*", "·", "►", "✓", "✔")
_WORD_EDGE_PUNCT = "\"'«»„“”()[]{}.,:;!?…—–-*•·/\\|<>"
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[^\W\d_]{2,}(?![\w-])")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d.]*\d)")
_IPV6 = re.compile(r"(?<![:\w])(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?![:\w])")


def replace_pii(text: str, email_placeholder: str, ip_placeholder: str) -> str:
    """E-mail and IP addresses become placeholders (FineWeb anonymises the same two kinds)."""
    text = _EMAIL.sub(email_placeholder, text)
    text = _IPV4.sub(ip_placeholder, text)
    return _IPV6.sub(ip_placeholder, text)


class DocumentStats:
    """The word, line and paragraph views of a document that the rules share (computed once)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.words = text.split()
        self.stripped_words = [w.strip(_WORD_EDGE_PUNCT) for w in self.words]
        self.lines = [line for line in text.split("\n") if line.strip()]
        self.paragraphs = [p for p in text.split("\n\n") if p.strip()]


def _mean_word_length(stats: DocumentStats, cfg: QualityConfig) -> bool:
    lengths = [len(w) for w in stats.stripped_words if w]
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    return cfg.min_mean_word_length <= mean <= cfg.max_mean_word_length


def _symbol_ratio(stats: DocumentStats, cfg: QualityConfig) -> bool:
    symbols = stats.text.count("#") + stats.text.count("...") + stats.text.count("…")
    return symbols / max(len(stats.words), 1) <= cfg.max_symbol_word_ratio


def _bullet_lines(stats: DocumentStats, cfg: QualityConfig) -> bool:
    bullets = sum(line.lstrip().startswith(BULLETS) for line in stats.lines)
    return bullets / max(len(stats.lines), 1) <= cfg.max_bullet_lines_share


def _ellipsis_lines(stats: DocumentStats, cfg: QualityConfig) -> bool:
    ellipses = sum(line.rstrip().endswith(("...", "…")) for line in stats.lines)
    return ellipses / max(len(stats.lines), 1) <= cfg.max_ellipsis_lines_share


def _alpha_words(stats: DocumentStats, cfg: QualityConfig) -> bool:
    alpha = sum(any(ch.isalpha() for ch in w) for w in stats.words)
    return alpha / max(len(stats.words), 1) >= cfg.min_alpha_words_share


def _stop_words(stats: DocumentStats, cfg: QualityConfig) -> bool:
    found = {w.lower() for w in stats.stripped_words} & RUSSIAN_STOP_WORDS
    return len(found) >= cfg.min_stop_words


def _terminal_punct(stats: DocumentStats, cfg: QualityConfig) -> bool:
    ending = sum(line.rstrip().endswith(TERMINAL_PUNCTUATION) for line in stats.lines)
    return ending / max(len(stats.lines), 1) >= cfg.min_terminal_punct_lines_share


def _duplicate_lines(stats: DocumentStats, cfg: QualityConfig) -> bool:
    counts = Counter(line.strip() for line in stats.lines)
    repeated_chars = sum(len(line) * (n - 1) for line, n in counts.items() if n > 1)
    total = sum(len(line.strip()) for line in stats.lines)
    return repeated_chars / max(total, 1) <= cfg.max_duplicate_lines_chars_share


def _short_lines(stats: DocumentStats, cfg: QualityConfig) -> bool:
    short = sum(len(line.strip()) <= cfg.short_line_chars for line in stats.lines)
    return short / max(len(stats.lines), 1) <= cfg.max_short_lines_share


def _duplicate_paragraphs(stats: DocumentStats, cfg: QualityConfig) -> bool:
    counts = Counter(p.strip() for p in stats.paragraphs)
    repeated = sum(n - 1 for n in counts.values() if n > 1)
    return repeated / max(len(stats.paragraphs), 1) <= cfg.max_duplicate_paragraphs_share


def top_ngram_chars_share(words: list[str], n: int) -> float:
    """Gopher: characters covered by the most frequent word n-gram, over all word characters."""
    if len(words) < n:
        return 0.0
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    gram, count = grams.most_common(1)[0]
    if count < 2:
        return 0.0
    total = sum(len(w) for w in words)
    return sum(len(w) for w in gram) * count / max(total, 1)


def _make_top_ngram_rule(n: int) -> Callable[[DocumentStats, QualityConfig], bool]:
    def rule(stats: DocumentStats, cfg: QualityConfig) -> bool:
        words = [w.lower() for w in stats.stripped_words if w]
        return top_ngram_chars_share(words, n) <= cfg.max_top_ngram_chars_share[n - 2]

    return rule


# (reason, rule) in the order they are checked; cheap and decisive rules first.
RULES: list[tuple[str, Callable[[DocumentStats, QualityConfig], bool]]] = [
    ("too_few_words", lambda s, c: len(s.words) >= c.min_words),
    ("too_many_words", lambda s, c: len(s.words) <= c.max_words),
    ("mean_word_length", _mean_word_length),
    ("symbol_ratio", _symbol_ratio),
    ("bullet_lines", _bullet_lines),
    ("ellipsis_lines", _ellipsis_lines),
    ("alpha_words", _alpha_words),
    ("stop_words", _stop_words),
    ("terminal_punctuation", _terminal_punct),
    ("duplicate_lines", _duplicate_lines),
    ("short_lines", _short_lines),
    ("duplicate_paragraphs", _duplicate_paragraphs),
    ("top_2gram", _make_top_ngram_rule(2)),
    ("top_3gram", _make_top_ngram_rule(3)),
    ("top_4gram", _make_top_ngram_rule(4)),
]
QUALITY_REASONS = [reason for reason, _ in RULES]


def quality_rejection(text: str, cfg: QualityConfig) -> str | None:
    """The reason of the first quality rule ``text`` breaks, or None if it passes them all."""
    stats = DocumentStats(text)
    for reason, passes in RULES:
        if not passes(stats, cfg):
            return reason
    return None


# ------------------------------------------------------------------ FineWeb-2 rus_Cyrl preset
# The filter set of FineWeb-2 (github.com/huggingface/fineweb-2, fineweb-2-pipeline.py) with the Russian
# thresholds of its configs/rus_Cyrl.yml, each metric as datatrove 0.10.1 defines it (GopherRepetitionFilter
# with the paragraph rules and dup_line_char_frac off, FineWebQualityFilter with the short-line rule off and
# char_duplicates_ratio 0.1, GopherQualityFilter). Words: FineWeb-2 splits Russian with spaCy's blank "ru"
# tokenizer, which is not installed here; FINEWEB2_WORD approximates it (runs of letters/digits, decimal
# numbers kept whole, "..." one token, every other punctuation mark a token of its own).

FINEWEB2_WORD = re.compile(r"\d+(?:[.,]\d+)+|\w+|\.\.\.|[^\w\s]")
# datatrove's terminal punctuation set, restricted to the marks that end lines of Cyrillic text
FINEWEB2_TERMINAL = (".", "!", "?", "‼", "‽", "⁇", "⁈", "⁉")
_FINEWEB2_RUS_STOP_WORDS_TEXT = "в и на с года по году из был к не от что за для его как а он также до после"
FINEWEB2_RUS_STOP_WORDS = frozenset(_FINEWEB2_RUS_STOP_WORDS_TEXT.split())


@dataclass(frozen=True)
class FineWeb2Thresholds:
    """FineWeb-2's per-language thresholds (configs/<lang>.yml) and the pipeline's fixed settings."""

    dup_line_frac: float = 0.322
    top_n_grams: tuple[tuple[int, float], ...] = ((2, 0.184), (3, 0.164), (4, 0.146))
    dup_n_grams: tuple[tuple[int, float], ...] = ((5, 0.168), (6, 0.156), (7, 0.145), (8, 0.133), (9, 0.121),
                                                  (10, 0.109))
    line_punct_thr: float = 0.231
    char_dup_ratio: float = 0.1  # FineWeb-2's global change (FineWeb: 0.01)
    new_line_ratio: float = 0.139
    min_doc_words: int = 50
    max_doc_words: int = 100_000
    min_avg_word_length: float = 3
    max_avg_word_length: float = 11
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    max_non_alpha_words_ratio: float = 0.713  # (datatrove's name) the least share of words with a letter
    min_stop_words: int = 2
    stop_words: frozenset[str] = FINEWEB2_RUS_STOP_WORDS
    language_score: float = 0.9  # GlotLID's confidence; lingua's equivalent is lingua_min_confidence
    # lingua's confidence that rejects as much non-Russian Cyrillic text as GlotLID >= 0.9 is meant to while
    # keeping Russian prose: measured in bench/fineweb2_langid.py (bench/README.md, "FineWeb-2 language score")
    lingua_min_confidence: float = 0.9


FINEWEB2_RUS = FineWeb2Thresholds()


def fineweb2_words(text: str) -> list[str]:
    return FINEWEB2_WORD.findall(text)


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items seen before, their characters), as Gopher counts repeated lines."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def top_ngram_chars(words: list[str], n: int) -> int:
    """Characters of the most frequent word n-gram (joined by spaces) times its count; 0 without n-grams."""
    grams = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    return len(gram) * count


def duplicated_ngram_chars(words: list[str], n: int) -> int:
    """Characters of word n-grams (joined without spaces) that repeat an earlier one, not counting the
    words of a repeat twice: after a repeat the scan jumps past it."""
    seen: set[str] = set()
    chars = i = 0
    while i <= len(words) - n:
        gram = "".join(words[i:i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


def _is_symbol_word(word: str) -> bool:
    return all(unicodedata.category(ch)[0] in "PSC" for ch in word)


def fineweb2_rejection(text: str, t: FineWeb2Thresholds = FINEWEB2_RUS) -> str | None:
    """The first FineWeb-2 rule ``text`` breaks (in the pipeline's order), or None: a plain function of one
    document, for the local pool and the Beam workers alike. The language score is checked apart
    (``cleaning.filter_rejection``), as FineWeb-2 checks it before dedup."""
    if not text.strip():
        return "fw2_empty"
    n_chars = len(text)
    # GopherRepetitionFilter
    lines = re.split(r"\n+", text)
    if _duplicates(lines)[0] / len(lines) > t.dup_line_frac:
        return "fw2_dup_line_frac"
    words = fineweb2_words(text)
    for n, share in t.top_n_grams:
        if top_ngram_chars(words, n) / n_chars > share:
            return f"fw2_top_{n}gram"
    for n, share in t.dup_n_grams:
        if duplicated_ngram_chars(words, n) / n_chars > share:
            return f"fw2_dup_{n}gram"
    # FineWebQualityFilter
    filled = [line for line in text.split("\n") if line.strip()]
    if sum(line.endswith(FINEWEB2_TERMINAL) for line in filled) / len(filled) < t.line_punct_thr:
        return "fw2_line_punct"
    if _duplicates(filled)[1] / max(len(text.replace("\n", "")), 1) > t.char_dup_ratio:
        return "fw2_char_dup"
    if not words or text.count("\n") / len(words) > t.new_line_ratio:
        return "fw2_new_lines"
    # GopherQualityFilter
    real_words = [w for w in words if not _is_symbol_word(w)]
    if len(real_words) < t.min_doc_words:
        return "fw2_short_doc"
    if len(real_words) > t.max_doc_words:
        return "fw2_long_doc"
    mean_length = sum(map(len, real_words)) / len(real_words)
    if not t.min_avg_word_length <= mean_length <= t.max_avg_word_length:
        return "fw2_avg_word_length"
    if (text.count("#") / len(words) > t.max_symbol_word_ratio
            or (text.count("...") + text.count("…")) / len(words) > t.max_symbol_word_ratio):
        return "fw2_symbols"
    all_lines = text.splitlines()
    if sum(line.lstrip().startswith(("•", "-")) for line in all_lines) / len(all_lines) > t.max_bullet_lines_ratio:
        return "fw2_bullets"
    if sum(line.rstrip().endswith(("...", "…")) for line in all_lines) / len(all_lines) > t.max_ellipsis_lines_ratio:
        return "fw2_ellipsis_lines"
    if sum(any(ch.isalpha() for ch in w) for w in words) / len(words) < t.max_non_alpha_words_ratio:
        return "fw2_alpha_words"
    if len(t.stop_words & set(words)) < t.min_stop_words:
        return "fw2_stop_words"
    return None

