"""A family's auxiliary losses (``ModelFamily.aux_losses``, ``hidden_with_aux``): the train step adds them to
the loss it differentiates, accumulates them over micro-batches like the loss, and reports each as
``aux/<name>``, which the log hook writes as ``train/aux/<name>`` to train_log.jsonl and W&B. The toy family
with one (``activation_l2``) is tests/toy_aux_family.py's."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from experiment.errors import ConfigError
from experiment.sections.train import MeshConfig, TrainConfig
from model.family import AuxLossModel, register_family
from model.loss import cross_entropy, output_logits
from model.registry import families
from model.sharding import build_mesh
from tests.toy_aux_family import AUX_LOSS, AUX_NAME, TOY_AUX, ToyAuxConfig, ToyAuxDecoder
from tests.toy_family import TOY, ToyDecoder
from trainer.hooks import LogMetrics
from trainer.step import TrainProgram, global_batch

VOCAB, SEQ, BATCH = 64, 16, 4
MODEL = ToyAuxConfig(max_seq_len=SEQ, z_loss=1e-3, activation_l2=0.5)
TRAIN = TrainConfig(steps=10, batch_size=BATCH, learning_rate=1e-2, warmup_steps=1)
METRIC = f"aux/{AUX_LOSS}"


def program(**train_fields: Any) -> TrainProgram:
    train_cfg = dataclasses.replace(TRAIN, **train_fields)
    return TrainProgram(MODEL, train_cfg, VOCAB, build_mesh(MeshConfig(data=1), jax.devices()[:1]), seed=0)


def batch(prog: TrainProgram, seed: int = 0) -> dict[str, jax.Array]:
    rows = np.random.default_rng(seed).integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    return global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, prog.batch_sharding)


def by_hand(prog: TrainProgram, params: nnx.State, data: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(total loss, aux loss) written out: cross-entropy + z_loss x mean log(Z)^2 + weight x mean(hidden^2)."""
    model = nnx.merge(prog.graphdef, params)
    hidden = model.hidden(data["inputs"])
    nll, z_term = cross_entropy(output_logits(hidden, model.output_weight()), data["targets"])
    aux = MODEL.activation_l2 * jnp.mean(jnp.square(hidden))
    return nll + MODEL.z_loss * z_term + aux, aux


def assert_trees_close(got: Any, want: Any, **tolerance: float) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tolerance)


def test_the_toy_module_provides_its_aux_loss() -> None:
    model = TOY_AUX.init(MODEL, VOCAB, seed=0)
    tokens = np.arange(2 * SEQ, dtype=np.int32).reshape(2, SEQ) % VOCAB
    hidden, aux = model.hidden_with_aux(tokens)
    assert isinstance(model, AuxLossModel) and TOY_AUX.aux_losses == (AUX_LOSS,) and AUX_NAME in families()
    np.testing.assert_allclose(hidden, model.hidden(tokens))  # eval's hidden is the same states, without aux
    assert float(aux[AUX_LOSS]) == pytest.approx(0.5 * float(jnp.mean(jnp.square(hidden))), rel=1e-6)


def test_the_step_adds_the_aux_loss_to_the_loss_it_differentiates() -> None:
    prog = program()
    state, data = prog.init_state(), batch(prog)
    params = jax.device_get(state["params"])
    (want_total, want_aux), want_grads = jax.value_and_grad(by_hand, argnums=1, has_aux=True)(prog, params, data)
    total, nll, aux, grads = jax.jit(prog.grads)(params, data)
    assert set(aux) == {AUX_LOSS}
    np.testing.assert_allclose(total, want_total, rtol=1e-6)
    np.testing.assert_allclose(aux[AUX_LOSS], want_aux, rtol=1e-6)
    assert float(total - nll) > float(aux[AUX_LOSS]) > 0.1  # the term counts (beside the z-loss)
    assert_trees_close(grads, want_grads, rtol=1e-5, atol=1e-7)
    # without it the gradient would differ: the aux term is not lost on the way
    no_aux = jax.grad(lambda p: by_hand(prog, p, data)[0] - by_hand(prog, p, data)[1])(params)
    assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(no_aux), strict=True)) > 1e-4

    _, metrics = prog.step(state, data)  # the jitted step reports it beside the loss
    assert METRIC in metrics
    np.testing.assert_allclose(metrics[METRIC], want_aux, rtol=1e-6)
    np.testing.assert_allclose(metrics["total_loss"], want_total, rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], nll, rtol=1e-6)


