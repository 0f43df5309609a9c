"""``MeasuredTokenizer``: what the report needs from a tokenizer, whatever library it comes from.

SentencePiece and each baseline are wrapped in it, so the report measures them all the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sentencepiece as spm

from tokenizer.spm import piece_surface


@dataclass
class MeasuredTokenizer:
    """What the report needs from a tokenizer, whatever library it comes from."""

    name: str
    vocab_size: int
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    is_byte_fallback: Callable[[int], bool] | None  # None: the tokenizer has no byte fallback (byte-level)
    is_unknown: Callable[[int], bool]
    surface: Callable[[int], str]  # readable text of one piece, for the piece lists
    train_seconds: float | None = None


def sentencepiece_under_test(sp: spm.SentencePieceProcessor, train_seconds: float | None = None) -> MeasuredTokenizer:
    return MeasuredTokenizer(
        name="sentencepiece",
        vocab_size=sp.get_piece_size(),
        encode=lambda text: sp.encode(text),
        decode=lambda ids: sp.decode(ids),
        is_byte_fallback=sp.is_byte,
        is_unknown=sp.is_unknown,
        surface=lambda i: piece_surface(sp, i) or sp.id_to_piece(i),
        train_seconds=train_seconds,
    )
