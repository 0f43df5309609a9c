"""A trained model loaded back from a run's checkpoints, for eval and export (the parameters alone).

The model is rebuilt by the family its checkpoint's meta names, in the layer layout it was saved
in, on the default device or restored straight onto a mesh (each device reads its own shards: a model too
large for one device loads); the newest step that passes its checksums is used
(``trainer.checkpoint_integrity.restore_verified``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh

from experiment.errors import DataError
from experiment.sections.model import FamilyConfig
from experiment.stages import PRETRAIN
from model.family import FamilyModel
from model.registry import get_family
from model.sharding import tree_shardings
from model.stacking import saved_scan_layers
from trainer.checkpoint import open_manager, read_meta
from trainer.checkpoint_integrity import READER_ADVICE, restore_verified

log = logging.getLogger("trainer.checkpoint")


def model_config_from_meta(meta: dict[str, Any]) -> FamilyConfig:
    """The model config a checkpoint was trained with, in its family's section class, for the machine that
    loads it: a platform's own attention kernel (splash, cudnn) becomes ``auto``, so a model trained on a
    TPU or a GPU evaluates on a CPU (the kernels compute the same attention). A checkpoint written before
    families were recorded is a Llama one."""
    family = get_family(meta.get("family") or meta["model"].get("family") or "llama")
    fields = {f.name for f in dataclasses.fields(family.config_cls)}
    cfg = family.config_cls(**{k: v for k, v in meta["model"].items() if k in fields})
    cfg = dataclasses.replace(cfg, scan_layers=saved_scan_layers(meta))  # the layout its parameters were saved in
    return dataclasses.replace(cfg, attention="auto") if cfg.attention in ("splash", "cudnn") else cfg


def load_trained_model(run_folder: Any, step: int | None = None, mesh: Mesh | None = None,
                       rules: Mapping[str, Sequence[str]] | None = None) -> tuple[FamilyModel, int, dict[str, Any]]:
    """The trained model of a run folder (latest checkpoint by default) on the default device, or with
    ``mesh`` laid out over it by its parameters' logical axes (the family's rules, ``rules`` taking precedence).

    Returns ``(model, step, meta)``; ``meta`` has ``family``, ``model``, ``vocab_size``, ``tokenizer_sha256``,
    ``seq_len``; the model is rebuilt by the family the meta names. Raises MissingStageError when the run has no
    finished checkpoint.
    """
    checkpoint_dir = run_folder.checkpoints
    if not checkpoint_dir.is_dir():
        raise PRETRAIN.missing(f"no checkpoints in {checkpoint_dir}")
    manager = open_manager(checkpoint_dir)
    try:
        steps = manager.all_steps()
        if not steps:
            raise PRETRAIN.missing(f"no finished checkpoint in {checkpoint_dir}")
        if step is not None and step not in steps:
            raise DataError(f"checkpoint step {step} not in {checkpoint_dir} (available: {sorted(steps)})")

        def read_params(step: int) -> tuple[dict[str, Any], Any, Any]:
            meta = read_meta(manager, step)
            model_cfg = model_config_from_meta(meta)
            abstract_model = get_family(model_cfg.family).abstract(model_cfg, meta["vocab_size"])
            graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
            if mesh is None:
                device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
                shardings = jax.tree.map(lambda _: device, abstract_params)
            else:
                layout = get_family(model_cfg.family).mesh_rules(rules or {})
                shardings = tree_shardings(abstract_params, mesh, layout)
            param_dtype = jax.numpy.dtype(meta.get("param_dtype", "float32"))
            target = jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, param_dtype, sharding=sharding),
                                  abstract_params, shardings)
            params = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
            return meta, graphdef, params["params"]

        # an explicit step is that step or an error; the latest falls back to the previous complete one
        step, (meta, graphdef, params), _ = restore_verified(manager, read_params, None if step is None else [step],
                                                             advice=READER_ADVICE)
    finally:
        manager.close()
    log.info("loaded step %d from %s", step, checkpoint_dir)
    return nnx.merge(graphdef, params), step, meta
