"""What each ``model.remat`` policy keeps for the backward pass, read from JAX itself (``saved_residuals``, the list
``jax.ad_checkpoint.print_saved_residuals`` prints), in every shipped family:

- ``full`` keeps the blocks' inputs and no projection output; ``save_dots`` keeps, besides those, the projections'
  outputs by name (model/linear.py's ``PROJECTIONS``: what a dot-matching policy could not see inside ``linear``'s
  custom VJP, where it kept exactly what ``full`` keeps); ``offload`` keeps the same outputs in host memory and
  on the device only what ``full`` keeps; ``none`` keeps more than ``save_dots`` (attention's probabilities, the
  activations' products).
- The scanned layout (the default), where the layers' residuals leave the loop stacked, keeps the same amounts.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals  # what the public print_saved_residuals prints, as data

from experiment.families import shipped_families
from model.linear import PROJECTIONS
from model.registry import get_family

VOCAB, BATCH, SEQ = 96, 2, 16
POLICIES = ("none", "save_dots", "offload", "full")


def hidden_loss(family: str, remat: str, seq: int = SEQ, **shape: object) -> tuple[Callable[[nnx.State], jax.Array],
                                                                                  nnx.State]:
    """(parameters -> the sum of the tiny model's hidden states, its parameters) under ``remat``."""
    fam = get_family(family)
    model = fam.init(fam.tiny_config(remat=remat, max_seq_len=max(seq, SEQ), **shape), VOCAB, seed=0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.zeros((BATCH, seq), jnp.int32)

    def loss(p: nnx.State) -> jax.Array:
        return jnp.sum(nnx.merge(graphdef, p, rest).hidden(tokens))

    return loss, params


def residuals(family: str, remat: str, scan_layers: bool) -> list[tuple[jax.core.ShapedArray, str]]:
    """(value, where it comes from) of everything the gradient of the tiny model's hidden states keeps, less the
    parameters (kept under every policy)."""
    loss, params = hidden_loss(family, remat, scan_layers=scan_layers)
    return [(aval, source) for aval, source in saved_residuals(loss, params)
            if not source.startswith("from the argument")]


def named(kept: list[tuple[jax.core.ShapedArray, str]]) -> Counter[tuple[str, tuple[int, ...]]]:
    """(name, shape) -> how many of the kept values carry that checkpoint name."""
    return Counter((source.split("'")[1], tuple(aval.shape)) for aval, source in kept if source.startswith("named '"))


def on_host(aval: jax.core.ShapedArray) -> bool:
    return "<host>" in str(aval)  # e.g. float32<host>[2,16,64]: what the policy moved to pinned host memory


def size(kept: list[tuple[jax.core.ShapedArray, str]], host: bool) -> int:
    """Values kept on the device (``host`` False) or in host memory (True)."""
    return sum(math.prod(aval.shape) for aval, _ in kept if on_host(aval) == host)


@pytest.mark.parametrize("family", shipped_families())
def test_each_policy_keeps_what_it_promises(family: str) -> None:
    kept = {remat: residuals(family, remat, scan_layers=False) for remat in POLICIES}
    cfg = get_family(family).tiny_config()
    saved = named(kept["save_dots"])
    assert {name for name, _ in saved} <= set(PROJECTIONS)
    # every layer keeps its attention's query, key and value projections (and what writes into the residual
    # stream), one per layer: DeepSeek-V3's low-rank query and key-value projections stand for q, k and v
    attention = {"q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj"} if family == "deepseek_v3" else {
        "q_proj", "k_proj", "v_proj", "o_proj"}
    per_name = Counter(name for name, _ in saved.elements())
    assert {name: per_name[name] for name in attention} == dict.fromkeys(attention, cfg.n_layers), saved
    assert not named(kept["full"]), named(kept["full"])  # full: nothing but the layers' inputs
    # save_dots keeps the projections on top of what full keeps, every one of them in full
    extra = size(kept["save_dots"], host=False) - size(kept["full"], host=False)
    assert extra == sum(math.prod(shape) * n for (_, shape), n in saved.items()) > 0
    # offload: the same values, in host memory; on the device, what full keeps
    assert size(kept["offload"], host=False) == size(kept["full"], host=False)
    assert size(kept["offload"], host=True) == extra
    assert not named([(aval, source) for aval, source in kept["offload"] if not on_host(aval)])
    assert size(kept["none"], host=False) > size(kept["save_dots"], host=False)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_scanned_layers_keep_the_same(family: str) -> None:
    """Scanned, the layers' kept values leave the loop stacked (unnamed): the amounts are the unrolled layout's."""
    unrolled = {remat: residuals(family, remat, scan_layers=False) for remat in ("save_dots", "full")}
    scanned = {remat: residuals(family, remat, scan_layers=True) for remat in ("save_dots", "offload", "full")}
    extra = size(unrolled["save_dots"], host=False) - size(unrolled["full"], host=False)
    assert size(scanned["save_dots"], host=False) - size(scanned["full"], host=False) == extra > 0
    assert size(scanned["offload"], host=True) == extra


def test_the_priced_recompute_is_what_the_compiled_step_recomputes() -> None:
    """XLA's own FLOP count of the unrolled step (which counts rematerialised work) under each policy, less the
    step without remat, against what the planner prices (``ModelFamily.recompute_flops``, hand-counted dots):
    save_dots re-runs attention's score and value dots (and elementwise work the hand count leaves out, under a
    fifth here); full re-runs every block but the down projections, whose outputs the backward pass never reads
    (the hand count includes them: full is priced high by at most those)."""
    fam = get_family("llama")
    seq, shape = 128, {"d_model": 128, "d_ff": 512, "n_heads": 4, "n_kv_heads": 2, "attention": "dot_product"}
    compiled, priced = {}, {}
    for remat in ("none", "save_dots", "full"):
        loss, params = hidden_loss("llama", remat, seq, scan_layers=False, **shape)
        compiled[remat] = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()["flops"] / (BATCH * seq)
        priced[remat] = fam.recompute_flops(fam.tiny_config(remat=remat, max_seq_len=seq, **shape), VOCAB, seq,
                                            "dot_product")
    save_dots, full = compiled["save_dots"] - compiled["none"], compiled["full"] - compiled["none"]
    assert priced["save_dots"] <= save_dots <= 1.2 * priced["save_dots"], (save_dots, priced)
    down = 2 * shape["d_model"] * shape["d_ff"] * fam.tiny_config().n_layers
    assert priced["full"] - down <= full <= priced["full"], (full, priced)
