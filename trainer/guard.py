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
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiment.errors import RecipeError

log = logging.getLogger("trainer")
GUARD_KEY = "guard"  # in a checkpoint's meta: {"finite": true, "measured": {step: loss on its parameters}}
DIVERGED_DIR = "diverged"  # in checkpoints/: steps set aside after a divergence (not a step name for Orbax)


class TrainingDiverged(RecipeError):
    """The loss, the gradient or the updated state became NaN/Inf."""


def describe(metrics: dict[str, Any]) -> str:
    """The step's loss and gradient norm, and, when both are finite, that the update overflowed the state."""
    loss, grad_norm = float(metrics["total_loss"]), float(metrics["grad_norm"])
    what = f"loss {loss}, gradient norm {grad_norm}"
    if math.isfinite(loss) and math.isfinite(grad_norm):
        what += ", non-finite parameters or optimizer state after the update"
    return what


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

    @classmethod
    def resumed(cls, saved_meta: dict[str, Any] | None, step: int) -> Guard:
        """The guard of a session that starts from checkpoint ``step`` (its meta: None for a fresh start)."""
        record = (saved_meta or {}).get(GUARD_KEY) or {}
        measured = {int(k): float("nan" if v is None else v) for k, v in (record.get("measured") or {}).items()}
        return cls(measured=measured, on_params_of=step if saved_meta is not None else None)

    def after_step(self, step: int, metrics: dict[str, Any], kept_previous: bool) -> bool:
        """Book the step's outcome; returns whether it trained (False: not finite). ``kept_previous``: a step
        that is not finite kept the previous state (``train.nan_policy: skip``)."""
        trained = bool(metrics["finite"])
        self.state_finite = trained or (kept_previous and self.state_finite)
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
        return {"finite": True, "measured": {str(s): (v if math.isfinite(v) else None)
                                             for s, v in sorted(self.measured.items())}}


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


def stop_message(step: int, what: str, usable: int | None, moved: Sequence[int], folder: Path) -> str:
    moved_text = (f" (the later step(s) {', '.join(map(str, moved))} were moved to {folder / DIVERGED_DIR})"
                  if moved else "")
    if usable is None:
        where = (f"no checkpoint in {folder} is worth resuming from{moved_text}: rerunning starts over from "
                 "step 0")
    else:
        where = f"the last good checkpoint is step {usable}{moved_text}: rerunning resumes from it"
    return (f"training diverged at step {step} ({what}); {where}. Lower train.learning_rate (with "
            "train.allow_schedule_change=true on a resume), or set train.nan_policy=skip to skip such steps")
