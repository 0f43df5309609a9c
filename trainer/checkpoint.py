"""Orbax checkpoints of a training run, and loading a trained model back for eval and export.

One checkpoint step holds five items:

- ``params``: the parameters (separate from the rest so eval restores them alone);
- ``train``: optimizer state, step counter and RNG key data;
- ``loader``: the data iterator's state (JSON), so that resume sees the same batches;
- ``ledger``: the cost ledger's summary at that step (JSON);
- ``meta``: model config, vocab_size, tokenizer_sha256, seq_len, W&B run id (JSON).

Orbax writes a step into a temporary folder and renames it when complete, so a crash mid-save
leaves a ``*.orbax-checkpoint-tmp`` folder that a new manager ignores: the latest finished step is
what resume and eval see.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx
from orbax.checkpoint.checkpoint_managers import preservation_policy

from experiment.errors import DataError, MissingStageError
from experiment.sections.model import ModelConfig
from experiment.sections.train import TrainConfig
from model.decoder import Decoder

log = logging.getLogger("trainer.checkpoint")
PRETRAIN_RECIPE = "recipes/04_pretrain.py"
ITEMS = ("params", "train", "loader", "ledger", "meta")


def open_manager(checkpoint_dir: Path, train_cfg: TrainConfig | None = None) -> ocp.CheckpointManager:
    """A manager that keeps the latest ``keep_checkpoints`` plus every ``keep_checkpoints_every``-th step.

    Without ``train_cfg`` (eval, export) it only reads: nothing is created, cleaned or deleted, so
    it is safe beside a training run that is still writing.
    """
    policies: list[preservation_policy.PreservationPolicy] = []
    if train_cfg is not None:
        policies.append(preservation_policy.LatestN(train_cfg.keep_checkpoints))
        if train_cfg.keep_checkpoints_every:
            policies.append(preservation_policy.EveryNSteps(train_cfg.keep_checkpoints_every))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=preservation_policy.AnyPreservationPolicy(policies) if policies else None,
        enable_async_checkpointing=bool(train_cfg and train_cfg.async_checkpointing),
        cleanup_tmp_directories=train_cfg is not None,
        create=train_cfg is not None,
    )
    return ocp.CheckpointManager(Path(checkpoint_dir).resolve(), item_names=ITEMS, options=options)


def save(manager: ocp.CheckpointManager, step: int, state: dict[str, Any], loader_state: dict[str, Any],
         ledger_summary: dict[str, Any], meta: dict[str, Any], force: bool = False) -> None:
    """Start saving ``step`` (asynchronously when the manager is async; Orbax copies device arrays first)."""
    train_part = {k: state[k] for k in ("opt_state", "step", "rng")}
    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(state["params"]),
            train=ocp.args.StandardSave(train_part),
            loader=ocp.args.JsonSave(loader_state),
            ledger=ocp.args.JsonSave(ledger_summary),
            meta=ocp.args.JsonSave(meta),
        ),
        force=force,
    )


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore the full train state onto its shardings; returns ``(state, json_items)``."""
    abstract_train = {k: abstract_state[k] for k in ("opt_state", "step", "rng")}
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_state["params"]),
            train=ocp.args.StandardRestore(abstract_train),
            loader=ocp.args.JsonRestore(),
            ledger=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        ),
    )
    state = {"params": restored["params"], **restored["train"]}
    return state, {k: restored[k] for k in ("loader", "ledger", "meta")}


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def model_config_from_meta(meta: dict[str, Any]) -> ModelConfig:
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in meta["model"].items() if k in fields})


def load_trained_model(run_folder: Any, step: int | None = None) -> tuple[Decoder, int, dict[str, Any]]:
    """The trained model of a run folder (latest checkpoint by default) on the default device.

    Returns ``(model, step, meta)``; ``meta`` has ``model``, ``vocab_size``, ``tokenizer_sha256``,
    ``seq_len``. Raises MissingStageError when the run has no finished checkpoint.
    """
    checkpoint_dir = Path(run_folder.checkpoints)
    if not checkpoint_dir.is_dir():
        raise MissingStageError(f"no checkpoints in {checkpoint_dir}: run {PRETRAIN_RECIPE} first")
    manager = open_manager(checkpoint_dir)
    try:
        steps = manager.all_steps()
        if not steps:
            raise MissingStageError(f"no finished checkpoint in {checkpoint_dir}: run {PRETRAIN_RECIPE} first")
        if step is None:
            step = max(steps)
        elif step not in steps:
            raise DataError(f"checkpoint step {step} not in {checkpoint_dir} (available: {sorted(steps)})")
        meta = read_meta(manager, step)
        model_cfg = model_config_from_meta(meta)
        with nnx.use_eager_sharding(False):
            abstract_model = nnx.eval_shape(lambda: Decoder(model_cfg, meta["vocab_size"], nnx.Rngs(0)))
        graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        param_dtype = jax.numpy.dtype(meta.get("param_dtype", "float32"))
        target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, param_dtype, sharding=device), abstract_params)
        params = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))["params"]
    except (ValueError, KeyError, FileNotFoundError, json.JSONDecodeError) as exc:
        raise DataError(f"checkpoint {step} in {checkpoint_dir} is unreadable: {exc}".splitlines()[0]) from exc
    finally:
        manager.close()
    log.info("loaded step %d from %s", step, checkpoint_dir)
    return nnx.merge(graphdef, params), step, meta
