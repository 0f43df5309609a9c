"""The Orbax wrapper: the checkpoint manager of a training run, saving and restoring a train state.

One checkpoint step holds five items:

- ``params``: the parameters (separate from the rest so eval restores them alone);
- ``train``: optimizer state, step counter and RNG key data;
- ``loader``: the data iterator's state (JSON), so that resume sees the same batches;
- ``ledger``: the cost ledger's mark of that step (session, moment, tokens counted; ``Ledger.checkpoint_record``);
- ``meta``: model family and config, vocab_size, tokenizer_sha256, seq_len, W&B run id (JSON).

Orbax writes a step into a temporary folder and renames it when complete, so a crash mid-save
leaves a ``*.orbax-checkpoint-tmp`` folder that a new manager ignores. In a bucket, where a rename
is a copy of every object, it writes the step in place and commits it with a marker object
(``commit_success.txt``) written last; a step without it is ignored the same way. ``gs://`` is
Orbax's own; ``s3://`` is taught to it by ``trainer.orbax_s3``. The manager here adds the
checksums of each committed step and a free-space check (``trainer.checkpoint_integrity``), and
turns write errors into one line. A checkpoint of either layer layout restores onto a program of
the other (``restore_any_layout``). Loading a trained model for eval and export is
``trainer.trained_model``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy

from experiment.errors import WriteError
from experiment.files import format_bytes, free_bytes, free_space, write_errno
from experiment.lock import check_lease
from experiment.sections.train import TrainConfig
from experiment.storage import RunPath, location
from model.stacking import saved_scan_layers
from trainer import orbax_s3
from trainer.checkpoint_integrity import ChecksumWriter, committed_step_bytes, mark_checksummed
from trainer.checkpoint_pins import KeepPinned

log = logging.getLogger("trainer.checkpoint")
ITEMS = ("params", "train", "loader", "ledger", "meta")


# ---------------------------------------------------------------------------------------------
# A full disk (or another write error) during a save: one line, not Orbax's threads' tracebacks
# (those are quieted by tracking.process_hooks, which the recipe harness installs)


def checkpoint_location(directory: Any) -> RunPath:
    """An Orbax manager's directory (an ``epath.Path``: ``gs://...`` stays a URL) as a ``RunPath``."""
    return location(str(directory))


@contextmanager
def write_errors_as_one_line(directory: RunPath, what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        code = write_errno(exc)
        if code is None:
            raise
        raise WriteError(f"cannot write {what} in {directory}: {os.strerror(code)} ({free_space(directory)} free on "
                         "that disk): free some space (or lower train.keep_checkpoints) and rerun the same command "
                         "to resume from the latest complete checkpoint") from None


class VerifiedCheckpointManager(ocp.CheckpointManager):
    """An Orbax manager that writes ``<step>/checksums.json`` after each committed save (process 0),
    checks the free space before a save, and turns write errors into one WriteError line."""

    def __init__(self, directory: RunPath | str, *args: Any, **kwargs: Any) -> None:
        super().__init__(str(directory), *args, **kwargs)
        self._checksums = ChecksumWriter(location(directory)) if jax.process_index() == 0 else None
        self._in_flight: int | None = None  # the step of the save Orbax may still be writing

    def save(self, step: int, *args: Any, **kwargs: Any) -> bool:
        directory = checkpoint_location(self.directory)
        check_lease()  # a process whose run lock was taken over writes no more checkpoints
        self.wait_until_finished()  # Orbax's save starts with it too; free space is measured after it
        free = free_bytes(directory)  # None in a bucket: no disk to fill
        last = committed_step_bytes(directory) if free is not None and directory.is_dir() else None
        if last is not None and free is not None and free < last[1]:
            # refuse before Orbax starts: a save that fails half-way leaves tensorstore callbacks behind
            raise WriteError(f"not enough disk space for checkpoint step {step} in {directory}: a step takes "
                             f"{format_bytes(last[1])}, {format_bytes(free)} free on that disk: free some space (or "
                             f"lower train.keep_checkpoints) and rerun the same command to resume from step {last[0]}")
        with write_errors_as_one_line(directory, f"checkpoint step {step}"):
            if self._checksums is not None and not (directory.is_dir() and any(
                    p.name.isdigit() for p in directory.iterdir())):  # an empty bucket prefix is no folder yet
                mark_checksummed(directory)  # a fresh folder: every step of it will carry checksums
            saved = super().save(step, *args, **kwargs)
        self._in_flight = step if saved else None
        if saved and self._checksums is not None:
            self._checksums.schedule(step)
        return saved

    def wait_until_finished(self) -> None:
        in_flight = getattr(self, "_in_flight", None)  # Orbax's __init__ may call this before ours ran
        with write_errors_as_one_line(checkpoint_location(self.directory), "a checkpoint" if in_flight is None else
                                       f"checkpoint step {in_flight}"):
            super().wait_until_finished()
            if getattr(self, "_checksums", None) is not None:
                self._checksums.settle()
        self._in_flight = None

    def close(self) -> None:
        super().close()
        if self._checksums is not None:
            self._checksums.close()


def open_manager(checkpoint_dir: RunPath | str, train_cfg: TrainConfig | None = None) -> ocp.CheckpointManager:
    """A manager that keeps the latest ``keep_checkpoints`` plus every ``keep_checkpoints_every``-th step.

    Without ``train_cfg`` (eval, export) it only reads: nothing is created, cleaned or deleted, so
    it is safe beside a training run that is still writing. A training run's manager also keeps the steps
    readers have pinned (``trainer.checkpoint_pins``).
    """
    directory = location(checkpoint_dir)
    policies: list[preservation_policy.PreservationPolicy] = []
    if train_cfg is not None:
        policies.append(preservation_policy.LatestN(train_cfg.keep_checkpoints))
        if train_cfg.keep_checkpoints_every:
            policies.append(preservation_policy.EveryNSteps(train_cfg.keep_checkpoints_every))
        policies.append(KeepPinned(directory))  # a step a reader is loading stays until it is done
    options = ocp.CheckpointManagerOptions(
        preservation_policy=preservation_policy.AnyPreservationPolicy(policies) if policies else None,
        enable_async_checkpointing=bool(train_cfg and train_cfg.async_checkpointing),
        cleanup_tmp_directories=train_cfg is not None,
        create=train_cfg is not None,
        **orbax_s3.checkpoint_options_for(directory),  # a bucket: commit by a marker object, not a rename
    )
    return VerifiedCheckpointManager(directory.resolve(), item_names=ITEMS, options=options)


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


def restore(manager: ocp.CheckpointManager, step: int,
            abstract_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
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
