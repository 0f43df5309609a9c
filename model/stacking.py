"""Scanned decoder layers: one module whose parameters are every layer's, stacked, run by one ``lax.scan``.

Why: with a Python loop over layers the traced program, its compile time and the memory the compiler
plans for all grow with depth (an 80-layer step is 80 copies of the block). Stacked along a leading
``layers`` axis, the block is traced once and ``jax.lax.scan`` runs it per layer; under FSDP each
layer's weights are gathered inside the scan body, one layer at a time (MaxText's ``scan_layers``,
Levanter's ``Stacked``, Flax's ``nnx_toy_examples/06_scan_over_layers.py``).

The layer axis is axis 0 of every stacked parameter (logical name ``layers``, never sharded by the
default rules): ``lax.scan`` slices its ``xs`` along axis 0, so a layer's weights are a contiguous
slice of the stacked array and no transpose is ever made of them (docs/launch.md has the measurement
against MaxText's axis 1).

The scan body merges the layer's slice into the block's graphdef, runs it, and returns the hidden
states alone: returning the (read-only) parameters as scan outputs would stack a second copy of them
(MaxText's fix #4405, 12.7 GB per host on DeepSeek-V3).

Layers that repeat a pattern of static settings (Gemma 3's local and global attention) are one stack too,
run by ``scan_groups`` (a scan over groups of ``len(pattern)`` layers, each unrolled in the body with its own
setting, then the tail); layers of different parameter shapes are two stacks (its docstring).

Layouts on disk: a checkpoint records its layout in its meta (``layout_meta``); ``stack_tree`` and
``unstack_tree`` convert any tree holding a layer stack's subtree (``blocks``, or the names a family gives in
``ModelFamily.roles.layers``; parameters, optimizer moments, pure dicts or ``nnx.State``) between
``blocks/<i>/...`` (the unrolled ``nnx.List``) and ``blocks/...`` with a leading layer axis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

LAYER_AXIS = "layers"  # the logical axis name of the stacked layer dimension (train.mesh.rules)
BLOCKS = "blocks"  # the attribute holding a decoder's layers, stacked or as an nnx.List (ModelFamily.roles.layers)
LAYOUT_KEY = "layout"  # the checkpoint meta's entry


def stacked(make: Callable[[nnx.Rngs], nnx.Module], n_layers: int, rngs: nnx.Rngs) -> nnx.Module:
    """``n_layers`` modules ``make(rngs)`` as one, every parameter stacked along a new axis 0 named ``layers``.

    Layer ``i`` gets exactly the values an unrolled build (``[make(rngs) for _ in range(n_layers)]``) gives
    its ``i``-th module: the parameter stream's draws are numbered (``fold_in(key, count)``), so layer ``i``
    starts counting where the unrolled loop would have, and the stream ends where the loop leaves it. The
    step-0 parameters of a run are thereby the same in either layout, and so is eval's random-init baseline.
    ``make`` may draw from the ``params`` stream only."""
    stream = rngs.params
    draws = _draws_per_module(make)
    start = stream.count[...]

    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYER_AXIS})
    def build(first_draw: jax.Array) -> nnx.Module:
        layer_rngs = nnx.Rngs(params=stream.key[...])
        layer_rngs.params.count[...] = first_draw
        return make(layer_rngs)

    stack = build(start + draws * jnp.arange(n_layers, dtype=start.dtype))
    stream.count[...] = start + draws * n_layers
    return stack


class _CountingRngs:
    """Stands in for ``nnx.Rngs`` while a module is built for its shapes: counts the ``params`` draws."""

    def __init__(self) -> None:
        self.draws = 0

    def params(self) -> jax.Array:
        self.draws += 1
        return jax.random.key(0)


def layer_stack(make: Callable[[nnx.Rngs], nnx.Module], n_layers: int, rngs: nnx.Rngs, scanned: bool) -> nnx.Module:
    """A decoder's layers: one module whose parameters carry a leading layer axis (``stacked``, run by a scan)
    when ``scanned``, else an ``nnx.List`` of per-layer modules; layer i gets the same initial values either way."""
    return stacked(make, n_layers, rngs) if scanned else nnx.List([make(rngs) for _ in range(n_layers)])


def _draws_per_module(make: Callable[[nnx.Rngs], nnx.Module]) -> int:
    """How many keys ``make`` takes from the ``params`` stream (shapes only: nothing is computed)."""
    counter = _CountingRngs()
    with nnx.use_eager_sharding(False):
        jax.eval_shape(lambda: nnx.state(make(counter)))  # type: ignore[arg-type]
    return counter.draws


def scan_layers(stack: nnx.Module, x: jax.Array, run: Callable[[nnx.Module, jax.Array], jax.Array],
                policy: Any = None, remat: bool = False, unroll: int = 1) -> jax.Array:
    """``x`` through every layer of ``stack`` (built by ``stacked``): ``run(layer, x)`` is one layer.

    ``remat``: the body is ``jax.checkpoint``ed with ``policy`` (None: save nothing), which is what a
    remat policy means per layer. ``unroll``: ``lax.scan``'s, layers per loop iteration."""
    graphdef, params = nnx.split(stack)

    def body(h: jax.Array, layer_params: Any) -> tuple[jax.Array, None]:
        return run(nnx.merge(graphdef, layer_params), h), None  # the parameters are not returned

    if remat:
        body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    out, _ = jax.lax.scan(body, x, params, unroll=unroll)
    return out


