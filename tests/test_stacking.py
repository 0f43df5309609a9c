"""model/stacking.py's shared pieces against plain Python: the grouped scan over a repeating pattern of static layer
settings (``scan_groups``, ``scan_groups_xs``: Gemma 3's local/global layers) against a loop over the layers, and
the layer-stack names a family gives (``ModelFamily.roles.layers``) in restacking and weight decay's per-layer rank.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from model.stacking import layer_ndim, n_stacked, scan_groups, scan_groups_xs, stack_tree, stacked, unstack_tree

D = 8
PATTERN = ("tanh", "relu")  # two static settings: each is another program, so neither can be a scanned input
L = 2 * len(PATTERN) + 1  # two full groups and a tail of one


class Layer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (D, D)) / D ** 0.5)
        self.b = nnx.Param(jax.random.normal(rngs.params(), (D,)))

    def __call__(self, x: jax.Array, setting: str) -> jax.Array:
        act = jnp.tanh if setting == "tanh" else jax.nn.relu
        return x + act(x @ self.w[...] + self.b[...])


def layers_of(stack: nnx.Module) -> list[nnx.Module]:
    """Each layer of a stack as a module of its own (its slice of every stacked parameter)."""
    graphdef, params = nnx.split(stack)
    return [nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params)) for i in range(n_stacked(stack))]


def stack_and_input() -> tuple[nnx.Module, jax.Array]:
    stack = stacked(Layer, L, nnx.Rngs(0))
    return stack, jax.random.normal(jax.random.key(1), (3, D))


@pytest.mark.parametrize("unroll", [1, 2])
def test_grouped_scan_equals_a_loop_over_the_layers(unroll: int) -> None:
    stack, x = stack_and_input()
    assert n_stacked(stack) == L
    got = scan_groups(stack, x, PATTERN, lambda layer, h, setting: layer(h, setting), unroll=unroll)
    want = x
    for i, layer in enumerate(layers_of(stack)):
        want = layer(want, PATTERN[i % len(PATTERN)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # the tail layer (layer 4) runs with pattern[0]: with the other setting the output differs
    wrong = x
    for i, layer in enumerate(layers_of(stack)):
        wrong = layer(wrong, PATTERN[1] if i == L - 1 else PATTERN[i % len(PATTERN)])
    assert np.abs(np.asarray(wrong) - np.asarray(want)).max() > 1e-3


def test_grouped_scan_with_per_layer_inputs_and_outputs_equals_a_loop() -> None:
    stack, x = stack_and_input()
    xs = {"k": jax.random.normal(jax.random.key(2), (L, 3, D)), "v": jnp.arange(L, dtype=jnp.float32)}

    def run(layer: nnx.Module, h: jax.Array, setting: str, layer_xs: Any) -> tuple[jax.Array, Any]:
        h = layer(h + layer_xs["k"], setting) * (1 + layer_xs["v"])
        return h, {"k": h - layer_xs["k"], "v": layer_xs["v"] + h.sum()}

    got, ys = scan_groups_xs(stack, x, xs, PATTERN, run)
    want, written = x, []
    for i, layer in enumerate(layers_of(stack)):
        want, out = run(layer, want, PATTERN[i % len(PATTERN)], jax.tree.map(lambda a, i=i: a[i], xs))
        written.append(out)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert ys["k"].shape == (L, 3, D) and ys["v"].shape == (L,)  # the layer axis first, every layer's slice
    for i, out in enumerate(written):
        np.testing.assert_allclose(ys["k"][i], out["k"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ys["v"][i], out["v"], rtol=1e-5, atol=1e-5)


def test_restacking_and_the_per_layer_rank_follow_the_familys_stack_names() -> None:
    """Two stacks under other names than ``blocks`` (dense layers, then MoE layers): both restack, and a stacked
    norm scale [layers, D] counts as the vector it is per layer."""
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(size=shape).astype(np.float32)

    unrolled = {"embed": normal(5, 4), "dense": {i: {"w": normal(4, 4), "scale": normal(4)} for i in range(2)},
                "moe": {i: {"w": normal(3, 4, 4)} for i in range(3)}}
    like = {"embed": np.zeros((5, 4)), "dense": {"w": np.zeros((2, 4, 4)), "scale": np.zeros((2, 4))},
            "moe": {"w": np.zeros((3, 3, 4, 4))}}
    stacks = ("dense", "moe")
    restacked = stack_tree(unrolled, like, stacks)
    np.testing.assert_array_equal(restacked["moe"]["w"][2], unrolled["moe"][2]["w"])
    np.testing.assert_array_equal(restacked["dense"]["scale"][1], unrolled["dense"][1]["scale"])
    back = unstack_tree(restacked, unrolled, stacks)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(unrolled), strict=True):
        np.testing.assert_array_equal(a, b)
    ranks = {jax.tree_util.keystr(path): layer_ndim(path, leaf, stacks)
             for path, leaf in jax.tree_util.tree_leaves_with_path(restacked)}
    assert ranks == {"['dense']['scale']": 1, "['dense']['w']": 2, "['embed']": 2, "['moe']['w']": 3}
    # under the default name only ``blocks`` is a stack: the scale would count as a matrix
    assert layer_ndim(jax.tree_util.tree_leaves_with_path(restacked)[0][0], restacked["dense"]["scale"]) == 2
