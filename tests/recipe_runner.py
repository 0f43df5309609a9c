"""Run recipes as a user would: a subprocess per recipe, in a temporary run root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "configs" / "tiny.yaml"


def tiny_config(tmp_path: Path, **sections: dict) -> Path:
    """Write the tiny experiment with its run root in ``tmp_path``; ``sections`` replace keys."""
    cfg = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    cfg["experiment"]["run_root"] = str(tmp_path / "runs")
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


def recipe_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("WANDB_API_KEY", None)
    # a W&B service started by an earlier in-process test would be shared through this variable and
    # would still hold the id of a run the test killed: each recipe starts its own service, as for a user
    env.pop("WANDB_SERVICE", None)
    return env


def run_recipe(script: str, config: Path, *overrides: str, timeout: float = 600,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "recipes" / script), "--config", str(config), *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=recipe_env(config.parent), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-5000:]}")
    return proc


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one-line error a recipe prints last on stderr."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
