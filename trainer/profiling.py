"""A JAX profiler trace of a few training steps (``train.profile_steps: [first, count]``), written to
``<run>/profile/`` and logged as a W&B artifact of type ``profile``.

Open it with TensorBoard/XProf (``tensorboard --logdir <run>/profile``) or drop the
``*.trace.json.gz`` into Perfetto (ui.perfetto.dev). The trace is two hooks that share one
``StepTrace``: ``trace.start`` goes last in the hooks list, so it begins after step first-1 has
been logged and checkpointed, and ``trace.stop`` goes first, so it ends right after step
first+count-1 (once that step's outputs are computed), before the other hooks of that step run.
A resumed run whose window has partly passed traces what is left of it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax

from experiment.sections.train import TrainConfig
from tracking.artifacts import log_files
from trainer.hooks import LoopContext, Schedule

log = logging.getLogger("trainer")
PROFILE_DIR = "profile"


class StepTrace:
    """The trace of ``train.profile_steps``: ``start`` and ``stop`` are the hooks to put in the list."""

    def __init__(self) -> None:
        self.folder: Path | None = None  # where the trace in progress is written; None when none is
        self.before: set[Path] = set()
        self.first_traced = 0
        self.done = False
        self.start = _StartTrace(self)
        self.stop = _StopTrace(self)

    def begin(self, ctx: LoopContext) -> None:
        folder = ctx.run_folder.local / PROFILE_DIR  # the profiler writes local files; a bucket run uploads them
        if jax.process_count() > 1:  # the trace files are named by host: keep the processes apart
            folder = folder / f"process-{jax.process_index()}"
        folder.mkdir(parents=True, exist_ok=True)
        self.before = set(folder.rglob("*"))
        jax.profiler.start_trace(str(folder))
        self.folder, self.first_traced = folder, ctx.step + 1

    def end(self, ctx: LoopContext) -> None:
        assert self.folder is not None
        jax.block_until_ready(ctx.state)  # the trace must hold the step's device work, not only its dispatch
        jax.profiler.stop_trace()
        folder, self.folder, self.done = self.folder, None, True
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p not in self.before)
        log.info("profiler trace of steps %d-%d in %s (%d files): tensorboard --logdir %s", self.first_traced,
                 ctx.step, folder, len(files), folder)
        if ctx.run_folder.in_bucket:
            target = ctx.run_folder.root / folder.relative_to(ctx.run_folder.local).as_posix()
            for file in files:
                (target / file.relative_to(folder).as_posix()).write_bytes(file.read_bytes())
            log.info("profiler trace uploaded to %s", target)
        log_files(ctx.wandb_run, f"profile-{getattr(ctx.wandb_run, 'id', None) or 'run'}", "profile", files,
                  metadata={"first_step": self.first_traced, "last_step": ctx.step}, root=folder)


def window(train_cfg: TrainConfig) -> tuple[int, int]:
    """The first and last step to trace."""
    first, count = train_cfg.profile_steps
    return first, first + count - 1


class _StartTrace:
    """Starts the trace after step first-1 (or, resumed inside the window, after the first step left)."""

    def __init__(self, trace: StepTrace) -> None:
        self.trace = trace

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return Schedule(every=1 if train_cfg.profile_steps else 0)

    def __call__(self, ctx: LoopContext) -> None:
        first, last = window(ctx.train_cfg)
        if not self.trace.done and self.trace.folder is None and first - 1 <= ctx.step < last:
            self.trace.begin(ctx)


class _StopTrace:
    """Stops the trace after step first+count-1, or earlier when SIGTERM asks the run to stop."""

    def __init__(self, trace: StepTrace) -> None:
        self.trace = trace

    def schedule(self, train_cfg: TrainConfig) -> Schedule:
        return Schedule(every=1 if train_cfg.profile_steps else 0, on_signal=True)

    def __call__(self, ctx: LoopContext) -> None:
        if self.trace.folder is not None and (ctx.step >= window(ctx.train_cfg)[1] or ctx.signalled):
            self.trace.end(ctx)
