"""Fixtures shared by the shard, TFRecord and loader tests: a small Russian corpus folder and a
tiny SentencePiece tokenizer folder, both with finished manifests, built in a temp folder."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sentencepiece as spm

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")

from experiment.files import sha256_file  # noqa: E402
from experiment.manifest import write_manifest  # noqa: E402

WORDS = (
    "мороз", "и", "солнце", "день", "чудесный", "ещё", "ты", "дремлешь", "друг", "прелестный", "пора",
    "красавица", "проснись", "открой", "сомкнуты", "негой", "взоры", "навстречу", "северной", "авроры",
    "звездою", "севера", "явись", "вечор", "ты", "помнишь", "вьюга", "злилась", "на", "мутном", "небе",
    "мгла", "носилась", "луна", "как", "бледное", "пятно", "сквозь", "тучи", "мрачные", "желтела", "ёлка",
    "ёж", "1837", "год",
)


def make_documents(count: int = 60, seed: int = 0) -> list[dict[str, str]]:
    """Documents of varied length, with paragraphs, punctuation, ё and digits."""
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        paragraphs = []
        for _ in range(rng.randint(1, 3)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(5, 80))]
            words[0] = words[0].capitalize()
            paragraphs.append(" ".join(words) + rng.choice([".", "!", "?", "…"]))
        docs.append({"id": f"doc-{i:04d}", "source": "fixture", "text": "\n\n".join(paragraphs)})
    return docs


def write_corpus(corpus_dir: Path, docs: list[dict[str, str]], per_shard: int = 25) -> None:
    corpus_dir.mkdir(parents=True, exist_ok=True)
    shards = []
    for start in range(0, len(docs), per_shard):
        name = f"docs-{start // per_shard:05d}.jsonl"
        path = corpus_dir / name
        path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs[start:start + per_shard]),
                        encoding="utf-8")
        shards.append({"file": name, "documents": len(docs[start:start + per_shard]),
                       "bytes": path.stat().st_size, "sha256": sha256_file(path)})
    write_manifest(corpus_dir, "corpus", {"shards": shards, "documents": len(docs),
                                          "bytes": sum(s["bytes"] for s in shards), "sources": ["fixture"],
                                          "counts": {}, "config": {}})


def write_tokenizer(tokenizer_dir: Path, docs: list[dict[str, str]], vocab_size: int = 400,
                    special: dict[str, int] | None = None, **options: Any) -> None:
    """Train a tiny SentencePiece model the way recipe 2 does (identity normalization, lossless).

    ``special``: the special ids (default pad 0, unk 1, bos 2, eos 3); -1 leaves one out, as SentencePiece does.
    """
    special = special or {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    options = {"max_sentence_length": 1 << 16, **options}  # the default 4192 bytes drops whole documents
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([d["text"] for d in docs]), model_prefix=str(tokenizer_dir / "spm"),
        vocab_size=vocab_size, model_type="unigram", normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, byte_fallback=True, **{f"{name}_id": i for name, i in special.items()},
        seed_sentencepiece_size=10000, num_threads=1, minloglevel=2, hard_vocab_limit=False, **options,
    )
    write_manifest(tokenizer_dir, "tokenizer", {
        "model_file": "spm.model", "sha256": sha256_file(tokenizer_dir / "spm.model"),
        "vocab_size": spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "spm.model")).get_piece_size(),
        "special_ids": {name: i for name, i in special.items() if i >= 0}})


def shards_cfg(**overrides: object) -> Any:
    from experiment.sections.shards import ShardsConfig

    return ShardsConfig(**{"validation_percent": 10.0, "records_per_shard": 16,
                           "encode_batch_documents": 7, "num_threads": 1, **overrides})


class DisabledRun:
    """Stands in for a W&B run where a test checks the shards, not the tracking."""

    def __init__(self) -> None:
        self.summary: dict[str, object] = {}
        self.artifacts: list[object] = []

    def log_artifact(self, artifact: object) -> None:
        self.artifacts.append(artifact)

    def use_artifact(self, artifact: object) -> None:
        raise TypeError("Cannot use artifact when in offline mode.")


def make_run(tmp_path: Path, docs: list[dict[str, str]] | None = None, seq_len: int = 32,
             **cfg_overrides: object) -> SimpleNamespace:
    """A run folder with corpus and tokenizer stages done, and a config whose shards section is small;
    the rows are ``model.max_seq_len = seq_len`` tokens long (+1)."""
    from experiment.runfolder import RunFolder
    from model.llama.config import LlamaConfig

    docs = docs if docs is not None else make_documents()
    run_folder = RunFolder(tmp_path / "runs" / "t")
    write_corpus(run_folder.corpus, docs)
    write_tokenizer(run_folder.tokenizer, docs)
    cfg = SimpleNamespace(experiment=SimpleNamespace(name="t"), shards=shards_cfg(**cfg_overrides),
                          model=LlamaConfig(max_seq_len=seq_len))
    return SimpleNamespace(cfg=cfg, run_folder=run_folder, docs=docs)


@pytest.fixture(scope="module")
def built_shards(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Concat-packed shards of the fixture corpus (several shards per split)."""
    from data_prep.shards.build import shard_corpus

    run = make_run(tmp_path_factory.mktemp("shards"))
    run.wandb = DisabledRun()
    run.manifest = shard_corpus(run.cfg, run.run_folder, run.wandb)
    return run


def test_fixture_tokenizer_is_lossless(tmp_path: Path) -> None:
    docs = make_documents(10)
    write_tokenizer(tmp_path, make_documents())
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    for doc in docs:
        assert sp.decode(sp.encode(doc["text"])) == doc["text"]
