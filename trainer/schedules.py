"""Learning-rate schedules: linear warmup, then cosine, warmup-stable-decay (WSD) or constant.

Step ``s`` trains with ``schedule(s)``, s = 0 .. steps - 1 (optax's convention): the warmup reaches
the peak at ``s = warmup_steps`` and a decay reaches its end value at ``s = steps``.

WSD (Hu et al. 2024, MiniCPM; Hägele et al. 2024) holds the peak until ``steps - decay_steps`` and
only then decays, so a long stable run can be cut short by a decay of its own length at any point.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiment.sections.train import TrainConfig

# fraction of the peak-to-end gap left at decay progress p in [0, 1]: 1 at p=0, 0 at p=1
DECAY_SHAPES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "linear": lambda p: 1.0 - p,
    "cosine": lambda p: 0.5 * (1.0 + jnp.cos(jnp.pi * p)),
    "1-sqrt": lambda p: 1.0 - jnp.sqrt(p),
}


def make_schedule(train_cfg: TrainConfig) -> optax.Schedule:
    peak, warmup, steps = train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.steps
    steps = max(steps, warmup + 1)  # train.steps=0 (write the step-0 checkpoint only) trains no step of it
    end = peak * train_cfg.min_lr_ratio
    if train_cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=peak, warmup_steps=warmup,
                                                  decay_steps=steps, end_value=end)
    wsd = train_cfg.schedule == "wsd"
    decay_start, shape = steps - train_cfg.decay_steps, DECAY_SHAPES[train_cfg.decay]

    def schedule(step: jax.Array | int) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        warming = peak * step / max(warmup, 1)
        if not wsd:  # constant
            return jnp.where(step < warmup, warming, peak)
        progress = jnp.clip((step - decay_start) / train_cfg.decay_steps, 0.0, 1.0)
        decaying = end + (peak - end) * shape(progress)
        return jnp.where(step < warmup, warming, jnp.where(step < decay_start, peak, decaying))

    return schedule


# the train keys make_schedule reads: a checkpoint's meta records them ("schedule") so a resume can tell
SCHEDULE_KEYS = ("learning_rate", "warmup_steps", "steps", "schedule", "decay", "decay_steps", "min_lr_ratio")


def schedule_record(train_cfg: TrainConfig) -> dict[str, Any]:
    return {key: getattr(train_cfg, key) for key in SCHEDULE_KEYS}


def schedule_change(saved: dict[str, Any], train_cfg: TrainConfig, step: int) -> dict[str, tuple[Any, Any]] | None:
    """The keys (``{key: (old, new)}``) by which ``train_cfg``'s schedule differs from ``saved`` (a checkpoint's
    ``schedule_record``) for a run restored at ``step``, or None when it is the same optimization.

    The same optimization: every step already trained, and the next one, gets the rate it had. So raising
    ``steps`` of a constant schedule, or of a WSD one whose decay has not begun, changes nothing, while
    raising it under cosine moves every rate past the warmup. A run restored at step 0 trained nothing yet.
    """
    changed = {key: (saved[key], getattr(train_cfg, key)) for key in SCHEDULE_KEYS
               if key in saved and saved[key] != getattr(train_cfg, key)}
    if not changed or step == 0:
        return None
    old = dataclasses.replace(train_cfg, **{key: saved[key] for key in SCHEDULE_KEYS if key in saved})
    steps = np.arange(step + 1)
    before, after = np.asarray(make_schedule(old)(steps)), np.asarray(make_schedule(train_cfg)(steps))
    return None if np.allclose(before, after, rtol=1e-6, atol=0.0) else changed
