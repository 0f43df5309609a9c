"""The batch-split rule (experiment/batch_split.py) and its three checks: config load, the planner and the trainer
refuse the same batches where each knows the whole mesh."""

from __future__ import annotations

from pathlib import Path

import pytest
from jax.sharding import AbstractMesh

from cost.planner import batch_split_problem
from experiment.batch_split import BatchSplit
from experiment.config import load_config
from experiment.errors import ConfigError
from model.registry import family_of
from model.sharding import batch_sharding, mesh_shape
from trainer.step import check_batch

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "configs" / "demo.yaml"


def test_the_rule_splits_each_micro_batch_over_the_product_of_the_batch_axes() -> None:
    assert BatchSplit(24, 2, {"data": 2, "fsdp": 3}).even  # micro-batches of 12 over 6 devices
    assert not BatchSplit(24, 2, {"data": 4, "fsdp": 2}).even  # 12 over 8
    assert not BatchSplit(10, 3, {}).even  # 10 sequences make no 3 equal micro-batches, split or not
    assert BatchSplit(7, 1, {}).even and BatchSplit(7, 1, {}).parts == 1  # no batch axis: the batch is not split


# (batch_size, grad_accum_steps, train.mesh, refused): data sized, so config load knows every axis the trainer builds
CASES = [
    (16, 1, "{data: 2, fsdp: 4}", False),  # 16 over 8
    (12, 1, "{data: 2, fsdp: 4}", True),  # 12 over 8
    (24, 2, "{data: 2, fsdp: 3}", False),  # micro-batches of 12 over 6
    (24, 2, "{data: 4, fsdp: 2}", True),  # 12 over 8
    (16, 1, "{data: 2, fsdp: 4, rules: {batch: [data, fsdp, tensor]}, tensor: 3}", True),  # 16 over 24
    (48, 2, "{data: 2, fsdp: 4, rules: {batch: [data, fsdp, tensor]}, tensor: 3}", False),  # 24 over 24
    # a batch rule naming one data-parallel axis: the planner split it over data x fsdp (8) and dropped options
    # the trainer runs
    (4, 1, "{data: 4, fsdp: 2, rules: {batch: [data]}}", False),  # 4 over data's 4
    (2, 1, "{data: 4, fsdp: 2, rules: {batch: [fsdp]}}", False),  # 2 over fsdp's 2
    (2, 1, "{data: 4, fsdp: 2, rules: {batch: [data]}}", True),  # 2 over data's 4
]


@pytest.mark.parametrize(("batch", "accum", "mesh", "refused"), CASES)
def test_config_load_the_planner_and_the_trainer_agree(batch: int, accum: int, mesh: str, refused: bool) -> None:
    overrides = [f"train.batch_size={batch}", f"train.grad_accum_steps={accum}", f"train.mesh={mesh}"]
    try:
        load_config(DEMO, overrides)
        config_refuses = False
    except ConfigError as exc:
        assert str(exc).startswith("config key 'train.batch_size': the micro-batch of"), exc
        config_refuses = True
    # the same mesh loaded with a batch every case's mesh splits, then the batch checked as the other two would
    cfg = load_config(DEMO, ["train.batch_size=48", "train.grad_accum_steps=1", f"train.mesh={mesh}"])
    cfg.train.batch_size, cfg.train.grad_accum_steps = batch, accum
    rules = family_of(cfg.model).mesh_rules(cfg.train.mesh.rules)
    devices = cfg.train.mesh.data * cfg.train.mesh.fsdp * cfg.train.mesh.tensor
    planner_refuses = batch_split_problem(devices, cfg.model, cfg.train, accum) is not None
    shape = mesh_shape(cfg.train.mesh, devices, rules)
    try:
        check_batch(cfg.train, batch_sharding(AbstractMesh(tuple(shape.values()), tuple(shape)), rules))
        trainer_refuses = False
    except ConfigError as exc:
        assert str(exc).startswith("config key 'train.batch_size': the micro-batch of"), exc
        trainer_refuses = True
    assert (config_refuses, planner_refuses, trainer_refuses) == (refused, refused, refused)
