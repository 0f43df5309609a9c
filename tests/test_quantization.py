"""Quantized training through Qwix (``train.quantization``): exactly the projections' and MLP's
matmuls run in int8 / fp8 (forward and both backward dots), the loss moves but stays close to the float
one, bad settings are one error line, and a quantized run resumes from its (float) checkpoint exactly."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from experiment.config import load_config
from experiment.errors import ConfigError
from experiment.sections.train import TrainConfig
from model.linear import plain_projections
from model.llama.config import LlamaConfig
from model.llama.family import LLAMA
from model.sharding import build_mesh
from tests.fixture_run import log_records, run_copy
from tests.recipe_runner import REPO, run_recipe
from trainer.step import TrainProgram, global_batch

VOCAB, SEQ, BATCH, LAYERS = 64, 16, 4, 2
MODEL = LlamaConfig(d_model=32, n_layers=LAYERS, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=SEQ)
TRAIN = TrainConfig(steps=50, batch_size=BATCH, learning_rate=1e-2, warmup_steps=1, checkpoint_every=10)
# per layer: q, k, v, o and the MLP's gate, up, down
PROJECTIONS = 7
QUANTIZED_TYPE = {"int8": "i8", "fp8": "f8E4M3FN|f8E5M2"}


def program(quantization: str, model: LlamaConfig = MODEL) -> TrainProgram:
    train_cfg = dataclasses.replace(TRAIN, quantization=quantization)
    return TrainProgram(model, train_cfg, VOCAB, build_mesh(train_cfg.mesh), seed=0)


def dots(prog: TrainProgram) -> tuple[int, int, str]:
    """(all dot_generals, those with a quantized operand, the StableHLO) of the lowered train step."""
    text = prog.lower(prog.abstract_batch(BATCH, SEQ)).as_text()
    lines = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    quantized = [line for line in lines if re.search(r"tensor<[0-9x]*x(i8|f8E4M3FN|f8E5M2)>", line)]
    return len(lines), len(quantized), text


def test_plain_projections_compute_what_the_cpu_kernel_does() -> None:
    """The dot_general path a quantized step traces is the same function as ``linear``'s 2-D views, with
    its gradients (only the CPU-tuned backward is left out)."""
    model = LLAMA.init(dataclasses.replace(MODEL, qkv_bias=True), VOCAB)
    tokens = jax.numpy.asarray(np.random.default_rng(0).integers(0, VOCAB, (2, SEQ)), jax.numpy.int32)

    def value_and_grads(plain: bool) -> tuple[jax.Array, object]:
        def loss(m: nnx.Module) -> jax.Array:
            with plain_projections() if plain else contextlib.nullcontext():
                return (m.hidden(tokens) ** 2).mean()
        return nnx.value_and_grad(loss)(model)

    (ref, ref_grads), (got, got_grads) = value_and_grads(False), value_and_grads(True)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_exactly_the_projection_matmuls_are_quantized(quantization: str, scan_layers: bool) -> None:
    """Forward, input-gradient and weight-gradient dot of each projection: 3 x 7 per layer; attention's
    einsums and the output head stay float (the step has as many dots as the float step). Scanned, the
    layer's dots stand once in the scan bodies (forward and backward loop), whatever the depth."""
    model = dataclasses.replace(MODEL, scan_layers=scan_layers, scan_unroll=1)  # one layer per loop iteration
    total, quantized, text = dots(program(quantization, model))
    assert quantized == 3 * PROJECTIONS * (1 if scan_layers else LAYERS)
    assert re.search(rf"x({QUANTIZED_TYPE[quantization]})>", text)
    float_total, float_quantized, _ = dots(program("none", model))
    assert (total, float_quantized) == (float_total, 0)


def losses(prog: TrainProgram, steps: int = 2) -> list[float]:
    rows = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, prog.batch_sharding)
    state, out = prog.init_state(), []
    for _ in range(steps):
        state, metrics = prog.step(state, batch)
        out.append(float(metrics["loss"]))
    assert all(a.dtype == np.float32 for a in jax.tree.leaves(state["params"]))  # the master weights stay float
    return out


def test_a_quantized_step_moves_the_loss_a_little() -> None:
    """int8 (fp8's dots are counted above; its demo losses are in bench/README.md)."""
    reference, quantized = losses(program("none")), losses(program("int8"))
    assert all(q != r for q, r in zip(quantized, reference, strict=True)), "quantization changed nothing"
    np.testing.assert_allclose(quantized, reference, rtol=2e-3)


def test_bad_settings_are_one_error_line() -> None:
    with pytest.raises(ConfigError, match=r"train\.quantization.*int4") as info:
        load_config(REPO / "recipes" / "configs" / "demo.yaml", ["train.quantization=int4"])
    assert "\n" not in str(info.value)
    from tests.toy_family import ToyConfig  # a family that names no modules to quantize

    toy = ToyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=SEQ)
    with pytest.raises(ConfigError, match=r"^config key 'train\.quantization': model family 'toy_mha' names no "):
        program("int8", toy)


@pytest.mark.integration
def test_a_quantized_run_resumes_exactly(fixture_stages: Path, tmp_path: Path) -> None:
    """Recipe 04 with int8: 2 steps, then resumed to 4 (a constant schedule does not depend on
    train.steps), retraces an uninterrupted 4-step run's losses bitwise."""
    train = {"steps": 2, "checkpoint_every": 2, "warmup_steps": 1, "log_every": 1, "schedule": "constant",
             "quantization": "int8"}
    resumed = run_copy(fixture_stages, tmp_path / "resumed", train=train, wandb={"mode": "disabled"})
    run_recipe("04_pretrain.py", resumed)
    run_recipe("04_pretrain.py", resumed, "train.steps=4")
    whole = run_copy(fixture_stages, tmp_path / "whole", train={**train, "steps": 4}, wandb={"mode": "disabled"})
    run_recipe("04_pretrain.py", whole)
    got = {r["train/step"]: r["train/loss"] for r in log_records(resumed.parent / "runs" / "tiny")}
    want = {r["train/step"]: r["train/loss"] for r in log_records(whole.parent / "runs" / "tiny")}
    assert sorted(got) == [1, 2, 3, 4]
    assert got == want  # floats from JSON: equal means bitwise



def test_a_family_with_auxiliary_losses_is_refused_rather_than_left_float() -> None:
    """qwen3_moe's step differentiates ``hidden_with_aux``, which Qwix does not intercept: quantizing it would
    quantize nothing, silently. One error line instead."""
    from experiment.errors import ConfigError
    from model.registry import get_family

    family = get_family("qwen3_moe")
    train_cfg = dataclasses.replace(TRAIN, quantization="int8")
    mesh = build_mesh(train_cfg.mesh, rules=family.mesh_rules(train_cfg.mesh.rules))  # its expert axis, size 1
    with pytest.raises(ConfigError, match="train.quantization.*auxiliary losses"):
        TrainProgram(family.tiny_config(), train_cfg, VOCAB, mesh, seed=0)
