"""Text generation with a KV cache (model/kv_cache.py, model/generate.py) on tiny random models of every family.

The cached prefill and decode give the full forward pass's logits of the same sequence (within 1e-5), in
both layer layouts; a batch of prompts of different lengths (left-padded) generates what each prompt does
alone; sampling is reproducible by seed; EOS stops a row; on a mesh of 8 devices (the training mesh's axes)
the parameters and the cache are laid out like the trainer's and the activations, and the tokens are the
one-device tokens.
"""

from __future__ import annotations

import dataclasses
import os
from functools import cache
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

VOCAB = 97
SHAPES: dict[str, dict[str, Any]] = {
    "llama": dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=96, init_std=0.3),
    "qwen2": dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=96, init_std=0.3),
    "qwen3": dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=16, d_ff=64, max_seq_len=96,
                  init_std=0.3),
    # 5 layers of 2 local : 1 global: one scanned group and a tail of two, so both kinds of layer's caches, in
    # the scan and after it, in fewer layers than the 5 : 1 pattern needs; a window of 5 under longer sequences
    "gemma3": dict(d_model=32, n_layers=5, layer_pattern="LLG", n_heads=4, n_kv_heads=2, head_dim=16, d_ff=64,
                   sliding_window=5, query_pre_attn_scalar=12, max_seq_len=96, init_std=0.3, rope_theta_global=1000.0),
}
FAMILIES = sorted(SHAPES)


@cache
def tiny(family: str, scan_layers: bool, vocab: int = VOCAB) -> Any:
    fam = get_family(family)
    cfg = dataclasses.replace(fam.config_cls(), **SHAPES[family], scan_layers=scan_layers)
    model = fam.init(cfg, vocab, seed=3)
    if family == "qwen2":  # biases start at zero: make them count
        state = nnx.state(model, nnx.Param)
        rng = np.random.default_rng(0)
        for path, leaf in nnx.to_flat_state(state):
            if path[-1] in ("bq", "bk", "bv"):
                leaf[...] = jnp.asarray(rng.normal(0, 0.5, leaf[...].shape), jnp.float32)
        nnx.update(model, state)
    if family == "gemma3":  # norm scales start at zero (1 + w): make them count
        state = nnx.state(model, nnx.Param)
        rng = np.random.default_rng(1)
        for path, leaf in nnx.to_flat_state(state):
            if path[-1] == "scale":
                leaf[...] = jnp.asarray(rng.normal(0, 0.2, leaf[...].shape), jnp.float32)
        nnx.update(model, state)
    return model


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_prefill_and_decode_give_the_full_forward_logits(family: str, scan_layers: bool) -> None:
    model = tiny(family, scan_layers)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCAB, size=(2, 21)).astype(np.int32)
    forward = nnx.jit(lambda m, t: m(t))
    full = np.asarray(forward(model, jnp.asarray(tokens)))

    # row 1 left-padded by 3: its sequence is tokens[1, 3:], whose logits a forward of its own gives
    start = np.asarray([0, 3], np.int32)
    padded = tokens.copy()
    padded[1, :3] = 0
    cache = init_cache(model, 2, 32, start=start)
    prompt = 13
    decode = nnx.jit(lambda m, t, c: m.decode(t, c))  # two compiles (prompt, one token) beat eager op by op
    logits, cache = decode(model, jnp.asarray(padded[:, :prompt]), cache)
    steps = [np.asarray(logits)]
    for i in range(prompt, tokens.shape[1]):
        logits, cache = decode(model, jnp.asarray(padded[:, i:i + 1]), cache)
        steps.append(np.asarray(logits))
    cached = np.concatenate(steps, axis=1)
    assert int(cache.index) == tokens.shape[1]
    np.testing.assert_allclose(cached[0], full[0], atol=1e-5, rtol=0)
    alone = np.asarray(forward(model, jnp.asarray(tokens[1:, 3:])))
    print(f"{family} scan_layers={scan_layers}: max |cached - full| {np.abs(cached[0] - full[0]).max():.1e}, "
          f"left-padded row {np.abs(cached[1, 3:] - alone[0]).max():.1e}")
    np.testing.assert_allclose(cached[1, 3:], alone[0], atol=1e-5, rtol=0)
    assert full.std() > 0.3  # logits that vary


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_batch_of_different_lengths_equals_each_prompt_alone(family: str, scan_layers: bool) -> None:
    model = tiny(family, scan_layers)
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
    model = tiny("llama", True)
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
    model = tiny("llama", True)
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
    model = tiny("llama", True)
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
    model = tiny(family, True, vocab=96)  # the vocabulary is split over tensor too
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
    tensor = 1 if family == "qwen3" else 2  # qwen3's one KV head cannot be split over tensor
    out = eight_devices.run(generate_on_8_devices, family, 2, tensor)
    assert out["devices"] == 8 and out["mesh"] == {"data": 4 // tensor, "fsdp": 2, "tensor": tensor}
    assert out["decoded_on"] == 8  # the new tokens come out split over the batch's axes
    assert out["greedy"] == out["greedy_one_device"] and all(len(t) == 12 for t in out["greedy"])
    assert out["sampled"][0] == out["sampled"][1]
    # [L, B, S, KV, D]: the batch over data and fsdp, the KV heads over tensor, as the activations are
    assert out["cache_spec"] == "P(None, ('data', 'fsdp'), None, 'tensor', None)"
    assert out["prompts_spec"] == "P(('data', 'fsdp'), None)" and out["cache_devices"] == 8
    # the parameters as the trainer lays them out: all but the norms' scales are split over fsdp or tensor
    assert out["params_split"] >= out["params"] // 2
    # the KV heads (2, or qwen3's 1) do not divide a tensor axis of 8: one line names what does not fit
    assert out["error"] is not None and "\n" not in out["error"] and "tensor" in out["error"]
