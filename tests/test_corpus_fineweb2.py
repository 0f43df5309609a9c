"""The FineWeb-2 rus_Cyrl filter preset (each threshold crossed by one document step, the reason
flipping exactly there), FineWeb-2 rehydration by cluster size, and the corpus keys that turn them on."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from data_prep.corpus import quality
from data_prep.corpus.dedup import ClusterSizes, rehydration_copies
from data_prep.corpus.quality import FINEWEB2_RUS as T
from data_prep.corpus.quality import fineweb2_rejection, fineweb2_words

_C, _V = "бвгдзклмнпрстфхцчш", "аеиоуя"


def word(i: int, length: int = 5) -> str:
    """The i-th distinct Cyrillic word of ``length`` letters (consonant-vowel pattern)."""
    letters = []
    for pos in range(length):
        alphabet = _C if pos % 2 == 0 else _V
        i, r = divmod(i, len(alphabet))
        letters.append(alphabet[r])
    return "".join(letters)


def line(i: int) -> str:
    """A plain sentence of unique words with two stop words: 8 words and a full stop."""
    return f"и {' '.join(word(6 * i + j) for j in range(5))} в {word(6 * i + 5)}."


def doc(lines: int = 60, start: int = 0) -> str:
    return "\n".join(line(start + i) for i in range(lines))


def crossing(build: Callable[[int], str], metric: Callable[[str], float], threshold: float, reason: str,
             rejects_above: bool = True, tolerance: float = 0.03) -> None:
    """The first step k whose document crosses ``threshold`` is rejected for ``reason``; step k-1, within
    ``tolerance`` of the threshold on the other side, is not rejected for it."""
    over = (lambda v: v > threshold) if rejects_above else (lambda v: v < threshold)
    k = next(k for k in range(1, 300) if over(metric(build(k))))
    inside, outside = build(k - 1), build(k)
    assert abs(metric(inside) - threshold) <= tolerance, (metric(inside), threshold)
    assert fineweb2_rejection(inside) != reason
    assert fineweb2_rejection(outside) == reason


def test_a_plain_russian_document_passes() -> None:
    assert fineweb2_rejection(doc()) is None


def test_dup_line_frac() -> None:
    def build(k: int) -> str:
        return doc(40) + "\n" + "\n".join([line(999)] * (k + 1))

    lines = lambda t: t.split("\n")  # noqa: E731
    crossing(build, lambda t: (len(lines(t)) - len(set(lines(t)))) / len(lines(t)), T.dup_line_frac,
             "fw2_dup_line_frac")


@pytest.mark.parametrize(("n", "share"), T.top_n_grams)
def test_top_n_gram(n: int, share: float) -> None:
    gram = " ".join(word(9000 + j) for j in range(n))

    def build(k: int) -> str:  # the n-gram once in each of the first k lines
        return "\n".join(f"{gram} {line(i)}" if i < k else line(i) for i in range(60))

    crossing(build, lambda t: quality.top_ngram_chars(fineweb2_words(t), n) / len(t), share, f"fw2_top_{n}gram")


@pytest.mark.parametrize(("n", "share"), T.dup_n_grams)
def test_duplicated_n_grams(n: int, share: float) -> None:
    def build(k: int) -> str:  # k distinct passages of n words, each twice between unique words: no line
        # repeats, no n-gram stands out, and only n-grams inside a passage repeat
        passages = [" ".join(word(90_000 + n * j + w, 7) for w in range(n)) for j in range(k)]
        return "\n".join([doc(40)] + [f"и {word(50_000 + 4 * j + c)} {passages[j]} в {word(50_002 + 4 * j + c)}."
                                       for j in range(k) for c in (0, 1)])

    crossing(build, lambda t: quality.duplicated_ngram_chars(fineweb2_words(t), n) / len(t), share,
             f"fw2_dup_{n}gram", tolerance=0.04)


def test_line_punctuation() -> None:
    def build(k: int) -> str:  # k lines lose their full stop
        return "\n".join(line(i)[:-1] if i < k else line(i) for i in range(60))

    ending = lambda t: sum(s.endswith(".") for s in t.split("\n")) / len(t.split("\n"))  # noqa: E731
    crossing(build, ending, T.line_punct_thr, "fw2_line_punct", rejects_above=False, tolerance=0.02)


def test_char_dup_ratio() -> None:
    def build(k: int) -> str:  # one line repeated k times, spread out
        return "\n".join(line(i) + ("\n" + line(999) if i % 3 == 0 and i // 3 < k else "") for i in range(90))

    def dup_chars(t: str) -> float:
        lines = [s for s in t.split("\n") if s.strip()]
        return quality._duplicates(lines)[1] / len(t.replace("\n", ""))

    crossing(build, dup_chars, T.char_dup_ratio, "fw2_char_dup", tolerance=0.02)


def test_new_line_ratio() -> None:
    def build(k: int) -> str:  # k empty lines between sentences
        return doc(60).replace("\n", "\n\n", k)

    crossing(build, lambda t: t.count("\n") / len(fineweb2_words(t)), T.new_line_ratio, "fw2_new_lines",
             tolerance=0.005)


def test_document_words() -> None:
    words = ["и", "в"] + [word(i) for i in range(200)]
    build = lambda k: " ".join(words[:k]) + "."  # noqa: E731
    assert fineweb2_rejection(build(T.min_doc_words - 1)) == "fw2_short_doc"
    assert fineweb2_rejection(build(T.min_doc_words)) is None


@pytest.mark.parametrize(("length", "rejected"), [(2, True), (3, False), (11, False), (12, True)])
def test_average_word_length_bounds(length: int, rejected: bool) -> None:
    text = " ".join(word(i, length) for i in range(60)) + "."  # the mean word length is exactly `length`
    assert (fineweb2_rejection(text) == "fw2_avg_word_length") == rejected


@pytest.mark.parametrize("mark", ["#", "…"])
def test_symbol_word_ratio(mark: str) -> None:
    def build(k: int) -> str:  # k marks spread over the lines
        return "\n".join(f"{line(i)[:-1]}{f' {mark}' * (k // 40 + (i < k % 40))}." for i in range(40))

    count = lambda t: t.count("#") + t.count("…") + t.count("...")  # noqa: E731
    crossing(build, lambda t: count(t) / len(fineweb2_words(t)), T.max_symbol_word_ratio, "fw2_symbols",
             tolerance=0.005)


def test_bullet_lines() -> None:
    def build(k: int) -> str:
        return "\n".join(f"- {line(i)}" if i < k else line(i) for i in range(40))

    share = lambda t: sum(s.startswith("-") for s in t.split("\n")) / len(t.split("\n"))  # noqa: E731
    crossing(build, share, T.max_bullet_lines_ratio, "fw2_bullets")


def test_ellipsis_lines() -> None:
    def build(k: int) -> str:
        return "\n".join(f"{line(i)[:-1]}..." if i < k else line(i) for i in range(60))

    share = lambda t: sum(s.endswith("...") for s in t.split("\n")) / len(t.split("\n"))  # noqa: E731
    crossing(build, share, T.max_ellipsis_lines_ratio, "fw2_ellipsis_lines", tolerance=0.02)


def test_alpha_words() -> None:
    def build(k: int) -> str:  # numbers after the sentences of the first lines, one per step
        return "\n".join(f"{line(i)[:-1]}{''.join(f' {1000 + 40 * m + i}' for m in range(k // 40 + (i < k % 40)))}."
                         for i in range(40))

    def alpha(t: str) -> float:
        words = fineweb2_words(t)
        return sum(any(ch.isalpha() for ch in w) for w in words) / len(words)

    crossing(build, alpha, T.max_non_alpha_words_ratio, "fw2_alpha_words", rejects_above=False, tolerance=0.005)


def test_stop_words() -> None:
    assert T.stop_words == set(quality._FINEWEB2_RUS_STOP_WORDS_TEXT.split()) and len(T.stop_words) == 22
    one = doc().replace(" в ", " ")  # only "и" left
    assert fineweb2_rejection(one) == "fw2_stop_words"
    assert fineweb2_rejection(one.replace("и ", "и после ", 1)) is None


def test_rehydration_table() -> None:
    expected = {1: 1, 2: 2, 3: 3, 4: 3, 5: 5, 99: 5, 100: 8, 999: 8, 1000: 1, 50_000: 1}
    assert {size: rehydration_copies(size) for size in expected} == expected
    clusters = ClusterSizes()
    for doc_id, of in [("b", "a"), ("c", "b"), ("d", "a"), ("y", "x")]:  # c duplicates a duplicate of a
        clusters.add_duplicate(doc_id, of)
    assert clusters.sizes == {"a": 4, "x": 2}
    assert [clusters.copies(d) for d in ("a", "x", "z")] == [3, 2, 1]


def test_corpus_with_the_preset_and_rehydration(tmp_path: Path) -> None:
    from tests.test_corpus_build import make_cfg, run

    texts = [doc(30, start=100 * i) for i in range(4)] + [doc(30, start=0)] * 2 + ["и в " + "ааа " * 60]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    cfg = make_cfg(tmp_path, [{"kind": "files", "paths": [str(src)]}], filters="fineweb2-rus", workers=1,
                   langid={"enabled": False}, dedup={"rehydrate": True})
    manifest, docs = run(cfg)
    assert manifest["counts"]["rejected"] == {"fw2_top_2gram": 1}  # the "ааа ааа ..." text
    assert manifest["rehydrated_copies"] == 2  # doc 0 and its two exact copies: a cluster of 3 -> 3 copies
    assert manifest["documents"] == len(docs) == 4 + 2
    assert [d["text"] for d in docs].count(texts[0]) == 3
