"""Two CPU processes (jax.distributed, gloo collectives, 4 devices each) train like one 8-device process.

Each process feeds only its own rows of the global batch (as on a multi-host TPU slice), and the
losses and the parameters must match a single process that holds all 8 devices.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration  # every test runs a recipe or another process

REPO = Path(__file__).resolve().parents[1]
STEPS = 3

SCRIPT = textwrap.dedent(f'''
    import json, os, sys
    import jax
    import numpy as np
    from model.llama.config import LlamaConfig
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch
    from trainer.distributed import maybe_initialize_distributed

    train = TrainConfig(steps=10, batch_size=8, warmup_steps=1, learning_rate=1e-2,
                        distributed=os.environ.get("JAX_NUM_PROCESSES", "1") != "1",
                        mesh=MeshConfig(data=2, fsdp=2, tensor=2))
    maybe_initialize_distributed(train)
    model = LlamaConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)
    prog = TrainProgram(model, train, 64, build_mesh(train.mesh), seed=0)
    state = prog.init_state()
    losses = []
    for _ in range({STEPS}):
        rows = np.random.default_rng(0).integers(0, 64, (8, 17)).astype(np.int32)
        per_process = 8 // jax.process_count()
        mine = rows[jax.process_index() * per_process:(jax.process_index() + 1) * per_process]
        batch = global_batch({{"inputs": mine[:, :-1], "targets": mine[:, 1:]}}, prog.batch_sharding)
        state, metrics = prog.step(state, batch)
        losses.append(float(metrics["loss"]))
    embed = jax.experimental.multihost_utils.process_allgather(state["params"]["embed"][...], tiled=True)
    print("RESULT " + json.dumps({{"process": jax.process_index(), "devices": jax.device_count(),
                                  "local": jax.local_device_count(), "losses": losses,
                                  "embed_abs_sum": float(np.abs(np.asarray(embed, np.float64)).sum())}}))
''')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(devices: int, extra_env: dict[str, str]) -> subprocess.Popen[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices), **extra_env)
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen([sys.executable, "-c", "import jax.experimental.multihost_utils\n" + SCRIPT], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT ")).removeprefix("RESULT "))


def test_two_processes_equal_one_process() -> None:
    port = free_port()
    workers = [launch(4, {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
                          "JAX_PROCESS_ID": str(i)}) for i in range(2)]
    two = [result(p) for p in workers]
    one = result(launch(8, {}))
    assert [r["devices"] for r in two] == [8, 8] and [r["local"] for r in two] == [4, 4]
    assert one["devices"] == 8 and one["local"] == 8
    assert two[0]["losses"] == two[1]["losses"]  # both processes see the same global (replicated) loss
    np.testing.assert_allclose(two[0]["losses"], one["losses"], rtol=1e-6)
    assert two[0]["losses"][-1] < two[0]["losses"][0]
    np.testing.assert_allclose(two[0]["embed_abs_sum"], one["embed_abs_sum"], rtol=1e-6)
