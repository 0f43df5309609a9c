"""Log-likelihood scoring against a hand computation, padding awareness and bits-per-byte arithmetic."""

from __future__ import annotations

import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp
import numpy as np
import pytest

from eval.bpb import BitsPerByte, batches_bpb, text_bpb
from eval.scoring import ScoreRequest, bucket_length, score_requests

VOCAB = 7


def bigram_table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(VOCAB, VOCAB)).astype(np.float32)


def bigram_logits_fn(table: np.ndarray):
    """A model whose next-token logits depend only on the current token: easy to compute by hand."""
    t = jnp.asarray(table)
    return lambda tokens, **_: t[tokens]


def hand_logprob(table: np.ndarray, context: list[int], continuation: list[int]) -> float:
    seq = context + continuation
    total = 0.0
    for pos in range(len(context), len(seq)):
        row = table[seq[pos - 1]].astype(np.float64)
        total += row[seq[pos]] - math.log(np.exp(row).sum())
    return total


def test_loglik_matches_hand_computation() -> None:
    table = bigram_table()
    requests = [ScoreRequest([1], [2, 3]), ScoreRequest([4, 5, 6], [0]), ScoreRequest([2], [2, 2, 2, 1, 0, 3]),
                ScoreRequest([3, 1], [5, 5])]
    scores = score_requests(bigram_logits_fn(table), requests, batch_size=3, max_len=32)
    for request, score in zip(requests, scores, strict=True):
        expected = hand_logprob(table, list(request.context), list(request.continuation))
        assert score.logprob == pytest.approx(expected, abs=1e-5)
        assert score.tokens == len(request.continuation)


def test_greedy_flag_follows_the_argmax() -> None:
    table = np.zeros((VOCAB, VOCAB), np.float32)
    table[1, 2] = table[2, 3] = 5.0  # 1 -> 2 -> 3 is the greedy path
    scores = score_requests(bigram_logits_fn(table), [ScoreRequest([1], [2, 3]), ScoreRequest([1], [2, 4])],
                            batch_size=2, max_len=16)
    assert [s.greedy for s in scores] == [True, False]


def test_long_rows_lose_context_from_the_left() -> None:
    table = bigram_table(1)
    request = ScoreRequest(list(range(6)) * 4, [1, 2, 3])
    (score,) = score_requests(bigram_logits_fn(table), [request], batch_size=1, max_len=8)
    # a bigram model only sees the previous token, which the window keeps
    assert score.logprob == pytest.approx(hand_logprob(table, [request.context[-1]], [1, 2, 3]), abs=1e-5)


def test_empty_context_is_refused() -> None:
    with pytest.raises(ValueError, match="context"):
        score_requests(bigram_logits_fn(bigram_table()), [ScoreRequest([], [1])], batch_size=1, max_len=8)


def prefix_mean_logits_fn(seed: int = 0):
    """A causal model that sees the whole prefix: logits from the running mean of token embeddings.

    A padding bug (padding read as context, or a wrong mask) would change its scores.
    """
    emb = jnp.asarray(np.random.default_rng(seed).normal(size=(VOCAB, 8)).astype(np.float32))
    out = jnp.asarray(np.random.default_rng(seed + 1).normal(size=(8, VOCAB)).astype(np.float32))

    def logits_fn(tokens, **_):
        x = emb[tokens]
        mean = jnp.cumsum(x, axis=1) / jnp.arange(1, tokens.shape[1] + 1)[None, :, None]
        return mean @ out

    return logits_fn, np.asarray(emb, np.float64), np.asarray(out, np.float64)


def test_padding_and_batch_neighbours_do_not_change_scores() -> None:
    logits_fn, emb, out = prefix_mean_logits_fn()
    short = ScoreRequest([1, 2], [3, 4, 5])
    long = ScoreRequest([1, 2, 3, 4, 5, 6] * 4, [0, 1])
    (alone,) = score_requests(logits_fn, [short], batch_size=1, max_len=32)
    together = score_requests(logits_fn, [long, short], batch_size=3, max_len=32)
    assert together[1].logprob == pytest.approx(alone.logprob, abs=1e-5)
    seq = [1, 2, 3, 4, 5]
    expected = 0.0
    for pos in range(2, 5):
        logits = emb[seq[:pos]].mean(axis=0) @ out
        expected += logits[seq[pos]] - math.log(np.exp(logits).sum())
    assert alone.logprob == pytest.approx(expected, abs=1e-4)


def test_bucket_lengths_are_few_and_capped() -> None:
    assert [bucket_length(n, 128) for n in (1, 16, 17, 33, 100, 128)] == [16, 16, 32, 64, 128, 128]
    assert bucket_length(100, 80) == 80


def test_bits_per_byte_arithmetic() -> None:
    acc = BitsPerByte()
    acc.add(nats=10.0, n_bytes=20, n_tokens=5)
    acc.add(nats=4.0, n_bytes=8, n_tokens=2)
    assert acc.bits_per_byte == pytest.approx(14.0 / math.log(2) / 28)
    assert acc.perplexity == pytest.approx(math.exp(14.0 / 7))


def test_validation_bpb_counts_target_bytes_and_eos_as_zero() -> None:
    table = bigram_table(2)
    piece_bytes = np.array([0, 1, 2, 3, 1, 2, 0], np.int32)  # ids 0 and 6 are control pieces (EOS)
    inputs = np.array([[1, 2, 3, 6], [4, 5, 6, 1]], np.int32)
    targets = np.array([[2, 3, 6, 4], [5, 6, 1, 2]], np.int32)
    acc = batches_bpb(bigram_logits_fn(table), [{"inputs": inputs, "targets": targets}], piece_bytes)
    nats = -sum(hand_logprob(table, [int(i)], [int(t)]) for i, t in zip(inputs.ravel(), targets.ravel(), strict=True))
    assert acc.nats == pytest.approx(nats, abs=1e-4)
    assert acc.bytes == int(piece_bytes[targets].sum()) == 2 + 3 + 0 + 1 + 2 + 0 + 1 + 2
    assert acc.tokens == 8
    assert acc.bits_per_byte == pytest.approx(nats / math.log(2) / acc.bytes, rel=1e-6)


def test_text_bpb_uses_the_texts_own_bytes_and_every_token_once() -> None:
    table = bigram_table(3)
    text = "абв"  # 6 UTF-8 bytes
    ids = [1, 2, 3, 4, 5, 1, 2]

    acc = text_bpb(bigram_logits_fn(table), lambda _: ids, [("t", text)], start_id=0, seq_len=3, batch_size=2)
    assert acc.tokens == len(ids)
    assert acc.bytes == 6
    assert acc.nats == pytest.approx(-hand_logprob(table, [0], ids), abs=1e-4)


def test_batches_hold_a_fixed_token_budget_and_every_request_once() -> None:
    from eval.scoring import plan_batches

    lengths = [5, 120, 30, 31, 17, 64, 2, 100] * 5
    plan = plan_batches(lengths, batch_size=2, max_len=128)
    seen = sorted(i for chunk, _, _ in plan for i in chunk)
    assert seen == list(range(len(lengths)))
    for chunk, rows, width in plan:
        assert rows * width <= 2 * 128 and len(chunk) <= rows
        assert all(lengths[i] <= width for i in chunk)
    assert len({(rows, width) for _, rows, width in plan}) <= 4  # few shapes, few compiles
