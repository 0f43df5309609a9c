"""The NaN guard's choice of the checkpoint to resume from, and the resume's schedule check (units)."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest

from experiment.errors import ConfigError
from experiment.sections.train import TrainConfig
from trainer.guard import Guard, usable_step
from trainer.resume import check_schedule
from trainer.schedules import schedule_change, schedule_record

NAN = math.nan


def metrics(loss: float, finite: bool = True, grad_norm: float = 1.0) -> dict[str, object]:
    return {"finite": finite, "loss": loss, "total_loss": loss, "grad_norm": grad_norm if finite else NAN}


def test_a_checkpoint_whose_loss_rose_after_it_is_not_named() -> None:
    # train.learning_rate=1e6 on the fixture run: step 2's update ruins the weights (the loss on them is
    # ln V, above the loss on checkpoint 1's), step 3's leaves NaN gradients at step 4
    measured = {1: 6.3965, 2: 6.3969, 3: NAN}
    assert usable_step([1, 2, 3], measured) == 1
    assert usable_step([1, 2, 3], {1: 4.0, 2: 3.5, 3: 3.2}) == 3  # falling: the newest
    assert usable_step([2, 3], {2: NAN, 3: NAN}) is None  # none: start over
    assert usable_step([5, 6], {5: 4.0}) == 6  # never measured (an older checkpoint, or no step on it yet)


def test_the_guard_measures_each_checkpoint_by_the_first_step_that_trains_on_it() -> None:
    guard = Guard()
    guard.after_step(1, metrics(6.4), kept_previous=False)
    assert guard.saved(1, [])["measured"] == {}
    guard.after_step(2, metrics(NAN, finite=False), kept_previous=True)  # skipped: the same weights again
    assert guard.measured == {1: NAN} and guard.skipped_in_a_row == 1
    guard.after_step(3, metrics(6.1), kept_previous=True)  # the next batch trains on checkpoint 1's weights
    assert guard.measured == {1: 6.1} and guard.skipped_in_a_row == 0
    guard.after_step(4, metrics(9.9), kept_previous=True)  # on later weights: not checkpoint 1's
    assert guard.saved(4, [1])["measured"] == {"1": 6.1}
    resumed = Guard.resumed({"guard": {"finite": True, "measured": {"1": 6.1, "2": None}}}, 4)
    assert resumed.measured[1] == 6.1 and math.isnan(resumed.measured[2]) and resumed.on_params_of == 4


def test_a_checkpoint_with_no_gradient_left_is_not_named_though_its_loss_fell() -> None:
    # the fixture run at train.learning_rate=1e6 with the space-digit tokenizer: a random init scores 6.410 and
    # 6.415 (above ln 600 = 6.397); step 2's update leaves every logit alike: loss ln V, gradient norm 0.0
    guard = Guard()
    for step, loss, grad_norm in [(1, 6.4096, 0.68), (2, 6.4149, 0.71), (3, 6.3969, 0.0)]:
        guard.after_step(step, metrics(loss, grad_norm=grad_norm), kept_previous=False)
        guard.saved(step, list(range(1, step)))
    guard.after_step(4, metrics(6.3969, finite=False), kept_previous=False)
    assert guard.measured[1] == 6.4149 and math.isnan(guard.measured[2]) and math.isnan(guard.measured[3])
    assert usable_step([1, 2, 3], guard.measured) == 1


def test_a_non_finite_state_is_never_saved() -> None:
    guard = Guard()
    guard.after_step(1, metrics(NAN, finite=False), kept_previous=False)  # nan_policy=stop: the state is ruined
    with pytest.raises(RuntimeError, match="non-finite state of step 1"):
        guard.saved(1, [])


COSINE = TrainConfig(steps=100, warmup_steps=5)


@pytest.mark.parametrize(("old", "changes", "step", "changed"), [
    (COSINE, {"steps": 200}, 50, {"steps": (100, 200)}),  # every rate past the warmup moves
    (COSINE, {"steps": 200}, 3, None),  # still in the warmup: no rate trained so far differs
    (COSINE, {"learning_rate": 1e-3}, 50, {"learning_rate": (3e-4, 1e-3)}),
    (COSINE, {"min_lr_ratio": 0.0}, 0, None),  # nothing trained yet
    (dataclasses.replace(COSINE, schedule="constant"), {"steps": 500}, 100, None),
    (dataclasses.replace(COSINE, schedule="wsd", decay_steps=20), {"steps": 200}, 50, None),  # decay not begun
    (dataclasses.replace(COSINE, schedule="wsd", decay_steps=20), {"steps": 200}, 90, {"steps": (100, 200)}),
])
def test_a_schedule_change_is_one_that_moves_a_rate_already_trained(old: TrainConfig, changes: dict, step: int,
                                                                      changed: dict | None) -> None:
    assert schedule_change(schedule_record(old), dataclasses.replace(old, **changes), step) == changed


def test_a_schedule_change_is_refused_naming_the_key_unless_allowed(tmp_path, caplog) -> None:
    saved = {"schedule": schedule_record(COSINE)}
    new = dataclasses.replace(COSINE, steps=300)
    with pytest.raises(ConfigError, match=r"config key 'train\.steps': 100 -> 300 .*allow_schedule_change=true"):
        check_schedule(saved, new, 100, tmp_path)
    assert check_schedule(saved, dataclasses.replace(new, allow_schedule_change=True), 100, tmp_path) == {
        "steps": (100, 300)}
    with caplog.at_level(logging.WARNING, logger="trainer"):
        assert check_schedule({}, new, 100, tmp_path) is None  # an older checkpoint: unknown, allowed
    assert "do not record their learning-rate schedule" in caplog.text
