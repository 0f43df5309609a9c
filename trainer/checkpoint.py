"""Orbax checkpoints of a training run, and loading a trained model back for eval and export.

One checkpoint step holds five items:

- ``params``: the parameters (separate from the rest so eval restores them alone);
- ``train``: optimizer state, step counter and RNG key data;
- ``loader``: the data iterator's state (JSON), so that resume sees the same batches;
- ``ledger``: the cost ledger's mark of that step (session, moment, tokens counted; ``Ledger.checkpoint_record``);
- ``meta``: model family and config, vocab_size, tokenizer_sha256, seq_len, W&B run id (JSON).

Orbax writes a step into a temporary folder and renames it when complete, so a crash mid-save
leaves a ``*.orbax-checkpoint-tmp`` folder that a new manager ignores.

Once Orbax has committed a step (for async saves: in the background, when the renamed folder
appears), ``<step>/checksums.json`` records the size and CRC32C of every file of the step, written
atomically. Resume and eval verify it before Orbax reads anything: a step without it (a kill
between the commit and the checksums) or with a changed, missing or truncated file is damaged,
and the latest step that passes is what resume and eval see. Checking first also keeps Orbax
from failing half-way through a restore, which leaves tensorstore callbacks printing ``Event loop
is closed`` tracebacks.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import google_crc32c
import jax
import orbax.checkpoint as ocp
from flax import nnx
from orbax.checkpoint.checkpoint_managers import preservation_policy

from experiment.errors import DataError, WriteError
from experiment.files import atomic_write_json, atomic_write_text, format_bytes, free_bytes, free_space, write_errno
from experiment.sections.train import TrainConfig
from experiment.stages import PRETRAIN
from model.family import FamilyModel
from model.registry import get_family
from model.stacking import saved_scan_layers

log = logging.getLogger("trainer.checkpoint")
ITEMS = ("params", "train", "loader", "ledger", "meta")
CHECKSUMS = "checksums.json"
DAMAGED_DIR = "damaged"  # not a step name for Orbax (digits, or ending in _digits)
_CHUNK = 4 << 20


class CheckpointDamaged(DataError):
    """A checkpoint step fails its checksums or cannot be read (names the step folder and file)."""


# ---------------------------------------------------------------------------------------------
# Checksums of a committed step


def file_crc32c(path: Path) -> str:
    crc = 0
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            crc = google_crc32c.extend(crc, block)
    return f"{crc:08x}"


def step_files(step_dir: Path) -> Iterator[Path]:
    for path in sorted(step_dir.rglob("*")):
        if path.is_file() and path.name != CHECKSUMS:
            yield path


def write_checksums(step_dir: Path) -> None:
    """Record size and CRC32C of every file of a committed step in ``<step>/checksums.json``."""
    started = time.perf_counter()
    files = {p.relative_to(step_dir).as_posix(): {"bytes": p.stat().st_size, "crc32c": file_crc32c(p)}
             for p in step_files(step_dir)}
    atomic_write_json(step_dir / CHECKSUMS, {"algorithm": "crc32c", "files": files})
    mark_checksummed(step_dir.parent)
    log.debug("checksums of %d files of %s in %.3f s", len(files), step_dir, time.perf_counter() - started)


CHECKSUMMED = ".checksummed"  # in a checkpoint folder: its steps carry checksums (written by this version)


def uses_checksums(directory: Path) -> bool:
    """Whether the steps of ``directory`` must have checksums: it says so, or one of them has them.

    A folder of an older version (steps, no marker, no checksums) is read unverified, so that an
    upgrade does not lose a run; a fresh folder gets the marker before its first save, so a step
    that lost its checksums there (a kill between Orbax's commit and the checksum write) is damaged."""
    if (directory / CHECKSUMMED).exists():
        return True
    return directory.is_dir() and any((p / CHECKSUMS).is_file() for p in directory.iterdir() if p.name.isdigit())


def mark_checksummed(directory: Path) -> None:
    if not (directory / CHECKSUMMED).exists():
        atomic_write_text(directory / CHECKSUMMED, "every step of this folder has checksums.json\n")


def verify_checksums(step_dir: Path, item: str | None = None) -> None:
    """Raise CheckpointDamaged naming the first file of ``step_dir`` (of its ``item`` folder alone when
    given, e.g. ``meta``) that differs from its checksum."""
    path = step_dir / CHECKSUMS
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["files"]
        if not isinstance(recorded, dict) or not recorded:
            raise ValueError("no files listed")
    except FileNotFoundError:
        raise CheckpointDamaged(f"{path} is missing (the run stopped before the checksums of the step were "
                                "written)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"{path} is unreadable ({exc})") from exc
    for name, expected in recorded.items():
        if item is not None and not name.startswith(f"{item}/"):
            continue
        file = step_dir / name
        try:
            size = file.stat().st_size
            if size != expected["bytes"]:
                raise CheckpointDamaged(f"{file} has {size} bytes, its checksum file says {expected['bytes']}")
            if file_crc32c(file) != expected["crc32c"]:
                raise CheckpointDamaged(f"{file} does not match its CRC32C in {path}")
        except FileNotFoundError:
            raise CheckpointDamaged(f"{file} is missing") from None
        except (OSError, KeyError, TypeError) as exc:
            raise CheckpointDamaged(f"{file} cannot be checked ({exc})") from exc


class _ChecksumWriter:
    """Writes the checksums of each saved step once its committed folder appears (one thread)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-checksums")
        self._futures: list[Future[None]] = []
        self._settled = threading.Event()  # Orbax has finished every save started so far

    def schedule(self, step: int) -> None:
        self._settled.clear()
        self._futures.append(self._pool.submit(self._write_when_committed, self.directory / str(step)))

    def _write_when_committed(self, step_dir: Path) -> None:
        while not step_dir.is_dir():
            if self._settled.is_set():
                if not step_dir.is_dir():
                    return  # the save failed; Orbax reports why
                break
            time.sleep(0.02)
        write_checksums(step_dir)

    def settle(self) -> None:
        """Called once Orbax finished its saves: write what is pending and raise the first error."""
        self._settled.set()
        futures, self._futures = self._futures, []
        for future in futures:
            future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# ---------------------------------------------------------------------------------------------
# A full disk (or another write error) during a save: one line, not Orbax's threads' tracebacks
# (those are quieted by tracking.process_hooks, which the recipe harness installs)


@contextmanager
def write_errors_as_one_line(directory: Path, what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        code = write_errno(exc)
        if code is None:
            raise
        raise WriteError(f"cannot write {what} in {directory}: {os.strerror(code)} ({free_space(directory)} free on "
                         "that disk): free some space (or lower train.keep_checkpoints) and rerun the same command "
                         "to resume from the latest complete checkpoint") from None


def committed_step_bytes(directory: Path) -> tuple[int, int] | None:
    """``(step, bytes)`` of the newest step with checksums: what the next save will need on disk."""
    for step_dir in sorted((p for p in directory.iterdir() if p.name.isdigit()), key=lambda p: -int(p.name)):
        with suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            files = json.loads((step_dir / CHECKSUMS).read_text(encoding="utf-8"))["files"]
            return int(step_dir.name), sum(int(f["bytes"]) for f in files.values())
    return None


class VerifiedCheckpointManager(ocp.CheckpointManager):
    """An Orbax manager that writes ``<step>/checksums.json`` after each committed save (process 0),
    checks the free space before a save, and turns write errors into one WriteError line."""

    def __init__(self, directory: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(directory, *args, **kwargs)
        self._checksums = _ChecksumWriter(Path(directory)) if jax.process_index() == 0 else None
        self._in_flight: int | None = None  # the step of the save Orbax may still be writing

    def save(self, step: int, *args: Any, **kwargs: Any) -> bool:
        directory = Path(self.directory)
        self.wait_until_finished()  # Orbax's save starts with it too; free space is measured after it
        last = committed_step_bytes(directory) if directory.is_dir() else None
        free = free_bytes(directory)
        if last is not None and free is not None and free < last[1]:
            # refuse before Orbax starts: a save that fails half-way leaves tensorstore callbacks behind
            raise WriteError(f"not enough disk space for checkpoint step {step} in {directory}: a step takes "
                             f"{format_bytes(last[1])}, {format_bytes(free)} free on that disk: free some space (or "
                             f"lower train.keep_checkpoints) and rerun the same command to resume from step {last[0]}")
        with write_errors_as_one_line(directory, f"checkpoint step {step}"):
            if self._checksums is not None and not any(p.name.isdigit() for p in directory.iterdir()):
                mark_checksummed(directory)  # a fresh folder: every step of it will carry checksums
            saved = super().save(step, *args, **kwargs)
        self._in_flight = step if saved else None
        if saved and self._checksums is not None:
            self._checksums.schedule(step)
        return saved

    def wait_until_finished(self) -> None:
        in_flight = getattr(self, "_in_flight", None)  # Orbax's __init__ may call this before ours ran
        with write_errors_as_one_line(Path(self.directory), "a checkpoint" if in_flight is None else
                                       f"checkpoint step {in_flight}"):
            super().wait_until_finished()
            if getattr(self, "_checksums", None) is not None:
                self._checksums.settle()
        self._in_flight = None

    def close(self) -> None:
        super().close()
        if self._checksums is not None:
            self._checksums.close()


def open_manager(checkpoint_dir: Path, train_cfg: TrainConfig | None = None) -> ocp.CheckpointManager:
    """A manager that keeps the latest ``keep_checkpoints`` plus every ``keep_checkpoints_every``-th step.

    Without ``train_cfg`` (eval, export) it only reads: nothing is created, cleaned or deleted, so
    it is safe beside a training run that is still writing.
    """
    policies: list[preservation_policy.PreservationPolicy] = []
    if train_cfg is not None:
        policies.append(preservation_policy.LatestN(train_cfg.keep_checkpoints))
        if train_cfg.keep_checkpoints_every:
            policies.append(preservation_policy.EveryNSteps(train_cfg.keep_checkpoints_every))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=preservation_policy.AnyPreservationPolicy(policies) if policies else None,
        enable_async_checkpointing=bool(train_cfg and train_cfg.async_checkpointing),
        cleanup_tmp_directories=train_cfg is not None,
        create=train_cfg is not None,
    )
    return VerifiedCheckpointManager(Path(checkpoint_dir).resolve(), item_names=ITEMS, options=options)


def save(manager: ocp.CheckpointManager, step: int, state: dict[str, Any], loader_state: dict[str, Any],
         ledger_item: dict[str, Any], meta: dict[str, Any], force: bool = False) -> None:
    """Start saving ``step`` (asynchronously when the manager is async; Orbax copies device arrays first)."""
    train_part = {k: state[k] for k in ("opt_state", "step", "rng")}
    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(state["params"]),
            train=ocp.args.StandardSave(train_part),
            loader=ocp.args.JsonSave(loader_state),
            ledger=ocp.args.JsonSave(ledger_item),
            meta=ocp.args.JsonSave(meta),
        ),
        force=force,
    )


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore the full train state onto its shardings; returns ``(state, json_items)``."""
    abstract_train = {k: abstract_state[k] for k in ("opt_state", "step", "rng")}
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_state["params"]),
            train=ocp.args.StandardRestore(abstract_train),
            loader=ocp.args.JsonRestore(),
            ledger=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        ),
    )
    state = {"params": restored["params"], **restored["train"]}
    return state, {k: restored[k] for k in ("loader", "ledger", "meta")}


