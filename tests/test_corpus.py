"""Per-document corpus functions: normalization, language ID, quality filters, PII, dedup."""

from __future__ import annotations

import dataclasses
import random
import unicodedata
from pathlib import Path

import pytest

from data_prep.corpus.cleaning import clean_document, filter_rejection
from data_prep.corpus.dedup import Deduplicator, exact_key, minhash_signature
from data_prep.corpus.documents import RawDocument
from data_prep.corpus.langid import cyrillic_share, detect_language, sample_for_langid
from data_prep.corpus.normalize import decode_bytes, normalize_text
from data_prep.corpus.quality import QUALITY_REASONS, quality_rejection, replace_pii
from experiment.config import build_dataclass
from experiment.errors import ConfigError
from experiment.sections.corpus import CorpusConfig, DedupConfig, QualityConfig
from tests.dedup_eval import light_edit, planted_rates

FIXTURES = Path(__file__).parent / "fixtures" / "corpus"
LANGS = ("ru", "uk", "be", "bg", "kk", "sr", "mk", "en")


def fixture_text(name: str) -> str:
    return normalize_text((FIXTURES / name).read_text(encoding="utf-8"))


RU = fixture_text("ru_prose.txt")
RU_NEWS = fixture_text("ru_news.txt")


# ---------------------------------------------------------------- normalization

@pytest.mark.parametrize("codec", ["utf-8", "cp1251", "koi8_r"])
def test_mojibake_read_as_latin1_is_repaired(codec: str) -> None:
    original = "Съешь же ещё этих мягких французских булок, да выпей чаю."
    garbled = original.encode(codec).decode("latin-1")
    assert garbled != original
    assert normalize_text(garbled) == original


def test_utf8_read_as_cp1252_is_repaired() -> None:
    original = "Ёлка стояла в углу, и на ней горели свечи."
    # what Windows software shows: cp1252 where it defines a byte, the byte's latin-1 character elsewhere
    garbled = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in original.encode("utf-8"))
    assert "Ð" in garbled
    assert normalize_text(garbled) == original


def test_clean_russian_text_is_untouched_by_repair() -> None:
    text = "Он сказал: «Ёлка» — и “ушёл”… Это № 5, цена 100 ₽."
    assert normalize_text(text) == text


def test_nfc_composes_and_keeps_yo() -> None:
    decomposed = unicodedata.normalize("NFD", "ёж и йод, Ёлкин")
    assert len(decomposed) > len("ёж и йод, Ёлкин")
    result = normalize_text(decomposed)
    assert result == "ёж и йод, Ёлкин"
    assert "е" + "\u0308" not in result and "ё" in result and "Ё" in result


def test_control_characters_and_whitespace() -> None:
    raw = "Первая\u00a0строка\u00ad  с\u200bмусором\x07\r\nвторая строка   \r\n\r\n\r\n\r\n\tТретий абзац\ufeff "
    assert normalize_text(raw) == "Первая строка смусором\nвторая строка\n\nТретий абзац"


def test_decode_bytes_handles_legacy_codecs_and_rejects_garbage() -> None:
    text = "Мороз и солнце; день чудесный! Ещё ты дремлешь, друг прелестный."
    assert decode_bytes(text.encode("utf-8")) == (text, None)
    assert decode_bytes(b"\xef\xbb\xbf" + text.encode("utf-8")) == (text, None)
    assert decode_bytes(text.encode("cp1251")) == (text, None)
    assert decode_bytes(text.encode("koi8_r")) == (text, None)
    assert decode_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR") == (None, "binary")
    assert decode_bytes(bytes(range(0x80, 0x100)) * 4)[1] == "invalid_utf8"


# ---------------------------------------------------------------- language ID

def test_cyrillic_share() -> None:
    assert cyrillic_share("abc где") == 0.5
    assert cyrillic_share("12345 !!!") == 0.0
    assert cyrillic_share(RU) > 0.99
    assert cyrillic_share(fixture_text("en.txt")) == 0.0


@pytest.mark.parametrize("name, expected", [
    ("ru_prose.txt", "ru"), ("ru_news.txt", "ru"), ("uk.txt", "uk"), ("be.txt", "be"), ("bg.txt", "bg"),
    ("en.txt", "en"),
])
def test_lingua_tells_cyrillic_neighbours_apart(name: str, expected: str) -> None:
    language, confidence = detect_language(fixture_text(name), LANGS, 1500)
    assert language == expected
    assert confidence > 0.65


def test_sample_for_langid_takes_start_middle_and_end() -> None:
    text = " ".join(f"слово{i}" for i in range(3000))
    sample = sample_for_langid(text, 600)
    assert len(sample) <= 600
    assert "слово0 " in sample and "слово2999" in sample and "слово15" in sample
    assert sample_for_langid("короткий текст", 600) == "короткий текст"


