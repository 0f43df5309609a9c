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

Layouts on disk: a checkpoint records its layout in its meta (``layout_meta``); ``stack_tree`` and
``unstack_tree`` convert any tree holding a ``blocks`` subtree (parameters, optimizer moments,
pure dicts or ``nnx.State``) between ``blocks/<i>/...`` (the unrolled ``nnx.List``) and
``blocks/...`` with a leading layer axis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

LAYER_AXIS = "layers"  # the logical axis name of the stacked layer dimension (train.mesh.rules)
BLOCKS = "blocks"  # the attribute holding the decoder's layers, stacked or as an nnx.List
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


def layer_ndim(path: tuple[Any, ...], leaf: Any) -> int:
    """A parameter's rank per layer: a stacked leaf (under ``blocks``, no layer index in its path) has one
    dimension more than each layer's (weight decay skips vectors by this rank, not the stacked one)."""
    keys = tuple(_key(k) for k in path)
    return leaf.ndim - 1 if BLOCKS in keys and not _has_layer_index(keys) else leaf.ndim


def _key(entry: Any) -> Any:
    """A tree path entry's key: a dict key, an attribute name or a sequence index."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return entry


def _has_layer_index(path: tuple[Any, ...]) -> bool:
    """Whether the key after ``blocks`` is a layer index (an unrolled leaf's path)."""
    at = path.index(BLOCKS) + 1
    return at < len(path) and _is_layer_index(path[at])


def _is_layer_index(key: Any) -> bool:
    return isinstance(key, int) or (isinstance(key, str) and key.isdigit())


def _paths(tree: Any) -> tuple[list[tuple[Any, ...]], list[Any], Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [tuple(_key(k) for k in path) for path, _ in flat], [leaf for _, leaf in flat], treedef


def _unrolled_path(stacked_path: tuple[Any, ...], layer: int) -> tuple[Any, ...] | None:
    """The unrolled twin of a stacked leaf's path for ``layer`` (None: not under ``blocks``)."""
    if BLOCKS not in stacked_path:
        return None
    at = stacked_path.index(BLOCKS) + 1
    return (*stacked_path[:at], layer, *stacked_path[at:])


def _canonical(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """Layer indices as ints, whichever way the tree spells them (``nnx.List`` keys, Orbax's strings)."""
    if BLOCKS in path and _has_layer_index(path):
        at = path.index(BLOCKS) + 1
        return (*path[:at], int(path[at]), *path[at + 1:])
    return path


def stack_tree(unrolled: Any, stacked_like: Any) -> Any:
    """``stacked_like``'s structure filled from ``unrolled``: each leaf under ``blocks`` is ``stack`` of
    the unrolled tree's leaves ``blocks/0/...``, ``blocks/1/...`` (in layer order, ``jnp.stack``); every other leaf is
    taken as it is. Both trees are of the same kind (parameters, or a whole train state)."""
    source = {_canonical(p): leaf for p, leaf in zip(*_paths(unrolled)[:2], strict=True)}
    paths, _, treedef = _paths(stacked_like)
    leaves = []
    for path in paths:
        if _unrolled_path(path, 0) is None:
            leaves.append(source[path])
            continue
        layers = []
        while (twin := _unrolled_path(path, len(layers))) in source:
            layers.append(source[twin])
        if not layers:
            raise KeyError(f"no unrolled layers for stacked leaf {'/'.join(map(str, path))}")
        leaves.append(jnp.stack(layers))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def unstack_tree(stacked_tree: Any, unrolled_like: Any) -> Any:
    """The inverse of ``stack_tree``: ``unrolled_like``'s structure, each ``blocks/<i>/...`` leaf being
    ``stacked leaf[i]``."""
    source = dict(zip(*_paths(stacked_tree)[:2], strict=True))
    paths, _, treedef = _paths(unrolled_like)
    leaves = []
    for path in paths:
        path = _canonical(path)
        if BLOCKS in path and _has_layer_index(path):
            at = path.index(BLOCKS) + 1
            leaves.append(source[(*path[:at], *path[at + 1:])][int(path[at])])
        else:
            leaves.append(source[path])
    return jax.tree_util.tree_unflatten(treedef, leaves)


def unrolled_pure(pure: Mapping[str, Any]) -> dict[str, Any]:
    """A pure parameter dict (``nnx.to_pure_dict``) with stacked ``blocks`` as ``{i: {...}}`` per layer
    (numpy views, no copy); an unrolled dict is returned as it is."""
    blocks = pure.get(BLOCKS)
    if not isinstance(blocks, Mapping) or not blocks or all(_is_layer_index(k) for k in blocks):
        return dict(pure)
    arrays = jax.tree.map(np.asarray, dict(blocks))
    n = len(jax.tree.leaves(arrays)[0])
    return {**pure, BLOCKS: {i: jax.tree.map(lambda a, i=i: a[i], arrays) for i in range(n)}}