def scan_layers_xs(stack: nnx.Module, x: jax.Array, xs: Any,
                   run: Callable[[nnx.Module, jax.Array, Any], tuple[jax.Array, Any]],
                   unroll: int = 1) -> tuple[jax.Array, Any]:
    """``scan_layers`` with a per-layer input and output: ``run(layer, x, layer_xs) -> (x, layer_ys)``.

    ``xs``: a tree whose leaves have the layer axis first (e.g. a KV cache's [L, B, S, KV, D] keys and
    values); each layer gets its slice, and the slices it returns come back stacked the same way. No
    remat: this is for inference (text generation), where nothing is differentiated."""
    graphdef, params = nnx.split(stack)

    def body(h: jax.Array, layer: tuple[Any, Any]) -> tuple[jax.Array, Any]:
        layer_params, layer_xs = layer
        return run(nnx.merge(graphdef, layer_params), h, layer_xs)

    return jax.lax.scan(body, x, (params, xs), unroll=unroll)


def run_layers_ys(blocks: Any, x: jax.Array, run: Callable[[nnx.Module, jax.Array], tuple[jax.Array, Any]],
                  scanned: bool, unroll: int = 1) -> tuple[jax.Array, Any]:
    """``x`` through every layer, ``run(layer, x) -> (x, layer_ys)``, whichever layout: ``blocks`` stacked (a
    ``lax.scan``, ``scan_layers_xs``) or a list (a loop); the per-layer outputs come back stacked [L, ...] either
    way (a mixture of experts' router statistics, say)."""
    if scanned:
        return scan_layers_xs(blocks, x, None, lambda block, h, _: run(block, h), unroll=unroll)
    per_layer = []
    for block in blocks:
        x, ys = run(block, x)
        per_layer.append(ys)
    return x, jax.tree.map(lambda *a: jnp.stack(a), *per_layer)


def scan_groups(stack: nnx.Module, x: jax.Array, pattern: Sequence[Any],
                run: Callable[[nnx.Module, jax.Array, Any], jax.Array], unroll: int = 1) -> jax.Array:
    """``x`` through every layer of ``stack`` (built by ``stacked``) where layer ``i`` runs with the static setting
    ``pattern[i % len(pattern)]``: ``run(layer, x, setting)`` is one layer.

    When a family uses it: its layers share their parameters' shapes (one stack, the [L, ...] layout that
    checkpoints, restacking and HF import handle) but differ in settings fixed at trace time, in a repeating
    pattern: Gemma 3's local (sliding window, RoPE base 10k) and global layers (model/gemma3/model.py).
    ``scan_layers`` cannot run them: its body is one program for every layer, and a setting that changes the
    program cannot be a scanned input. Layers whose parameters differ in shape (DeepSeek-style dense first
    layers, then mixture-of-experts layers) are not one stack: build two with ``stacked`` (two attributes, both
    named in ``ModelFamily.roles.layers``) and run each with its own ``scan_layers``, one after the other.

    How: with g = ``len(pattern)``, every stacked parameter's axis 0 is viewed as [L // g, g]; a ``lax.scan``
    runs the L // g groups, the g layers of a group unrolled in its body, each with its own setting; the L % g
    tail layers (settings ``pattern[:L % g]``) run after the scan (Gemma 3 1B: 26 = 4 x 6 + 2; MaxText's Gemma 3
    decoder scans the same repeating block). The body merges one layer's slice at a time into the block's
    graphdef and returns only the hidden states (the read-only parameters are never scan outputs: the module
    docstring says why). ``unroll``: ``lax.scan``'s, groups per loop iteration. No remat here: a family
    checkpoints each layer inside ``run`` (one ``nnx.remat`` per setting, static to its trace, as Gemma 3's
    ``Decoder.layer_fn``).

    With a tail (L % g > 0) the scan's operand is the slice [:L // g * g] of each stacked parameter, which XLA
    materialises as its own buffer (and the gradient is a concatenation of the two parts). Under bf16 compute the
    slice fuses into the cast from the fp32 master weights that the train step makes anyway; under fp32 compute
    it is one transient copy of the scanned layers' weights per step."""
    graphdef, params = nnx.split(stack)
    g = len(pattern)
    n_groups, n_tail = divmod(n_stacked(stack), g)
    if n_groups:
        def body(h: jax.Array, group: Any) -> tuple[jax.Array, None]:
            for j in range(g):
                h = run(nnx.merge(graphdef, _at(group, j)), h, pattern[j])
            return h, None

        x, _ = jax.lax.scan(body, x, _grouped(params, n_groups, g), unroll=unroll)
    for j in range(n_tail):  # layer n_groups * g + j has the setting pattern[j]
        x = run(nnx.merge(graphdef, _at(params, n_groups * g + j)), x, pattern[j])
    return x


