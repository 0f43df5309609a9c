"""The key/value cache of text generation, for every family: one layout, one attention over it.

    k, v   [L, B, S, KV, D]  every layer's keys and values (RoPE applied), S slots per row (multi-head latent
                             attention: k its latent, v its rope key, one "head" each, of their own widths)
    index  int32 scalar      the next slot to write: the same for every row
    start  [B] int32         each row's first real slot

Prompts are LEFT-padded to one length, so all rows write the same slot at each step and one
``dynamic_update_slice`` serves the batch; a row's padding (slots before ``start``) is never attended
to, and its positions (for RoPE) count from ``start``: slot - start. A scanned decoder passes each
layer's [B, S, KV, D] slice in as a scan input and gets the updated slice back as a scan output
(model/stacking.py's ``scan_layers_xs``); an unrolled one loops over the layers.

The cached attention is the einsum reference (model/attention.py) with an explicit mask: the queries
are few (one per step after the prompt), and its scores read any number of key slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from model.attention import einsum_attention
from model.stacking import scan_layers_xs

LayerKV = tuple[jax.Array, jax.Array]  # one layer's k and v [B, S, KV, D]


class KVCache(NamedTuple):
    """Every layer's keys and values and where the next write goes (a pytree: passes through ``jax.jit``)."""

    k: jax.Array  # [L, B, S, KV, D]
    v: jax.Array  # [L, B, S, KV, D]
    index: jax.Array  # int32 scalar: the slot the next token's keys and values are written to
    start: jax.Array  # [B] int32: each row's first real slot (the rows are left-padded)

    @property
    def length(self) -> int:
        """S: the slots per row."""
        return int(self.k.shape[2])

    def slots(self, t: int) -> jax.Array:
        """The slots [T] the next ``t`` tokens go to."""
        return self.index + jnp.arange(t, dtype=jnp.int32)

    def positions(self, t: int) -> jax.Array:
        """Row-local positions [B, T] of the next ``t`` tokens: slot - start, 0 on a row's padding."""
        return jnp.maximum(self.slots(t)[None, :] - self.start[:, None], 0)

    def advanced(self, k: jax.Array, v: jax.Array, t: int) -> KVCache:
        """The cache after ``t`` tokens were written: their keys and values, the index past them."""
        return KVCache(k, v, self.index + t, self.start)


def cache_shape(model: Any) -> tuple[int, int, int, int]:
    """(layers, KV heads, key width, value width) of a family's decoder (``CachedDecoding.cache_shape``)."""
    return model.cache_shape()


def init_cache(model: Any, batch: int, length: int, start: Any = None, dtype: Any = None) -> KVCache:
    """An empty cache of ``length`` slots per row for ``model``, in its parameters' dtype unless ``dtype`` is given.

    ``start`` [B]: each row's first real slot (default 0: no padding)."""
    layers, kv_heads, key_width, value_width = cache_shape(model)
    dtype = model.compute_dtype() if dtype is None else dtype
    first = jnp.zeros((batch,), jnp.int32) if start is None else jnp.asarray(start, jnp.int32)
    # two buffers, not one zeros array twice: a jitted step donates k and v (one buffer cannot be donated twice)
    return KVCache(jnp.zeros((layers, batch, length, kv_heads, key_width), dtype),
                   jnp.zeros((layers, batch, length, kv_heads, value_width), dtype), jnp.zeros((), jnp.int32), first)


def cache_mask(cache: KVCache, t: int, window: int = 0) -> jax.Array:
    """[B, 1, T, S] boolean: query slot q (``cache.slots(t)``) sees key slot s when start <= s <= q, and
    q - s < ``window`` when > 0 (sliding-window layers)."""
    query = cache.slots(t)[:, None]
    key = jnp.arange(cache.length, dtype=jnp.int32)[None, :]
    visible = key <= query
    if window > 0:
        visible &= query - key < window
    return (visible[None] & (key[None] >= cache.start[:, None, None]))[:, None]


def attend_cached(q: jax.Array, k: jax.Array, v: jax.Array, layer: LayerKV, cache: KVCache, window: int = 0,
                  scale: float | None = None) -> tuple[jax.Array, LayerKV]:
    """Attention [B, T, H, D] of the new queries over the cached keys and values with the new ones
    (``k``, ``v`` [B, T, KV, D]) written at ``cache.index``; returns the layer's updated k and v too."""
    cached_k, cached_v = layer
    at = (0, cache.index, 0, 0)
    cached_k = jax.lax.dynamic_update_slice(cached_k, k.astype(cached_k.dtype), at)
    cached_v = jax.lax.dynamic_update_slice(cached_v, v.astype(cached_v.dtype), at)
    mask = cache_mask(cache, q.shape[1], window)
    out = einsum_attention(q, cached_k.astype(q.dtype), cached_v.astype(q.dtype), mask, scale)
    return out, (cached_k, cached_v)


def decode_layers(blocks: Any, x: jax.Array, cache: KVCache,
                  run: Callable[[Any, jax.Array, LayerKV], tuple[jax.Array, LayerKV]], scanned: bool,
                  unroll: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Every layer's ``run(block, h, (k, v)) -> (h, (k, v))`` over its slice of ``cache``, scanned (the stacked
    ``blocks``, the slices riding through the scan) or in a loop over per-layer blocks: (hidden, new k, new v),
    each cache stacked [L, ...] as ``cache.advanced`` takes it."""
    if scanned:
        x, (k, v) = scan_layers_xs(blocks, x, (cache.k, cache.v), run, unroll=unroll)
        return x, k, v
    layers = []
    for i, block in enumerate(blocks):
        x, layer = run(block, x, (cache.k[i], cache.v[i]))
        layers.append(layer)
    k, v = (jnp.stack(kv) for kv in zip(*layers, strict=True))
    return x, k, v


def cached_logits(model: Any, tokens: Any, prompt: int, cache: KVCache | None = None,
                  slots: int = 32) -> tuple[jax.Array, KVCache]:
    """Logits [B, T, V] of ``tokens`` [B, T] as generation computes them: one prefill of the first ``prompt`` tokens
    written into ``cache`` (default: an empty one of ``slots`` per row), then a decode step per remaining token; and
    the cache after them. What a family's cache is held to against its full forward pass (tests, bench)."""
    from flax import nnx  # the module's other users never build a model

    decode = nnx.jit(lambda m, t, c: m.decode(t, c))
    tokens = jnp.asarray(tokens)
    logits, cache = decode(model, tokens[:, :prompt], init_cache(model, tokens.shape[0], slots) if cache is None
                           else cache)
    steps = [logits]
    for i in range(prompt, tokens.shape[1]):
        logits, cache = decode(model, tokens[:, i:i + 1], cache)
        steps.append(logits)
    return jnp.concatenate(steps, axis=1), cache
