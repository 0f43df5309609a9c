"""Settings that make JAX train well on a CPU-only host (a laptop, a CPU VM, CI).

Both must be made before JAX starts its backends, so ``prepare_cpu_host`` runs first thing in
recipe 4 (and in the train-step benchmark). On a host with an accelerator they change nothing.

- **Keep freed memory in the heap.** Every step XLA:CPU allocates its scratch buffer (hundreds of
  MB: logits, activations, gradients) from a worker thread and frees it at the end. glibc serves a
  request that big from a fresh ``mmap`` (a worker thread's arena cannot hold it), so each step
  the kernel faults in and zeroes every page again: on the demo model that was 310 MB of page
  faults and ~0.27 s of system CPU per step. One arena, no ``mmap`` and no trimming keep the
  buffer's pages mapped, so steady-state steps take no page faults at all.
- **One JAX device per core.** XLA:CPU runs one device's independent operations side by side on
  its thread pool, so two matmuls contend for the same two cores. With one device per core and
  the batch split over them (plain data parallelism on the existing mesh), each core runs its own
  half of the batch. The count is the largest number up to the core count that divides the
  micro-batch, so every configuration that worked on one device still works.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sys
from typing import Any

import jax

from experiment.sections.train import TrainConfig

log = logging.getLogger("trainer.cpu_host")

# mallopt(3) parameters
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_ACCELERATOR_PLUGINS = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin", "libneuronxla")


def runs_on_cpu_only() -> bool:
    """Whether JAX will pick its CPU backend, decided without starting any backend."""
    platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or ""
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not any(importlib.util.find_spec(name) is not None for name in _ACCELERATOR_PLUGINS)


def keep_freed_memory() -> bool:
    """glibc: one arena, no mmap for big blocks, never trim. False where that is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(param, value) == 1 for param, value in (
            (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1)))
    except (OSError, AttributeError):  # musl and friends have no mallopt
        return False


def cpu_device_count(requested: int, micro_batch: int, cores: int | None = None) -> int:
    """``requested`` devices, or with 0 the largest count <= the cores that divides the micro-batch."""
    if requested > 0:
        return requested
    cores = cores or os.cpu_count() or 1
    return max(n for n in range(1, min(cores, micro_batch) + 1) if micro_batch % n == 0)


def prepare_cpu_host(train_cfg: TrainConfig) -> dict[str, Any]:
    """Apply both settings when training runs on the CPU backend; returns what was done (for the log)."""
    if not runs_on_cpu_only():
        return {}
    done: dict[str, Any] = {"malloc_keeps_freed_memory": train_cfg.cpu_keep_freed_memory and keep_freed_memory()}
    if (os.environ.get("JAX_NUM_CPU_DEVICES")
            or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")):
        return done  # the caller chose the device count (tests, multi-process runs)
    count = cpu_device_count(train_cfg.cpu_devices, train_cfg.batch_size // train_cfg.grad_accum_steps)
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX already started (library use): keep its devices
        log.info("JAX is already initialised: keeping its CPU devices (train.cpu_devices not applied)")
        return done
    done["cpu_devices"] = count
    log.info("CPU host: %d JAX device(s) over %d core(s); allocator keeps freed memory: %s", count,
             os.cpu_count() or 1, done["malloc_keeps_freed_memory"])
    return done
