"""Test environment: offline hubs, offline W&B inside a temp folder, JAX on the CPU."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_WANDB_HOME = Path(tempfile.mkdtemp(prefix="wandb-tests-"))

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_API_KEY", None)
for _var, _sub in (("WANDB_DIR", "runs"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                   ("WANDB_DATA_DIR", "data")):
    os.environ[_var] = str(_WANDB_HOME / _sub)
os.environ.setdefault("RU_SHARED_DATA", str((REPO_ROOT.parent / "shared" / "data").resolve()))


def shared_data_dir() -> Path:
    return Path(os.environ["RU_SHARED_DATA"])


@pytest.fixture
def shared_data() -> Path:
    """The real Russian data folder; tests that need it skip with a reason when it is absent."""
    path = shared_data_dir()
    if not (path / "text" / "ruslit").is_dir():
        pytest.skip(f"shared data not found at {path} (set RU_SHARED_DATA to the shared/data folder)")
    return path


@pytest.fixture(autouse=True)
def restore_wandb_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tracking.wandb_run.open_run`` points WANDB_* at a run folder; put them back after each test."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR", "WANDB_MODE"):
        if var in os.environ:
            monkeypatch.setenv(var, os.environ[var])
        else:
            monkeypatch.delenv(var, raising=False)
