"""Offline baselines for the report: a Hugging Face byte-level BPE trained on the same text."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokenizer.measured import MeasuredTokenizer, hf_tokenizer_under_test

BASELINE_SPECIAL_TOKENS = ["<pad>", "<unk>", "<s>", "</s>"]


def train_bytelevel_bpe(lines: Iterable[str], vocab_size: int) -> Tokenizer:
    """GPT-2-style byte-level BPE (no prefix space, so decode(encode(x)) == x) at ``vocab_size``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BASELINE_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return tokenizer


def bytelevel_bpe_under_test(tokenizer: Tokenizer, train_seconds: float | None = None) -> MeasuredTokenizer:
    return hf_tokenizer_under_test(tokenizer, "hf_bytelevel_bpe", unk_token="<unk>", train_seconds=train_seconds)
