"""Recipe 02: train the SentencePiece tokenizer on the train side of the cleaned corpus.

Input is streamed line by line from the corpus (``tokenizer.texts``) and SentencePiece keeps a seeded
sample of ``input_sentence_size`` lines, so a multi-GB corpus never sits in memory whole.
"""

from __future__ import annotations

import io
import itertools
import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import sentencepiece as spm

from experiment.config import redact
from experiment.corpus_format import iter_documents, read_corpus_manifest, verify_corpus
from experiment.errors import ConfigError, DataError
from experiment.files import atomic_write_bytes, atomic_write_text, check_removable, remove_file, sha256_file
from experiment.manifest import invalidate
from experiment.progress import progress
from experiment.schema import ExperimentConfig
from experiment.sections.tokenizer import TokenizerConfig
from experiment.stages import TOKENIZER
from experiment.storage import remove_tree
from tokenizer.measured import sentencepiece_under_test
from tokenizer.model_proto import with_normalizer_name
from tokenizer.normalization import NORMALIZATION_NAME, normalization_record, write_rules_tsv
from tokenizer.report import build_report, log_report, write_report
from tokenizer.spm import MODEL_FILE, VOCAB_FILE
from tokenizer.texts import NEWLINE, CorpusSplit, split_corpus, text_lines, training_lines

log = logging.getLogger("tokenizer")

# The smallest training text worth a tokenizer; below it SentencePiece's own errors are cryptic.
MIN_TRAINING_CHARS = 1_000
_VOCAB_TOO_HIGH = re.compile(r"Vocabulary size (?:is )?too high \((\d+)\)\. Please set it to a value <= (\d+)")


def user_symbols(tok: TokenizerConfig) -> list[str]:
    """User-defined symbols: the newline first (so it never needs byte fallback), then the config's, then
    the "▁<digit>" pieces of ``tokenizer.space_digit_pieces``."""
    symbols = [NEWLINE] + [s for s in tok.user_defined_symbols if s != NEWLINE]
    return symbols + [s for s in tok.space_digit_symbols() if s not in symbols]


def trainer_options(tok: TokenizerConfig, seed: int) -> dict[str, Any]:
    """SentencePiece trainer arguments; the fixed ones are what docs/CONTRACTS.md section 2 promises."""
    return {
        "model_type": tok.model_type,
        "vocab_size": tok.vocab_size,
        "character_coverage": tok.character_coverage,
        "byte_fallback": tok.byte_fallback,
        "split_digits": tok.split_digits,
        # tokenizer.normalization's rules compiled into the model (nmt_nfkc would map \n to space and № to
        # No); "identity" only to measure a model without them
        "normalization": tok.normalization,
        "add_dummy_prefix": False,
        "remove_extra_whitespaces": False,
        "allow_whitespace_only_pieces": True,  # runs of spaces (indentation) get their own pieces
        "user_defined_symbols": user_symbols(tok),
        "required_chars": tok.required_chars,
        "pad_id": tok.pad_id,
        "unk_id": tok.unk_id,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "input_sentence_size": tok.input_sentence_size,
        "shuffle_input_sentence": True,
        "max_sentence_length": tok.max_sentence_length,
        "max_sentencepiece_length": tok.max_piece_length,
        "num_threads": tok.num_threads,
        "random_seed": seed,
        "minloglevel": 2,
    }


def train_sentencepiece(lines: Iterable[str], options: dict[str, Any]) -> bytes:
    """Train and return the serialized model; SentencePiece's internal errors become one clear line.

    ``options["normalization"]``: ``NORMALIZATION_NAME`` compiles ``tokenizer.normalization``'s rules into
    the model (named so in its normalizer spec), ``"identity"`` leaves text as it is."""
    options = dict(options)
    seed = options.pop("random_seed")
    normalization = options.pop("normalization", NORMALIZATION_NAME)
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if normalization == NORMALIZATION_NAME:
                options["normalization_rule_tsv"] = str(write_rules_tsv(Path(tmp) / "rules.tsv"))
            else:
                options["normalization_rule_name"] = normalization
            spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, **options)
    except RuntimeError as exc:
        message = str(exc)
        too_high = _VOCAB_TOO_HIGH.search(message)
        if too_high:
            raise ConfigError(
                f"config key 'tokenizer.vocab_size': {too_high.group(1)} is larger than this corpus allows "
                f"(at most {too_high.group(2)}); lower it or use a bigger corpus"
            ) from exc
        if "sentences_.empty()" in message:
            raise DataError("the corpus has no training text left after the held-out split") from exc
        raise DataError(f"SentencePiece training failed: {message.strip().splitlines()[0]}") from exc
    return named_normalization(model.getvalue(), normalization)


def named_normalization(model_bytes: bytes, name: str) -> bytes:
    """The model with its normalizer spec named after the rules it carries (SentencePiece names any
    rules file "user_defined" and keeps the temporary file's path, which means nothing later)."""
    return with_normalizer_name(model_bytes, name)


def vocab_text(sp: spm.SentencePieceProcessor) -> str:
    """The ``spm.vocab`` listing: piece and score per line, in id order (SentencePiece's own format)."""
    return "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))


