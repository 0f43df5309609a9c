"""Context parallelism: one sequence split over the devices of a ``context`` mesh axis.

When a slice has more chips than the batch has sequences (a long-context stage: a few sequences of 32k-128k tokens),
the data-parallel axes run out of rows to split. The ``context`` axis (``train.mesh.axes: {context: N}``, which lays
the logical axis ``length`` out on it) splits each sequence instead: every activation [B, T, ...] holds T / N positions
per device. Everything but attention is per position; attention runs inside ``jax.shard_map`` by
``model.context_attention``: ``all_gather`` (MaxText's default strategy) gathers the keys and values of the whole
sequence over the context axis (one all-gather of K and V per layer forward, its transpose, a reduce-scatter,
backward) and each device attends its own queries to them; ``ring`` passes K and V from device to device in N - 1
``ppermute``s and accumulates each query's softmax one share at a time, never holding the whole sequence's.

Load balancing: with causal attention the device holding the last positions has all the work (its queries see
every key) and the first almost none. As in MaxText (``context_parallel_load_balance``) and Megatron-LM, the sequence
is cut into 2N chunks and device i holds chunks i and 2N-1-i, so every device gets one early and one late chunk and
the same number of visible (query, key) pairs. The decoder reorders tokens, segment ids and positions into that
layout at its entry and its hidden states back at its exit (``to_balanced``, ``from_balanced``), so the loss,
the targets and the data pipeline see the sequence in its order. RoPE reads the reordered positions (each token's
own), and the mask is built from each token's original index and its segment id: packed documents stay apart.
"""

from __future__ import annotations

from collections.abc import Callable

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


def to_balanced(x: jax.Array, parts: int, logical: tuple[str | None, ...]) -> jax.Array:
    """[B, T, ...] in sequence order -> the load-balanced layout (unchanged when the sequence is not split).
    ``logical``: x's logical axis names (its layout on the mesh)."""
    return x if parts == 1 else _move_chunks(x, parts, logical, to_balanced=True)


def from_balanced(x: jax.Array, parts: int, logical: tuple[str | None, ...]) -> jax.Array:
    """``to_balanced``'s inverse: [B, T, ...] back in sequence order."""
    return x if parts == 1 else _move_chunks(x, parts, logical, to_balanced=False)


