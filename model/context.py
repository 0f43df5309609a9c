"""Context parallelism: one sequence split over the devices of a ``context`` mesh axis.

When a slice has more chips than the batch has sequences (a long-context stage: a few sequences of 32k-128k tokens),
the data-parallel axes run out of rows to split. The ``context`` axis (``train.mesh.axes: {context: N}``, which lays
the logical axis ``length`` out on it) splits each sequence instead: every activation [B, T, ...] holds T / N positions
per device. Everything but attention is per position; attention gathers the keys and values of the whole sequence
over the context axis inside ``jax.shard_map`` (the "all-gather" strategy, MaxText's default: one all-gather of K
and V per layer forward, its transpose, a reduce-scatter, backward) and each device attends its own queries to them.

Load balancing: with causal attention the device holding the last positions has all the work (its queries see
every key) and the first almost none. As in MaxText (``context_parallel_load_balance``) and Megatron-LM, the sequence
is cut into 2N chunks and device i holds chunks i and 2N-1-i, so every device gets one early and one late chunk and
the same number of visible (query, key) pairs. The decoder reorders tokens, segment ids and positions into that
layout at its entry and its hidden states back at its exit (``to_balanced``, ``from_balanced``), so the loss,
the targets and the data pipeline see the sequence in its order. RoPE reads the reordered positions (each token's
own), and the mask is built from each token's original index and its segment id: packed documents stay apart.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from experiment.errors import ConfigError
from model.sharding import Rules, current_layout, logical_to_spec, mesh_parts, spec_axes


def context_parts(layout: tuple[Mesh, Rules] | None = None) -> int:
    """How many devices one sequence is split over in the step being traced (the mesh axes ``length`` is laid out
    on); 1 outside a trainer's layout or when the sequence is not split."""
    layout = current_layout() if layout is None else layout
    if layout is None:
        return 1
    mesh, rules = layout
    return mesh_parts(mesh, logical_to_spec(("length",), rules)[0])


def balanced_order(length: int, parts: int) -> np.ndarray:
    """The original index of each position of the load-balanced layout: chunks 0, 2N-1, 1, 2N-2, ... of
    ``length / 2N`` positions, so that device i (holding the i-th ``length / N`` positions) has chunks i and 2N-1-i."""
    chunks = 2 * parts
    if length % chunks:
        raise ConfigError(f"config key 'train.mesh.axes.context': context parallelism over {parts} devices cuts a "
                          f"sequence into {chunks} load-balanced chunks, but its length {length} is not divisible "
                          f"by {chunks}; change model.max_seq_len or the context axis")
    size = length // chunks
    order = [c for i in range(parts) for c in (i, chunks - 1 - i)]
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in order])


def to_balanced(x: jax.Array, parts: int) -> jax.Array:
    """[B, T, ...] in sequence order -> the load-balanced layout (unchanged when the sequence is not split)."""
    return x if parts == 1 else jnp.take(x, balanced_order(x.shape[1], parts), axis=1)


def from_balanced(x: jax.Array, parts: int) -> jax.Array:
    """``to_balanced``'s inverse: [B, T, ...] back in sequence order."""
    return x if parts == 1 else jnp.take(x, np.argsort(balanced_order(x.shape[1], parts)), axis=1)


def context_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, window: int = 0,
                      scale: float | None = None) -> jax.Array:
    """Causal attention [B, T, H, D] of a sequence in the load-balanced layout (``to_balanced``) whose length is
    split over the context axis: each device gathers K, V and the segment ids of the whole sequence and attends its
    own queries to them with XLA's attention. The mask is ``model.attention.attention_mask``'s (causal, within
    ``window``, within one packed document), on the tokens' original indices."""
    layout = current_layout()
    assert layout is not None, "context_attention runs inside a trainer's activation layout"
    mesh, rules = layout
    parts = context_parts(layout)
    b, t = q.shape[:2]
    order = balanced_order(t, parts)
    chunk = t // (2 * parts)
    heads = logical_to_spec(("batch", "length", "act_heads", "head_dim"), rules)
    rows = logical_to_spec(("batch", "length"), rules)
    axes = spec_axes(heads[1])
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)

    def local(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array) -> jax.Array:
        # the whole sequence's keys, values and segment ids, in the balanced layout (device order along T)
        k_all, v_all, seg_all = (jax.lax.all_gather(x, axes, axis=1, tiled=True) for x in (k, v, seg))
        device = jax.lax.axis_index(axes)
        arange = jnp.arange(chunk)
        query_index = jnp.concatenate([device * chunk + arange, (2 * parts - 1 - device) * chunk + arange])
        key_index = jnp.asarray(order)
        visible = key_index[None, :] <= query_index[:, None]
        if 0 < window < t:
            visible &= query_index[:, None] - key_index[None, :] < window
        mask = visible[None, None] & (seg[:, None, :, None] == seg_all[:, None, None, :])
        return jax.nn.dot_product_attention(q, k_all, v_all, mask=mask, scale=scale)

    return jax.shard_map(local, mesh=mesh, in_specs=(heads, heads, heads, rows), out_specs=heads)(q, k, v, seg)
