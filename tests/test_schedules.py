"""Learning-rate schedules against values computed by hand (peak 1.0, end 0.1, 100 steps, warmup 10)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest

from experiment.config import build_dataclass
from experiment.errors import ConfigError
from experiment.sections.train import TrainConfig
from trainer.schedules import make_schedule
from trainer.step import make_optimizer

BASE = {"steps": 100, "warmup_steps": 10, "learning_rate": 1.0, "min_lr_ratio": 0.1}


def schedule_for(**fields: object) -> optax.Schedule:
    return make_schedule(build_dataclass(TrainConfig, {**BASE, **fields}, "train"))


def values(schedule: optax.Schedule, steps: list[int]) -> list[float]:
    return [float(schedule(s)) for s in steps]


# decay over the last 20 steps: it starts at step 80; step 85 is progress 1/4, step 99 is 19/20
@pytest.mark.parametrize(("decay", "at_85", "at_99"), [
    ("linear", 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.05),
    ("cosine", 0.1 + 0.9 * 0.5 * (1 + 0.7071067811865476), 0.1 + 0.9 * 0.5 * (1 - 0.9876883405951378)),
    ("1-sqrt", 0.1 + 0.9 * 0.5, 0.1 + 0.9 * (1 - 0.9746794344808963)),
])
def test_wsd_warmup_stable_decay_values(decay: str, at_85: float, at_99: float) -> None:
    schedule = schedule_for(schedule="wsd", decay=decay, decay_steps=20)
    steps = [0, 5, 10, 50, 79, 80, 85, 99, 100, 130]
    expected = [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, at_85, at_99, 0.1, 0.1]
    assert values(schedule, steps) == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_wsd_without_warmup_or_stable_phase() -> None:
    # warmup 0 and decay over all 100 steps: a plain linear decay from the peak from step 0
    schedule = schedule_for(schedule="wsd", warmup_steps=0, decay_steps=100)
    assert values(schedule, [0, 50, 100]) == pytest.approx([1.0, 0.55, 0.1], rel=1e-6)


def test_constant_holds_the_peak_after_warmup() -> None:
    schedule = schedule_for(schedule="constant")
    assert values(schedule, [0, 5, 10, 99, 100, 500]) == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0, 1.0], rel=1e-6)


def test_cosine_is_the_default_and_unchanged() -> None:
    cfg = build_dataclass(TrainConfig, BASE, "train")
    assert cfg.schedule == "cosine"
    schedule = make_schedule(cfg)
    # by hand: step 55 is half way through the 90 cosine steps after warmup
    assert values(schedule, [0, 5, 10, 55, 100]) == pytest.approx([0.0, 0.5, 1.0, 0.55, 0.1], rel=1e-6, abs=1e-7)
    # the construction make_optimizer used before schedules had a choice, value for value
    before = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=1.0, warmup_steps=10, decay_steps=100,
                                                end_value=0.1)
    assert values(schedule, list(range(0, 121))) == values(before, list(range(0, 121)))


def test_optimizer_uses_the_configured_schedule_under_jit() -> None:
    _, schedule = make_optimizer(build_dataclass(TrainConfig, {**BASE, "schedule": "wsd", "decay": "1-sqrt",
                                                                "decay_steps": 20}, "train"))
    # the train step calls it on a traced int32 step
    assert float(jax.jit(schedule)(jnp.int32(85))) == pytest.approx(0.55, rel=1e-6)


@pytest.mark.parametrize(("fields", "message"), [
    ({"schedule": "wsd"},
     "'train.decay_steps': schedule wsd needs 1 <= decay_steps <= steps - warmup_steps = 90, got 0"),
    ({"schedule": "wsd", "decay_steps": 91}, "'train.decay_steps': schedule wsd needs .* got 91"),
    ({"decay_steps": 20}, "'train.decay_steps': only used by schedule wsd"),
    ({"schedule": "linear"}, "'train.schedule'"),
    ({"schedule": "wsd", "decay_steps": 20, "decay": "sqrt"}, "'train.decay'"),
])
def test_bad_schedule_config_names_the_key(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        build_dataclass(TrainConfig, {**BASE, **fields}, "train")
    assert "\n" not in str(caught.value)