def _move_chunks(x: jax.Array, parts: int, logical: tuple[str | None, ...], to_balanced: bool) -> jax.Array:
    """Each device's two chunks to where the other layout keeps them, by two ``ppermute``s over the context axis
    (a device sends one chunk and receives one in each), not a gather: indexing a split dimension with a constant
    permutation makes the compiler gather the whole sequence on every device, the memory context parallelism saves.

    In sequence order device d holds chunks 2d and 2d+1; balanced, chunks d and 2N-1-d. Moving to the balanced
    layout, round k sends every device's chunk in slot k (chunks of one parity, which land on distinct devices:
    chunk j < N on device j, j >= N on device 2N-1-j, of the other parity); back, round k fills every device's
    slot k (likewise from distinct devices). The tables say, per device, which slot it sends and which it fills."""
    layout = current_layout()
    assert layout is not None, "a split sequence is moved inside a trainer's activation layout"
    mesh, rules = layout
    balanced = balanced_order(2 * parts, parts)  # chunk order of the balanced layout (chunks of one position)
    where_balanced = {int(chunk): (slot // 2, slot % 2) for slot, chunk in enumerate(balanced)}
    where_sequence = {chunk: (chunk // 2, chunk % 2) for chunk in range(2 * parts)}
    source, target = (where_sequence, where_balanced) if to_balanced else (where_balanced, where_sequence)
    rounds = []  # per round: (device pairs, slot each device sends, slot each device fills)
    for k in range(2):
        moves = [(source[c], target[c]) for c in range(2 * parts) if (source if to_balanced else target)[c][1] == k]
        send, fill = np.zeros(parts, np.int32), np.zeros(parts, np.int32)
        for (src, src_slot), (dst, dst_slot) in moves:
            send[src], fill[dst] = src_slot, dst_slot
        rounds.append(([(src, dst) for (src, _), (dst, _) in moves], send, fill))
    spec = logical_to_spec(logical, rules)
    axes = spec_axes(spec[1])

    def local(x: jax.Array) -> jax.Array:
        device = jax.lax.axis_index(axes)
        slots = jnp.split(x, 2, axis=1)
        got = []
        for pairs, send, fill in rounds:
            chunk = jnp.where(jnp.asarray(send)[device] == 0, slots[0], slots[1])
            got.append((jax.lax.ppermute(chunk, axes, perm=pairs), jnp.asarray(fill)[device]))
        (first, first_slot), (second, _) = got  # the two rounds fill the two slots
        return jnp.where(first_slot == 0, jnp.concatenate([first, second], axis=1),
                         jnp.concatenate([second, first], axis=1))

    return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec)(x)


def context_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, window: int = 0,
                      scale: float | None = None, ring: bool = False) -> jax.Array:
    """Causal attention [B, T, H, D] of a sequence in the load-balanced layout (``to_balanced``) whose length is
    split over the context axis. All-gather (the default): each device gathers K, V and the segment ids of the whole
    sequence and attends its own queries to them with XLA's attention. ``ring``: the devices pass their K, V and
    segment ids around the axis in N steps and each accumulates its queries' softmax over one share at a time (the
    online softmax of flash attention), holding one share instead of the whole sequence. The mask is
    ``model.attention.attention_mask``'s (causal, within ``window``, within one packed document), on the tokens'
    original indices."""
    layout = current_layout()
    assert layout is not None, "context_attention runs inside a trainer's activation layout"
    mesh, rules = layout
    parts = context_parts(layout)
    b, t, h, hd = q.shape
    order = jnp.asarray(balanced_order(t, parts))
    chunk = t // (2 * parts)
    scale = hd**-0.5 if scale is None else scale
    heads = logical_to_spec(("batch", "length", "act_heads", "head_dim"), rules)
    rows = logical_to_spec(("batch", "length"), rules)
    axes = spec_axes(heads[1])
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)

    def visible(query_index: jax.Array, key_index: jax.Array, seg: jax.Array, key_seg: jax.Array) -> jax.Array:
        """[B, 1, Tq, Tk]: which keys each query sees."""
        causal = key_index[None, :] <= query_index[:, None]
        if 0 < window < t:
            causal &= query_index[:, None] - key_index[None, :] < window
        return causal[None, None] & (seg[:, None, :, None] == key_seg[:, None, None, :])

    def local(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array) -> jax.Array:
        device = jax.lax.axis_index(axes)
        arange = jnp.arange(chunk)
        query_index = jnp.concatenate([device * chunk + arange, (2 * parts - 1 - device) * chunk + arange])
        if not ring:  # the whole sequence's keys, values and segment ids, in the balanced layout (device order)
            k_all, v_all, seg_all = (jax.lax.all_gather(x, axes, axis=1, tiled=True) for x in (k, v, seg))
            mask = visible(query_index, order, seg, seg_all)
            return jax.nn.dot_product_attention(q, k_all, v_all, mask=mask, scale=scale)
        return _ring(q, k, v, seg, query_index, order, visible, axes, parts, scale)

    return jax.shard_map(local, mesh=mesh, in_specs=(heads, heads, heads, rows), out_specs=heads)(q, k, v, seg)


# ring attention's query block: a ring step scores this many of a device's queries at a time against the share of
# keys it holds, so a step's scores are [B, H, block, share] floats, not [B, H, share, share] (at 131,072 tokens over
# 32 devices, 32 heads: 0.5 GiB a block instead of 2 GiB a step, each with its probabilities and gradient beside it)
RING_QUERY_BLOCK = 1024


def query_block(share: int, most: int) -> int:
    """The largest divisor of ``share`` up to ``most``: every block full (a power-of-two gcd would cut a share of
    1,500 into blocks of 4, a 375-step loop a ring step)."""
    return max(d for d in range(1, min(share, most) + 1) if share % d == 0)


def _ring(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array, query_index: jax.Array, order: jax.Array,
          visible: Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array], axes: tuple[str, ...],
          parts: int, scale: float) -> jax.Array:
    """One device's queries [B, Tq, H, D] against every device's keys and values, passed around the ring: at step s
    the device holds device (i - s)'s share, whose original indices it reads from the balanced ``order``. Scores in
    float32, a running max and sum per query (a masked score adds nothing: exp is taken where visible only). The
    queries go ``RING_QUERY_BLOCK`` at a time through each step (a ``lax.map`` over blocks whose body the backward
    pass recomputes): one block's scores in memory, as flash attention tiles its queries."""
    b, share, h, hd = q.shape
    kv = k.shape[2]
    block = query_block(share, RING_QUERY_BLOCK)
    blocks = share // block
    device = jax.lax.axis_index(axes)
    neg = jnp.finfo(jnp.float32).min

    def by_block(x: jax.Array) -> jax.Array:  # [B, Tq, ...] -> [blocks, B, block, ...]
        return x.reshape(b, blocks, block, *x.shape[2:]).swapaxes(0, 1)

    q_blocks = by_block(q.reshape(b, share, kv, h // kv, hd))
    query_blocks, seg_blocks = query_index.reshape(blocks, block), by_block(seg)

    @jax.checkpoint  # the backward pass recomputes a block's scores: one block's in memory, never a step's
    def attend_block(carry: tuple[jax.Array, jax.Array, jax.Array], q: jax.Array, query_index: jax.Array,
                     seg: jax.Array, k: jax.Array, v: jax.Array, key_seg: jax.Array,
                     key_index: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        peak, total, acc = carry  # [B, KV, G, block], the same, [B, KV, G, block, D]
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k).astype(jnp.float32) * scale
        mask = visible(query_index, key_index, seg, key_seg)[:, :, None]  # [B, 1, 1, block, Tk]
        new_peak = jnp.maximum(peak, jnp.max(jnp.where(mask, scores, neg), axis=-1))
        probs = jnp.where(mask, jnp.exp(scores - new_peak[..., None]), 0.0)
        fade = jnp.exp(peak - new_peak)
        acc = acc * fade[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", probs, v.astype(jnp.float32))
        return new_peak, total * fade + probs.sum(-1), acc

    @jax.checkpoint  # a step's blocks are recomputed from its inputs: the ring keeps no step's intermediates
    def attend_share(carry: tuple[jax.Array, jax.Array, jax.Array], k: jax.Array, v: jax.Array, key_seg: jax.Array,
                     key_index: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        def one(args: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array, jax.Array]:
            *block_carry, q, query_index, seg = args
            return attend_block(tuple(block_carry), q, query_index, seg, k, v, key_seg, key_index)

        return jax.lax.map(one, (*carry, q_blocks, query_blocks, seg_blocks))

    # per block: [blocks, B, KV, G, block], the same, [blocks, B, KV, G, block, D]
    carry = (jnp.full((blocks, b, kv, h // kv, block), neg), jnp.zeros((blocks, b, kv, h // kv, block)),
             jnp.zeros((blocks, b, kv, h // kv, block, hd)))
    ring = [(j, (j + 1) % parts) for j in range(parts)]
    key_seg = seg
    for step in range(parts):
        key_index = jax.lax.dynamic_slice_in_dim(order, ((device - step) % parts) * share, share)
        carry = attend_share(carry, k, v, key_seg, key_index)
        if step < parts - 1:  # the next device's share; the last step's would only come back home
            k, v, key_seg = (jax.lax.ppermute(x, axes, perm=ring) for x in (k, v, key_seg))
    _, total, acc = carry
    out = acc / total[..., None]  # every query sees at least itself: total > 0
    # [blocks, B, KV, G, block, D] -> [B, blocks, block, KV, G, D] -> [B, Tq, H, D]
    return out.transpose(1, 0, 4, 2, 3, 5).reshape(b, share, h, hd).astype(v.dtype)
