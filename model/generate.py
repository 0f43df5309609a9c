"""Text generation with a KV cache, for any family's decoder (``FamilyModel.decode``): token ids in, token ids out.

    prompts --left-pad to a bucket--> prefill (one jitted call: every prompt token into the cache, the
    first new token sampled) --> decode steps (one jitted call per token: feed it, sample the next)

The prompts are left-padded to a multiple of ``BUCKET`` tokens and the cache is the padded prompt plus
``max_new_tokens`` rounded up to ``BUCKET``, so a prefill compiles once per (batch, bucket) and a decode
step once per (batch, cache length); a second call of the same shapes compiles nothing. The model crosses
the jit edge as (graphdef, state) (``nnx.split``), as the trainer's step does.

Sampling: greedy at temperature 0; else softmax of logits / temperature, restricted to the ``top_k``
most likely tokens (0: all) and to the smallest set whose probability reaches ``top_p`` (1: all), drawn
with the key ``fold_in(key(seed), i)`` at new token ``i``: one seed gives the same tokens every time.
A row stops at its first ``eos_id`` (not returned); the decode stops when every row has.

On a mesh (``layout``: the training mesh and its rules): the parameters are laid out by their logical axes as
the trainer lays them out, the prompts and the cache are split over the batch's mesh axes and the cache's KV
heads over the heads' (the cache sharded like the activations), and the model's own activation constraints
apply while the calls trace. A batch that does not divide the batch's axes is padded with copies of its first
prompt, dropped from the result: rows are independent, so the real rows' tokens are those of a one-device run.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiment.errors import ConfigError
from model.family import CachedDecoding
from model.kv_cache import KVCache, init_cache
from model.sharding import Rules, activation_layout, check_divisible, logical_to_spec, mesh_parts

CACHE_AXES = ("layers", "batch", "length", "kv_heads", "head_dim")  # KVCache.k and .v [L, B, S, KV, D]

BUCKET = 16  # prompt and cache lengths are rounded up to a multiple of this: a compile per bucket, not per length


def bucketed(n: int, bucket: int = BUCKET) -> int:
    return -(-n // bucket) * bucket


@dataclass(frozen=True)
class Sampling:
    """How each next token is chosen (see the module docstring); static to the compiled step."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def check(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generated:
    """What ``generate`` returns: each row's new ids (without the EOS that stopped it) and the timings."""

    tokens: list[list[int]]
    finished: list[str]  # per row: "eos" (stopped at eos_id) or "length" (max_new_tokens reached)
    prompt_lengths: list[int]
    prefill_seconds: float  # the prefill call, compile included the first time a shape is seen
    decode_seconds: float  # the decode steps after it, but a step that compiled
    decode_steps: int  # the decode steps timed (each gives one token to every row)
    compiled: list[str] = field(default_factory=list)  # which calls compiled in this run (prefill, decode)
    devices: int = 1  # the devices the decode ran over (its new tokens' placement)

    @property
    def decode_tokens_per_second(self) -> float:
        """New tokens per second of the decode phase, over all rows (the batch's throughput)."""
        tokens = self.decode_steps * len(self.tokens)
        return tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def sample(logits: jax.Array, key: jax.Array, sampling: Sampling) -> jax.Array:
    """The next token [B] int32 of fp32 logits [B, V]."""
    if sampling.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / sampling.temperature
    floor = jnp.finfo(jnp.float32).min
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, floor, logits)
    if sampling.top_p < 1:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        # a token is kept while the mass before it is short of top_p: the most likely one always is
        kept = jnp.cumsum(probs, axis=-1) - probs < sampling.top_p
        threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, floor, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "sampling"))
def _prefill(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array, cache: KVCache, key: jax.Array,
             sampling: Sampling) -> tuple[jax.Array, KVCache]:
    logits, cache = nnx.merge(graphdef, state).decode(tokens, cache, last=True)
    return sample(logits[:, -1], jax.random.fold_in(key, 0), sampling), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "sampling"), donate_argnames=("cache",))
