"""``train.profile_steps``: recipe 04 writes a JAX profiler trace of exactly those steps into the run
folder and logs it as a W&B artifact of the (offline) run."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from experiment.errors import ConfigError
from experiment.sections.train import TrainConfig
from tests.fixture_run import run_copy
from tests.recipe_runner import run_recipe
from tracking.readback import inspect_command

pytestmark = pytest.mark.integration
STEP_RUN = "CommonPjRtLoadedExecutable::Execute (jit_train_step)"  # one per train step run on the devices


def test_profile_steps_writes_a_trace_of_those_steps_and_logs_it(fixture_stages: Path, tmp_path: Path) -> None:
    config = run_copy(fixture_stages, tmp_path, train={"steps": 5, "checkpoint_every": 5, "warmup_steps": 1,
                                                       "profile_steps": [2, 3]})
    # a process of its own: the trace records the executables a fresh process runs (run in the test process,
    # after other runs, it held no jit_train_step executions under that name)
    proc = run_recipe("04_pretrain.py", config, subprocess_=True)
    run_dir = config.parent / "runs" / "tiny"
    profile = run_dir / "profile"
    assert f"profiler trace of steps 2-4 in {profile}" in proc.stderr
    (xplane,) = profile.rglob("*.xplane.pb")
    (trace,) = profile.rglob("*.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert sum(e.get("name") == STEP_RUN for e in events) == 3, "steps 2, 3 and 4, and not step 1 or 5"

    (run,) = (run_dir / "wandb" / "wandb").glob("offline-run-*")
    inspected = subprocess.run(inspect_command(run),
                               capture_output=True, text=True, check=True, timeout=120).stdout
    (artifact,) = [r["artifact"] for r in map(json.loads, inspected.splitlines()) if r.get("type") == "artifact"]
    assert artifact["type"] == "profile" and artifact["name"] == f"profile-{run.name.rsplit('-', 1)[-1]}"
    assert json.loads(artifact["metadata"]) == {"first_step": 2, "last_step": 4}
    assert {e["path"]: int(e["size"]) for e in artifact["manifest"]["contents"]} == {
        p.relative_to(profile).as_posix(): p.stat().st_size for p in (xplane, trace)}


@pytest.mark.parametrize("steps", [[1, 2], [3], [4, 0], [9, 3]])
def test_a_profile_window_outside_the_run_is_one_config_error(steps: list[int]) -> None:
    with pytest.raises(ConfigError, match=r"^config key 'train.profile_steps': give \[first step, count\]"):
        TrainConfig(steps=10, warmup_steps=1, profile_steps=steps).validate("train")
