"""Bits per byte and perplexity with exact arithmetic.

Bits per byte = (sum of target-token NLL in nats) / ln 2 / (UTF-8 bytes those tokens stand for).
It is comparable across tokenizers, unlike per-token perplexity. Bytes come from the run tokenizer's
``tokenizer.loaded.RunTokenizer.piece_byte_lengths``, trained or adopted (EOS and other control pieces
count 0 bytes, their NLL still counts: predicting the end of a document is part of modelling the text).
Sums are kept in float64.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from eval.scoring import LogitsFn, ScoreRequest, score_requests, target_logprobs
from experiment.errors import ConfigError, DataError
from experiment.progress import progress
from experiment.storage import RunPath, location

log = logging.getLogger("eval.bpb")


@dataclass
class BitsPerByte:
    """Running sums; ``add`` the scored tokens of each batch, read the metrics at the end."""

    nats: float = 0.0
    bytes: int = 0
    tokens: int = 0

    def add(self, nats: float, n_bytes: int, n_tokens: int) -> None:
        self.nats += float(nats)
        self.bytes += int(n_bytes)
        self.tokens += int(n_tokens)

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes if self.bytes else float("nan")

    @property
    def nats_per_token(self) -> float:
        return self.nats / self.tokens if self.tokens else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(self.nats_per_token) if self.tokens else float("nan")

    def to_dict(self) -> dict[str, float | int]:
        return {"bits_per_byte": self.bits_per_byte, "perplexity": self.perplexity,
                "nats_per_token": self.nats_per_token, "tokens": self.tokens, "bytes": self.bytes}


def add_batch(acc: BitsPerByte, logits_fn: LogitsFn, batch: dict[str, np.ndarray], piece_bytes: np.ndarray) -> None:
    """Score one loader batch (``inputs``/``targets`` [B, T]); packing padding (segment 0) is masked out."""
    inputs, targets = batch["inputs"], batch["targets"]
    kwargs = {}
    mask = np.ones(targets.shape, dtype=bool)
    if "segment_ids" in batch:
        kwargs = {"segment_ids": jnp.asarray(batch["segment_ids"]), "positions": jnp.asarray(batch["positions"])}
        mask = batch["segment_ids"] != 0
    if "loss_weights" in batch:  # shards.on_corrupt=skip: the row of a corrupt record scores nothing
        mask &= batch["loss_weights"] != 0
    logp, _ = target_logprobs(logits_fn(jnp.asarray(inputs), **kwargs), jnp.asarray(targets))
    logp = np.asarray(logp, dtype=np.float64)
    acc.add(-logp[mask].sum(), int(piece_bytes[targets[mask]].sum()), int(mask.sum()))


def validation_bpb(logits_fn: LogitsFn, shards_dir: Path, piece_bytes: np.ndarray, batch_size: int,
                   max_batches: int | None = None, split: str = "validation",
                   tokenizer_sha256: str | None = None) -> BitsPerByte:
    """Bits per byte over the validation shards (recipe 03's output), in file order; shards made
    with another tokenizer than ``tokenizer_sha256`` are refused (their ids would mean other text)."""
    from data_prep.shards.loader import iter_eval_batches

    batches = iter_eval_batches(shards_dir, split, batch_size, max_batches=max_batches,
                                tokenizer_sha256=tokenizer_sha256)
    return batches_bpb(logits_fn, batches, piece_bytes, total=max_batches)


def sets_validation_bpb(logits_fn: LogitsFn, sets: Sequence[tuple[str, Path, float]], piece_bytes: np.ndarray,
                        batch_size: int, max_batches: int | None = None,
                        tokenizer_sha256: str | None = None,
                        measured: dict[RunPath, BitsPerByte] | None = None) -> dict[str, BitsPerByte]:
    """Validation bits per byte of each shard set ``(name, shards folder, weight)`` of a training mixture,
    apart: the mixed average hides the source the model is worse on. A set with an empty validation
    split is left out with a warning (it has nothing to score). A folder is read once: ``measured`` (folder
    as ``experiment.links.resolved`` gives it -> its bits per byte at these settings) holds what was read already,
    and a set whose folder is there, or another set's, is given that measurement."""
    from data_prep.shards.loader import read_shards_manifest
    from experiment.links import resolved

    measured = dict(measured or {})
    by_set = {}
    for name, shards_dir, _weight in sets:
        folder = resolved(location(shards_dir))  # a link (an anneal run's shards/) and its target are one folder
        if folder in measured:
            by_set[name] = measured[folder]
            continue
        manifest = read_shards_manifest(shards_dir, tokenizer_sha256=tokenizer_sha256)
        if not manifest["splits"].get("validation", {}).get("records"):
            log.warning("mixture set %s (%s) has no validation records: no bits per byte for it", name, shards_dir)
            continue
        by_set[name] = measured[folder] = validation_bpb(logits_fn, location(shards_dir), piece_bytes, batch_size,
                                                         max_batches=max_batches, tokenizer_sha256=tokenizer_sha256)
    return by_set


def batches_bpb(logits_fn: LogitsFn, batches: Iterable[dict[str, np.ndarray]], piece_bytes: np.ndarray,
                total: int | None = None) -> BitsPerByte:
    acc = BitsPerByte()
    for batch in progress(batches, desc="validation bits/byte", unit="batch", total=total, leave=False):
        add_batch(acc, logits_fn, batch, piece_bytes)
    if acc.tokens == 0:
        raise DataError("the validation split has no tokens: check shards.validation_percent and rerun recipe 03")
    return acc


def text_bpb(logits_fn: LogitsFn, encode: Callable[[str], Sequence[int]], texts: Iterable[tuple[str, str]],
             start_id: int, seq_len: int, batch_size: int, pad_id: int = 0) -> BitsPerByte:
    """Bits per byte of raw texts ``(name, text)``, each conditioned on ``start_id`` (EOS) and cut into
    windows of ``seq_len`` scored tokens; each window sees the token before it.

    The byte count is the text's own UTF-8 length, so a lossy tokenizer cannot flatter itself.
    """
    acc = BitsPerByte()
    for name, text in texts:
        ids = [start_id, *encode(text)]
        if len(ids) < 2:
            raise DataError(f"{name}: no text to score")
        requests = [ScoreRequest(context=ids[s - 1:s], continuation=ids[s:s + seq_len])
                    for s in range(1, len(ids), seq_len)]
        scores = score_requests(logits_fn, requests, batch_size=batch_size, max_len=seq_len, pad_id=pad_id)
        acc.add(-sum(s.logprob for s in scores), len(text.encode("utf-8")), sum(s.tokens for s in scores))
    return acc


def read_text_files(paths: Sequence[str | RunPath]) -> list[tuple[str, str]]:
    """Read held-out UTF-8 text files; a missing or undecodable one is named in the error."""
    texts = []
    for path in paths:
        path = location(path)
        try:
            texts.append((str(path), path.read_text(encoding="utf-8")))
        except FileNotFoundError as exc:
            raise DataError(f"held-out text file {path} does not exist (eval.heldout_text_files)") from exc
        except UnicodeDecodeError as exc:
            raise DataError(f"held-out text file {path} is not UTF-8 at byte {exc.start}") from exc
    return texts


def bucket_spans(starts: Sequence[int], max_len: int) -> list[tuple[int, int]]:
    """``[start, next start)`` position spans from bucket starts (``eval.bpb_position_buckets``), the last one ending
    at the model's context ``max_len``; starts at or past ``max_len`` are dropped (a shorter model has no such
    positions). Starts must increase from 0."""
    kept = [int(s) for s in starts if int(s) < max_len]
    if not kept or kept[0] != 0 or any(b <= a for a, b in zip(kept, kept[1:], strict=False)):
        raise ConfigError(f"config key 'eval.bpb_position_buckets': bucket starts must increase from 0, got "
                          f"{list(starts)}")
    return list(zip(kept, [*kept[1:], max_len], strict=True))


def stream_documents(batches: Iterable[dict[str, np.ndarray]], eos_id: int) -> Iterator[np.ndarray]:
    """The documents of a split's token stream (the shards' rows in file order, each ``inputs`` plus the last
    target), cut at EOS, each without its EOS. Rows are consecutive cuts of one stream (data_prep.shards.packing),
    so a document that crossed rows comes back whole. Padding (segment 0) is left out; a row that scores nothing
    (a corrupt record skipped) breaks the stream, and the document it cut is dropped: its start is unknown."""
    pending: list[np.ndarray] = []
    known_start = True
    for batch in batches:
        rows = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
        keep = np.ones(rows.shape, dtype=bool)
        if "segment_ids" in batch:
            keep[:, :-1] = batch["segment_ids"] != 0
            keep[:, -1] = keep[:, -2]  # the last target belongs to the last input's segment or its padding
        for r, row in enumerate(rows):
            if "loss_weights" in batch and not batch["loss_weights"][r].any():
                pending, known_start = [], False
                continue
            row = row[keep[r]]
            start = 0
            for end in np.flatnonzero(row == eos_id):
                if known_start:
                    yield np.concatenate([*pending, row[start:end]])
                pending, known_start, start = [], True, end + 1
            pending.append(row[start:])
    if known_start and sum(piece.size for piece in pending):
        yield np.concatenate(pending)  # the stream's last document, as far as the split holds it


@dataclass
class PositionBuckets:
    """Bits per byte by position in the context window: each long document's first ``max_len`` tokens (after the
    EOS it follows) scored as one window, the target at input position ``p`` seeing ``p + 1`` tokens."""

    spans: list[tuple[int, int]]
    documents: int = 0  # windows scored: documents at least as long as the context
    shorter: int = 0  # documents left out for being shorter
    buckets: list[BitsPerByte] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buckets = self.buckets or [BitsPerByte() for _ in self.spans]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; with no document long enough the buckets' rates are null (nothing was measured), not NaN."""
        rates = ("bits_per_byte", "perplexity", "nats_per_token")
        return {"documents": self.documents, "shorter_documents": self.shorter,
                "buckets": [{"start": lo, "end": hi, **{k: (None if k in rates and not acc.tokens else v)
                                                         for k, v in acc.to_dict().items()}}
                            for (lo, hi), acc in zip(self.spans, self.buckets, strict=True)]}


def position_bucket_bpb(logits_fn: LogitsFn, documents: Iterable[np.ndarray], piece_bytes: np.ndarray,
                        spans: list[tuple[int, int]], start_id: int, max_len: int, batch_size: int,
                        max_documents: int | None = None) -> PositionBuckets:
    """Bits per byte per position span over the documents of at least ``max_len`` tokens (``max_documents`` of
    them at most): a model that uses its context gets better further in, and a stage trained at a longer
    ``max_seq_len`` shows it past the parent's length. Bytes are the target pieces' UTF-8 bytes."""
    out = PositionBuckets(spans)
    windows: list[np.ndarray] = []

    def score(windows: list[np.ndarray]) -> None:
        rows = np.stack(windows)
        logp, _ = target_logprobs(logits_fn(jnp.asarray(rows[:, :-1])), jnp.asarray(rows[:, 1:]))
        nll = -np.asarray(logp, dtype=np.float64)
        n_bytes = piece_bytes[rows[:, 1:]]
        for (lo, hi), acc in zip(spans, out.buckets, strict=True):
            acc.add(nll[:, lo:hi].sum(), int(n_bytes[:, lo:hi].sum()), nll[:, lo:hi].size)

    for doc in documents:
        if max_documents is not None and out.documents >= max_documents:
            break
        if doc.size < max_len:
            out.shorter += 1
            continue
        windows.append(np.concatenate([[start_id], doc[:max_len]]).astype(np.int32))
        out.documents += 1
        if len(windows) == batch_size:
            score(windows)
            windows = []
    if windows:
        score(windows)
    return out


def validation_position_buckets(logits_fn: LogitsFn, shards_dir: Path, piece_bytes: np.ndarray, *,
                                starts: Sequence[int], eos_id: int, max_len: int, batch_size: int,
                                max_batches: int | None = None, max_documents: int | None = None,
                                tokenizer_sha256: str | None = None) -> PositionBuckets:
    """``position_bucket_bpb`` over the validation split's documents (read as ``validation_bpb`` reads it)."""
    from data_prep.shards.loader import iter_eval_batches

    batches = iter_eval_batches(shards_dir, "validation", batch_size, max_batches=max_batches,
                                tokenizer_sha256=tokenizer_sha256)
    return position_bucket_bpb(logits_fn, stream_documents(batches, eos_id), piece_bytes,
                               bucket_spans(starts, max_len), eos_id, max_len, batch_size, max_documents)


def describe(acc: BitsPerByte) -> str:
    return f"{acc.bits_per_byte:.4f} bits/byte, perplexity {acc.perplexity:.2f} over {acc.tokens} tokens"


__all__ = ["BitsPerByte", "PositionBuckets", "add_batch", "batches_bpb", "bucket_spans", "describe",
           "position_bucket_bpb", "read_text_files", "sets_validation_bpb", "stream_documents",
           "text_bpb", "validation_bpb", "validation_position_buckets"]