def _step(graphdef: nnx.GraphDef, state: nnx.State, token: jax.Array, cache: KVCache, key: jax.Array,
          i: jax.Array, sampling: Sampling) -> tuple[jax.Array, KVCache]:
    logits, cache = nnx.merge(graphdef, state).decode(token[:, None], cache, last=True)
    return sample(logits[:, -1], jax.random.fold_in(key, i), sampling), cache


def compiled_programs(fn: Any) -> int:
    """How many programs a jitted function holds: a call that raised it compiled. A private counter of
    ``jax.jit`` (0 where a JAX version lacks it: timings then include compiles, and ``compiled`` stays empty)."""
    return int(getattr(fn, "_cache_size", lambda: 0)())


def check_decodes(model: Any) -> None:
    """A one-line error unless ``model`` implements cached decoding (``model.family.CachedDecoding``)."""
    from model.layers import CausalLM

    inherited = isinstance(model, CausalLM) and type(model).decode_hidden is CausalLM.decode_hidden
    if not isinstance(model, CachedDecoding) or inherited:
        raise ConfigError(f"{type(model).__module__}.{type(model).__name__} has no KV-cache decoding "
                          "(model.family.CachedDecoding): its family cannot generate text")


def generate(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, eos_id: int | Sequence[int] | None = None,
             pad_id: int = 0, max_len: int | None = None, layout: tuple[Mesh, Rules] | None = None) -> Generated:
    """Continue each prompt (token ids) by up to ``max_new_tokens`` ids (see the module docstring).

    ``eos_id``: one id or several that end a row. ``max_len``: the longest sequence the model takes (its
    ``max_seq_len``); a prompt plus ``max_new_tokens`` longer than that is a one-line error. ``layout``: the
    mesh and rules to run on (None: where the model's parameters are)."""
    check_decodes(model)
    sampling = Sampling(float(temperature), int(top_k), float(top_p))
    sampling.check()
    if not prompts:
        raise ConfigError("no prompts to generate from")
    if max_new_tokens <= 0:
        raise ConfigError(f"max_new_tokens must be positive, got {max_new_tokens}")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise ConfigError(f"prompt {lengths.index(0)} is empty: a prompt needs at least one token")
    longest = max(lengths)
    if max_len is not None and longest + max_new_tokens > max_len:
        raise ConfigError(f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} is longer than the "
                          f"model's max_seq_len={max_len}")
    stops = set() if eos_id is None else {int(eos_id)} if isinstance(eos_id, int) else {int(e) for e in eos_id}

    real_rows = len(prompts)
    if layout is not None:  # whole rows per device: pad with copies of the first prompt
        parts = batch_parts(*layout)
        prompts = [*prompts, *[prompts[0]] * (-real_rows % parts)]
    batch, width = len(prompts), bucketed(longest)
    padded = np.full((batch, width), pad_id, np.int32)
    for row, ids in enumerate(prompts):
        padded[row, width - len(ids):] = np.asarray(ids, np.int32)
    start = np.asarray([width - len(ids) for ids in prompts], np.int32)
    cache = init_cache(model, batch, width + bucketed(max_new_tokens), start=start)
    graphdef, state = nnx.split(model)
    tokens = jnp.asarray(padded)
    if layout is not None:
        state, tokens, cache = on_mesh(state, tokens, cache, *layout)
    key = jax.random.key(seed)
    with contextlib.ExitStack() as scope:
        if layout is not None:  # the model's activation constraints pin their layout while the calls trace
            scope.enter_context(activation_layout(*layout))
        drawn, prefill_seconds, timed, compiled, devices = _decode(graphdef, state, tokens, cache, key, sampling,
                                                                   max_new_tokens, stops)
    tokens_out, finished = [], []
    for row in drawn[:real_rows].tolist():
        cut = next((i for i, t in enumerate(row) if t in stops), None)
        tokens_out.append(row if cut is None else row[:cut])
        finished.append("length" if cut is None else "eos")
    return Generated(tokens_out, finished, lengths, prefill_seconds, sum(timed), len(timed), compiled, devices)


