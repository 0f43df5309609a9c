"""The training loop: one step at a time until ``train.steps``, then the hooks that are due.

    batch -> step -> NaN policy -> progress bar -> hooks (log, eval, checkpoint, stop on SIGTERM)

A non-finite loss stops the run before it is checkpointed (``train.nan_policy: stop``) or skips that
update (``skip``): it is checked right after the step, before any hook can log or save it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from experiment.errors import RecipeError
from experiment.progress import progress as progress_bar
from trainer.distributed import is_primary
from trainer.hooks import Hook, LoopContext
from trainer.preemption import PreemptionWatch
from trainer.resume import finished_steps
from trainer.step import global_batch

log = logging.getLogger("trainer")


class TrainingDiverged(RecipeError):
    """The loss or gradient became NaN/Inf."""


def run_loop(ctx: LoopContext, hooks: Sequence[Hook]) -> None:
    """Train from ``ctx.step`` to ``train.steps``; each hook runs, in list order, after every step its
    schedule is due. Pending checkpoint saves are finished before it returns."""
    train_cfg = ctx.train_cfg
    scheduled = [(hook, hook.schedule(train_cfg)) for hook in hooks]
    progress = progress_bar(total=train_cfg.steps, initial=ctx.step, desc="pretrain", unit="step", dynamic_ncols=True,
                    disable=not is_primary())
    try:
        with PreemptionWatch(train_cfg.preemption_grace_s) as preemption:
            ctx.preemption = preemption
            while ctx.step < train_cfg.steps:
                train_one_step(ctx)
                progress.update(1)
                progress.set_postfix(loss=f"{ctx.last_loss:.4f}")
                for hook, schedule in scheduled:
                    if schedule.due(ctx):
                        hook(ctx)
        ctx.saves.wait()
    finally:
        progress.close()


def train_one_step(ctx: LoopContext) -> None:
    """One optimizer step, booked in the ledger (the first one of a session as compilation)."""
    phase = "compile" if ctx.step == ctx.start_step else "train"
    with ctx.ledger.phase(phase):
        with ctx.ledger.phase("data"):  # waiting for the loader is badput of its own, not training
            host_batch = next(ctx.loader)
        batch = global_batch(host_batch, ctx.program.batch_sharding)
        ctx.state, metrics = ctx.program.step(ctx.state, batch)
        ctx.metrics = jax.device_get(metrics)  # tiny; also where a NaN is caught before any save
    ctx.step += 1
    ctx.window.add()
    ctx.ledger.add_tokens(ctx.step, ctx.tokens_per_step)
    ctx.last_loss = float(ctx.metrics["loss"])
    check_finite(ctx.metrics, ctx.step, ctx.train_cfg, Path(ctx.run_folder.checkpoints))
    if phase == "compile":
        log.info("first step (with compilation) done, loss %.4f", ctx.last_loss)
        ctx.window.flush()  # keep compilation out of tokens/s


def check_finite(metrics: dict[str, Any], step: int, train_cfg: Any, checkpoint_dir: Path) -> None:
    if bool(metrics["finite"]):
        return
    what = f"loss {float(metrics['total_loss'])}, gradient norm {float(metrics['grad_norm'])}"
    if train_cfg.nan_policy == "skip":
        log.warning("step %d: %s; update skipped (train.nan_policy=skip)", step, what)
        return
    saved = finished_steps(checkpoint_dir)  # none is newer than the last finite step: we stop before saving
    last = f"the last good checkpoint is step {saved[-1]}" if saved else "no checkpoint was saved"
    raise TrainingDiverged(f"training diverged at step {step} ({what}); {last}. Lower train.learning_rate, "
                           "or set train.nan_policy=skip to skip such steps")
