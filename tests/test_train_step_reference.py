"""The compiled train step against a hand-written reference: two real ``TrainProgram`` steps on a one-layer
float32 Llama, parameter for parameter, to fp32 tolerance.

What is pinned, each from its documented rule rather than from the library's code:

- the loss (model/loss.py): mean token cross-entropy over the weighted tokens (``loss_weights``: sum of
  weights, at least 1) plus ``model.z_loss`` times the same mean of log(Z)^2, with the chunked head
  (``train.loss_chunk_len`` shorter than the sequence) giving what full logits give;
- global-norm clipping (``train.grad_clip``) of the gradients, with a threshold that binds on both steps;
- AdamW (``train.beta1/beta2``, eps 1e-8, bias correction by step) at the schedule's rate of each step, with
  decoupled weight decay only on parameters of per-layer rank >= 2: vectors (norm scales) are not decayed, and
  a scanned layer's leading layer axis does not count (``trainer.step.make_optimizer``'s docstring);
- a frozen body (``train.trainable: embeddings``, ``train.embeddings_only_steps``): only the input embeddings
  and the LM head train; the body's gradients are zero before clipping and moments, its parameters stay
  bit-identical, and no weight decay reaches them (``trainer.step.freeze_body``);
- gradient accumulation (``train.grad_accum_steps``): the micro-batches' gradients averaged, which is one step
  on the whole batch.

Two steps, so that the moments and their bias correction matter, and two batches whose gradient norms differ,
so that the clip factors of the steps differ (Adam is almost blind to one uniform scale of the gradients:
clipping shows in the mix of the two steps' gradients). The reference runs the same model's forward pass for
its logits; everything after the logits is written here, in plain numpy for the optimizer.

Tolerances: the step's metrics (loss, total loss, gradient norm, rate) agree to 1e-5. The parameters are
compared by their move from the start, per parameter, to 1e-3 of that move's norm, not element by element: a
gradient element within fp32 rounding of zero (the library and the reference sum in different orders, and the
library's loss is chunked) gets an Adam update of m / (sqrt(v) + 1e-8), rounding noise amplified up to 1e8
times, up to a few 1e-5 of a parameter here. Per parameter that noise stayed under 0.03% of the move on every
batch tried (under 0.001% on these); the breakages this is meant to catch (no z-loss, norm scales decayed, no
clipping, a frozen body trained, accumulated gradients summed or one left out) move some parameter by 0.6% to
60% of its move, or change a metric (the loss, the pre-clip gradient norm) far beyond 1e-5.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from experiment.sections.train import TrainConfig
from model.llama.config import LlamaConfig
from model.registry import family_of
from model.sharding import build_mesh
from trainer.step import TrainProgram, global_batch

VOCAB, SEQ, BATCH = 64, 16, 4
LR, MIN_LR_RATIO, STEPS = 1e-2, 0.1, 4
B1, B2, EPS, WEIGHT_DECAY, CLIP, Z_LOSS = 0.9, 0.95, 1e-8, 0.1, 0.5, 0.05
MODEL = LlamaConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=SEQ, z_loss=Z_LOSS,
                    tie_embeddings=False)
TRAIN = TrainConfig(steps=STEPS, batch_size=BATCH, learning_rate=LR, warmup_steps=0, schedule="cosine",
                    min_lr_ratio=MIN_LR_RATIO, weight_decay=WEIGHT_DECAY, grad_clip=CLIP, beta1=B1, beta2=B2,
                    loss_chunk_len=SEQ // 2)
EMBEDDINGS = ("embed", "lm_head")  # what trains while the body is frozen (train.trainable's comment)
RTOL, ATOL = 1e-5, 1e-6  # the step's metrics
# the parameters' moves, relative to each move's norm: see the module's docstring for why not elementwise
UPDATE_RTOL = 1e-3

Params = dict[str, np.ndarray]  # parameter name ("blocks/attn/wq") -> value
Batch = dict[str, np.ndarray]


def program(**train_fields: object) -> TrainProgram:
    train_cfg = dataclasses.replace(TRAIN, **train_fields)
    return TrainProgram(MODEL, train_cfg, VOCAB, build_mesh(train_cfg.mesh), seed=0)


def make_batch(seed: int, weighted: bool = False) -> Batch:
    rows = np.random.default_rng(seed).integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    batch = {"inputs": rows[:, :-1], "targets": rows[:, 1:]}
    if weighted:  # part of a row and a whole row train nothing: the mean is over the other tokens
        weights = np.ones((BATCH, SEQ), np.float32)
        weights[0, SEQ // 2 + 3:] = 0.0
        weights[-1] = 0.0
        batch["loss_weights"] = weights
    return batch


def names(params: nnx.State) -> list[str]:
    """The parameters' names in the tree's order: ``blocks/attn/wq``, ``embed``, ..."""
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return [jax.tree_util.keystr(path[:-1], simple=True, separator="/") for path in paths]  # [:-1]: not ".value"


def flat(params: nnx.State) -> Params:
    return dict(zip(names(params), map(np.asarray, jax.tree.leaves(jax.device_get(params))), strict=True))


def run(prog: TrainProgram, batches: list[Batch]) -> tuple[list[Params], list[dict[str, float]]]:
    """The library's steps: the parameters before and after each step, and each step's metrics."""
    state = prog.init_state()
    params, metrics = [flat(state["params"])], []
    for batch in batches:
        state, step_metrics = prog.step(state, global_batch(batch, prog.batch_sharding))
        params.append(flat(state["params"]))
        metrics.append({k: float(v) for k, v in step_metrics.items()})
    return params, metrics


# -- the reference --


@cache
def reference_grads() -> Callable[[Params, Batch], tuple[tuple[jax.Array, jax.Array], Params]]:
    """(total loss, cross-entropy), d total / d params: the model's logits, the loss written here."""
    graphdef, abstract = nnx.split(family_of(MODEL).abstract(MODEL, VOCAB), nnx.Param)
    order, treedef = names(abstract), jax.tree.structure(abstract)

    def loss(params: Params, batch: Batch) -> tuple[jax.Array, jax.Array]:
        logits = nnx.merge(graphdef, jax.tree.unflatten(treedef, [params[name] for name in order]))(batch["inputs"])
        weights = batch.get("loss_weights", jnp.ones(batch["targets"].shape, jnp.float32))
        tokens = jnp.maximum(weights.sum(), 1.0)
        nll = (optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]) * weights).sum() / tokens
        z_term = (jnp.square(jax.nn.logsumexp(logits, axis=-1)) * weights).sum() / tokens
        return nll + MODEL.z_loss * z_term, nll

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def reference_lr(step: int) -> float:
    """Cosine from the peak at step 0 (no warmup) to peak * min_lr_ratio at step ``STEPS``."""
    end = LR * MIN_LR_RATIO
    return end + (LR - end) * 0.5 * (1 + math.cos(math.pi * step / STEPS))


