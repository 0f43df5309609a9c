"""Text generation with a KV cache (model/kv_cache.py, model/generate.py) on tiny random models (tests/tiny_models.py).

That the cached prefill and decode give the full forward pass's logits, and greedy generation of prompts of
different lengths greedy decoding by full forward passes, is checked for every family, in both layer layouts, by
tests/test_family_contract.py. Here: the same shapes again compile nothing; sampling is reproducible by seed;
EOS stops a row; bad requests are one line; on a mesh of 8 devices (the training mesh's axes) the parameters and
the cache are laid out like the trainer's and the activations, and the tokens are the one-device tokens.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.errors import ConfigError
from experiment.sections.train import MeshConfig
from model.generate import Sampling, generate, on_mesh, sample
from model.kv_cache import init_cache
from model.registry import get_family
from model.sharding import build_mesh
from tests.device_worker import DeviceWorker
from tests.tiny_models import VOCAB, tiny_model


def tiny(family: str) -> Any:
    """The family's tiny random model, scanned (tests/tiny_models.py)."""
    return tiny_model(family, True)


def test_a_batch_again_compiles_nothing_and_each_prompt_alone_generates_its_row() -> None:
    model = tiny("llama")
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, VOCAB, size=n).tolist() for n in (3, 17, 9)]
    batch = generate(model, prompts, 12, max_len=96)
    assert batch.finished == ["length"] * 3 and all(len(t) == 12 for t in batch.tokens)
    for prompt, got in zip(prompts, batch.tokens, strict=True):
        assert generate(model, [prompt], 12).tokens[0] == got
    # the same (batch, bucket) shapes again: nothing compiles
    again = generate(model, prompts, 12)
    assert again.tokens == batch.tokens and again.compiled == []


def test_sampling_is_reproducible_by_seed_and_differs_across_seeds() -> None:
    model = tiny("llama")
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    kwargs = dict(temperature=1.5, top_k=40, top_p=0.95)
    first = generate(model, prompts, 16, seed=7, **kwargs).tokens
    assert generate(model, prompts, 16, seed=7, **kwargs).tokens == first
    assert generate(model, prompts, 16, seed=8, **kwargs).tokens != first
    assert generate(model, prompts, 16, seed=7).tokens != first  # greedy is another thing


def test_top_k_and_top_p_keep_only_the_likely_tokens() -> None:
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]] * 64, jnp.float32))
    keys = jax.random.split(jax.random.key(0), 20)
    drawn = lambda s: {int(t) for key in keys for t in sample(logits, key, s)}  # noqa: E731
    assert drawn(Sampling(1.0, top_k=2)) == {0, 1}
    assert drawn(Sampling(1.0, top_p=0.7)) == {0, 1}  # 0.5 < 0.7: the second is needed, the third is not
    assert drawn(Sampling(1.0, top_p=0.1)) == {0}
    assert drawn(Sampling(1.0)) == {0, 1, 2, 3}


def test_eos_stops_a_row_and_is_not_returned() -> None:
    model = tiny("llama")
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    free = generate(model, prompts, 10).tokens
    eos = free[0][3]  # row 0's fourth new token
    stopped = generate(model, prompts, 10, eos_id=eos)
    cut = free[0].index(eos)
    assert stopped.tokens[0] == free[0][:cut] and stopped.finished[0] == "eos"
    row1 = free[1][:free[1].index(eos)] if eos in free[1] else free[1]
    assert stopped.tokens[1] == row1
    # every row at EOS: the decode stops early
    assert generate(model, [[5, 6, 7]], 10, eos_id=free[0][0]).tokens == [[]]


def test_bad_requests_are_one_line() -> None:
    model = tiny("llama")
    with pytest.raises(ConfigError, match="max_seq_len=96"):
        generate(model, [[1] * 90], 10, max_len=96)
    with pytest.raises(ConfigError, match="top_p"):
        generate(model, [[1]], 4, temperature=1.0, top_p=0.0)
    with pytest.raises(ConfigError, match="temperature"):
        generate(model, [[1]], 4, temperature=-1.0)
    with pytest.raises(ConfigError, match="empty"):
        generate(model, [[1], []], 4)


def test_a_family_without_cached_decoding_is_one_line() -> None:
    from tests.toy_family import TOY, ToyConfig

    model = TOY.init(ToyConfig(), 50)
    with pytest.raises(ConfigError, match="no KV-cache decoding"):
        generate(model, [[1, 2]], 4)


def generate_on_8_devices(family: str, fsdp: int, tensor: int) -> dict[str, Any]:
    """In the 8-device worker: greedy and sampled tokens on a data x fsdp x tensor mesh and on one device, and
    where the mesh put the parameters, the prompts and the cache."""
    model = tiny(family)  # the vocabulary (96) is split over tensor too
    mesh = build_mesh(MeshConfig(fsdp=fsdp, tensor=tensor))
    layout = (mesh, get_family(family).mesh_rules({}))
    rng = np.random.default_rng(2)
    prompts = [rng.integers(1, VOCAB, size=n).tolist() for n in (3, 17, 9)]  # 3 rows: padded to the batch axes
    sampled = dict(temperature=1.2, top_k=20, seed=5)
    on_the_mesh = generate(model, prompts, 12, layout=layout)
    out: dict[str, Any] = {
        "devices": jax.device_count(), "mesh": dict(mesh.shape), "decoded_on": on_the_mesh.devices,
        "greedy": on_the_mesh.tokens,
        "greedy_one_device": generate(model, prompts, 12).tokens,
        "sampled": [generate(model, prompts, 12, layout=layout, **sampled).tokens for _ in range(2)],
    }
    graphdef, state = nnx.split(model)
    state, tokens, cache = on_mesh(state, jnp.zeros((8, 16), jnp.int32), init_cache(model, 8, 32), *layout)
    out["cache_spec"] = str(cache.k.sharding.spec)
    out["prompts_spec"] = str(tokens.sharding.spec)
    out["cache_devices"] = len(cache.k.sharding.device_set)
    leaves = jax.tree.leaves(state)
    out["params"] = len(leaves)
    out["params_split"] = sum(not leaf.sharding.is_fully_replicated for leaf in leaves)
    try:
        generate(model, prompts, 4, layout=(build_mesh(MeshConfig(fsdp=1, tensor=8)), layout[1]))
        out["error"] = None
    except ConfigError as exc:
        out["error"] = str(exc)
    return out


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3"])
def test_generation_on_a_mesh_lays_out_the_cache_like_the_activations_and_gives_the_one_device_tokens(
        family: str, eight_devices: DeviceWorker) -> None:
    out = eight_devices.run(generate_on_8_devices, family, 2, 2)
    assert out["devices"] == 8 and out["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert out["decoded_on"] == 8  # the new tokens come out split over the batch's axes
    assert out["greedy"] == out["greedy_one_device"] and all(len(t) == 12 for t in out["greedy"])
    assert out["sampled"][0] == out["sampled"][1]
    # [L, B, S, KV, D]: the batch over data and fsdp, the KV heads over tensor, as the activations are
    assert out["cache_spec"] == "P(None, ('data', 'fsdp'), None, 'tensor', None)"
    assert out["prompts_spec"] == "P(('data', 'fsdp'), None)" and out["cache_devices"] == 8
    # the parameters as the trainer lays them out: all but the norms' scales are split over fsdp or tensor
    assert out["params_split"] >= out["params"] // 2
    # the KV heads (2) do not divide a tensor axis of 8: one line names what does not fit
    assert out["error"] is not None and "\n" not in out["error"] and "tensor" in out["error"]
