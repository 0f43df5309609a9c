"""Context parallelism (model/context.py): a sequence split over a ``context`` mesh axis, load-balanced, attention
over the gathered keys and values. On 8 fake CPU devices (tests/device_worker.py), the llama family's logits and
gradients with context 2 and 4 match one device's on packed rows (several documents a row), and so do the train
step's losses; config load lays ``length`` out on the axis and refuses sizes that do not cut the sequence."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model.context as context_module
from experiment.config import load_config
from experiment.errors import ConfigError
from experiment.sections.train import MeshConfig, TrainConfig
from model.context import RING_QUERY_BLOCK, balanced_order, context_parts
from model.family import get_family, init_module
from model.generate import generate
from model.loss import cross_entropy
from model.sharding import activation_layout, batch_sharding, build_mesh, tree_shardings
from tests.device_worker import DeviceWorker
from tests.recipe_runner import REPO
from trainer.step import TrainProgram, global_batch

TINY = REPO / "tests" / "configs" / "tiny.yaml"
VOCAB, SEQ, ROWS = 64, 32, 4
CONTEXT = {"length": ["context"]}
MESHES = {  # name -> the 8-device mesh: context 2 beside data and fsdp, context 4 beside data
    "context2": MeshConfig(data=2, fsdp=2, axes={"context": 2}, rules=CONTEXT),
    "context4": MeshConfig(data=2, axes={"context": 4}, rules=CONTEXT),
}
STRATEGIES = ("all_gather", "ring")  # model.context_attention


def packed_rows(seed: int) -> dict[str, np.ndarray]:
    """ROWS rows of SEQ + 1 tokens, each packing 2-5 documents: segment ids 1, 2, ... and positions restarting at
    every document, as the packer writes them."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (ROWS, SEQ + 1)).astype(np.int32)
    segments, positions = np.zeros((ROWS, SEQ), np.int32), np.zeros((ROWS, SEQ), np.int32)
    for row in range(ROWS):
        cuts = np.sort(rng.choice(np.arange(1, SEQ), size=rng.integers(1, 5), replace=False))
        for doc, (start, end) in enumerate(zip([0, *cuts], [*cuts, SEQ], strict=True)):
            segments[row, start:end] = doc + 1
            positions[row, start:end] = np.arange(end - start)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": segments, "positions": positions}