@pytest.mark.parametrize("name, reason", [
    ("ru_prose.txt", None), ("ru_news.txt", None), ("uk.txt", "language_uk"), ("be.txt", "language_be"),
    ("bg.txt", "language_bg"), ("en.txt", "low_cyrillic"), ("mixed_ru_en.txt", "low_cyrillic"),
])
def test_language_filters_keep_russian_only(name: str, reason: str | None) -> None:
    assert filter_rejection(fixture_text(name), CorpusConfig()) == reason


def test_mixed_text_past_the_prefilter_is_judged_by_lingua() -> None:
    cfg = CorpusConfig(min_cyrillic_share=0.0)
    assert filter_rejection(fixture_text("mixed_ru_en.txt"), cfg) == "language_en"
    assert filter_rejection(fixture_text("en.txt"), cfg) == "language_en"


# ---------------------------------------------------------------- quality filters

def _words(n: int) -> str:
    vocabulary = ["дом", "река", "лес", "поле", "город", "школа", "книга", "окно", "стол", "дорога", "небо", "море",
                  "гора"]
    return " ".join(vocabulary[i % len(vocabulary)] + str(i // len(vocabulary)) for i in range(n))


QUALITY_CASES = {
    "too_few_words": "Короткая заметка о погоде в городе: и снова дождь, и опять ветер.",
    "too_many_words": None,  # built from max_words below
    "mean_word_length": " ".join(["а", "и", "в", "к", "с", "у", "о", "я", "не", "он"] * 8) + ".",
    "symbol_ratio": "\n".join(f"#тег{i} и #метка{i} и #пост{i} что #ещё{i} на #лайк{i}." for i in range(12)),
    "bullet_lines": "\n".join(f"• пункт номер {i} списка покупок и дел на завтра, что не забыть" for i in range(12)),
    "ellipsis_lines": "\n".join(f"Строка {i} и тут он что-то сказал, но не договорил…" for i in range(12)),
    "alpha_words": " ".join(["и", "в", "не", "что"] + ["12:30", "45,6", "+7", "2024", "—", "%"] * 15) + ".",
    "stop_words": "\n".join(f"Красная машина{i} быстро проехала мимо большого здания." for i in range(12)),
    "terminal_punctuation": "\n".join(f"Меню раздела {i} и что в нём на странице сайта" for i in range(12)),
    "duplicate_lines": RU + "\n" + "\n".join(["Подписывайтесь на наш канал и ставьте лайки, это важно."] * 6),
    "short_lines": "\n".join(f"Вот {noun} опять спит." for noun in
                             ["лес", "дом", "сад", "пруд", "луг", "двор", "мост", "храм", "холм", "дуб", "клён", "вяз",
                              "кот", "пёс"]),
    # a short repeated paragraph: few characters (the line rule lets it through), many paragraphs
    "duplicate_paragraphs": "\n\n".join(p + "\n\nЧитать далее." for p in (RU + "\n\n" + RU_NEWS).split("\n\n"))
                            + "\n\nЧитать далее.",
    "top_2gram": " ".join(["купить дёшево"] * 40) + " и не только в нашем магазине, что на углу.",
}


@pytest.mark.parametrize("reason", [r for r in QUALITY_REASONS if r in QUALITY_CASES])
def test_each_quality_rule_rejects_its_case(reason: str) -> None:
    cfg = QualityConfig()
    text = QUALITY_CASES[reason]
    if text is None:
        cfg = QualityConfig(max_words=80)
        text = RU
    assert quality_rejection(text, cfg) == reason


@pytest.mark.parametrize("name", ["ru_prose.txt", "ru_news.txt", "ru_letter.txt", "ru_science.txt",
                                  "ru_recipe.txt", "ru_dialogue.txt", "ru_verse.txt"])
def test_russian_prose_dialogue_and_verse_pass_every_filter(name: str) -> None:
    text = fixture_text(name)
    assert quality_rejection(text, QualityConfig()) is None
    assert filter_rejection(text, CorpusConfig()) is None


@pytest.mark.parametrize("name, quality_reason, language", [
    ("uk.txt", None, "uk"), ("be.txt", None, "be"), ("bg.txt", None, "bg"), ("en.txt", "stop_words", "en"),
    ("mixed_ru_en.txt", "stop_words", "en"),
])
def test_quality_rules_judge_structure_and_lingua_judges_language(name: str, quality_reason: str | None,
                                                                  language: str) -> None:
    """Well-formed Ukrainian, Belarusian and Bulgarian prose passes the structure rules (their function
    words overlap Russian ones), which is why language ID runs first; English has no Russian stop words."""
    text = fixture_text(name)
    assert quality_rejection(text, QualityConfig()) == quality_reason
    assert quality_rejection(text, QualityConfig(min_stop_words=0)) is None
    assert filter_rejection(text, CorpusConfig(min_cyrillic_share=0.0)) == f"language_{language}"


def test_quality_thresholds_are_configurable() -> None:
    text = QUALITY_CASES["stop_words"]
    assert quality_rejection(text, QualityConfig(min_stop_words=0, max_duplicate_lines_chars_share=1.0,
                                                 max_top_ngram_chars_share=[1.0, 1.0, 1.0])) is None


def test_higher_order_ngram_rules() -> None:
    cfg = QualityConfig(max_top_ngram_chars_share=[1.0, 0.18, 0.16], max_duplicate_lines_chars_share=1.0)
    text = " ".join(["и снова в путь"] * 30) + " " + _words(40) + "."
    assert quality_rejection(text, cfg) in ("top_3gram", "top_4gram")


def test_bad_quality_thresholds_name_the_key() -> None:
    with pytest.raises(ConfigError, match="corpus.quality.max_short_lines_share"):
        build_dataclass(CorpusConfig, {"quality": {"max_short_lines_share": 1.5}}, "corpus")
    with pytest.raises(ConfigError, match="corpus.langid.target"):
        build_dataclass(CorpusConfig, {"langid": {"target": "xx"}}, "corpus")
    with pytest.raises(ConfigError, match=r"corpus.sources\[0\].weight"):
        build_dataclass(CorpusConfig, {"sources": [{"kind": "debian", "weight": 0}]}, "corpus")


# ---------------------------------------------------------------- PII

def test_pii_is_replaced_by_placeholders() -> None:
    text = ("Пишите на ivan.petrov+news@mail.ru или admin@пример.рф, сервер 192.168.0.17 и 10.0.0.1, "
            "адрес 2001:0db8:85a3:0000:0000:8a2e:0370:7334. Версия 1.2.3.4.5 и цена 3.14 — не адреса.")
    out = replace_pii(text, "<EMAIL>", "<IP>")
    assert "mail.ru" not in out and "пример.рф" not in out and "192.168" not in out and "8a2e" not in out
    assert out.count("<EMAIL>") == 2 and out.count("<IP>") == 3
    assert "1.2.3.4.5" in out and "3.14" in out


def test_clean_document_replaces_pii_in_kept_text() -> None:
    raw = RawDocument(0, "t:0", "t", "test", RU + "\n\nПишите мне: semen@example.org, я отвечу.", None, 0)
    doc = clean_document(raw, CorpusConfig())
    assert doc.reject is None and doc.text is not None
    assert "<EMAIL>" in doc.text and "semen@" not in doc.text


# ---------------------------------------------------------------- dedup

def test_exact_duplicates_keep_the_first() -> None:
    cfg = DedupConfig()
    dedup = Deduplicator(cfg)
    sig = minhash_signature(RU, cfg)
    assert dedup.check("a", exact_key(RU), sig) == (None, None)
    assert dedup.check("b", exact_key(RU), sig) == ("exact", "a")
    assert dedup.check("c", exact_key(RU_NEWS), minhash_signature(RU_NEWS, cfg)) == (None, None)


def test_planted_near_duplicates_are_caught_and_distinct_texts_kept() -> None:
    cfg = DedupConfig()
    dedup = Deduplicator(cfg)
    rng = random.Random(0)
    base = [RU, RU_NEWS, fixture_text("uk.txt"), fixture_text("be.txt"), fixture_text("bg.txt"), fixture_text("en.txt")]
    for i, text in enumerate(base):
        assert dedup.check(f"orig{i}", exact_key(text), minhash_signature(text, cfg)) == (None, None)
    caught = 0
    for i, text in enumerate(base * 3):
        copy = light_edit(text, rng, edit_rate=0.025)
        kind, earlier = dedup.check(f"copy{i}", exact_key(copy), minhash_signature(copy, cfg))
        caught += kind is not None
    # 3 edits in ~120 words leave a word-5-gram Jaccard of about 0.75-0.85, which 14 bands x 8 rows
    # catch with probability 0.8-0.97 each
    assert caught >= 15


def test_min_jaccard_verifies_bucket_collisions() -> None:
    strict = DedupConfig(bands=28, rows=1, min_jaccard=0.9)  # 1-row bands collide for almost anything
    loose = dataclasses.replace(strict, min_jaccard=0.0)
    for cfg, expected in ((strict, None), (loose, "near")):
        dedup = Deduplicator(cfg)
        dedup.check("a", exact_key(RU), minhash_signature(RU, cfg))
        edited = light_edit(RU, random.Random(1), edit_rate=0.2)
        assert dedup.check("b", exact_key(edited), minhash_signature(edited, cfg))[0] == expected


def test_light_edit_changes_a_few_words_only() -> None:
    rng = random.Random(5)
    edited = light_edit(RU, rng, edit_rate=0.02)
    assert edited != RU
    original, changed = RU.split(" "), edited.split(" ")
    assert abs(len(original) - len(changed)) <= 3
    assert len(set(original) ^ set(changed)) <= 6


def test_planted_rates_from_manifest_sources() -> None:
    manifest = {"sources": [
        {"name": "clean", "documents_in": 1000, "kept": 890, "rejected": 100, "duplicates": 10},
        {"name": "planted", "documents_in": 100, "kept": 3, "rejected": 7, "duplicates": 90},
    ]}
    rates = planted_rates(manifest, "planted")
    assert rates["planted_past_filters"] == 93 and rates["caught_share"] == 90 / 93
    assert rates["clean_past_filters"] == 900 and rates["clean_removed_share"] == 10 / 900
