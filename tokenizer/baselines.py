"""Offline baselines for the report: a Hugging Face byte-level BPE trained on the same text."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokenizer.measured import MeasuredTokenizer

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
    unk_id = tokenizer.token_to_id("<unk>")
    return MeasuredTokenizer(
        name="hf_bytelevel_bpe",
        vocab_size=tokenizer.get_vocab_size(),
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        is_byte_fallback=None,  # byte-level: every byte is an ordinary token, there is no fallback
        is_unknown=lambda i: i == unk_id,
        surface=lambda i: tokenizer.decode([i], skip_special_tokens=False),
        train_seconds=train_seconds,
    )
