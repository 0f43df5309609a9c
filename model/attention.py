"""Attention kernels per backend: Pallas splash attention on TPU, cuDNN flash attention on NVIDIA
GPUs, XLA's fused attention elsewhere; plus the hand-written einsum reference.

All take q [B, T, H, D], k and v [B, T, KV, D] (grouped-query: H is a multiple of KV), are causal,
and keep attention inside one packed document when segment ids [B, T] are given. A ``window`` > 0
makes it sliding-window (local) attention: a query sees itself and the ``window - 1`` keys before it
(Transformers' ``sliding_window``; Mistral, Gemma 2/3's local layers). ``scale`` multiplies the scores
(default head_dim ** -0.5). They differ in
memory: the XLA and einsum paths materialise the [B, H, T, T] score matrix (on TPU too: that is why
a 1B model at 2,048 tokens did not fit a v6e-8), the flash kernels never do.

``model.attention: auto`` picks by the platform of the devices the step is compiled for (the
mesh's, so an ahead-of-time compile for a TPU topology on a CPU host picks splash):
tpu -> splash, gpu -> cudnn when its constraints hold (16-bit compute, head_dim <= 128 and a
multiple of 8), else dot_product.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiment.errors import ConfigError
from model.sharding import compiled_platform, current_layout, logical_to_spec

IMPLEMENTATIONS = ("auto", "dot_product", "einsum", "cudnn", "splash")
SPLASH_BLOCKS = (512, 256, 128)  # the largest that divides the sequence is used (MaxText's default is 512)


def resolve_attention(choice: str, platform: str, compute_dtype: jnp.dtype, head_dim: int, seq_len: int) -> str:
    """The implementation ``choice`` stands for on ``platform`` (tpu, gpu/cuda, cpu)."""
    if choice not in IMPLEMENTATIONS:
        raise ConfigError(f"config key 'model.attention': unknown implementation '{choice}' "
                          f"(known: {', '.join(IMPLEMENTATIONS)})")
    platform = "gpu" if platform in ("cuda", "rocm") else platform
    cudnn_ok = jnp.dtype(compute_dtype).itemsize == 2 and head_dim <= 128 and head_dim % 8 == 0
    splash_ok = seq_len % SPLASH_BLOCKS[-1] == 0
    if choice == "auto":
        if platform == "tpu" and splash_ok:
            return "splash"
        if platform == "gpu" and cudnn_ok:
            return "cudnn"
        return "dot_product"
    if choice == "cudnn" and (platform != "gpu" or not cudnn_ok):
        raise ConfigError("config key 'model.attention': cudnn needs an NVIDIA GPU, bfloat16 compute "
                          "and head_dim <= 128 "
                          f"divisible by 8 (platform {platform}, compute {jnp.dtype(compute_dtype).name}, "
                          f"head_dim {head_dim}); use auto")
    if choice == "splash" and not splash_ok:
        raise ConfigError(f"config key 'model.attention': splash needs a sequence length divisible by "
                          f"{SPLASH_BLOCKS[-1]}, got {seq_len}; use auto")
    return choice


def attention_mask(segment_ids: jax.Array | None, length: int, window: int = 0) -> jax.Array:
    """[B or 1, 1, T, T] boolean: causal, within ``window`` positions when > 0, and within one packed
    document when segment ids are given."""
    query, key = jnp.arange(length)[:, None], jnp.arange(length)[None, :]
    visible = key <= query
    if window > 0:
        visible &= query - key < window
    visible = visible[None, None]
    if segment_ids is None:
        return visible
    same_doc = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    return visible & same_doc


def attend(impl: str, q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None,
           window: int = 0, scale: float | None = None) -> jax.Array:
    """Scaled causal attention [B, T, H, D] with the (resolved) implementation ``impl``; ``window`` > 0:
    sliding-window; ``scale``: of the scores (None: head_dim ** -0.5)."""
    if window >= q.shape[1]:  # a window at least the sequence long sees everything causal attention does
        window = 0
    if impl == "splash":
        return splash_attention(q, k, v, segment_ids, window, scale)
    if impl == "einsum":
        return einsum_attention(q, k, v, attention_mask(segment_ids, q.shape[1], window), scale)
    # with no packed documents the kernel's own causal (and local-window) mask is cheaper than a mask tensor
    mask = None if segment_ids is None else attention_mask(segment_ids, q.shape[1], window)
    local = (window - 1, 0) if window > 0 and mask is None else None
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=mask is None, scale=scale,
                                        local_window_size=local, implementation="cudnn" if impl == "cudnn" else None)


def einsum_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     scale: float | None = None) -> jax.Array:
    """The reference: scores in fp32, query heads grouped by the KV head they share."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, h // kv, hd)
    scale = hd**-0.5 if scale is None else scale
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k).astype(jnp.float32) * scale
    scores = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", probs, v).reshape(b, t, h, hd)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, window: int = 0,
                     scale: float | None = None) -> jax.Array:
    """Pallas splash attention (TPU), per device through ``shard_map`` when a mesh layout is active.

    The kernel is a custom call the SPMD partitioner cannot split, so each device runs it on its own
    rows and heads: batch split as the rules split "batch", heads as they split "act_heads" (KV heads
    alike, so every device keeps whole GQA groups). On a CPU it runs in Pallas' interpret mode
    (slow; for tests of its numerics).
    """
    b, t, _, hd = q.shape
    seg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    scale = hd**-0.5 if scale is None else scale
    # the kernel wants [heads, T, D] per example and does not scale the queries
    qh, kh, vh = (x.swapaxes(1, 2) for x in ((q * scale).astype(q.dtype), k, v))
    local = functools.partial(_splash_local, window=window)
    layout = current_layout()
    if layout is None:
        out = local(qh, kh, vh, seg)
    else:
        mesh, rules = layout
        heads = logical_to_spec(("batch", "act_heads", "length", "head_dim"), rules)
        if heads[2] is not None or heads[3] is not None:
            raise ConfigError("config key 'train.mesh.rules': splash attention needs whole sequences and heads per "
                              f"device, but 'length' or 'head_dim' is split ({heads}); use model.attention=dot_product")
        rows = logical_to_spec(("batch", "length"), rules)
        out = jax.shard_map(local, mesh=mesh, in_specs=(heads, heads, heads, rows), out_specs=heads,
                            check_vma=False)(qh, kh, vh, seg)
    return out.swapaxes(1, 2)


def _splash_local(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, window: int = 0) -> jax.Array:
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    kernel = _splash_kernel(q.shape[1], q.shape[2], window, interpret=compiled_platform() == "cpu")
    return jax.vmap(lambda q1, k1, v1, s1: kernel(q1, k1, v1, segment_ids=SegmentIds(s1, s1)))(q, k, v, segment_ids)


def _splash_kernel(heads: int, length: int, window: int, interpret: bool):  # noqa: ANN202 - a Pallas kernel object
    # made per trace, not cached: its mask tables become constants of the program being traced
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        BlockSizes,
        CausalMask,
        LocalMask,
        MultiHeadMask,
        make_splash_mha,
    )

    block = next(b for b in SPLASH_BLOCKS if length % b == 0)
    sizes = BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block, block_kv_dkv=block,
                       block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    # a local mask's blocks outside the window are skipped, not computed and masked
    one = CausalMask((length, length)) if window <= 0 else LocalMask((length, length), (window - 1, 0), offset=0)
    mask = MultiHeadMask([one for _ in range(heads)])
    return make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret)