def restore_any_layout(manager: ocp.CheckpointManager, step: int, program: Any,
                       meta: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``restore`` onto ``program``'s (a ``TrainProgram``) layout, whichever layer layout the checkpoint
    has (its meta's ``layout``; none: the unrolled code wrote it): the other layout is read as it was
    saved and restacked once, on the devices."""
    saved = saved_scan_layers(meta if meta is not None else read_meta(manager, step))
    target, to_program = program.checkpoint_layout(saved)
    state, items = restore(manager, step, target)
    if target is not program.abstract_state:
        log.info("checkpoint step %d has %s layers: %s them for this run's model.scan_layers=%s", step,
                 "scanned" if saved else "unrolled", "unstacked" if saved else "restacked", not saved)
        state = to_program(state)
    return state, items


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


# what Orbax and tensorstore raise on a file they cannot read (tensorstore: ValueError)
READ_ERRORS = (ValueError, KeyError, TypeError, OSError)


def restore_verified(manager: ocp.CheckpointManager, read: Callable[[int], Any],
                     steps: Sequence[int] | None = None, item: str | None = None) -> tuple[int, Any, list[int]]:
    """``read(step)`` of the newest step that passes its checksums and reads back (``item``: the checksums
    of that item's files alone, for a ``read`` that reads nothing else, such as ``read_meta``).

    Each damaged step is logged as a warning naming the file, and the previous one is tried.
    Returns ``(step, read(step), damaged steps)``; raises CheckpointDamaged naming the checkpoint
    folder when no step is left. Errors of ``read`` other than read errors (e.g. a checkpoint of
    another model) propagate.
    """
    directory = Path(manager.directory)
    candidates = sorted(manager.all_steps() if steps is None else steps, reverse=True)
    damaged: list[int] = []
    reasons: list[str] = []
    # a folder written before per-file checksums existed: read it (Orbax's read errors still fall back)
    # rather than call every step damaged and lose a run to an upgrade
    legacy = bool(candidates) and not uses_checksums(directory)
    if legacy:
        log.warning("the checkpoints in %s have no checksums (written by an older version): restoring them "
                    "unverified; steps saved from now on are verified", directory)
    for step in candidates:
        try:
            if not legacy:
                verify_checksums(directory / str(step), item)
            try:
                return step, read(step), damaged
            except READ_ERRORS as exc:
                raise CheckpointDamaged(f"step {step} passed its checksums but cannot be read: "
                                        f"{str(exc).splitlines()[0][:300]}") from exc
        except CheckpointDamaged as exc:
            damaged.append(step)
            reasons.append(f"step {step}: {exc}")
            older = [s for s in candidates if s < step]
            log.warning("checkpoint step %d is damaged: %s; %s", step, exc,
                        f"falling back to step {older[0]}" if older else "no older step is left")
    raise CheckpointDamaged(f"no restorable checkpoint in {directory} ({'; '.join(reasons)}): move the folder away "
                            "or delete it to start over")


def set_aside(manager: ocp.CheckpointManager, steps: Sequence[int]) -> None:
    """Move damaged steps into ``damaged/`` (kept for inspection): the run saves those steps again."""
    if not steps:
        return
    directory = Path(manager.directory)
    if jax.process_index() == 0:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        for step in steps:
            target = directory / DAMAGED_DIR / f"{step}-{stamp}"
            target.parent.mkdir(exist_ok=True)
            (directory / str(step)).rename(target)
            log.warning("moved the damaged checkpoint step %d to %s", step, target)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("checkpoint-set-aside")
    manager.reload()


def model_config_from_meta(meta: dict[str, Any]) -> Any:
    """The model config a checkpoint was trained with, in its family's section class, for the machine that
    loads it: a platform's own attention kernel (splash, cudnn) becomes ``auto``, so a model trained on a
    TPU or a GPU evaluates on a CPU (the kernels compute the same attention). A checkpoint written before
    families were recorded is a Llama one."""
    family = get_family(meta.get("family") or meta["model"].get("family") or "llama")
    fields = {f.name for f in dataclasses.fields(family.config_cls)}
    cfg = family.config_cls(**{k: v for k, v in meta["model"].items() if k in fields})
    if "scan_layers" in fields:  # the layout its parameters were saved in
        cfg = dataclasses.replace(cfg, scan_layers=saved_scan_layers(meta))
    return dataclasses.replace(cfg, attention="auto") if getattr(cfg, "attention", "") in ("splash", "cudnn") else cfg


def load_trained_model(run_folder: Any, step: int | None = None) -> tuple[FamilyModel, int, dict[str, Any]]:
    """The trained model of a run folder (latest checkpoint by default) on the default device.

    Returns ``(model, step, meta)``; ``meta`` has ``family``, ``model``, ``vocab_size``, ``tokenizer_sha256``,
    ``seq_len``; the model is rebuilt by the family the meta names. Raises MissingStageError when the run has no finished checkpoint.
    """
    checkpoint_dir = Path(run_folder.checkpoints)
    if not checkpoint_dir.is_dir():
        raise PRETRAIN.missing(f"no checkpoints in {checkpoint_dir}")
    manager = open_manager(checkpoint_dir)
    try:
        steps = manager.all_steps()
        if not steps:
            raise PRETRAIN.missing(f"no finished checkpoint in {checkpoint_dir}")
        if step is not None and step not in steps:
            raise DataError(f"checkpoint step {step} not in {checkpoint_dir} (available: {sorted(steps)})")

        def read_params(step: int) -> tuple[dict[str, Any], Any, Any]:
            meta = read_meta(manager, step)
            model_cfg = model_config_from_meta(meta)
            abstract_model = get_family(model_cfg.family).abstract(model_cfg, meta["vocab_size"])
            graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            param_dtype = jax.numpy.dtype(meta.get("param_dtype", "float32"))
            target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, param_dtype, sharding=device),
                                  abstract_params)
            params = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
            return meta, graphdef, params["params"]

        # an explicit step is that step or an error; the latest falls back to the previous complete one
        step, (meta, graphdef, params), _ = restore_verified(manager, read_params, None if step is None else [step])
    finally:
        manager.close()
    log.info("loaded step %d from %s", step, checkpoint_dir)
    return nnx.merge(graphdef, params), step, meta
