"""``MeasuredTokenizer``: what the report needs from a tokenizer, whatever library it comes from.

SentencePiece and each baseline are wrapped in it, so the report measures them all the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def sentencepiece_under_test(sp: spm.SentencePieceProcessor, train_seconds: float | None = None,
                             name: str = "sentencepiece") -> MeasuredTokenizer:
    return MeasuredTokenizer(
        name=name,
        vocab_size=sp.get_piece_size(),
        encode=lambda text: sp.encode(text),
        decode=lambda ids: sp.decode(ids),
        is_byte_fallback=sp.is_byte,
        is_unknown=sp.is_unknown,
        surface=lambda i: piece_surface(sp, i) or sp.id_to_piece(i),
        train_seconds=train_seconds,
    )


BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def hf_tokenizer_under_test(tokenizer: Any, name: str, *, unk_token: str | None = None,
                            train_seconds: float | None = None) -> MeasuredTokenizer:
    """A ``tokenizers.Tokenizer``: byte-level BPE (no fallback: every byte is a token) or a
    SentencePiece-style model whose ``<0xNN>`` pieces are its byte fallback. ``unk_token``: the
    unknown piece when the model does not name one itself."""
    model = json.loads(tokenizer.to_str()).get("model") or {}
    unk_id = tokenizer.token_to_id(unk_token or model.get("unk_token") or "")
    is_byte_fallback = None
    if model.get("byte_fallback"):
        def is_byte_fallback(i: int) -> bool:
            return bool(BYTE_PIECE.fullmatch(tokenizer.id_to_token(i) or ""))
    return MeasuredTokenizer(
        name=name,
        vocab_size=tokenizer.get_vocab_size(),
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        is_byte_fallback=is_byte_fallback,
        is_unknown=lambda i: unk_id is not None and i == unk_id,
        surface=lambda i: tokenizer.decode([i], skip_special_tokens=False),
        train_seconds=train_seconds,
    )