def test_grad_accumulation_averages_the_aux_loss_like_the_loss() -> None:
    one, two = program(), program(grad_accum_steps=2)
    params = jax.device_get(one.init_state()["params"])
    got = jax.jit(two.grads)(params, batch(two))
    want = jax.jit(one.grads)(params, batch(one))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)  # total
    np.testing.assert_allclose(got[2][AUX_LOSS], want[2][AUX_LOSS], rtol=1e-6)
    assert_trees_close(got[3], want[3], rtol=1e-5, atol=2e-7)
    _, metrics_one = one.step(one.init_state(), batch(one))
    _, metrics_two = two.step(two.init_state(), batch(two))
    np.testing.assert_allclose(metrics_two[METRIC], metrics_one[METRIC], rtol=1e-6)


def test_a_family_without_aux_losses_reports_none() -> None:
    from tests.toy_family import ToyConfig

    prog = TrainProgram(ToyConfig(max_seq_len=SEQ), TRAIN, VOCAB, build_mesh(MeshConfig(data=1), jax.devices()[:1]),
                        seed=0)
    _, metrics = prog.step(prog.init_state(), batch(prog))
    assert not [key for key in metrics if key.startswith("aux/")]
    assert set(metrics) == {"loss", "total_loss", "grad_norm", "lr", "finite", "spike"}


def test_the_log_hook_writes_train_aux(tmp_path: Path) -> None:
    from tests.test_train_hooks import context, logged

    ctx = context(tmp_path, steps=1)
    ctx.step, ctx.last_loss = 1, 2.0
    ctx.metrics = {"loss": np.float32(2.0), "total_loss": np.float32(2.25), "grad_norm": np.float32(1.0),
                   "lr": np.float32(1e-3), "finite": np.bool_(True), METRIC: np.float32(0.25)}
    LogMetrics()(ctx)
    (record,) = logged(ctx)
    assert record[f"train/{METRIC}"] == 0.25 and record["train/total_loss"] == 2.25