def decayed(name: str, value: np.ndarray) -> bool:
    """Weight decay by per-layer rank: the scanned block's parameters carry a leading layer axis."""
    return value.ndim - name.startswith("blocks/") >= 2


def reference_run(start: Params, batches: list[Batch],
                  frozen: Callable[[int], bool] = lambda step: False) -> tuple[list[Params], list[dict[str, float]]]:
    """``run`` by hand from the parameters ``start``: ``frozen(step)`` says whether only the embeddings train."""
    params = dict(start)
    m = {name: np.zeros_like(p) for name, p in params.items()}
    v = {name: np.zeros_like(p) for name, p in params.items()}
    history, metrics = [dict(params)], []
    for step, batch in enumerate(batches):
        (loss, nll), grads = reference_grads()(params, batch)
        trains = {name: not frozen(step) or name.split("/")[0] in EMBEDDINGS for name in params}
        grads = {name: np.asarray(g) if trains[name] else np.zeros_like(g) for name, g in grads.items()}
        norm = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values()))
        scale, t, lr = min(1.0, CLIP / norm), step + 1, reference_lr(step)
        for name, p in params.items():
            m[name] = B1 * m[name] + (1 - B1) * scale * grads[name]
            v[name] = B2 * v[name] + (1 - B2) * np.square(scale * grads[name])
            if trains[name]:
                adam = (m[name] / (1 - B1**t)) / (np.sqrt(v[name] / (1 - B2**t)) + EPS)
                params[name] = p - lr * (adam + (WEIGHT_DECAY * p if decayed(name, p) else 0.0))
        history.append(dict(params))
        metrics.append({"loss": float(nll), "total_loss": float(loss), "grad_norm": norm, "lr": lr})
    return history, metrics


