"""The training loop's periodic actions, as hooks: log metrics, evaluate, checkpoint, stop on SIGTERM.

A hook says when it fires (a ``Schedule``: every N steps, at the last step, on SIGTERM; derived from
the train config) and what it does with the ``LoopContext`` after a step. The loop calls the hooks
in list order after every step whose schedule is due; adding an action is adding a hook:

    class PrintLoss:
        def schedule(self, train_cfg: TrainConfig) -> Schedule:
            return Schedule(every=100)

        def __call__(self, ctx: LoopContext) -> None:
            print(ctx.step, ctx.last_loss)

Recipe 4 hands ``EvalHook(eval.run.evaluate_model)`` to ``trainer.train.pretrain``; the trainer
itself does not import eval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from experiment import appendlog
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.train import TrainConfig
from model.family import FamilyModel, params_label
from trainer import checkpoint
from trainer.branch import tokens_seen
from trainer.guard import GUARD_KEY, Guard, is_spike
from trainer.preemption import PREEMPTED_EXIT_CODE, PreemptionWatch
from trainer.reporting import TrainLedger, log_metrics, log_samples
from trainer.step import AUX_METRICS, State, TrainProgram
from trainer.throughput import MetricsWindow
from trainer.watchdog import Watchdog

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

    from data_prep.shards.loader import TrainIterator
    from tracking.wandb_run import WandbRun

log = logging.getLogger("trainer")


class CheckpointSaves:
    """Async Orbax saves, each booked in the ledger once it is known to be on disk."""

    def __init__(self, manager: ocp.CheckpointManager, ledger: TrainLedger, guard: Guard | None = None,
                 train_log: appendlog.LogWriter | None = None, watchdog: Watchdog | None = None) -> None:
        self.manager, self.ledger = manager, ledger
        self.guard = guard if guard is not None else Guard()
        self.train_log = train_log
        self.watchdog = watchdog  # the session's hang watchdog (None: saves have no deadline)
        self.unconfirmed: list[int] = []  # async saves not yet known to be on disk

    def save(self, step: int, state: State, loader_state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Save ``state`` (finite: the guard says so, or refuses) with ``meta`` and the guard's record."""
        record = self.guard.saved(step, [*self.manager.all_steps(), *self.unconfirmed])
        if self.train_log is not None:
            # the log up to this step is durable before the checkpoint that a resume cuts the log back to (in a
            # bucket, lines reach the storage only with a segment: a kill would lose the lines this step keeps)
            self.train_log.sync()
        with self._deadline(f"the checkpoint save of step {step}"), self.ledger.phase("checkpoint"):
            # Orbax finishes the previous async save before it starts this one
            checkpoint.save(self.manager, step, state, loader_state, self.ledger.checkpoint_record(step),
                            {**meta, GUARD_KEY: record}, force=True)
        self._confirm()
        self.unconfirmed = [step]

    def wait(self) -> None:
        pending = ", ".join(map(str, self.unconfirmed)) or "none pending"
        with self._deadline(f"waiting for the checkpoint save of step {pending}"), self.ledger.phase("checkpoint"):
            self.manager.wait_until_finished()
        self._confirm()

    def _deadline(self, what: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.watchdog is None else self.watchdog.save(what)

    def _confirm(self) -> None:
        for done in self.unconfirmed:
            self.ledger.mark_checkpoint(done)
        self.unconfirmed = []


@dataclasses.dataclass
class LoopContext:
    """What hooks see after a step: the run's parts and the step's results.

    ``wandb_run`` is a W&B run on process 0 and a ``tracking.wandb_run.SilentRun`` elsewhere; the
    ledger and ``train_log`` likewise keep nothing off process 0 (``trainer.reporting``).
    """

    cfg: ExperimentConfig
    run_folder: RunFolder
    program: TrainProgram
    loader: TrainIterator
    ledger: TrainLedger
    wandb_run: WandbRun
    train_log: appendlog.LogWriter | None
    saves: CheckpointSaves
    window: MetricsWindow
    meta: dict[str, Any]  # the checkpoints' meta (trainer.train.TrainSession.meta)
    tokens_per_step: int
    start_step: int
    state: State
    step: int = 0
    metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # the last step's, on the host
    last_loss: float = math.nan
    preemption: PreemptionWatch | None = None

    @property
    def guard(self) -> Guard:
        """The NaN guard of this session (the checkpoint saves' own: what it records goes into their meta)."""
        return self.saves.guard

    @property
    def watchdog(self) -> Watchdog | None:
        """The session's hang watchdog (the checkpoint saves' own, which watches them too)."""
        return self.saves.watchdog

    @property
    def train_cfg(self) -> TrainConfig:
        return self.cfg.train

    @property
    def at_end(self) -> bool:
        return self.step == self.train_cfg.steps

    @property
    def signalled(self) -> bool:
        return self.preemption is not None and self.preemption.requested

    def log(self, record: dict[str, Any]) -> None:
        """``record`` at this step: W&B (with the rubles spent so far), ``train_log.jsonl``, the log line."""
        log_metrics(self.wandb_run, self.train_log, self.step, record, self.ledger.summary())


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When a hook fires after a step: every ``every`` steps (0: never), at the last step, on SIGTERM."""

    every: int = 0
    at_end: bool = False
    on_signal: bool = False

    def due(self, ctx: LoopContext) -> bool:
        return ((self.every > 0 and ctx.step % self.every == 0) or (self.at_end and ctx.at_end)
                or (self.on_signal and ctx.signalled))


class Hook(Protocol):
    def schedule(self, train_cfg: TrainConfig) -> Schedule: ...

    def __call__(self, ctx: LoopContext) -> None: ...


class LogMetrics:
    """Loss, gradient norm, learning rate, throughput and MFU every ``train.log_every`` steps and at the end; a
    family's auxiliary losses and statistics as ``train/aux/<name>``."""

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return Schedule(every=train_cfg.log_every, at_end=True)

    def __call__(self, ctx: LoopContext) -> None:
        metrics = ctx.metrics
        record = {"train/step": ctx.step, "train/loss": ctx.last_loss,
                  "train/total_loss": float(metrics["total_loss"]),
                  "train/grad_norm": float(metrics["grad_norm"]), "train/lr": float(metrics["lr"]),
                  "train/skipped": int(not metrics["finite"] or is_spike(metrics)),
                  "train/tokens_seen": tokens_seen(ctx.meta, ctx.step, ctx.tokens_per_step), **ctx.window.flush(),
                  # the family's auxiliary losses (ModelFamily.aux_losses), weighted, as they joined the loss, and its
                  # statistics (ModelFamily.aux_metrics: a mixture of experts' expert load per layer, its drops)
                  **{f"train/{key}": float(value) for key, value in metrics.items() if key.startswith(AUX_METRICS)}}
        # a mixture's sets: each one's share of this step's rows and its tokens so far (closed forms of the step)
        record.update(ctx.loader.mixture_metrics(ctx.step, ctx.tokens_per_step))
        if ctx.loader.skipped_records:  # shards.on_corrupt=skip; each one was logged with file and offset
            record["data/skipped_records"] = ctx.loader.skipped_records
            ctx.wandb_run.summary["data/skipped_at"] = [f"{f}@{o}" for f, o in ctx.loader.skipped_at]
        ctx.log(record)


class BodyUnfreezes:
    """Says when ``train.embeddings_only_steps`` ends: the log line, and the step in W&B's summary."""

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        warmup = train_cfg.embeddings_only_steps if train_cfg.trainable != "embeddings" else 0
        return Schedule(every=warmup)

    def __call__(self, ctx: LoopContext) -> None:
        warmup = ctx.cfg.train.embeddings_only_steps
        if ctx.step != warmup:  # every multiple of it is due; the switch happens once
            return
        total = ctx.meta["n_params"]  # the family's count, as the start of the run logged it
        log.info("step %d: embeddings-only warm-up done (train.embeddings_only_steps); from step %d all %s "
                 "parameters train", warmup, warmup + 1, params_label(total))
        if ctx.wandb_run is not None:
            ctx.wandb_run.summary["train/full_training_from_step"] = warmup + 1


# evaluate(model, cfg, run_folder, step) -> flat metrics such as {"eval/loss": 3.1}
EvaluateFn = Callable[[FamilyModel, ExperimentConfig, RunFolder, int], Mapping[str, float]]
# sample(model, cfg, run_folder, step) -> records with "prompt" and "completion" (eval.run.sample_completions)
SampleFn = Callable[[FamilyModel, ExperimentConfig, RunFolder, int], list[dict[str, Any]]]


class EvalHook:
    """Eval during training every ``train.eval_every`` steps (0: never), booked as the ledger's eval phase; with
    ``sample``, the model's completions of fixed prompts too, logged against the step and the rubles spent."""

    def __init__(self, evaluate: EvaluateFn, sample: SampleFn | None = None) -> None:
        self.evaluate, self.sample = evaluate, sample

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return Schedule(every=train_cfg.eval_every)

    def __call__(self, ctx: LoopContext) -> None:
        model = ctx.program.model(ctx.state["params"])
        with ctx.ledger.phase("eval"):
            metrics = self.evaluate(model, ctx.cfg, ctx.run_folder, ctx.step)
            samples = self.sample(model, ctx.cfg, ctx.run_folder, ctx.step) if self.sample is not None else []
        ctx.log({"train/step": ctx.step, **metrics})
        if samples:
            log_samples(ctx.wandb_run, ctx.run_folder, ctx.step, samples, ctx.ledger.summary())


class SaveCheckpoint:
    """A checkpoint every ``train.checkpoint_every`` steps, at the end, and when SIGTERM asks for one."""

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return Schedule(every=train_cfg.checkpoint_every, at_end=True, on_signal=True)

    def __call__(self, ctx: LoopContext) -> None:
        if ctx.guard.skipped_in_a_row and not (ctx.at_end or ctx.signalled):
            # the state is the last good one again: another copy of it would only rotate older checkpoints away
            log.info("step %d: no checkpoint while updates are being skipped", ctx.step)
            return
        ctx.saves.save(ctx.step, ctx.state, ctx.loader.get_state(), ctx.meta)


class StopOnSignal:
    """After SIGTERM: wait for the checkpoint (``SaveCheckpoint`` runs first), then exit 143."""

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return Schedule(on_signal=True)

    def __call__(self, ctx: LoopContext) -> None:
        ctx.saves.wait()
        requested_at = ctx.preemption.requested_at if ctx.preemption else None
        waited = time.monotonic() - (requested_at or time.monotonic())
        log.warning("SIGTERM: checkpoint of step %d saved %.1f s after the signal; rerun the same "
                    "command to resume", ctx.step, waited)
        raise SystemExit(PREEMPTED_EXIT_CODE)
