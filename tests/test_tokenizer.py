"""Recipe 02: training, contracts, round-trip, determinism, errors and the Hugging Face export."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from experiment.config import build_config
from experiment.errors import ConfigError, DataError, MissingStageError
from experiment.files import atomic_write_bytes
from experiment.manifest import write_manifest
from experiment.runfolder import RunFolder
from tests.conftest import import_extra
from tokenizer.hf_export import build_hf_tokenizer
from tokenizer.spm import load_tokenizer, piece_byte_lengths
from tokenizer.texts import cut_long_line, training_lines
from tokenizer.train import train_sentencepiece, train_tokenizer, trainer_options

SUBJECTS = ["Старый мельник", "Её сестра", "Молодой учитель", "Наш сосед", "Ёжик", "Командир полка", "Девочка",
            "Лесник", "Пётр Иванович", "Анна Сергеевна", "Почтальон", "Художник"]
VERBS = ["медленно шёл", "быстро ехал", "долго смотрел", "тихо говорил", "весело пел", "громко звал",
         "часто думал", "никогда не писал", "вдруг вспомнил", "уже знал"]
PLACES = ["к реке", "через тёмный лес", "в город", "на ярмарку", "вдоль берега", "по широкой дороге",
          "в старую церковь", "за рекой", "у окна", "под ёлкой"]
TAILS = [", и никто не знал почему.", " — так было всегда.", "; вечером пошёл снег.", ": «Ещё рано!»",
         ". В 1812 году всё изменилось.", "… А потом наступила зима.", " (об этом писали в газете №7).",
         ", хотя погода была плохая.", "? Нет, не совсем.", "!"]
TRICKY = ("Ёлка и «ёлочки» — в 2024 году, №15: 3,14 и 1 000 000 рублей.\n\n"
          "Latin words like Python and JAX inside русского текста; emoji 😀🎉.\n"
          "Двойные  пробелы,   тройные, табуляция\tи\nновые строки.\n")


SYLLABLES = ["ра", "ло", "ми", "ве", "ско", "гор", "дан", "ку", "пре", "сла", "ва", "но", "ти", "жу", "че", "бор",
             "ём", "ль", "зи", "ха", "фе", "щу", "ры", "ан", "ост", "ип", "ель", "як"]


def place_name(rng: random.Random) -> str:
    """An invented town name: many distinct substrings, so the fixture supports a few hundred pieces."""
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()


def fixture_documents(count: int = 240, seed: int = 0) -> list[dict[str, Any]]:
    """Russian documents built from a phrase bank and invented names."""
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        paragraphs = []
        for _ in range(rng.randint(2, 4)):
            sentences = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(PLACES)} около села "
                         f"{place_name(rng)}{rng.choice(TAILS)}" for _ in range(rng.randint(3, 6))]
            paragraphs.append(" ".join(sentences))
        source = "prose" if i % 3 else "news"
        docs.append({"id": f"{source}/{i:05d}", "source": source,
                     "text": unicodedata.normalize("NFC", "\n\n".join(paragraphs))})
    return docs


def write_corpus(corpus_dir: Path, docs: list[dict[str, Any]]) -> None:
    """A finished corpus folder as recipe 01 leaves it (docs-NNNNN.jsonl + manifest)."""
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    atomic_write_bytes(corpus_dir / "docs-00000.jsonl", data)
    shards = [{"file": "docs-00000.jsonl", "documents": len(docs), "bytes": len(data), "sha256": ""}]
    write_manifest(corpus_dir, "corpus", {"shards": shards, "documents": len(docs), "bytes": len(data),
                                          "sources": sorted({d["source"] for d in docs}), "counts": {}, "config": {}})


def make_config(root: Path, model: dict[str, Any] | None = None, **tokenizer: Any) -> Any:
    tree = {
        "experiment": {"name": "tok", "run_root": str(root), "seed": 0},
        "tokenizer": {"vocab_size": 600, "report_max_docs": 50, **tokenizer},
        "shards": {"validation_percent": 10.0},
        "model": model or {"max_seq_len": 128},
    }
    return build_config(tree)  # what load_config returns: presets resolved


class RecordingRun:
    """Stands in for a W&B run and keeps what the stage logged."""

    def __init__(self) -> None:
        self.logged: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.artifacts: list[Any] = []

    def log(self, data: dict[str, Any]) -> None:
        self.logged.append(data)

    def log_artifact(self, artifact: Any) -> None:
        self.artifacts.append(artifact)


def run_stage(root: Path, docs: list[dict[str, Any]], model: dict[str, Any] | None = None,
              **tokenizer: Any) -> tuple[RunFolder, RecordingRun]:
    cfg = make_config(root, model, **tokenizer)
    folder = RunFolder.for_config(cfg)
    write_corpus(folder.corpus, docs)
    run = RecordingRun()
    train_tokenizer(cfg, folder, run)
    return folder, run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunFolder, RecordingRun]:
    return run_stage(tmp_path_factory.mktemp("tok"), fixture_documents())


def test_stage_writes_the_contract(trained: tuple[RunFolder, RecordingRun]) -> None:
    folder, run = trained
    sp, manifest = load_tokenizer(folder.tokenizer)
    assert manifest["vocab_size"] == sp.get_piece_size() == 600
    assert manifest["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert [sp.id_to_piece(4), sp.id_to_piece(5)] == ["\n", "\n\n"]
    vocab_lines = (folder.tokenizer / "spm.vocab").read_text(encoding="utf-8").split("\n")
    assert vocab_lines[0].split("\t")[0] == "<pad>"
    for name in ("report.json", "report.md", "hf/tokenizer.json", "hf/tokenizer_config.json"):
        assert (folder.tokenizer / name).is_file(), name
    assert [a.type for a in run.artifacts] == ["tokenizer"]
    assert any("tokenizer/report" in entry for entry in run.logged)


def test_report_measures_both_tokenizers_on_heldout(trained: tuple[RunFolder, RecordingRun]) -> None:
    folder, _ = trained
    report = json.loads((folder.tokenizer / "report.json").read_text(encoding="utf-8"))
    assert set(report["tokenizers"]) == {"sentencepiece", "hf_bytelevel_bpe"}
    assert set(report["heldout"]["sources"]) == {"news", "prose"}
    sp_all = report["tokenizers"]["sentencepiece"]["overall"]
    assert sp_all["documents"] == report["heldout"]["documents_measured"] > 0
    assert sp_all["roundtrip_exact"] == 1.0
    assert sp_all["chars_per_token"] > 1.3  # merges happened: well above one character per token
    assert sp_all["unk_rate"] == 0.0
    assert report["tokenizers"]["sentencepiece"]["coverage"]["cyrillic"]["share"] == 1.0
    assert report["tokenizers"]["hf_bytelevel_bpe"]["overall"]["roundtrip_exact"] == 1.0
    assert report["tokenizers"]["hf_bytelevel_bpe"]["overall"]["byte_fallback_share"] is None
    md = (folder.tokenizer / "report.md").read_text(encoding="utf-8")
    assert "| chars_per_token |" in md and "hf_bytelevel_bpe" in md


def test_report_defines_coverage_by_the_characters_it_checked(trained: tuple[RunFolder, RecordingRun]) -> None:
    """The coverage rows said neither which characters nor what counts as covered."""
    folder, _ = trained
    report = json.loads((folder.tokenizer / "report.json").read_text(encoding="utf-8"))
    cyrillic = report["tokenizers"]["sentencepiece"]["coverage"]["cyrillic"]
    assert len(cyrillic["characters"]) == 66 and "ё" in cyrillic["characters"] and "Ё" in cyrillic["characters"]
    md = (folder.tokenizer / "report.md").read_text(encoding="utf-8")
    assert ("cyrillic coverage is the share of the 66 Cyrillic letters of Russian `абвгдеё" in md
            and "that each encode, alone, as one ordinary token (not unknown, not byte-fallback pieces)" in md)
    assert "punctuation coverage is the share of the 21 punctuation marks `.,:;!?()" in md and "not covered: " in md


def test_heldout_documents_are_not_trained_on(tmp_path: Path) -> None:
    """A word only in held-out documents must not become a piece."""
    from experiment.split import is_validation

    docs = fixture_documents()
    heldout = next(d for d in docs if is_validation(d["id"], 10.0))
    heldout["text"] += " Зубрёжкаоченьдлинноеслово" * 50
    folder, _ = run_stage(tmp_path, docs, baseline_hf_bpe=False, hf_export=False)
    sp, _ = load_tokenizer(folder.tokenizer)
    assert len(sp.encode("Зубрёжкаоченьдлинноеслово")) > 3


def test_tricky_russian_roundtrips(trained: tuple[RunFolder, RecordingRun]) -> None:
    sp, _ = load_tokenizer(trained[0].tokenizer)
    ids = sp.encode(TRICKY)
    assert sp.decode(ids) == TRICKY
    newline, paragraph = sp.piece_to_id("\n"), sp.piece_to_id("\n\n")
    # newlines are whole pieces, never byte fallback; a paragraph break is one token
    assert ids.count(newline) + 2 * ids.count(paragraph) == TRICKY.count("\n") and ids.count(paragraph) == 1
    assert sp.encode("ё") == [sp.piece_to_id("ё")] and not sp.is_byte(sp.piece_to_id("ё"))
    assert all(sp.is_byte(i) for i in sp.encode("😀"))  # outside the vocabulary: byte fallback, no <unk>
    assert sp.unk_id() not in ids


def test_piece_byte_lengths_sum_to_utf8_length(trained: tuple[RunFolder, RecordingRun]) -> None:
    sp, _ = load_tokenizer(trained[0].tokenizer)
    lengths = piece_byte_lengths(sp)
    assert lengths.dtype.name == "int32" and lengths.shape == (sp.get_piece_size(),)
    assert lengths[[sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()]].tolist() == [0, 0, 0, 0]
    for text in [TRICKY, *(d["text"] for d in fixture_documents(20, seed=7))]:
        ids = sp.encode(text)
        assert sp.decode(ids) == text
        assert int(lengths[ids].sum()) == len(text.encode("utf-8"))


def test_same_corpus_config_and_seed_give_identical_model(tmp_path: Path) -> None:
    """Two stage runs in separate folders write byte-identical spm.model files."""
    docs = fixture_documents(150)
    hashes = []
    for name in ("first", "second"):
        folder, _ = run_stage(tmp_path / name, docs, vocab_size=550, baseline_hf_bpe=False, hf_export=False)
        hashes.append(json.loads((folder.tokenizer / "manifest.json").read_text(encoding="utf-8"))["sha256"])
    assert hashes[0] == hashes[1]
    tok = make_config(tmp_path, vocab_size=550).tokenizer  # the same model again, from the train side only
    lines = training_lines(docs, 10.0, tok.max_sentence_length)
    assert train_sentencepiece(lines, trainer_options(tok, seed=0)) == (folder.tokenizer / "spm.model").read_bytes()


def test_load_refuses_unfinished_or_changed_model(tmp_path: Path, trained: tuple[RunFolder, RecordingRun]) -> None:
    with pytest.raises(MissingStageError, match="run recipes/02_train_tokenizer.py first"):
        load_tokenizer(tmp_path)
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained[0].tokenizer, copy)
    with (copy / "spm.model").open("ab") as handle:
        handle.write(b"\0")
    with pytest.raises(DataError, match="sha256"):
        load_tokenizer(copy)


def test_long_lines_are_cut_not_dropped() -> None:
    line = "слово " * 5000
    pieces = list(cut_long_line(line, 1000))
    assert "".join(pieces) == line
    assert all(len(p.encode("utf-8")) <= 1000 for p in pieces)
    giant = "я" * 3000
    assert "".join(cut_long_line(giant, 1001)) == giant


@pytest.mark.parametrize(
    ("docs", "overrides", "error", "pattern"),
    [
        ([], {}, DataError, "no training documents"),
        ([{"id": "a", "source": "s", "text": "Короткий текст."}], {}, DataError, "too small"),
        (None, {"vocab_size": 20_000}, ConfigError, r"tokenizer\.vocab_size.*larger than this corpus allows"),
        # a caller that does not read the extra sources must not train without them silently
        (None, {"extra_train_sources": [{"kind": "files", "paths": ["extra.txt"]}]}, ConfigError,
         r"tokenizer\.extra_train_sources.*run recipes/02_train_tokenizer\.py"),
    ],
)
def test_bad_input_gives_one_clear_error(tmp_path: Path, docs: Any, overrides: dict[str, Any],
                                         error: type[Exception], pattern: str) -> None:
    docs = fixture_documents(60) if docs is None else docs
    with pytest.raises(error, match=pattern):
        run_stage(tmp_path, docs, baseline_hf_bpe=False, **overrides)
    assert not (tmp_path / "tok" / "tokenizer" / "manifest.json").exists()


def test_bad_config_values_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer\.vocab_size"):
        make_config(tmp_path, vocab_size=100)
    with pytest.raises(ConfigError, match=r"tokenizer\.pad_id/unk_id/bos_id/eos_id"):
        make_config(tmp_path, pad_id=1)
    with pytest.raises(ConfigError, match=r"tokenizer\.extra_train_sources\[0\]\.paths"):
        make_config(tmp_path, extra_train_sources=[{"kind": "files"}])


def test_extra_train_sources_that_give_nothing_are_one_clear_error(tmp_path: Path) -> None:
    from data_prep.corpus.sources import normalized_texts
    from experiment.sections.corpus import SourceConfig

    missing = [SourceConfig(kind="files", paths=[str(tmp_path / "nowhere.txt")])]
    with pytest.raises(DataError, match=r"^tokenizer\.extra_train_sources\[0\]\.paths: .*nowhere\.txt does not exist"):
        normalized_texts(missing, tmp_path, "tokenizer.extra_train_sources")  # now, before the corpus is read
    cfg = make_config(tmp_path, baseline_hf_bpe=False, hf_export=False,
                      extra_train_sources=[{"kind": "files", "paths": ["empty.txt"]}])
    folder = RunFolder.for_config(cfg)
    write_corpus(folder.corpus, fixture_documents(60))
    with pytest.raises(DataError, match=r"tokenizer\.extra_train_sources': the sources gave no text"):
        train_tokenizer(cfg, folder, RecordingRun(), lambda: iter(()))
    assert not (folder.tokenizer / "manifest.json").exists()


def test_hf_tokenizers_export_gives_identical_ids(trained: tuple[RunFolder, RecordingRun]) -> None:
    from tokenizers import Tokenizer

    sp, _ = load_tokenizer(trained[0].tokenizer)
    hf = Tokenizer.from_file(str(trained[0].tokenizer / "hf" / "tokenizer.json"))
    for text in [TRICKY, *(d["text"] for d in fixture_documents(30, seed=11))]:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ids == sp.encode(text)
        assert hf.decode(ids, skip_special_tokens=False) == text


def test_transformers_loads_export_offline_with_identical_ids(trained: tuple[RunFolder, RecordingRun]) -> None:
    transformers = import_extra("transformers", "hf")
    sp, _ = load_tokenizer(trained[0].tokenizer)
    hf = transformers.AutoTokenizer.from_pretrained(str(trained[0].tokenizer / "hf"), local_files_only=True)
    for text in [TRICKY, "Текст с <s> и </s> внутри.", *(d["text"] for d in fixture_documents(30, seed=13))]:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == sp.encode(text)
        assert hf.decode(ids) == text
    assert (hf.pad_token_id, hf.unk_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2, 3)


def test_preset_only_config_exports_the_presets_length(tmp_path: Path) -> None:
    """model.preset alone: the export's model_max_length is the preset's, resolved at load."""
    folder, _ = run_stage(tmp_path, fixture_documents(150), model={"preset": "125m"}, baseline_hf_bpe=False)
    config = json.loads((folder.tokenizer / "hf" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == 2048


def test_bpe_model_export_gives_identical_ids() -> None:
    from tokenizers import Tokenizer

    lines = [line for d in fixture_documents(120) for line in d["text"].split("\n") if line]
    cfg = make_config(Path("unused"), vocab_size=550, model_type="bpe")
    sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(lines, trainer_options(cfg.tokenizer, seed=0)))
    hf = Tokenizer.from_str(build_hf_tokenizer(sp).to_str())
    for text in [TRICKY, *(d["text"] for d in fixture_documents(30, seed=17))]:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ids == sp.encode(text)
        assert hf.decode(ids, skip_special_tokens=False) == text


@pytest.mark.integration
def test_recipe_runs_offline_and_logs_the_artifact(tmp_path: Path, trained: tuple[RunFolder, RecordingRun]) -> None:
    """The thin CLI end to end: config file, offline W&B run, tokenizer folder, artifact on disk; a
    tokenizer.extra_train_sources text trains the tokenizer beside the corpus."""
    import yaml

    from tests.recipe_runner import error_line, run_recipe

    extra = tmp_path / "extra.txt"  # the corpus never says "дистрибутив": without this text it is many pieces
    extra.write_text("\n".join(f"Дистрибутив\u00a0номер {i} собран, дистрибутив проверен." for i in range(300)),
                     encoding="utf-8")
    config = tmp_path / "tok.yaml"
    config.write_text(yaml.safe_dump({
        "experiment": {"name": "cli", "run_root": str(tmp_path / "runs")},
        "tokenizer": {"vocab_size": 600, "report_max_docs": 20, "baseline_hf_bpe": False,
                      "extra_train_sources": [{"kind": "files", "paths": [str(extra)]}]},
        "shards": {"validation_percent": 10.0},
        "wandb": {"mode": "offline"},
    }), encoding="utf-8")
    run_root = tmp_path / "runs" / "cli"
    write_corpus(run_root / "corpus", fixture_documents(120))
    run_recipe("02_train_tokenizer.py", config, timeout=120)
    sp, manifest = load_tokenizer(run_root / "tokenizer")
    assert manifest["vocab_size"] == 600
    assert list((run_root / "wandb").rglob("*.wandb")), "no offline W&B run was written"
    # read as recipe 01 reads it: one document, the no-break spaces normalized
    normalized = extra.read_text(encoding="utf-8").replace("\u00a0", " ")
    assert (manifest["extra_documents"], manifest["extra_chars"]) == (1, len(normalized))
    assert f"and {len(normalized):,} characters (1 documents) of tokenizer.extra_train_sources" in (
        run_root / "tokenizer" / "report.md").read_text(encoding="utf-8")
    without, _ = load_tokenizer(trained[0].tokenizer)
    assert len(sp.encode(" дистрибутив")) <= 2 < len(without.encode(" дистрибутив"))

    failed = run_recipe("02_train_tokenizer.py", config, "tokenizer.vocab_size=50000", check=False, timeout=120)
    assert failed.returncode == 2
    assert "tokenizer.vocab_size" in error_line(failed) and "Traceback" not in failed.stderr
    assert not (run_root / "tokenizer" / "manifest.json").exists()


def test_default_coverage_keeps_a_symbol_rare_as_in_technical_text() -> None:
    """A symbol at about 1 in 10,000 characters (§ in a man page) is a piece under the default coverage;
    SentencePiece's usual 0.9995 leaves it to byte fallback."""
    from experiment.sections.tokenizer import TokenizerConfig

    lines = [line for d in fixture_documents() for line in d["text"].split("\n") if line]
    lines = [f"{line} § 3" if i % 20 == 0 else line for i, line in enumerate(lines)]
    share = sum(line.count("§") for line in lines) / sum(len(line) for line in lines)
    assert 2e-5 < share < 3e-4  # between the two coverages' tails (1e-5 and 5e-4)
    for coverage, kept in ((TokenizerConfig().character_coverage, True), (0.9995, False)):
        options = trainer_options(TokenizerConfig(vocab_size=600, character_coverage=coverage), seed=0)
        sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(lines, options))
        ids = sp.encode("§")
        assert (len(ids) == 1 and not sp.is_byte(ids[0])) == kept, coverage


