"""CPU-host settings of recipe 4: device count per core, and no page faults per step from XLA's scratch buffer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.recipe_runner import xla_cache_env
from trainer.cpu_host import cpu_device_count, runs_on_cpu_only

REPO = Path(__file__).resolve().parents[1]


def test_device_count_divides_the_micro_batch() -> None:
    assert cpu_device_count(0, micro_batch=16, cores=2) == 2
    assert cpu_device_count(0, micro_batch=16, cores=6) == 4  # 6 and 5 do not divide 16
    assert cpu_device_count(0, micro_batch=3, cores=2) == 1
    assert cpu_device_count(0, micro_batch=1, cores=64) == 1
    assert cpu_device_count(3, micro_batch=16, cores=2) == 3  # an explicit count is the user's choice


def test_cpu_only_follows_jax_platforms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert runs_on_cpu_only()
    monkeypatch.setenv("JAX_PLATFORMS", "tpu,cpu")
    assert not runs_on_cpu_only()


PROBE = textwrap.dedent('''
    import json, resource, sys
    from experiment.sections.train import TrainConfig
    from trainer.cpu_host import prepare_cpu_host
    train = TrainConfig(steps=100, batch_size=16, warmup_steps=1, cpu_devices=int(sys.argv[2]),
                        cpu_keep_freed_memory=sys.argv[3] == "keep")
    done = prepare_cpu_host(train) if sys.argv[1] == "prepare" else {}
    import jax, numpy as np
    if sys.argv[4] == "count":  # the device count alone: no program to compile and time
        print("RESULT " + json.dumps({"devices": jax.device_count(), "done": done}))
        sys.exit(0)
    from model.llama.config import LlamaConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch
    # logits of 16 x 128 x 8000 fp32 are 64 MB: XLA's scratch buffer is far above glibc's mmap threshold
    model = LlamaConfig(d_model=64, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=128, max_seq_len=128)
    program = TrainProgram(model, train, 8000, build_mesh(train.mesh), seed=0)
    state = program.init_state()
    rows = np.random.default_rng(0).integers(0, 8000, (16, 129)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)
    for _ in range(3):
        state, metrics = program.step(state, batch)
    jax.block_until_ready(metrics)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        state, metrics = program.step(state, batch)
    jax.block_until_ready(metrics)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
    print("RESULT " + json.dumps({"devices": jax.device_count(), "faults_per_step": faults, "done": done}))
''')


def probe(mode: str, cpu_devices: int, memory: str = "keep", measure: str = "faults", **env: str) -> dict:
    """The probe in a fresh process: ``measure`` "faults" trains and counts page faults per step, "count"
    only reports the device count and what prepare_cpu_host did."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    # faults are counted after the compile
    full_env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **xla_cache_env(), **env)
    proc = subprocess.run([sys.executable, "-c", PROBE, mode, str(cpu_devices), memory, measure], cwd=REPO,
                          env=full_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator settings")
@pytest.mark.integration
def test_prepared_host_takes_no_page_faults_per_step_and_splits_the_batch() -> None:
    plain = probe("plain", 0)
    prepared = probe("prepare", 2)
    assert plain["devices"] == 1 and prepared["devices"] == 2
    assert prepared["done"]["malloc_keeps_freed_memory"] is True
    # without the settings every step faults in XLA's scratch buffer again (tens of MB of 4 KB pages)
    assert plain["faults_per_step"] > 5000
    assert prepared["faults_per_step"] < plain["faults_per_step"] / 4
    # a device count chosen by the caller (tests, multi-process runs) is left alone
    assert probe("prepare", 2, measure="count", JAX_NUM_CPU_DEVICES="1")["devices"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator settings")
@pytest.mark.integration
def test_keeping_freed_memory_can_be_turned_off() -> None:
    """train.cpu_keep_freed_memory=false trades the page faults back for a lower peak RSS."""
    released = probe("prepare", 2, memory="release")
    assert released["done"]["malloc_keeps_freed_memory"] is False and released["devices"] == 2
    assert released["faults_per_step"] > 5000
