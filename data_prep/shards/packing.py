"""Packing tokenized documents into fixed rows of ``seq_len + 1`` tokens.

Two modes (``shards.packing``):

- ``concat``: documents (each ending in EOS) are concatenated into one stream that is cut into
  rows of ``seq_len + 1``; a row may hold the end of one document and the start of the next. The
  stream's last partial row is dropped (counted as ``dropped_tokens``), as in most pretraining
  pipelines.
- ``document``: the same dense stream, but every row also carries ``segment_ids`` (1, 2, ... for
  the document pieces inside the row) and ``positions`` (restarting at 0 where a piece starts),
  so the model can keep attention inside one document. A document that crosses a row boundary
  continues in the next row as a new segment at position 0. The last partial row is padded with
  the pad id and segment 0 (counted as ``padding_tokens``), so no token is lost.

A row of ``seq_len + 1`` tokens gives inputs ``row[:-1]`` and targets ``row[1:]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

PackingMode = Literal["concat", "document"]


@dataclass
class PackingStats:
    documents: int = 0
    tokens: int = 0  # document tokens placed in rows
    rows: int = 0
    padding_tokens: int = 0
    dropped_tokens: int = 0


def segments_and_positions(doc_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-local segment ids (1-based) and positions from the per-token document number of each row.

    ``doc_index`` is one row ``[row_len]`` or a batch of rows ``[rows, row_len]``; all rows are
    done in one vectorised pass (a Python loop over rows cost more than the varint coding)."""
    rows = np.atleast_2d(doc_index)
    starts_run = np.empty(rows.shape, dtype=np.bool_)
    starts_run[:, :1] = True  # every row starts a segment, even mid-document
    np.not_equal(rows[:, 1:], rows[:, :-1], out=starts_run[:, 1:])
    segments = np.cumsum(starts_run, axis=1, dtype=np.int32)
    column = np.arange(rows.shape[1], dtype=np.int32)
    run_start = np.where(starts_run, column, 0)  # the column where each token's run began, via a running max
    np.maximum.accumulate(run_start, axis=1, out=run_start)
    positions = column - run_start
    if doc_index.ndim == 1:
        return segments[0], positions[0]
    return segments, positions


@dataclass
class Packer:
    """Streams documents in, full rows out; ``finish()`` emits what is left."""

    seq_len: int
    mode: PackingMode = "concat"
    pad_id: int = 0
    stats: PackingStats = field(default_factory=PackingStats)
    _tokens: list[np.ndarray] = field(default_factory=list, init=False, repr=False)
    # document mode: pending tokens per document (the first may be the rest of a cut document);
    # the per-token document numbers are only built for the rows being cut
    _doc_sizes: list[int] = field(default_factory=list, init=False, repr=False)
    _pending: int = field(default=0, init=False, repr=False)

    @property
    def row_len(self) -> int:
        return self.seq_len + 1

    def add(self, documents: Sequence[Sequence[int] | np.ndarray]) -> dict[str, np.ndarray]:
        """Add tokenized documents (EOS already appended); returns the rows completed so far as
        ``{"input_ids": [n, seq_len + 1]}`` (plus ``segment_ids`` and ``positions`` in document mode)."""
        for tokens in documents:
            array = np.asarray(tokens, dtype=np.int32)  # token ids: int32 halves the copying
            self._tokens.append(array)
            if self.mode == "document":
                self._doc_sizes.append(array.size)
            self._pending += array.size
            self.stats.documents += 1
            self.stats.tokens += array.size
        full_rows = self._pending // self.row_len
        return self._take(full_rows * self.row_len)

    def finish(self) -> dict[str, np.ndarray]:
        """The last partial row: padded in document mode, dropped in concat mode."""
        if self._pending == 0:
            return self._take(0)
        if self.mode == "concat":
            self.stats.dropped_tokens += self._pending
            self.stats.tokens -= self._pending
            self._tokens, self._pending = [], 0
            return self._take(0)
        padding = self.row_len - self._pending
        self._tokens.append(np.full(padding, self.pad_id, dtype=np.int32))
        self._pending += padding
        self.stats.padding_tokens += padding
        return self._take(self.row_len, padding=padding)

    def _take(self, count: int, padding: int = 0) -> dict[str, np.ndarray]:
        """Cut ``count`` tokens (a multiple of the row length) off the front of the pending stream;
        the last ``padding`` of them are padding (document mode, ``finish`` only)."""
        stream = np.concatenate(self._tokens) if self._tokens else np.zeros(0, np.int32)
        self._tokens = [stream[count:]] if stream.size > count else []
        doc_index = None
        if self.mode == "document":
            doc_index = self._cut_doc_index(count - padding)
            if padding:
                doc_index = np.concatenate((doc_index, np.full(padding, -1, dtype=np.int32)))  # -1 marks padding
        out = rows_from_stream(stream[:count], doc_index, self.row_len)
        self._pending -= count
        self.stats.rows += out["input_ids"].shape[0]
        return out

    def _cut_doc_index(self, count: int) -> np.ndarray:
        """Document numbers of the first ``count`` pending tokens; the sizes left describe the rest."""
        sizes = np.asarray(self._doc_sizes, dtype=np.int64)
        ends = np.cumsum(sizes)
        cut = int(np.searchsorted(ends, count, side="right"))  # the first document not wholly taken
        taken = sizes[:cut + 1].copy()
        if cut < sizes.size:
            left = int(ends[cut]) - count  # > 0: its tail stays pending
            taken[cut] -= left
            self._doc_sizes = [left, *self._doc_sizes[cut + 1:]]
        else:
            self._doc_sizes = []
        return np.repeat(np.arange(taken.size, dtype=np.int32), taken)


def rows_from_stream(tokens: np.ndarray, doc_index: np.ndarray | None, row_len: int) -> dict[str, np.ndarray]:
    """Rows of ``row_len`` from a token stream whose length is a multiple of ``row_len``.

    ``doc_index`` (document mode) numbers the document each token belongs to (-1 for padding);
    only where it changes matters, so any increasing numbering gives the same rows."""
    rows = tokens.size // row_len
    out = {"input_ids": tokens.reshape(rows, row_len)}
    if doc_index is not None:
        segments, positions = segments_and_positions(doc_index.reshape(rows, row_len))
        if doc_index.size and doc_index.min() < 0:
            padded = doc_index.reshape(rows, row_len) < 0
            segments[padded] = 0
            positions[padded] = 0
        out["segment_ids"], out["positions"] = segments, positions
    return out
