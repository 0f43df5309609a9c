"""Process start-up for training: join the other JAX processes, and settings made before any device is used.

Recipe 4 hands ``prepare_processes`` to the harness as its ``prepare`` hook, so it runs before W&B
opens, and ``reports`` as its ``reports`` hook: after ``jax.distributed.initialize`` the process
index is known, and only process 0 opens a W&B run (the others log nothing).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax

from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.train import TrainConfig
from trainer.cpu_host import prepare_cpu_host

log = logging.getLogger("trainer")


def maybe_initialize_distributed(train_cfg: TrainConfig) -> None:
    """Join the other hosts (TPU VM slices, multi-node GPUs) before anything touches a device.

    ``jax.distributed.initialize()`` finds its peers on Cloud TPU, SLURM and similar clusters;
    elsewhere set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID.
    """
    if not train_cfg.distributed or jax.distributed.is_initialized():
        return
    env = os.environ
    kwargs: dict[str, Any] = {}
    if env.get("JAX_COORDINATOR_ADDRESS"):
        kwargs = {"coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
                  "num_processes": int(env.get("JAX_NUM_PROCESSES", "1")),
                  "process_id": int(env.get("JAX_PROCESS_ID", "0"))}
    if jax.config.jax_platforms == "cpu" or env.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)
    log.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())


def enable_compilation_cache(train_cfg: TrainConfig, run_root: Path) -> None:
    """A resumed (preempted) run reuses the compiled step instead of paying for the compile again."""
    if train_cfg.compilation_cache and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str((Path(run_root) / "xla_cache").resolve()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def prepare_processes(cfg: ExperimentConfig) -> None:
    """Everything recipe 4 sets before W&B opens and before JAX starts its backends."""
    prepare_cpu_host(cfg.train)
    enable_compilation_cache(cfg.train, RunFolder.for_config(cfg).local)  # a bucket run's: this host's disk
    maybe_initialize_distributed(cfg.train)


def is_primary() -> bool:
    """Process 0 reports for the whole slice: the W&B run, the ledger, ``train_log.jsonl``, the progress bar."""
    return jax.process_index() == 0


def reports(cfg: ExperimentConfig) -> bool:
    """The harness's ``reports`` hook: whether this process opens the W&B run (a single process
    answers without starting JAX's backends, which W&B would otherwise wait for)."""
    return not cfg.train.distributed or is_primary()