def scan_groups_xs(stack: nnx.Module, x: jax.Array, xs: Any, pattern: Sequence[Any],
                   run: Callable[[nnx.Module, jax.Array, Any, Any], tuple[jax.Array, Any]],
                   unroll: int = 1) -> tuple[jax.Array, Any]:
    """``scan_groups`` with a per-layer input and output, as ``scan_layers_xs`` is ``scan_layers``'s:
    ``run(layer, x, setting, layer_xs) -> (x, layer_ys)``.

    ``xs``: a tree whose leaves have the layer axis first (a KV cache's [L, B, S, KV, D] keys and values); they
    are viewed as [L // g, g, ...] scan inputs beside the parameters, each layer's returned slices come back as
    scan outputs, and the tail layers' are appended after them: ``ys`` has the layer axis first, L long. No remat:
    this is for inference (text generation)."""
    graphdef, params = nnx.split(stack)
    g = len(pattern)
    n_groups, n_tail = divmod(n_stacked(stack), g)
    outs: list[Any] = []
    if n_groups:
        def body(h: jax.Array, group: tuple[Any, Any]) -> tuple[jax.Array, Any]:
            group_params, group_xs = group
            written = []
            for j in range(g):
                h, layer_ys = run(nnx.merge(graphdef, _at(group_params, j)), h, pattern[j], _at(group_xs, j))
                written.append(layer_ys)
            return h, jax.tree.map(lambda *a: jnp.stack(a), *written)

        x, scanned = jax.lax.scan(body, x, (_grouped(params, n_groups, g), _grouped(xs, n_groups, g)), unroll=unroll)
        outs.append(jax.tree.map(lambda a: a.reshape(n_groups * g, *a.shape[2:]), scanned))
    for j in range(n_tail):  # layer n_groups * g + j has the setting pattern[j]
        i = n_groups * g + j
        x, layer_ys = run(nnx.merge(graphdef, _at(params, i)), x, pattern[j], _at(xs, i))
        outs.append(jax.tree.map(lambda a: a[None], layer_ys))
    return x, jax.tree.map(lambda *a: jnp.concatenate(a), *outs)


def _at(tree: Any, i: int) -> Any:
    """Layer (or group) ``i`` of a tree whose leaves have that axis first."""
    return jax.tree.map(lambda a: a[i], tree)


def _grouped(tree: Any, n_groups: int, g: int) -> Any:
    """The first ``n_groups * g`` layers of each leaf, viewed as [n_groups, g, ...]."""
    return jax.tree.map(lambda a: a[:n_groups * g].reshape(n_groups, g, *a.shape[1:]), tree)


def n_stacked(stack: nnx.Module) -> int:
    """How many layers a stacked module holds (the length of its parameters' axis 0)."""
    return int(jax.tree.leaves(nnx.state(stack, nnx.Param))[0].shape[0])


def layout_meta(scanned: bool) -> dict[str, Any]:
    """What a checkpoint's meta records of its parameters' layer layout."""
    return {"scan_layers": bool(scanned), "layer_axis": 0 if scanned else None}


def saved_scan_layers(meta: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's parameters are stacked: its meta's layout; a meta without one was written
    before scanned layers existed, by the unrolled code."""
    layout = meta.get(LAYOUT_KEY)
    return bool(layout and layout.get("scan_layers"))


def layer_ndim(path: tuple[Any, ...], leaf: Any, stacks: Sequence[str] = (BLOCKS,)) -> int:
    """A parameter's rank per layer: a stacked leaf (under a layer stack, ``stacks``: the family's
    ``ModelFamily.roles.layers``; no layer index in its path) has one dimension more than each layer's (weight
    decay skips vectors by this rank, not the stacked one)."""
    keys = tuple(_key(k) for k in path)
    at = _stack_at(keys, stacks)
    return leaf.ndim - 1 if at is not None and not _has_layer_index(keys, at) else leaf.ndim


def path_keys(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """A tree path's keys (dict keys, attribute names, sequence indices), as ``nnx.to_pure_dict`` spells them."""
    return tuple(_key(k) for k in path)


