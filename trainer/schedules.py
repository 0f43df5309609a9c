"""Learning-rate schedules: linear warmup, then cosine, warmup-stable-decay (WSD) or constant.

Step ``s`` trains with ``schedule(s)``, s = 0 .. steps - 1 (optax's convention): the warmup reaches
the peak at ``s = warmup_steps`` and a decay reaches its end value at ``s = steps``.

WSD (Hu et al. 2024, MiniCPM; Hägele et al. 2024) holds the peak until ``steps - decay_steps`` and
only then decays, so a long stable run can be cut short by a decay of its own length at any point.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
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
