"""The output projection and the next-token loss, for any family's ``hidden`` and ``output_weight``.

The train step never materialises all logits of a long sequence: ``chunked_cross_entropy`` computes
them a chunk of positions at a time from the hidden states and the output weight (``FamilyModel``
in model/family.py), so these live apart from any one architecture.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from model.linear import linear
from model.sharding import constrain


def output_logits(hidden: jax.Array, weight: jax.Array) -> jax.Array:
    """hidden [..., T, D] @ weight [D, V] -> fp32 logits, laid out with the vocabulary split as the rules say."""
    logits = linear(hidden, weight.astype(hidden.dtype))
    return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))


def cross_entropy(logits: jax.Array, targets: jax.Array, z_loss: float = 0.0,
                  weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Mean next-token cross-entropy and mean log(Z)^2 (the z-loss term, before its weight)."""
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = log_z - target_logit
    z_term = jnp.square(log_z)
    if weights is None:
        return nll.mean(), z_term.mean()
    total = jnp.maximum(weights.sum(), 1.0)
    return (nll * weights).sum() / total, (z_term * weights).sum() / total


def chunked_cross_entropy(hidden: jax.Array, weight: jax.Array, targets: jax.Array, chunk_len: int,
                          weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """``cross_entropy(output_logits(hidden, weight), targets)`` without all logits in memory at once.

    The sequence is cut into chunks of ``chunk_len`` positions (the last padded with zero-weight
    positions); a scan computes each chunk's logits, its summed NLL and log(Z)^2 and drops the logits,
    and the backward pass recomputes them chunk by chunk (``jax.checkpoint``). Peak memory for the
    logits falls from B x T x V to B x chunk_len x V floats, for one more forward matmul of the head.
    """
    b, t, d = hidden.shape
    if chunk_len <= 0 or chunk_len >= t:
        return cross_entropy(output_logits(hidden, weight), targets, weights=weights)
    n = -(-t // chunk_len)
    pad = n * chunk_len - t
    mask = jnp.ones((b, t), jnp.float32) if weights is None else weights.astype(jnp.float32)
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets, mask = jnp.pad(targets, ((0, 0), (0, pad))), jnp.pad(mask, ((0, 0), (0, pad)))

    def by_chunk(x: jax.Array) -> jax.Array:  # [B, n * c, ...] -> [n, B, c, ...]
        return x.reshape(b, n, chunk_len, *x.shape[2:]).swapaxes(0, 1)

    @jax.checkpoint
    def chunk_sums(h: jax.Array, tgt: jax.Array, m: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = output_logits(h, weight)
        log_z = jax.nn.logsumexp(logits, axis=-1)
        nll = log_z - jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
        return (nll * m).sum(), (jnp.square(log_z) * m).sum()

    def step(carry: tuple[jax.Array, jax.Array],
             chunk: tuple[jax.Array, ...]) -> tuple[tuple[jax.Array, jax.Array], None]:
        nll_sum, z_sum = chunk_sums(*chunk)
        return (carry[0] + nll_sum, carry[1] + z_sum), None

    zero = jnp.zeros((), jnp.float32)
    (nll_sum, z_sum), _ = jax.lax.scan(step, (zero, zero), (by_chunk(hidden), by_chunk(targets), by_chunk(mask)))
    total = jnp.maximum(mask.sum(), 1.0) if weights is not None else jnp.float32(b * t)
    return nll_sum / total, z_sum / total



class Labels(NamedTuple):
    """What a train step's batch says each position should predict, for a family whose auxiliary losses predict
    tokens too (``ModelFamily.predicts_ahead``: multi-token prediction)."""

    targets: jax.Array  # [B, T] int32: the token after each input position
    weights: jax.Array | None  # [B, T]: 0 where a position trains nothing (a corrupt record's row), else 1; or None
    chunk_len: int  # train.loss_chunk_len: logits a chunk of positions at a time


def targets_ahead(labels: Labels, segment_ids: jax.Array | None, k: int) -> tuple[jax.Array, jax.Array]:
    """Each position's token ``k`` further than its next (``targets[i + k]``) and its weight: 0 where ``i + k``
    leaves the row or (packed documents) the position's document, or either position trains nothing."""
    b, t = labels.targets.shape
    weights = jnp.ones((b, t), jnp.float32) if labels.weights is None else labels.weights.astype(jnp.float32)
    keep = weights[:, :t - k] * weights[:, k:]
    if segment_ids is not None:
        keep = keep * (segment_ids[:, :t - k] == segment_ids[:, k:]).astype(jnp.float32)
    return jnp.pad(labels.targets[:, k:], ((0, 0), (0, k))), jnp.pad(keep, ((0, 0), (0, k)))
