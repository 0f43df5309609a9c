"""Spike skip (train.skip_spikes): a step whose loss or gradient norm is far above the window of the last steps'
keeps the weights and moments bitwise, and the window a checkpoint records gives a resumed run the same limits."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from experiment.errors import ConfigError
from experiment.sections.train import TrainConfig
from tests.test_train_step import BATCH, SEQ, VOCAB, batch, program
from trainer.guard import Guard, SpikeWindow
from trainer.step import TrainProgram, global_batch

WINDOW, SIGMA = 8, 6.0


def corrupted(prog: TrainProgram) -> dict[str, jax.Array]:
    """A planted bad batch: every target the same token (a corrupted record); its gradient norm is ~2x the limit."""
    rows = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    return global_batch({"inputs": rows[:, :-1], "targets": np.full((BATCH, SEQ), 7, np.int32)}, prog.batch_sharding)


def run(prog: TrainProgram, guard: Guard, state: dict, batches: list) -> tuple[dict, list[dict]]:
    """The loop's order: limits from the guard, the step, the guard books it."""
    seen = []
    for b in batches:
        limits = guard.spike_limits()
        state, metrics = prog.step_skipping_spikes(state, b, limits)
        metrics = jax.device_get(metrics)
        guard.after_step(int(state["step"]), metrics, kept_previous=False)
        seen.append(metrics)
    return state, seen


def test_a_planted_spike_keeps_weights_and_moments_bitwise_and_training_goes_on() -> None:
    prog = program(skip_spikes=True, spike_window=WINDOW, spike_sigma=SIGMA)
    guard = Guard(spikes=SpikeWindow(WINDOW, SIGMA))
    fixed = batch(prog)
    state, seen = run(prog, guard, prog.init_state(), [fixed] * 12)
    assert not any(bool(m["spike"]) for m in seen)  # ordinary steps train, the window warm since step 4
    before = jax.device_get({"params": state["params"], "opt_state": state["opt_state"]})

    state, (metrics,) = run(prog, guard, state, [corrupted(prog)])
    assert bool(metrics["spike"]) and bool(metrics["finite"])
    assert float(metrics["grad_norm"]) > guard.checked_against[1]
    after = jax.device_get({"params": state["params"], "opt_state": state["opt_state"]})
    for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        assert np.array_equal(old, new) and old.dtype == new.dtype  # bitwise: moments and Adam's count too
    assert guard.skipped_in_a_row == 1 and guard.state_finite
    assert int(state["step"]) == 13  # the step counter (schedule, RNG) moves on as for a NaN skip

    state, (metrics,) = run(prog, guard, state, [fixed])
    assert not bool(metrics["spike"]) and guard.skipped_in_a_row == 0
    trained = jax.tree.leaves(jax.device_get(state["params"]))
    assert not all(np.array_equal(old, new) for old, new in zip(jax.tree.leaves(after["params"]), trained,
                                                                strict=True))
    assert prog.step_skipping_spikes._cache_size() == 1  # warm-up's +inf limits and later ones: one program


def test_without_the_switch_the_same_batch_trains() -> None:
    prog = program()
    state, metrics = prog.step(prog.init_state(), corrupted(prog))
    assert not bool(metrics["spike"]) and bool(metrics["finite"])


def test_the_window_a_checkpoint_records_gives_a_resumed_guard_the_same_limits() -> None:
    live = Guard(spikes=SpikeWindow(4, SIGMA))
    for loss, grad_norm in [(5.0, 1.0), (4.75, 1.25), (np.float32(4.6), np.float32(0.9)), (4.5, 1.1), (4.4, 1.0),
                            (math.nan, math.nan)]:  # a NaN step joins no window
        live.after_step(0, {"finite": math.isfinite(loss), "total_loss": loss, "loss": loss,
                            "grad_norm": grad_norm, "spike": False}, kept_previous=True)
    record = live.saved(6, [])
    assert record["window"]["losses"] == [4.75, float(np.float32(4.6)), 4.5, 4.4]  # the newest 4, float32 exact
    resumed = Guard.resumed({"guard": record}, 6, SpikeWindow(4, SIGMA))
    assert np.array_equal(resumed.spike_limits(), live.spike_limits())
    assert resumed.spike_limits()[0] == np.float32(np.mean([4.75, np.float32(4.6), 4.5, 4.4])
                                                   + SIGMA * np.std([4.75, np.float32(4.6), 4.5, 4.4], ddof=1))
    # a fresh start, or spikes not skipped: no window
    assert Guard.resumed(None, 0, SpikeWindow(4, SIGMA)).spike_limits()[0] == np.inf
    assert Guard.resumed({"guard": record}, 6).spike_limits() is None


def test_a_run_of_skips_cut_by_a_save_goes_on_counting_after_the_resume() -> None:
    """A preemption's checkpoint between two skipped spikes: the resumed guard counts the first, so the run stops
    at train.max_skipped_steps where the uninterrupted one does (it restarted the count at 0)."""
    live = Guard(spikes=SpikeWindow(4, SIGMA))
    spike = {"finite": True, "total_loss": 9.0, "loss": 9.0, "grad_norm": 9.0, "spike": True}
    assert not live.after_step(7, spike, kept_previous=True)
    resumed = Guard.resumed({"guard": live.saved(7, [])}, 7, SpikeWindow(4, SIGMA))
    assert resumed.skipped_in_a_row == live.skipped_in_a_row == 1
    resumed.after_step(8, spike, kept_previous=True)
    live.after_step(8, spike, kept_previous=True)
    assert resumed.skipped_in_a_row == live.skipped_in_a_row == 2
    assert "skipped_in_a_row" not in Guard().saved(3, [])  # a checkpoint after a step that trained: nothing to carry


def test_the_window_warms_up_before_it_skips_anything() -> None:
    window = SpikeWindow(8, SIGMA)
    for value in (1.0, 2.0, 3.0):
        window.add({"total_loss": value, "grad_norm": value})
        assert np.all(np.isinf(window.limits()))  # under half the window: no limit
    window.add({"total_loss": 4.0, "grad_norm": 4.0})
    assert np.all(np.isfinite(window.limits()))


@pytest.mark.parametrize(("fields", "key"), [({"spike_window": 1}, "train.spike_window"),
                                             ({"spike_sigma": 0.0}, "train.spike_sigma"),
                                             ({"step_deadline_s": -1.0}, "train.step_deadline_s")])
def test_bad_spike_and_deadline_keys_are_one_error_naming_the_key(fields: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        TrainConfig(**fields).validate("train")


def test_the_fit_check_lowers_the_step_the_loop_runs() -> None:
    """trainer/fit_check.py compiles ``lower``: under train.skip_spikes that is the step taking the limits."""
    prog = program(skip_spikes=True)
    compiled = prog.lower(prog.abstract_batch(BATCH, SEQ)).compile()
    state, metrics = compiled(prog.init_state(), corrupted(prog), np.array([np.inf, 0.0], np.float32))
    assert bool(metrics["spike"]) and int(state["step"]) == 1