def test_numbers_are_whole_by_default_and_split_digits_gives_one_token_per_digit_after_a_space_piece() -> None:
    """By default BPE learns numbers as it learns words (a frequent " 1812" one piece, as the byte-level
    peer has it). With tokenizer.split_digits=true digits stay one token each, but " 1812" is "▁1" 8 1 2
    (no lone "▁" before every number); with tokenizer.space_digit_pieces=false too the ten pieces are not
    added. The Hugging Face export gives the same ids."""
    from experiment.sections.tokenizer import SPACE_DIGIT_PIECES, TokenizerConfig

    lines = [line for d in fixture_documents() for line in d["text"].split("\n") if line]
    lines += ["Это было в 1812 году, а потом в 1825 году."] * 40  # years frequent enough to be merged
    text = "В 1812 году, 12.05.2023 и 3,14; 12 и 34 (стр. 7)"

    def trained(**tok: Any) -> spm.SentencePieceProcessor:
        options = trainer_options(TokenizerConfig(vocab_size=600, **tok), seed=0)
        return spm.SentencePieceProcessor(model_proto=train_sentencepiece(lines, options))

    default = trained()
    assert default.encode(" 1812", out_type=str) == ["▁1812"]
    assert default.piece_to_id("▁1") == default.unk_id()  # no space-digit pieces without the split
    assert default.decode(default.encode(text)) == text
    assert build_hf_tokenizer(default).encode(text, add_special_tokens=False).ids == default.encode(text)

    sp = trained(split_digits=True)
    assert [sp.id_to_piece(i) for i in range(4, 16)] == ["\n", "\n\n", *SPACE_DIGIT_PIECES]
    pieces = sp.encode(text, out_type=str)
    assert pieces[1:5] == ["▁1", "8", "1", "2"] and "▁" not in pieces
    assert all(len(p.lstrip("▁")) == 1 for p in pieces if any(c.isdigit() for c in p))  # one digit per token
    assert sp.decode(sp.encode(text)) == text
    assert build_hf_tokenizer(sp).encode(text, add_special_tokens=False).ids == sp.encode(text)
    plain_split = trained(split_digits=True, space_digit_pieces=False)
    assert plain_split.piece_to_id("▁1") == plain_split.unk_id()
    assert plain_split.encode(" 7", out_type=str) == ["▁", "7"]