class ToyStatsDecoder(ToyAuxDecoder):
    """The aux toy, also reporting a statistic (``ModelFamily.aux_metrics``): its hidden states' RMS."""

    def hidden_with_aux(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                        positions: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        hidden, aux = super().hidden_with_aux(tokens, segment_ids, positions)
        return hidden, {**aux, "stats/hidden_rms": jnp.sqrt(jnp.mean(jnp.square(hidden.astype(jnp.float32))))}


def test_a_familys_statistics_are_logged_beside_its_aux_loss_and_not_added_to_the_loss() -> None:
    stats = register_family(dataclasses.replace(TOY_AUX, name="toy_aux_stats", build=ToyStatsDecoder,
                                                aux_metrics=lambda cfg: ("stats/hidden_rms",)))
    model_cfg = dataclasses.replace(MODEL, family=stats.name)
    plain, with_stats = program(), TrainProgram(model_cfg, TRAIN, VOCAB,
                                                build_mesh(MeshConfig(data=1), jax.devices()[:1]), seed=0)
    data = batch(plain)
    _, want = plain.step(plain.init_state(), data)
    _, got = with_stats.step(with_stats.init_state(), data)
    np.testing.assert_allclose(got["total_loss"], want["total_loss"], rtol=1e-6)  # the statistic adds nothing
    np.testing.assert_allclose(got[METRIC], want[METRIC], rtol=1e-6)
    hidden = nnx.merge(with_stats.graphdef, with_stats.init_state()["params"]).hidden(data["inputs"])
    np.testing.assert_allclose(got["aux/stats/hidden_rms"], jnp.sqrt(jnp.mean(jnp.square(hidden))), rtol=1e-5)
    with pytest.raises(ConfigError, match=r"aux_metrics must give a tuple of distinct names .*'activation_l2'"):
        register_family(dataclasses.replace(TOY_AUX, name="toy_aux_stats_clash", build=ToyStatsDecoder,
                                            aux_metrics=lambda cfg: (AUX_LOSS,)))  # a loss's name
    with pytest.raises(ConfigError, match=r"aux_metrics must give a tuple"):
        register_family(dataclasses.replace(TOY_AUX, name="toy_aux_stats_bad", build=ToyStatsDecoder,
                                            aux_metrics=lambda cfg: ("stats/hidden rms",)))


def test_declaring_an_aux_loss_needs_hidden_with_aux() -> None:
    with pytest.raises(ConfigError) as caught:  # the builder is a class: checked without building anything
        register_family(dataclasses.replace(TOY, name="toy_aux_missing", aux_losses=("balance",)))
    assert str(caught.value) == ("model family 'toy_aux_missing' declares auxiliary losses ['balance'], but its "
                                 "module ToyDecoder has no hidden_with_aux(tokens, segment_ids, positions) method")
    with pytest.raises(ConfigError, match="^model family 'toy_aux_fn' declares .* module ToyDecoder has no"):
        register_family(dataclasses.replace(  # a builder function: its module's class from an abstract build
            TOY, name="toy_aux_fn", aux_losses=("balance",), build=lambda cfg, vocab, rngs: ToyDecoder(cfg, vocab,
                                                                                                       rngs)))
    with pytest.raises(ConfigError, match=r"aux_losses must be a tuple of distinct names"):
        register_family(dataclasses.replace(TOY_AUX, name="toy_aux_twice", aux_losses=(AUX_LOSS, AUX_LOSS)))
    assert not {"toy_aux_missing", "toy_aux_fn", "toy_aux_twice"} & set(families())


@pytest.mark.integration
def test_recipe_04_logs_the_aux_loss_to_the_train_log_and_wandb(fixture_stages: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fixture_run import log_records, run_copy
    from tests.recipe_runner import REPO, run_recipe
    from tracking.readback import find_offline_runs, read_offline_run

    monkeypatch.setenv("RU_PRETRAIN_PLUGINS", "tests.toy_aux_family")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    config = run_copy(fixture_stages, tmp_path, train={"steps": 2, "checkpoint_every": 2, "warmup_steps": 1,
                                                       "log_every": 1})
    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree["model"] = {"family": AUX_NAME, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "max_seq_len": 64,
                     "activation_l2": 0.1}
    config.write_text(yaml.safe_dump(tree, allow_unicode=True), encoding="utf-8")
    run_recipe("04_pretrain.py", config)

    run_dir, key = tmp_path / "runs" / "tiny", f"train/{METRIC}"
    records = [r for r in log_records(run_dir) if "train/loss" in r]
    assert [r["train/step"] for r in records] == [1, 2]
    assert all(0 < r[key] < 1 for r in records)  # 0.1 x mean(hidden^2), the hidden states RMS-normalised
    assert all(r["train/total_loss"] == pytest.approx(r["train/loss"] + r[key], rel=1e-5) for r in records)
    runs = [read_offline_run(d) for d in find_offline_runs(run_dir / "wandb")]
    (pretrain,) = [r for r in runs if any(key in row for row in r.history)]
    assert [row[key] for row in pretrain.history if key in row] == pytest.approx([r[key] for r in records])
    assert pretrain.summary[key] == pytest.approx(records[-1][key])
