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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from eval.scoring import LogitsFn, ScoreRequest, score_requests, target_logprobs
from experiment.errors import DataError
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
                        tokenizer_sha256: str | None = None) -> dict[str, BitsPerByte]:
    """Validation bits per byte of each shard set ``(name, shards folder, weight)`` of a training mixture,
    apart: the mixed average hides the source the model is worse on. A set with an empty validation
    split is left out with a warning (it has nothing to score)."""
    from data_prep.shards.loader import read_shards_manifest

    by_set = {}
    for name, shards_dir, _weight in sets:
        manifest = read_shards_manifest(shards_dir, tokenizer_sha256=tokenizer_sha256)
        if not manifest["splits"].get("validation", {}).get("records"):
            log.warning("mixture set %s (%s) has no validation records: no bits per byte for it", name, shards_dir)
            continue
        by_set[name] = validation_bpb(logits_fn, location(shards_dir), piece_bytes, batch_size, max_batches=max_batches,
                                      tokenizer_sha256=tokenizer_sha256)
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


def describe(acc: BitsPerByte) -> str:
    return f"{acc.bits_per_byte:.4f} bits/byte, perplexity {acc.perplexity:.2f} over {acc.tokens} tokens"


__all__ = ["BitsPerByte", "add_batch", "batches_bpb", "describe", "read_text_files", "sets_validation_bpb", "text_bpb",
           "validation_bpb"]
