"""Tokens per second, step time and MFU between two log points.

MFU is per device: the model's FLOP/s divided by the peak of every JAX device training, where a device's
peak is ``train.peak_flops_per_chip`` or the bf16 figure of ``cost.accelerator`` in the hardware catalog,
over the chip's devices (a TPU7x chip shows two, each with half its peak; dividing by chips instead would
double the MFU). The chips a run pays for are its devices over the devices per chip.
"""

from __future__ import annotations

import logging
import time

import jax

from experiment.errors import RecipeError
from experiment.schema import ExperimentConfig

log = logging.getLogger("trainer")


def devices_per_chip(cfg: ExperimentConfig) -> int:
    """JAX devices one chip of ``cost.accelerator`` shows (cost/hardware.csv; 1 when the catalog has no row)."""
    try:
        from cost.catalog import Catalog

        return Catalog.from_config(cfg.cost).chip(cfg.cost.accelerator).devices_per_chip
    except (RecipeError, OSError) as exc:
        log.info("devices per chip of %s unknown (%s): one", cfg.cost.accelerator, exc)
        return 1


def chips_in_use(per_chip: int = 1) -> int:
    """Accelerator chips training this run: its devices over ``per_chip`` devices a chip shows; a CPU host
    counts once however many JAX devices it shows."""
    if jax.devices()[0].platform == "cpu":
        return jax.process_count()
    if jax.device_count() % per_chip:
        raise RecipeError(f"{jax.device_count()} devices train this run, not a whole number of chips of {per_chip} "
                          "devices each (cost/hardware.csv devices_per_chip of cost.accelerator)")
    return jax.device_count() // per_chip


def devices_in_use() -> int:
    """Devices MFU divides by: every JAX device, or one per CPU host (its devices share the host's cores)."""
    return jax.process_count() if jax.devices()[0].platform == "cpu" else jax.device_count()


def peak_flops_per_device(cfg: ExperimentConfig) -> float | None:
    """Peak bf16 FLOP/s of one device: ``train.peak_flops_per_chip`` or the cost catalog's chip figure, over
    the devices a chip shows."""
    if cfg.train.peak_flops_per_chip:
        return cfg.train.peak_flops_per_chip / devices_per_chip(cfg)
    try:
        from cost.catalog import Catalog

        tflops = Catalog.from_config(cfg.cost).chip(cfg.cost.accelerator).peak_bf16_tflops_per_device
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
            out["train/mfu"] = tokens_per_s * self.flops_per_token / (self.peak_flops * devices_in_use())
        self.start, self.steps = time.perf_counter(), 0
        return out