def _key(entry: Any) -> Any:
    """A tree path entry's key: a dict key, an attribute name or a sequence index."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return entry


def _stack_at(path: tuple[Any, ...], stacks: Sequence[str]) -> int | None:
    """The position just after the first key of ``path`` that names a layer stack (None: not under one)."""
    return next((i + 1 for i, key in enumerate(path) if key in stacks), None)


def _has_layer_index(path: tuple[Any, ...], at: int) -> bool:
    """Whether the key after the stack's name (at ``at``) is a layer index (an unrolled leaf's path)."""
    return at < len(path) and _is_layer_index(path[at])


def _is_layer_index(key: Any) -> bool:
    return isinstance(key, int) or (isinstance(key, str) and key.isdigit())


def _paths(tree: Any) -> tuple[list[tuple[Any, ...]], list[Any], Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [path_keys(path) for path, _ in flat], [leaf for _, leaf in flat], treedef


def _unrolled_path(stacked_path: tuple[Any, ...], layer: int, stacks: Sequence[str]) -> tuple[Any, ...] | None:
    """The unrolled twin of a stacked leaf's path for ``layer`` (None: not under a layer stack)."""
    at = _stack_at(stacked_path, stacks)
    if at is None:
        return None
    return (*stacked_path[:at], layer, *stacked_path[at:])


def _canonical(path: tuple[Any, ...], stacks: Sequence[str]) -> tuple[Any, ...]:
    """Layer indices as ints, whichever way the tree spells them (``nnx.List`` keys, Orbax's strings)."""
    at = _stack_at(path, stacks)
    if at is not None and _has_layer_index(path, at):
        return (*path[:at], int(path[at]), *path[at + 1:])
    return path


def stack_tree(unrolled: Any, stacked_like: Any, stacks: Sequence[str] = (BLOCKS,)) -> Any:
    """``stacked_like``'s structure filled from ``unrolled``: each leaf under a layer stack (``stacks``: the
    family's ``ModelFamily.roles.layers``, default ``blocks``) is ``stack`` of the unrolled tree's leaves
    ``blocks/0/...``, ``blocks/1/...`` (in layer order, ``jnp.stack``); every other leaf is taken as it is. Both
    trees are of the same kind (parameters, or a whole train state)."""
    source = {_canonical(p, stacks): leaf for p, leaf in zip(*_paths(unrolled)[:2], strict=True)}
    paths, _, treedef = _paths(stacked_like)
    leaves = []
    for path in paths:
        if _unrolled_path(path, 0, stacks) is None:
            leaves.append(source[path])
            continue
        layers = []
        while (twin := _unrolled_path(path, len(layers), stacks)) in source:
            layers.append(source[twin])
        if not layers:
            raise KeyError(f"no unrolled layers for stacked leaf {'/'.join(map(str, path))}")
        leaves.append(jnp.stack(layers))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def unstack_tree(stacked_tree: Any, unrolled_like: Any, stacks: Sequence[str] = (BLOCKS,)) -> Any:
    """The inverse of ``stack_tree``: ``unrolled_like``'s structure, each ``blocks/<i>/...`` leaf being
    ``stacked leaf[i]``."""
    source = dict(zip(*_paths(stacked_tree)[:2], strict=True))
    paths, _, treedef = _paths(unrolled_like)
    leaves = []
    for path in paths:
        path = _canonical(path, stacks)
        at = _stack_at(path, stacks)
        if at is not None and _has_layer_index(path, at):
            leaves.append(source[(*path[:at], *path[at + 1:])][int(path[at])])
        else:
            leaves.append(source[path])
    return jax.tree_util.tree_unflatten(treedef, leaves)


def unrolled_pure(pure: Mapping[str, Any], stacks: Sequence[str] = (BLOCKS,)) -> dict[str, Any]:
    """A pure parameter dict (``nnx.to_pure_dict``) with each stacked layer stack (``stacks``, default
    ``blocks``) as ``{i: {...}}`` per layer (numpy views, no copy); an unrolled dict is returned as it is."""
    out = dict(pure)
    for name in stacks:
        blocks = pure.get(name)
        if not isinstance(blocks, Mapping) or not blocks or all(_is_layer_index(k) for k in blocks):
            continue
        arrays = jax.tree.map(np.asarray, dict(blocks))
        n = len(jax.tree.leaves(arrays)[0])
        out[name] = {i: jax.tree.map(lambda a, i=i: a[i], arrays) for i in range(n)}
    return out
