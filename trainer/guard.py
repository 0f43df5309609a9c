"""The NaN guard: which steps trained, which were skipped, and which checkpoint is still good.

The jitted step reports ``finite``: its loss, its gradient norm and every updated parameter and moment are
finite (trainer/step.py). A step that is not stops the run before any hook can log or save it
(``train.nan_policy: stop``), or keeps the previous state (``skip``) up to ``train.max_skipped_steps`` in a
row. No checkpoint of a non-finite state is ever written (``CheckpointSaves.save`` refuses one).

Finite is not the same as good: a huge learning rate can leave weights that are finite and ruined (every
logit alike: loss ln V, zero or NaN gradients at the next step). What tells a checkpoint's parameters
apart is the loss measured on them, the loss of the step right after the checkpoint (``measured``,
carried from checkpoint to checkpoint in their meta, so that every process of a run, and a later session,
knows it). The checkpoint a stopped run names (``usable_step``) is the newest one whose measured loss is
finite and not above the measured loss of the checkpoint before it: a loss that rose right after a
checkpoint means its weights had already been pushed off course. A gradient norm of exactly zero on a
checkpoint's parameters rules it out too: nothing flows back through a network whose every logit is alike,
and its loss, ln V, can sit below a fresh model's (a random init scores a little above ln V), so the loss
comparison alone would vouch for it. The newer checkpoints are moved aside
(``checkpoints/diverged/``), so that rerunning the command, with a lower learning rate, resumes from it.

Spikes (``train.skip_spikes``, after MaxText's ``skip_step_on_spikes``, src/maxtext/optimizers/optimizers.py):
a step whose loss (the total loss the gradient is taken of) or gradient norm is above ``mean +
train.spike_sigma * std`` (the standard deviation with Bessel's correction) of the last ``train.spike_window``
finite steps' is skipped like a non-finite one: weights and moments stay the previous ones, the ledger books the step as
lost, and more than ``train.max_skipped_steps`` skipped steps in a row stop the run. As in MaxText, the
window takes every finite step's values, a skipped spike's too (a lasting shift becomes the new baseline
instead of stopping the run), and nothing is skipped until the window is half full (at least 2 steps). The
window lives on the host (``SpikeWindow``) from the metrics the loop reads after every step anyway; the
limits it gives go into the next step (``TrainProgram.step_skipping_spikes``), which keeps or drops its
update on the devices: no extra wait for the host. The window is part of every checkpoint's guard record, so
a resumed run skips exactly the steps an uninterrupted one would.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiment.errors import RecipeError

log = logging.getLogger("trainer")
# in a checkpoint's meta: {"finite": true, "measured": {step: loss on its parameters}, "window": SpikeWindow.record(),
# "skipped_in_a_row": steps skipped just before the save (absent: none)}
GUARD_KEY = "guard"
DIVERGED_DIR = "diverged"  # in checkpoints/: steps set aside after a divergence (not a step name for Orbax)


class TrainingDiverged(RecipeError):
    """The loss, the gradient or the updated state became NaN/Inf."""


def describe(metrics: dict[str, Any], limits: np.ndarray | None = None) -> str:
    """The step's loss and gradient norm, and, when both are finite, that the update overflowed the state, or,
    for a spike, the limits (``SpikeWindow.limits``) they went over."""
    loss, grad_norm = float(metrics["total_loss"]), float(metrics["grad_norm"])
    what = f"loss {loss}, gradient norm {grad_norm}"
    if is_spike(metrics):
        above = limits if limits is not None else (math.nan, math.nan)
        what += f": a spike (limits {float(above[0]):.6g} and {float(above[1]):.6g}, train.spike_sigma)"
    elif math.isfinite(loss) and math.isfinite(grad_norm):
        what += ", non-finite parameters or optimizer state after the update"
    return what


def is_spike(metrics: dict[str, Any]) -> bool:
    """Whether the step was skipped as a spike (``TrainProgram.update``; False for a step run without limits)."""
    return bool(metrics.get("spike", False))


@dataclasses.dataclass
class SpikeWindow:
    """The last ``size`` finite steps' total losses and gradient norms, and the limits they set for the next step.

    Values are kept as Python floats of the step's float32 metrics, so a checkpoint's record (JSON) holds them
    exactly and a resumed run computes the same limits.
    """

    size: int
    sigma: float
    losses: collections.deque[float] = dataclasses.field(default_factory=collections.deque)
    grad_norms: collections.deque[float] = dataclasses.field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        # a resumed run with another train.spike_window keeps the newest values that fit
        self.losses = collections.deque(self.losses, maxlen=self.size)
        self.grad_norms = collections.deque(self.grad_norms, maxlen=self.size)

    @property
    def warm(self) -> bool:
        return len(self.losses) >= max(2, self.size // 2)

    def limits(self) -> np.ndarray:
        """``[loss limit, gradient-norm limit]`` for the next step, float32; +inf while the window warms up."""
        if not self.warm:
            return np.full(2, np.inf, np.float32)
        # numpy's float64 mean and std (Bessel's correction), not statistics': its exact rational arithmetic over
        # 128 values ran on the host before every step's dispatch
        window = np.array([self.losses, self.grad_norms], np.float64)
        return (window.mean(axis=1) + self.sigma * window.std(axis=1, ddof=1)).astype(np.float32)

    def add(self, metrics: dict[str, Any]) -> None:
        loss, grad_norm = float(metrics["total_loss"]), float(metrics["grad_norm"])
        if math.isfinite(loss) and math.isfinite(grad_norm):  # a NaN would make every later limit NaN
            self.losses.append(loss)
            self.grad_norms.append(grad_norm)

    def record(self) -> dict[str, list[float]]:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms)}

    @classmethod
    def restored(cls, size: int, sigma: float, record: dict[str, Any] | None) -> SpikeWindow:
        record = record or {}
        return cls(size, sigma, collections.deque(float(v) for v in record.get("losses") or []),
                   collections.deque(float(v) for v in record.get("grad_norms") or []))


@dataclasses.dataclass
class Guard:
    """Per session: the measured loss of each checkpoint, and the skipped steps in a row.

    ``on_params_of``: the checkpoint step whose parameters the state still holds (from its save, or the
    restore, until a step trains): the loss of the first step that trains on them is its measured loss.
    """

    measured: dict[int, float] = dataclasses.field(default_factory=dict)
    on_params_of: int | None = None
    skipped_in_a_row: int = 0
    state_finite: bool = True  # the state the loop holds: a stopped step's is not, a skipped step's is the last one
    spikes: SpikeWindow | None = None  # train.skip_spikes: the window of the last steps' losses and gradient norms
    checked_against: np.ndarray | None = None  # the limits the latest step was given (spike_limits)

    @classmethod
    def resumed(cls, saved_meta: dict[str, Any] | None, step: int, spikes: SpikeWindow | None = None) -> Guard:
        """The guard of a session that starts from checkpoint ``step`` (its meta: None for a fresh start);
        ``spikes``: an empty window of the run's size and sigma (None: spikes are not skipped), filled with the
        checkpoint's."""
        record = (saved_meta or {}).get(GUARD_KEY) or {}
        measured = {int(k): float("nan" if v is None else v) for k, v in (record.get("measured") or {}).items()}
        if spikes is not None:
            spikes = SpikeWindow.restored(spikes.size, spikes.sigma, record.get("window"))
        # a save in the middle of a run of skipped steps (a preemption's): the resumed run goes on counting it, so it
        # stops at train.max_skipped_steps where an uninterrupted one would
        return cls(measured=measured, on_params_of=step if saved_meta is not None else None, spikes=spikes,
                   skipped_in_a_row=int(record.get("skipped_in_a_row", 0)))

    def spike_limits(self) -> np.ndarray | None:
        """The limits the next step is checked against (``TrainProgram.step_skipping_spikes``); None: no check."""
        self.checked_against = None if self.spikes is None else self.spikes.limits()
        return self.checked_against

    def after_step(self, step: int, metrics: dict[str, Any], kept_previous: bool) -> bool:
        """Book the step's outcome; returns whether it trained (False: not finite, or a spike). ``kept_previous``:
        a step that is not finite kept the previous state (``train.nan_policy: skip``); a spike always does."""
        spike = is_spike(metrics)
        trained = bool(metrics["finite"]) and not spike
        self.state_finite = trained or ((kept_previous or spike) and self.state_finite)
        if self.spikes is not None:
            self.spikes.add(metrics)
        loss = float(metrics["loss"])  # the cross-entropy, as train_log.jsonl has it
        alive = trained and math.isfinite(loss) and float(metrics["grad_norm"]) > 0.0
        if self.on_params_of is not None:
            # a skipped step ran on the same parameters again: a finite one later still measures them
            if trained or not math.isfinite(self.measured.get(self.on_params_of, math.nan)):
                self.measured[self.on_params_of] = loss if alive else math.nan
            if trained:
                self.on_params_of = None
        self.skipped_in_a_row = 0 if trained else self.skipped_in_a_row + 1
        return trained

    def saved(self, step: int, kept: Sequence[int]) -> dict[str, Any]:
        """The meta record of the checkpoint of ``step``, the steps on disk being ``kept``; raises when the
        state is not finite (the loop stops before such a state reaches a save)."""
        if not self.state_finite:
            raise RuntimeError(f"refusing to save the non-finite state of step {step}")
        self.on_params_of = step
        keep = set(kept) | {step}
        self.measured = {s: v for s, v in self.measured.items() if s in keep}
        record: dict[str, Any] = {"finite": True, "measured": {str(s): (v if math.isfinite(v) else None)
                                                               for s, v in sorted(self.measured.items())}}
        if self.spikes is not None:
            record["window"] = self.spikes.record()
        if self.skipped_in_a_row:
            record["skipped_in_a_row"] = self.skipped_in_a_row
        return record