def batch_parts(mesh: Mesh, rules: Rules) -> int:
    """How many parts the batch is split into on ``mesh``: the product of the mesh axes ``batch`` maps to."""
    return mesh_parts(mesh, logical_to_spec(("batch",), rules)[0])


def on_mesh(state: nnx.State, tokens: jax.Array, cache: KVCache, mesh: Mesh,
            rules: Rules) -> tuple[nnx.State, jax.Array, KVCache]:
    """The parameters, prompts and cache placed on ``mesh``: parameters by their logical axes (a model restored
    onto the mesh already is, and stays where it is; a variable without axis names is replicated), prompts
    [B, T] and the cache's k and v split like the activations, the row starts over the batch's axes, the write
    index replicated. A dim that does not divide its mesh axes is a one-line error naming it."""

    def placed(what: str, logical: Sequence[str], shape: Sequence[int]) -> NamedSharding:
        spec = logical_to_spec([name if name in rules else None for name in logical], rules)
        check_divisible(f"{what} {tuple(logical)}", shape, spec, mesh)
        return NamedSharding(mesh, spec)

    def parameter(path: tuple[Any, ...], leaf: Any) -> Any:
        names = leaf.get_metadata().get("out_sharding") if isinstance(leaf, nnx.Variable) else None
        if names is None:
            return jax.device_put(leaf, NamedSharding(mesh, PartitionSpec()))
        where = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        return jax.device_put(leaf, leaf.replace(placed(f"parameter {where}", names, leaf.shape)))

    state = jax.tree_util.tree_map_with_path(parameter, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    keys, values = placed("the KV cache", CACHE_AXES, cache.k.shape), placed("the KV cache", CACHE_AXES, cache.v.shape)
    cache = KVCache(jax.device_put(cache.k, keys), jax.device_put(cache.v, values),
                    jax.device_put(cache.index, NamedSharding(mesh, PartitionSpec())),
                    jax.device_put(cache.start, placed("the row starts", ("batch",), cache.start.shape)))
    return state, jax.device_put(tokens, placed("the prompts", ("batch", "length"), tokens.shape)), cache


def _decode(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array, cache: KVCache, key: jax.Array,
            sampling: Sampling, max_new_tokens: int,
            stops: set[int]) -> tuple[np.ndarray, float, list[float], list[str], int]:
    """The prefill and the decode steps: (new ids [B, N], prefill seconds, timed steps' seconds, what compiled,
    the devices the last new tokens were on)."""
    compiled: list[str] = []
    batch = tokens.shape[0]

    began = time.perf_counter()
    before = compiled_programs(_prefill)
    token, cache = _prefill(graphdef, state, tokens, cache, key, sampling)
    if compiled_programs(_prefill) > before:
        compiled.append("prefill")
    new = [np.asarray(token)]
    prefill_seconds = time.perf_counter() - began

    done = np.isin(new[0], list(stops)) if stops else np.zeros(batch, bool)
    step_seconds = []
    for i in range(1, max_new_tokens):
        if done.all():
            break
        began, before = time.perf_counter(), compiled_programs(_step)
        token, cache = _step(graphdef, state, token, cache, key, jnp.int32(i), sampling)
        new.append(np.asarray(token))  # a host copy per step: the EOS check needs it anyway
        if compiled_programs(_step) > before:
            compiled.append("decode")
            began = None  # a step that compiled is left out of the decode throughput
        step_seconds.append(None if began is None else time.perf_counter() - began)
        if stops:
            done |= np.isin(new[-1], list(stops))
    timed = [s for s in step_seconds if s is not None]
    return np.stack(new, axis=1), prefill_seconds, timed, compiled, len(token.sharding.device_set)
