from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class TokenizerConfig:
    vocab_size: int = 32_000
    model_type: Literal["unigram", "bpe"] = "unigram"
    character_coverage: float = 0.9995
    byte_fallback: bool = True
    split_digits: bool = True
    input_sentence_size: int = 2_000_000  # sampled lines for multi-GB corpora
    max_sentence_length: int = 65_536  # bytes; SentencePiece's default 4192 drops long paragraphs
    user_defined_symbols: list[str] = field(default_factory=list)
    num_threads: int = 2
