"""Open W&B runs with every file inside the experiment's run folder.

One run per recipe invocation, grouped by experiment (the variants of a sweep by the sweep), ``job_type`` = stage.
Without an API key the run is offline, so the demo and the tests work on a machine with no network. ``mode: auto``
with a key also goes offline, with a warning, when the W&B server cannot be reached within a few seconds
or refuses to start the run (``wandb sync`` uploads the run folder later). Secrets never reach
W&B: the config we log is the experiment config, which has no secret fields, with any credential a
value read from the environment as its ``${VAR}`` (experiment.config.redact), and API keys are read
from the environment by wandb itself.
"""

from __future__ import annotations

import contextlib
import logging
import netrc
import os
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from experiment.config import redact, to_dict
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sweep import sweep_name, variant_of

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

log = logging.getLogger("tracking")

REACH_TIMEOUT_S = 3.0  # how long mode=auto waits for the W&B server before it logs offline
VARIANT_CONFIG_KEY = "variant"  # a sweep variant's name and overrides in its runs' W&B config
AUTO_INIT_TIMEOUT_S = 30.0  # mode=auto: a reachable server that does not start the run in time (wandb waits 90 s)


def base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    with contextlib.suppress(FileNotFoundError, netrc.NetrcParseError, OSError):
        host = base_url().split("://")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    return False


def unreachable(url: str, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """Why a TCP connection to the server of ``url`` fails within ``timeout`` seconds (None: it connects)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return None
    except (OSError, ValueError) as exc:  # refused, timed out, no route, unknown host, bad port
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _fall_back_offline(reason: str) -> str:
    log.warning("wandb.mode=auto: cannot reach W&B at %s (%s); logging offline instead (upload later with "
                "`wandb sync` on the run's wandb folder)", base_url(), reason)
    return "offline"


def resolve_mode(requested: str) -> str:
    env_mode = os.environ.get("WANDB_MODE", "").strip()
    if env_mode in ("offline", "online", "disabled"):
        return env_mode
    os.environ.pop("WANDB_MODE", None)  # an empty or unknown value makes wandb.init fail
    if requested == "auto":
        if not has_api_key():
            return "offline"
        reason = unreachable(base_url())
        return "online" if reason is None else _fall_back_offline(reason)
    return requested


def point_wandb_at(folder: Path) -> None:
    """Keep W&B's run files, cache and settings inside the run folder, not the home directory."""
    folder.mkdir(parents=True, exist_ok=True)
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", ".cache"), ("WANDB_CONFIG_DIR", ".config"),
                     ("WANDB_DATA_DIR", ".data"), ("WANDB_ARTIFACT_DIR", ".artifacts")):
        path = folder / sub if sub else folder
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path.resolve())


_GONE: set[str] = set()  # W&B run folders found deleted (each warned about once)


def warn_if_folder_gone(wandb_run: Any) -> None:
    """Warn, once, when the run's local W&B folder has been deleted while it runs: wandb goes on taking
    metrics without a word, and an offline run loses all of them. One stat per call: cheap at log steps."""
    if getattr(wandb_run, "disabled", True):  # a disabled or silent run keeps no folder
        return
    folder = getattr(getattr(wandb_run, "settings", None), "sync_dir", None)
    if not folder or folder in _GONE or Path(folder).is_dir():
        return
    _GONE.add(folder)
    log.warning("the W&B folder of this run, %s, was deleted while it runs: what it logs from now on is lost "
                "to W&B (offline, nothing is left for `wandb sync`); the loss, cost and eval scores still go "
                "to the run folder (train_log.jsonl, ledger/, eval/), which recipe 06 reads", folder)


class SilentRun:
    """The run of a process that reports nothing (every JAX process but the first): it takes what a
    W&B run takes and keeps none of it, so stage code logs without asking which process it is on."""

    id: str | None = None
    offline = False
    disabled = True  # as a disabled W&B run: artifact helpers (tracking.artifacts) skip building, hashing files

    def __init__(self) -> None:
        self.summary: dict[str, Any] = {}

    @property
    def config(self) -> SilentRun:
        return self

    def update(self, values: dict[str, Any], allow_val_change: bool = False) -> None: ...

    def log(self, payload: dict[str, Any], step: int | None = None, commit: bool | None = None) -> None: ...

    def define_metric(self, name: str, **kwargs: Any) -> None: ...

    def log_artifact(self, artifact: Any, aliases: list[str] | None = None) -> None: ...

    def finish(self, exit_code: int = 0) -> None: ...


# what ``open_run`` yields and stage code logs to: a W&B run (online, offline or disabled) on the process that
# reports, a ``SilentRun`` on the others
WandbRun: TypeAlias = "Run | SilentRun"


@contextlib.contextmanager
def open_run(cfg: ExperimentConfig, run_folder: RunFolder, job_type: str, run_id: str | None = None,
             extra_config: dict[str, Any] | None = None, reports: bool = True) -> Iterator[WandbRun]:
    """Yield a W&B run (a no-op run when disabled); always finished, with exit code 1 on error.

    ``reports=False`` (a JAX process other than the first) yields a ``SilentRun``: no W&B run, no
    file, no W&B thread; the first process reports for all of them.
    """
    if not reports:
        yield SilentRun()
        return
    import wandb

    mode = resolve_mode(cfg.wandb.mode)
    point_wandb_at(Path(run_folder.wandb))
    config = to_dict(cfg)
    variant = variant_of(cfg.experiment)
    if variant is not None:  # what this run of a sweep changes, as W&B config keys to group and filter by
        config[VARIANT_CONFIG_KEY] = {"name": variant.name, **variant.overrides}
    if extra_config:
        config.update(redact(extra_config))
    auto_online = cfg.wandb.mode == "auto" and mode == "online"

    def init(mode: str) -> Any:
        timeout = {"init_timeout": AUTO_INIT_TIMEOUT_S} if auto_online and mode == "online" else {}
        # the names and tags are recorded in the run too: a credential read into one stays ${VAR}
        return wandb.init(
            project=redact(cfg.wandb.project),
            entity=redact(cfg.wandb.entity) or None,
            group=redact(sweep_name(cfg.experiment)),
            job_type=job_type,
            name=redact(f"{cfg.experiment.name}-{job_type}"),
            id=run_id,
            resume="allow" if run_id else None,
            config=config,
            tags=redact(cfg.wandb.tags),
            dir=os.environ["WANDB_DIR"],
            mode=mode,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, **timeout),
        )

    try:
        run = init(mode)
    except (wandb.errors.Error, OSError, TimeoutError) as exc:
        if not auto_online:
            raise
        mode = _fall_back_offline(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        run = init(mode)
    log.info("W&B run %s (%s, %s)", getattr(run, "id", "-"), mode, job_type)
    ok = False
    try:
        yield run
        ok = True
    finally:
        run.finish(exit_code=0 if ok else 1)
