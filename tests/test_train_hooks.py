"""The training loop's periodic actions are hooks: each fires when its schedule says, in list order,
and a recipe adds one (eval during training) without the loop knowing about it."""

from __future__ import annotations

import io
import json
import time
import types
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from experiment.sections.train import TrainConfig
from tracking.wandb_run import SilentRun
from trainer.hooks import CheckpointSaves, EvalHook, LogMetrics, LoopContext, Schedule, StopOnSignal
from trainer.preemption import PREEMPTED_EXIT_CODE
from trainer.reporting import OtherHostLedger
from trainer.throughput import MetricsWindow
from trainer.train import run_loop


class CountingProgram:
    """A train step that counts: the state is the number of steps taken, the loss falls with it."""

    batch_sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def step(self, state: dict[str, Any], batch: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        steps = state["params"] + 1
        return {"params": steps}, {"loss": 10.0 / steps, "total_loss": 10.0 / steps, "grad_norm": 1.0, "lr": 1e-3,
                                   "finite": True}

    def model(self, params: int) -> str:
        return f"model after {params} steps"


class Loader:
    skipped_records = 0

    def __next__(self) -> dict[str, np.ndarray]:
        return {"inputs": np.zeros((2, 4), np.int32)}

    def get_state(self) -> dict[str, Any]:
        return {}

    def tokens_by_set(self, batch: int, tokens_per_step: int) -> None:  # one shard set: nothing by set
        return None

    def mixture_metrics(self, step: int, tokens_per_step: int) -> dict[str, float]:
        return {}


class Recorder:
    """A hook added by a test: notes the steps it fired at."""

    def __init__(self, schedule: Schedule) -> None:
        self.fixed, self.fired = schedule, []

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return self.fixed

    def __call__(self, ctx: LoopContext) -> None:
        self.fired.append(ctx.step)


def context(tmp_path: Path, **train: Any) -> LoopContext:
    ledger = OtherHostLedger()
    manager = types.SimpleNamespace(wait_until_finished=lambda: None)
    return LoopContext(cfg=types.SimpleNamespace(train=TrainConfig(**train)),
                       run_folder=types.SimpleNamespace(checkpoints=tmp_path), program=CountingProgram(),
                       loader=Loader(), ledger=ledger, wandb_run=SilentRun(), train_log=io.StringIO(),
                       saves=CheckpointSaves(manager, ledger), window=MetricsWindow(8, 1.0, None), meta={},
                       tokens_per_step=8, start_step=0, state={"params": 0})


def logged(ctx: LoopContext) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ctx.train_log.getvalue().splitlines()]


def test_hooks_fire_on_their_schedule_and_a_recipe_hook_logs_through_the_context(tmp_path: Path) -> None:
    ctx = context(tmp_path, steps=7, log_every=5, eval_every=2)
    every_three, at_end = Recorder(Schedule(every=3)), Recorder(Schedule(at_end=True))
    evaluated = []

    def evaluate(model: Any, cfg: Any, run_folder: Any, step: int) -> dict[str, float]:
        evaluated.append((model, step))
        return {"eval/loss": float(step)}

    run_loop(ctx, [LogMetrics(), EvalHook(evaluate), every_three, at_end])
    assert (ctx.step, ctx.state["params"], ctx.last_loss) == (7, 7, pytest.approx(10 / 7))
    assert every_three.fired == [3, 6] and at_end.fired == [7]
    assert evaluated == [("model after 2 steps", 2), ("model after 4 steps", 4), ("model after 6 steps", 6)]
    assert [(r["train/step"], "eval/loss" in r, "train/loss" in r) for r in logged(ctx)] == [
        (2, True, False), (4, True, False), (5, False, True), (6, True, False), (7, False, True)]


class SigtermAt:
    """Marks SIGTERM as received after ``step``, as PreemptionWatch's handler does (without its
    exit-after-grace timer, which would end pytest)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return Schedule(every=1)

    def __call__(self, ctx: LoopContext) -> None:
        if ctx.step == self.step and ctx.preemption is not None:
            ctx.preemption.requested_at = time.monotonic()


def test_sigterm_runs_the_signal_hooks_in_order_then_exits_143(tmp_path: Path) -> None:
    ctx = context(tmp_path, steps=10, log_every=100, eval_every=0)
    on_signal, after_stop = Recorder(Schedule(on_signal=True)), Recorder(Schedule(every=1))
    with pytest.raises(SystemExit) as stopped:
        run_loop(ctx, [SigtermAt(4), on_signal, StopOnSignal(), after_stop])
    assert stopped.value.code == PREEMPTED_EXIT_CODE
    assert on_signal.fired == [4] and after_stop.fired == [1, 2, 3]  # nothing after the stop runs
    assert ctx.step == 4 and logged(ctx) == []
