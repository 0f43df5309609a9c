"""The harness every recipe uses: parse ``--config`` and overrides, open a W&B run, report errors.

A recipe is a few lines: it names its stage (experiment/stages.py) and hands one package function to ``recipe_main``.
Problems the user can fix end in one line on stderr and exit code 2; the traceback is kept for
real bugs. It sits in tracking, above experiment in the package layering
(``experiment.layers``), because it opens the W&B run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiment.check import run_stage_checks
from experiment.config import load_config
from experiment.errors import RecipeError
from experiment.files import WRITE_ERRNOS, write_error
from experiment.links import prepare_links
from experiment.lock import stage_lock
from experiment.plugins import load_plugins
from experiment.runfolder import RunFolder
from experiment.stages import Stage, stage_named
from experiment.storage import RunPath, describe
from experiment.storage.backends import storage_failure_reason
from experiment.storage.mounts import bucket_mount_of
from tracking.process_hooks import install_process_hooks

StageFn = Callable[[Any, RunFolder, Any], Any]


def make_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="experiment YAML, e.g. recipes/configs/demo.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=200 model.d_model=128")
    return parser


def setup_logging() -> None:
    """The process's logging and its process-wide hooks (``tracking.process_hooks``): what a command
    line program sets at start-up, never a module on import."""
    # force: importing orbax (via grain) already called basicConfig() through absl, at WARNING level
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S", force=True)
    for noisy in ("absl", "jax._src", "orbax", "urllib3", "datasets", "filelock", "httpx", "fsspec", "gcsfs", "s3fs",
                  "aiobotocore", "botocore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    install_process_hooks()


def check_not_on_a_bucket_mount(run_folder: RunFolder) -> None:
    """Refuse a run folder on a FUSE mount of a bucket: it would look like a disk and break the guarantees the
    run folder rests on (experiment/storage/mounts.py); the bucket's URL gives them."""
    if run_folder.in_bucket:
        return
    mount = bucket_mount_of(run_folder.root)
    if mount is not None:
        raise RecipeError(f"{run_folder.root} is on a {mount.fstype.removeprefix('fuse.')} mount of {mount.source} "
                          f"({mount.point}): a run folder there breaks locks, renames and durable appends; set "
                          "experiment.run_root to the bucket's URL (gs://bucket/prefix or s3://bucket/prefix) instead "
                          "(docs/launch.md, buckets and mounts)")


def storage_failure(exc: BaseException, run_root: RunPath | Path) -> str | None:
    """One line for a bucket that could not be reached or refused a request after the client's retries
    (None: not a storage failure)."""
    reason = storage_failure_reason(exc)
    if reason is None:
        return None
    return (f"storage at {describe(run_root)} failed after retries: {reason}: nothing half-written is trusted; "
            "rerun the same command once it answers again (training resumes from its latest checkpoint)")


def exit_on_storage_failure(exc: BaseException, run_root: RunPath | Path) -> None:
    """End the process with one line and exit code 2 when ``exc`` is a storage failure; return otherwise."""
    unreachable = storage_failure(exc, run_root)
    if unreachable is None:
        return
    print(f"error: {unreachable}", file=sys.stderr)
    # the storage client's and Orbax's background threads may still wait out their retries and signals
    # (minutes): nothing they could still write is trusted, so the process ends now
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)


def recipe_main(stage: Stage | str, description: str, fn: StageFn, argv: list[str] | None = None,
                wandb_run_id: Callable[[Any, RunFolder], str | None] | None = None,
                prepare: Callable[[Any], Any] | None = None, reports: Callable[[Any], bool] | None = None,
                check: Callable[[Any, RunFolder], None] | None = None) -> None:
    """Run one stage: ``fn(cfg, run_folder, wandb_run)``; exits 2 with one line on a RecipeError.

    ``wandb_run_id(cfg, run_folder)``, when given, names a W&B run to continue (a resumed training).
    The stage's checks of the config (``Stage.checks``, experiment/check.py: what ``python -m experiment.check``
    runs) come first, before anything is written. ``prepare(cfg)`` runs right after them, before W&B starts any
    thread (process-wide settings such as the allocator and JAX's device count, and joining the other JAX processes).
    ``reports(cfg)``, asked after ``prepare``, says whether this process opens the W&B run (only the
    first JAX process does; the others get a run that keeps nothing); that process also holds the run
    folder's stage lock (experiment/lock.py) while the stage runs. Before it, the stage's output folder is
    checked to be this run's own, and ``experiment.data_from`` is linked (experiment/links.py).
    ``check(cfg, run_folder)`` runs the stage's checks of its config and inputs, under the lock, before
    anything else is written: a failing rerun leaves no resolved config, W&B run or ledger session behind.
    """
    stage = stage if isinstance(stage, Stage) else stage_named(stage)
    args = make_parser(description).parse_args(argv)
    setup_logging()
    run_root: RunPath = Path.cwd()
    try:
        load_plugins()  # e.g. a model family defined outside the package, before its config section is read
        cfg = load_config(args.config, args.overrides)
        run_folder = RunFolder.for_config(cfg)
        run_root = run_folder.root
        # the stage's checks of the config (experiment/check.py), before anything is written or joined
        for note in run_stage_checks(stage, cfg, run_folder):
            logging.getLogger("experiment.check").info("not checked yet: %s", note)
        if prepare is not None:
            prepare(cfg)
        check_not_on_a_bucket_mount(run_folder)
        run_folder.root.mkdir(parents=True, exist_ok=True)
        prepare_links(cfg, run_folder, stage)
        primary = reports(cfg) if reports else True
        with stage_lock(run_folder, stage, primary):
            if check is not None:
                check(cfg, run_folder)
            if primary:  # run metadata: written by the first process of a job alone
                run_folder.save_resolved_config(cfg, stage.name)
            from tracking.wandb_run import open_run

            run_id = wandb_run_id(cfg, run_folder) if wandb_run_id else None
            with open_run(cfg, run_folder, job_type=stage.name, run_id=run_id, reports=primary) as wandb_run:
                fn(cfg, run_folder, wandb_run)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            exit_on_storage_failure(exc, run_root)
            raise
        # a full disk (or quota, read-only, failing disk): the stage wrote no manifest, a rerun redoes it
        print(f"error: {write_error(exc, run_root)}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:
        exit_on_storage_failure(exc, run_root)
        raise
    except KeyboardInterrupt:
        print(f"error: {stage.name} interrupted", file=sys.stderr)
        sys.exit(130)
