"""Start a base model's embeddings for another tokenizer's vocabulary (``model.vocab_adaptation``).

``mean`` (the initialisation of RuAdapt, Vikhr and Tikhomirov & Chernyshev): the base tokenizer
splits each new token's text into its own pieces, and the new token's row is the mean of those
pieces' rows; a token the base has whole (one piece) is thereby copied exactly. Tokens without a
text (control pieces, bytes that are no character on their own) take their base counterpart where
the caller maps one (EOS to EOS), else a fresh row. ``random``: every row fresh (the control).
Fresh rows are drawn from a normal with the base table's own standard deviation, so they start at
the scale the base layers expect.

Only numpy here: the caller passes a function that encodes text to base ids (built from the base
tokenizer in trainer/), which keeps this module below the tokenizer packages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

EncodeFn = Callable[[str], Sequence[int]]
# Which parameters are the input embedding table [V, D] and the untied output head [D, V] is the family's to say
# (``model.family.ParamRoles``: ``ModelFamily.roles``): trainer/init_from.py hands their tables in, token-major.


@dataclasses.dataclass(frozen=True)
class AdaptationReport:
    mode: str
    copied: int  # the base tokenizer has the token's text as one piece (or a mapped special token)
    averaged: int  # the mean of two or more base pieces
    unknown: int  # no text, or the base tokenizer gives no piece for it: a fresh row
    new_vocab: int
    base_vocab: int

    def as_dict(self) -> dict[str, int | str]:
        return dataclasses.asdict(self)


def base_pieces(texts: Sequence[str | None], encode: EncodeFn, base_vocab: int,
                special_map: Mapping[int, int] | None = None) -> list[list[int]]:
    """For each new token: the base ids its row is the mean of ([] where it has none)."""
    special = dict(special_map or {})
    pieces: list[list[int]] = []
    for token_id, text in enumerate(texts):
        if token_id in special:
            pieces.append([int(special[token_id])])
        elif text:
            ids = [int(i) for i in encode(text)]
            pieces.append(ids if ids and all(0 <= i < base_vocab for i in ids) else [])
        else:
            pieces.append([])
    return pieces


def adapt_table(base: np.ndarray, pieces: Sequence[Sequence[int]], mode: str, rng: np.random.Generator) -> np.ndarray:
    """A [new_vocab, D] table from the base table [base_vocab, D]: ``mean`` rows for tokens with
    pieces, fresh rows for the rest (every row under ``random``). Computed in fp64, returned in the
    base table's dtype."""
    base64 = np.asarray(base, dtype=np.float64)
    table = rng.normal(0.0, float(base64.std()) or 1.0, size=(len(pieces), base.shape[1]))
    if mode == "mean":
        for row, ids in enumerate(pieces):
            if ids:
                table[row] = base64[list(ids)].mean(axis=0)
    elif mode != "random":
        raise ValueError(f"vocabulary adaptation mode {mode!r} is not mean or random")
    return table.astype(base.dtype)


def adapt_embeddings(tables: Mapping[str, np.ndarray], texts: Sequence[str | None], encode: EncodeFn, mode: str,
                     seed: int = 0, special_map: Mapping[int, int] | None = None
                     ) -> tuple[dict[str, np.ndarray], AdaptationReport]:
    """Every table (input embeddings, and the output head's rows when untied: each [base_vocab, D],
    token-major) adapted to the new vocabulary of ``texts`` (one entry per new id: its text, or None)."""
    base_vocab = next(iter(tables.values())).shape[0]
    pieces = base_pieces(texts, encode, base_vocab, special_map)
    rng = np.random.default_rng(seed)
    adapted = {name: adapt_table(table, pieces, mode, rng) for name, table in tables.items()}
    if mode == "mean":
        copied = sum(len(p) == 1 for p in pieces)
        averaged = sum(len(p) > 1 for p in pieces)
    else:
        copied = averaged = 0
    report = AdaptationReport(mode=mode, copied=copied, averaged=averaged, unknown=len(pieces) - copied - averaged,
                              new_vocab=len(texts), base_vocab=base_vocab)
    return adapted, report
