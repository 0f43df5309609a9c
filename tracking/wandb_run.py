"""Open W&B runs with every file inside the experiment's run folder.

One run per recipe invocation, grouped by experiment, ``job_type`` = stage. Without an API key the
run is offline, so the demo and the tests work on a machine with no network. Secrets never reach
W&B: the config we log is the experiment config, which has no secret fields, and API keys are read
from the environment by wandb itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import netrc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("tracking")


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    with contextlib.suppress(FileNotFoundError, netrc.NetrcParseError, OSError):
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    return False


def resolve_mode(requested: str) -> str:
    env_mode = os.environ.get("WANDB_MODE", "").strip()
    if env_mode in ("offline", "online", "disabled"):
        return env_mode
    os.environ.pop("WANDB_MODE", None)  # an empty or unknown value makes wandb.init fail
    if requested == "auto":
        return "online" if has_api_key() else "offline"
    return requested


def point_wandb_at(folder: Path) -> None:
    """Keep W&B's run files, cache and settings inside the run folder, not the home directory."""
    folder.mkdir(parents=True, exist_ok=True)
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", ".cache"), ("WANDB_CONFIG_DIR", ".config"),
                     ("WANDB_DATA_DIR", ".data"), ("WANDB_ARTIFACT_DIR", ".artifacts")):
        path = folder / sub if sub else folder
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path.resolve())


@contextlib.contextmanager
def open_run(cfg: Any, run_folder: Any, job_type: str, run_id: str | None = None,
             extra_config: dict[str, Any] | None = None) -> Iterator[Any]:
    """Yield a W&B run (a no-op run when disabled); always finished, with exit code 1 on error."""
    import wandb

    mode = resolve_mode(cfg.wandb.mode)
    point_wandb_at(Path(run_folder.wandb))
    config = dataclasses.asdict(cfg)
    if extra_config:
        config.update(extra_config)
    run = wandb.init(
        project=cfg.wandb.project,
        entity=cfg.wandb.entity or None,
        group=cfg.experiment.name,
        job_type=job_type,
        name=f"{cfg.experiment.name}-{job_type}",
        id=run_id,
        resume="allow" if run_id else None,
        config=config,
        tags=cfg.wandb.tags,
        dir=os.environ["WANDB_DIR"],
        mode=mode,
        settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
    )
    log.info("W&B run %s (%s, %s)", getattr(run, "id", "-"), mode, job_type)
    ok = False
    try:
        yield run
        ok = True
    finally:
        run.finish(exit_code=0 if ok else 1)