# -- the checks --


def assert_updates_close(got: list[Params], want: list[Params]) -> None:
    """After each step, every parameter's move from its start agrees with the reference's to ``UPDATE_RTOL`` of
    that move's norm (a parameter the reference keeps must not move at all)."""
    for step in range(1, len(want)):
        for name, start in want[0].items():
            moved, wanted = got[step][name] - start, want[step][name] - start
            error, size = np.linalg.norm(moved - wanted), np.linalg.norm(wanted)
            assert error <= UPDATE_RTOL * size, f"step {step}: {name} off by {error:.3g} of a move of {size:.3g}"


def assert_metrics_close(got: list[dict[str, float]], want: list[dict[str, float]]) -> None:
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g["finite"] == 1.0
        for key in w:
            assert g[key] == pytest.approx(w[key], rel=RTOL, abs=ATOL), f"step {step}: {key}"


@pytest.fixture(scope="module")
def plain() -> TrainProgram:
    return program()


def test_layout_and_rules_the_reference_assumes(plain: TrainProgram) -> None:
    """The reference's reading of the model: scanned layers (a leading layer axis under ``blocks``) and norm
    scales as the only per-layer vectors, which weight decay must skip."""
    params = flat(plain.init_state()["params"])
    assert MODEL.scan_layers and params["blocks/attn_norm/scale"].shape == (1, MODEL.d_model)
    assert sorted(name for name, p in params.items() if not decayed(name, p)) == [
        "blocks/attn_norm/scale", "blocks/mlp_norm/scale", "final_norm/scale"]
    assert [reference_lr(s) for s in range(STEPS + 1)] == pytest.approx(
        [float(plain.schedule(s)) for s in range(STEPS + 1)], rel=1e-6)


def test_two_steps_match_the_reference(plain: TrainProgram) -> None:
    """z-loss, loss weights, clipping, AdamW with bias correction and decay by rank, the schedule's rate."""
    batches = [make_batch(1, weighted=True), make_batch(2)]
    got, got_metrics = run(plain, batches)
    want, want_metrics = reference_run(got[0], batches)
    assert all(m["grad_norm"] > 1.5 * CLIP for m in want_metrics)  # the clip binds on both steps
    assert want_metrics[0]["grad_norm"] / want_metrics[1]["grad_norm"] > 1.1  # ... by different factors
    assert all(m["total_loss"] - m["loss"] > 100 * ATOL for m in want_metrics)  # the z-loss term counts
    assert_updates_close(got, want)
    assert_metrics_close(got_metrics, want_metrics)


@pytest.mark.parametrize(("trainable", "embeddings_only_steps"), [("embeddings", 0), ("all", 1)])
def test_a_frozen_body_stays_bit_identical(trainable: str, embeddings_only_steps: int) -> None:
    """While the body is frozen it gets no gradient (not in the clipping norm, not in the moments), no
    update and no weight decay: its parameters stay bit-identical; the embeddings follow the reference."""
    prog = program(trainable=trainable, embeddings_only_steps=embeddings_only_steps)
    batches = [make_batch(1), make_batch(2)]
    got, got_metrics = run(prog, batches)
    want, want_metrics = reference_run(got[0], batches,
                                       frozen=lambda step: trainable == "embeddings" or step < embeddings_only_steps)
    body = [name for name in got[0] if name.split("/")[0] not in EMBEDDINGS]
    assert body and all(np.array_equal(got[1][name], got[0][name]) for name in body)
    assert all(not np.array_equal(got[1][name], got[0][name]) for name in EMBEDDINGS)
    if trainable == "embeddings":
        assert all(np.array_equal(got[2][name], got[0][name]) for name in body)
    assert_updates_close(got, want)
    assert_metrics_close(got_metrics, want_metrics)


@pytest.mark.parametrize("accum", [2, 4])
def test_grad_accumulation_averages_the_micro_batches(accum: int) -> None:
    """``accum`` micro-batches of the four rows are one step on the four rows: the same gradient norm, loss and
    weights (the micro-batches' gradients averaged, none left out)."""
    batches = [make_batch(3), make_batch(4)]
    got, got_metrics = run(program(grad_accum_steps=accum), batches)
    want, want_metrics = reference_run(got[0], batches)
    assert_updates_close(got, want)
    assert_metrics_close(got_metrics, want_metrics)