def check_trainable(split: CorpusSplit, corpus_dir: Path) -> None:
    if split.train_documents == 0:
        raise DataError(f"corpus {corpus_dir} has no training documents (all {split.heldout_documents} are held out "
                        "or the corpus is empty)")
    if split.train_chars < MIN_TRAINING_CHARS:
        raise DataError(f"corpus {corpus_dir} is too small to train a tokenizer: {split.train_chars} characters of "
                        f"training text, at least {MIN_TRAINING_CHARS} needed")


def special_ids(tok: TokenizerConfig) -> dict[str, int]:
    return {"pad": tok.pad_id, "unk": tok.unk_id, "bos": tok.bos_id, "eos": tok.eos_id}


def train_tokenizer(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any,
                    extra_texts: Callable[[], Iterable[str]] | None = None) -> dict[str, Any]:
    """Recipe 02 entry point: train (or, with ``tokenizer.adopt_from``, adopt a base model's), write
    ``tokenizer/`` and its report, log the W&B artifact. ``extra_texts`` returns a fresh stream of
    ``tokenizer.extra_train_sources``' texts (read by the recipe: the readers live in ``data_prep``)."""
    tok: TokenizerConfig = cfg.tokenizer
    if tok.extra_train_sources and extra_texts is None and not tok.adopt_from:
        raise ConfigError("config key 'tokenizer.extra_train_sources': this caller does not read them; "
                          "run recipes/02_train_tokenizer.py")
    if tok.adopt_from:
        from tokenizer.adopt import adopt_tokenizer

        return adopt_tokenizer(cfg, run_folder, wandb_run)
    out_dir = run_folder.tokenizer
    corpus_dir = run_folder.corpus
    validation_percent = cfg.shards.validation_percent
    # a corpus edited since recipe 01 wrote it is refused (as recipe 03 refuses it) before the old tokenizer goes
    verify_corpus(corpus_dir, read_corpus_manifest(corpus_dir))
    invalidate(out_dir)

    log.info("reading the corpus in %s (held-out share %.1f%%)", corpus_dir, validation_percent)
    split = split_corpus(corpus_dir, validation_percent, tok.report_max_docs, tok.heldout_sources)
    check_trainable(split, corpus_dir)
    log.info("training a %s SentencePiece model, vocabulary %d, on %d documents (%.1f M characters); after the "
             "lines are read it fits silently, which takes minutes at 32k on a large corpus",
             tok.model_type, tok.vocab_size, split.train_documents, split.train_chars / 1e6)
    started = time.perf_counter()
    extra_train = {"extra_documents": 0, "extra_chars": 0}

    # checked before training, which on a large corpus takes hours: any() stops at the first text
    if extra_texts is not None and not any(extra_texts()):
        raise DataError("config key 'tokenizer.extra_train_sources': the sources gave no text")

    def counted_extra() -> Iterator[str]:
        for text in extra_texts() if extra_texts is not None else ():
            extra_train["extra_documents"] += 1
            extra_train["extra_chars"] += len(text)
            yield text

    lines = progress(itertools.chain(
        training_lines(iter_documents(corpus_dir), validation_percent, tok.max_sentence_length, tok.heldout_sources),
        text_lines(counted_extra(), tok.max_sentence_length)), desc="feeding SentencePiece", unit="line", leave=False)
    model_bytes = train_sentencepiece(lines, trainer_options(tok, cfg.experiment.seed))
    train_seconds = time.perf_counter() - started
    log.info("SentencePiece trained in %.1f s", train_seconds)
    if extra_texts is not None:
        log.info("of which tokenizer.extra_train_sources: %d documents, %.1f M characters",
                 extra_train["extra_documents"], extra_train["extra_chars"] / 1e6)

    for adopted in ("tokenizer.json", "tokenizer.model"):  # an earlier adoption's model (tokenizer.adopt)
        remove_file(out_dir / adopted)
    atomic_write_bytes(out_dir / MODEL_FILE, model_bytes)
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    atomic_write_text(out_dir / VOCAB_FILE, vocab_text(sp))

    report = build_report(cfg, sentencepiece_under_test(sp, train_seconds), split, corpus_dir, extra_texts,
                          extra_train if extra_texts is not None else None)
    write_report(out_dir, report)

    if tok.hf_export:
        from tokenizer.hf_export import export_hf

        export_hf(sp, out_dir / "hf", special_ids(tok), model_max_length=cfg.model.max_seq_len)
    elif (out_dir / "hf").exists():  # an export left by an earlier run would not match this model
        check_removable(out_dir / "hf")
        remove_tree(out_dir / "hf")

    manifest = {
        "model_file": MODEL_FILE,
        "sha256": sha256_file(out_dir / MODEL_FILE),
        "vocab_size": sp.get_piece_size(),
        "special_ids": special_ids(tok),
        "model_type": tok.model_type,
        "normalization": (normalization_record() if tok.normalization == NORMALIZATION_NAME
                          else {"name": tok.normalization}),
        "user_defined_symbols": user_symbols(tok),
        "train_documents": split.train_documents,
        "train_chars": split.train_chars,
        **(extra_train if extra_texts is not None else {}),
        "heldout_documents_measured": len(split.heldout_docs()),
        "hf_export": "hf" if tok.hf_export else None,
        "config": {**redact(asdict(tok)), "seed": cfg.experiment.seed, "validation_percent": validation_percent},
    }
    TOKENIZER.write_manifest(out_dir, manifest)
    log.info("tokenizer written to %s", out_dir)
    log_report(wandb_run, report, out_dir, artifact_name=f"{cfg.experiment.name}-tokenizer")
    return manifest