def usable_step(steps: Sequence[int], measured: dict[int, float]) -> int | None:
    """The newest of ``steps`` worth resuming from (None: none is).

    A step whose measured loss is unknown (a checkpoint of an older version, or one no step trained on
    yet) is taken as good; one whose measured loss is not finite is not; one whose measured loss is above
    that of the next older checkpoint measured is not either (the oldest has nothing to compare to).
    """
    ordered = sorted(steps)
    for i in range(len(ordered) - 1, -1, -1):
        step = ordered[i]
        loss = measured.get(step)
        if loss is None:
            return step
        if not math.isfinite(loss):
            continue
        older = [measured[s] for s in ordered[:i] if s in measured and math.isfinite(measured[s])]
        if not older or loss <= older[-1]:
            return step
    return None


SPIKE_ADVICE = "Raise train.spike_sigma or train.max_skipped_steps, or lower train.learning_rate"
NAN_ADVICE = ("Lower train.learning_rate (with train.allow_schedule_change=true on a resume), or set "
              "train.nan_policy=skip to skip such steps")


def stop_message(step: int, what: str, usable: int | None, moved: Sequence[int], folder: Path,
                 advice: str = NAN_ADVICE) -> str:
    moved_text = (f" (the later step(s) {', '.join(map(str, moved))} were moved to {folder / DIVERGED_DIR})"
                  if moved else "")
    if usable is None:
        where = (f"no checkpoint in {folder} is worth resuming from{moved_text}: rerunning starts over from "
                 "step 0")
    else:
        where = f"the last good checkpoint is step {usable}{moved_text}: rerunning resumes from it"
    return f"training diverged at step {step} ({what}); {where}. {advice}"
