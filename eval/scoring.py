"""Batched log-likelihood scoring in JAX with padding-aware masks.

Everything here works on a plain ``logits_fn(tokens [B, T] int32) -> logits [B, T, V]``, so it is
tested with a hand-made model and serves any decoder (our Flax NNX one via ``model_logits_fn``).

A request is a context (conditioning only) and a continuation (the tokens scored). Rows are
right-padded to a bucketed length and the batch to a fixed size, so XLA compiles a handful of
shapes, not one per item; a causal model never lets padding on the right change the positions
before it, and the mask keeps padding out of every sum. Requests are scored longest first (fewer
pad tokens) and returned in the caller's order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiment.progress import progress

LogitsFn = Callable[[Any], Any]


@dataclass(frozen=True)
class ScoreRequest:
    context: Sequence[int]  # at least one token: the first scored token needs something to condition on
    continuation: Sequence[int]


@dataclass(frozen=True)
class Score:
    logprob: float  # sum of natural-log probabilities of the continuation tokens
    greedy: bool  # every continuation token is the model's argmax
    tokens: int  # continuation tokens actually scored (fewer only if the window cut them)


@jax.jit
def target_logprobs(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per position: log p(target) in float32 and whether the target is the argmax."""
    logits = logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked, jnp.argmax(logits, axis=-1) == targets


def bucket_length(n: int, max_len: int, multiple: int = 16) -> int:
    """Round a row length up to a power of two (at least ``multiple``), capped at ``max_len``."""
    size = multiple
    while size < n:
        size *= 2
    return min(size, max_len)


@functools.partial(jax.jit, static_argnums=0)
def _nnx_forward(graphdef: Any, state: Any, tokens: jax.Array, segment_ids: jax.Array | None,
                 positions: jax.Array | None) -> jax.Array:
    from flax import nnx

    return nnx.merge(graphdef, state)(tokens, segment_ids=segment_ids, positions=positions)


def model_logits_fn(model: Any) -> LogitsFn:
    """Wrap a Flax NNX module as a jitted ``logits_fn``.

    The parameters are arguments, not constants baked into the program, and the graph definition is
    the static key: evaluating the same architecture again (eval during training) reuses the compile.
    """
    from flax import nnx

    graphdef, state = nnx.split(model)

    def logits_fn(tokens: Any, segment_ids: Any = None, positions: Any = None) -> jax.Array:
        return _nnx_forward(graphdef, state, tokens, segment_ids, positions)

    return logits_fn


def _window(request: ScoreRequest, max_len: int) -> tuple[list[int], int]:
    """The token row (inputs plus one) and how many continuation tokens it scores.

    Too long a row loses context tokens from the left, as lm-evaluation-harness does.
    """
    if len(request.context) == 0:
        raise ValueError("a score request needs at least one context token (use EOS as the document start)")
    if len(request.continuation) == 0:
        raise ValueError("a score request needs at least one continuation token")
    row = list(request.context) + list(request.continuation)
    row = row[-(max_len + 1):]
    return row, min(len(request.continuation), len(row) - 1)


def plan_batches(lengths: Sequence[int], batch_size: int, max_len: int) -> list[tuple[list[int], int, int]]:
    """Group request indices into (indices, rows, width) batches, longest first.

    A batch holds the tokens of ``batch_size`` full-length rows: short rows (RuBLiMP sentences are
    ~30 tokens) come many to a batch, so the work per dispatch stays large. Rows and width are
    both powers-of-two multiples, so only a few shapes are ever compiled.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    full = bucket_length(max_len, max_len)
    plan, start = [], 0
    while start < len(order):
        width = bucket_length(lengths[order[start]], max_len)
        rows = batch_size * max(1, full // width)
        plan.append((order[start:start + rows], rows, width))
        start += rows
    return plan


def score_requests(logits_fn: LogitsFn, requests: Sequence[ScoreRequest], *, batch_size: int, max_len: int,
                   pad_id: int = 0, desc: str | None = None) -> list[Score]:
    """Score every request; results come back in the order of ``requests``.

    ``batch_size`` is in full-length rows (``max_len`` tokens); shorter rows are batched more densely.
    """
    windows = [_window(r, max_len) for r in requests]
    results: list[Score | None] = [None] * len(windows)
    plan = plan_batches([len(row) - 1 for row, _ in windows], batch_size, max_len)
    for chunk, rows, width in progress(plan, desc=desc or "scoring", unit="batch", disable=desc is None, leave=False):
        inputs = np.full((rows, width), pad_id, dtype=np.int32)
        targets = np.full((rows, width), pad_id, dtype=np.int32)
        mask = np.zeros((rows, width), dtype=bool)
        for r, i in enumerate(chunk):
            row, n_scored = windows[i]
            n = len(row) - 1
            inputs[r, :n] = row[:-1]
            targets[r, :n] = row[1:]
            mask[r, n - n_scored:n] = True
        logp, is_argmax = target_logprobs(logits_fn(jnp.asarray(inputs)), jnp.asarray(targets))
        logp = np.asarray(logp, dtype=np.float64)
        is_argmax = np.asarray(is_argmax)
        for r, i in enumerate(chunk):
            m = mask[r]
            results[i] = Score(logprob=float(logp[r][m].sum()), greedy=bool(is_argmax[r][m].all()),
                               tokens=int(m.sum()))
    return [s for s in results if s is not None]