def logits_and_grads(mesh_cfg: MeshConfig, devices: list[Any], strategy: str = "all_gather"
                     ) -> tuple[np.ndarray, dict[str, np.ndarray], int, list[str]]:
    """The tiny llama's logits on packed rows and the gradient of their mean cross-entropy, computed on ``mesh_cfg``
    (parameters laid out by the rules, the batch split, the trainer's activation layout) with attention over the
    context axis by ``strategy``; the context parts; the shapes the compiled program all-gathers."""
    fam = get_family("llama")
    cfg = fam.tiny_config(max_seq_len=SEQ, context_attention=strategy)
    rules = fam.mesh_rules(mesh_cfg.rules)
    mesh = build_mesh(mesh_cfg, devices, rules)
    graphdef, params = nnx.split(init_module(fam.build, cfg, VOCAB), nnx.Param)
    params = jax.device_put(params, tree_shardings(params, mesh, rules))
    batch = global_batch(packed_rows(0), batch_sharding(mesh, rules))

    def loss(params: nnx.State, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        logits = nnx.merge(graphdef, params)(batch["inputs"], batch["segment_ids"], batch["positions"])
        return cross_entropy(logits, batch["targets"])[0], logits

    with activation_layout(mesh, rules):
        parts = context_parts()
        compiled = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(params, batch).compile()
    (_, logits), grads = compiled(params, batch)
    flat = {"/".join(map(str, path)): np.asarray(leaf) for path, leaf in nnx.to_flat_state(grads)}
    gathered = sorted({shape.split("{")[0] for shape in re.findall(r"= (\S+) all-gather\(", compiled.as_text())})
    return np.asarray(logits), flat, parts, gathered


def context_parallel_on_8_devices() -> dict[str, Any]:
    """In the 8-device worker: logits and gradients on each context mesh against one device; the train step's
    losses and gradient norms (two steps on packed batches) likewise; the layout the mesh gives the activations."""
    want_logits, want_grads, one_parts, _ = logits_and_grads(MeshConfig(data=1), jax.devices()[:1])
    out: dict[str, Any] = {"one_parts": one_parts}
    for (name, mesh_cfg), strategy in itertools.product(MESHES.items(), (*STRATEGIES, "ring_blocks")):
        if strategy == "ring_blocks":  # ring with several query blocks a step (the shares here are 8 and 16 long)
            context_module.RING_QUERY_BLOCK = 4
        logits, grads, parts, gathered = logits_and_grads(mesh_cfg, jax.devices(), strategy.removesuffix("_blocks"))
        context_module.RING_QUERY_BLOCK = RING_QUERY_BLOCK
        out[f"{name}_{strategy}"] = {"parts": parts, "logits_diff": float(np.abs(logits - want_logits).max()),
                     "logits_scale": float(np.abs(want_logits).max()),
                     # per parameter, relative to the largest entry of its one-device gradient
                     "grad_diff": max(float(np.abs(grads[k] - g).max() / np.abs(g).max())
                                      for k, g in want_grads.items()),
                     "grad_zero": [k for k, g in want_grads.items() if not np.abs(g).max() > 0],
                     "grad_names": sorted(grads) == sorted(want_grads), "gathered": gathered}
    fam = get_family("llama")
    train = TrainConfig(steps=10, batch_size=ROWS, learning_rate=1e-2, warmup_steps=1, loss_chunk_len=8,
                        mesh=MESHES["context4"])
    one = dataclasses.replace(train, mesh=MeshConfig(data=1))
    for name, train_cfg, devices, strategy in (("step_all_gather", train, None, "all_gather"),
                                               ("step_ring", train, None, "ring"),
                                               ("step_one", one, jax.devices()[:1], "all_gather")):
        cfg = fam.tiny_config(max_seq_len=SEQ, context_attention=strategy)
        rules = fam.mesh_rules(train_cfg.mesh.rules)
        program = TrainProgram(cfg, train_cfg, VOCAB, build_mesh(train_cfg.mesh, devices, rules), seed=0)
        state, metrics = program.init_state(), []
        for seed in (1, 2):
            state, m = program.step(state, global_batch(packed_rows(seed), program.batch_sharding))
            metrics.append([float(m["loss"]), float(m["grad_norm"])])
        out[name] = metrics
        out[f"{name}_batch"] = str(program.batch_sharding.spec)
    # recipe 09 generates on the training mesh: a decode step's one position is not split, the compiler lays it out
    model = init_module(fam.build, fam.tiny_config(max_seq_len=SEQ), VOCAB)
    rules = fam.mesh_rules(CONTEXT)
    prompts = [np.random.default_rng(3).integers(1, VOCAB, size=n).tolist() for n in (3, 9)]
    out["generated"] = generate(model, prompts, 6, layout=(build_mesh(MESHES["context2"], None, rules), rules)).tokens
    out["generated_one"] = generate(model, prompts, 6).tokens
    return out


def test_context_parallel_matches_one_device(eight_devices: DeviceWorker) -> None:
    out = eight_devices.run(context_parallel_on_8_devices)
    assert out["one_parts"] == 1
    for (name, parts), strategy in itertools.product((("context2", 2), ("context4", 4)), (*STRATEGIES, "ring_blocks")):
        got = out[f"{name}_{strategy}"]
        assert got["parts"] == parts and got["grad_names"]
        assert got["logits_diff"] < 1e-5 * max(1.0, got["logits_scale"]), got
        assert got["grad_diff"] < 1e-4 and got["grad_zero"] == [], got  # every parameter has a gradient
        # all-gather: K and V [rows, T, KV, head_dim] and the segment ids are gathered whole; ring: never. Neither
        # gathers the hidden states [rows, T, d_model] (the load-balanced reorder moves chunks between devices)
        rows = ROWS // (4 if parts == 2 else 2)  # the rows a device holds: data 2 (x fsdp 2 beside context 2)
        whole_kv = {f"f32[{rows},{SEQ},2,8]", f"s32[{rows},{SEQ}]"}
        if strategy.startswith("ring"):
            assert not whole_kv & set(got["gathered"]), got
        else:
            assert whole_kv <= set(got["gathered"]), got
        assert f"f32[{rows},{SEQ},32]" not in got["gathered"], got
    # the rows over data x fsdp, each row's positions over context
    assert out["step_all_gather_batch"] == "P(('data', 'fsdp'), 'context')"
    np.testing.assert_allclose(out["step_all_gather"], out["step_one"], rtol=1e-5)
    np.testing.assert_allclose(out["step_ring"], out["step_one"], rtol=1e-5)
    assert out["generated"] == out["generated_one"]


def test_the_balanced_order_gives_each_device_an_early_and_a_late_chunk() -> None:
    order = balanced_order(16, 2)  # 4 chunks of 4: device 0 holds chunks 0 and 3, device 1 chunks 1 and 2
    assert order.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    # causal work (visible query-key pairs) per device is the same
    work = [sum(int(i) + 1 for i in order[d * 8:(d + 1) * 8]) for d in range(2)]
    assert work[0] == work[1]
    with pytest.raises(ConfigError, match=r"^config key 'train\.mesh\.axes\.context': context parallelism over 4 "
                                          r"devices cuts a sequence into 8 load-balanced chunks, but its length 20"):
        balanced_order(20, 4)
    assert jnp.asarray(order).shape == (16,)


def test_config_load_lays_the_sequence_out_on_the_context_axis() -> None:
    cfg = load_config(TINY, ["train.mesh.axes.context=2", "model.max_seq_len=64"])
    assert cfg.train.mesh.axes == {"context": 2} and cfg.train.mesh.rules == {"length": ["context"]}
    assert load_config(TINY).train.mesh.axes == {}  # no context axis unless sized
    with pytest.raises(ConfigError) as caught:
        load_config(TINY, ["train.mesh.axes.context=4", "model.max_seq_len=100"])
    message = str(caught.value)
    assert message.startswith("config key 'train.mesh.axes.context': context parallelism over 4 devices cuts a "
                              "sequence into 8 load-balanced chunks, but model.max_seq_len 100") and "\n" not in message


def test_a_family_without_context_parallelism_refuses_the_axis() -> None:
    gemma = json.dumps({"family": "gemma3", "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64,
                        "max_seq_len": 64})
    with pytest.raises(ConfigError, match=r"^config key 'train\.mesh\.axes\.context': context parallelism is built "
                                          r"for the llama family's attention"):
        load_config(TINY, [f"model={gemma}", "train.mesh.axes.context=2"])


def test_ring_query_blocks_are_the_largest_divisor_of_the_share_up_to_the_limit() -> None:
    from model.context import query_block

    assert query_block(32_768, 1024) == 1024 and query_block(4096, 1024) == 1024
    assert query_block(1500, 1024) == 750  # a power-of-two gcd would take 4: a 375-step loop each ring step
    assert query_block(1031, 1024) == 1  # a prime share: one query at a time, still exact
    assert query_block(96, 1024) == 96
