"""Tokens per second, step time and MFU between two log points.

MFU divides the model's FLOP/s by the peak of the chips in use: ``train.peak_flops_per_chip``, or
the bf16 figure of ``cost.accelerator`` in the cost catalog.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax

from experiment.errors import RecipeError

log = logging.getLogger("trainer")


def chips_in_use() -> int:
    """Accelerator chips training this run; a CPU host counts once however many JAX devices it shows."""
    return jax.process_count() if jax.devices()[0].platform == "cpu" else jax.device_count()


def peak_flops_per_device(cfg: Any) -> float | None:
    """Peak bf16 FLOP/s of one chip: ``train.peak_flops_per_chip`` or the cost catalog's figure."""
    if cfg.train.peak_flops_per_chip:
        return cfg.train.peak_flops_per_chip
    try:
        from cost.catalog import Catalog

        tflops = Catalog.from_config(cfg.cost).chip(cfg.cost.accelerator).peak_bf16_tflops
    except (RecipeError, OSError) as exc:
        log.info("no peak FLOP/s for MFU (%s)", exc)
        return None
    return tflops * 1e12 if tflops else None


class MetricsWindow:
    """Accumulates steps between two log points into tokens/s, step time and MFU."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float | None) -> None:
        self.tokens_per_step, self.flops_per_token, self.peak_flops = tokens_per_step, flops_per_token, peak_flops
        self.start = time.perf_counter()
        self.steps = 0

    def add(self) -> None:
        self.steps += 1

    def flush(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        tokens_per_s = self.steps * self.tokens_per_step / elapsed
        out = {"train/tokens_per_s": tokens_per_s, "train/step_time_s": elapsed / max(self.steps, 1),
               "train/model_tflops_per_s": tokens_per_s * self.flops_per_token / 1e12}
        if self.peak_flops:
            out["train/mfu"] = tokens_per_s * self.flops_per_token / (self.peak_flops * chips_in_use())
        self.start, self.steps = time.perf_counter(), 0
        return out
