"""Where a training run resumes: the newest verified checkpoint, checked to belong to this run.

A run can stop at any point: SIGKILL loses only the steps since the last checkpoint (and the
resumed run retraces them bit for bit on CPU). Checkpoints made for another model or data are
refused, damaged newer steps are set aside, and ``train_log.jsonl`` is cut back to the restored step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Callable
from typing import Any

from experiment import appendlog
from experiment.checkpoint_steps import finished_steps
from experiment.errors import ConfigError, DataError
from experiment.jsonl import read_jsonl
from experiment.jsontext import parse_json
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.model import model_section_class
from experiment.sections.rope import STAGE_ROPE_KEYS
from experiment.sections.train import TrainConfig
from experiment.storage import RunPath
from trainer import checkpoint, checkpoint_integrity
from trainer.schedules import schedule_change
from trainer.step import TrainProgram

log = logging.getLogger("trainer")
WANDB_ID_FILE = "wandb_run.json"
# how the step runs, not what it computes: a run may resume on another slice with another kernel or remat
EXECUTION_KEYS = ("attention", "remat", "scan_layers", "scan_unroll")  # a checkpoint of either layer layout restacks
# where the first session's weights came from: read once, at step 0 (trainer/init_from.py); a resume may
# name the base model's folder elsewhere, or not at all
START_KEYS = ("init_from", "vocab_adaptation", "extend_context")


def is_stage_key(name: str) -> bool:
    """A model key a stage (``train.branch_data: own``) may change from its parent's checkpoint: the context
    length, RoPE's base and scaling, and how attention splits a sequence over the context axis; none of them
    shapes a parameter."""
    return name in ("max_seq_len", "context_attention") or name in STAGE_ROPE_KEYS


def resume_wandb_run_id(cfg: ExperimentConfig, run_folder: RunFolder) -> str | None:
    """The W&B run id of the run these checkpoints belong to, so a resumed run continues it.

    Only when a finished checkpoint exists: a run killed before its first checkpoint starts over
    from step 0, and is a new W&B run.
    """
    path = run_folder.checkpoints / WANDB_ID_FILE
    if not path.is_file() or not finished_steps(run_folder.checkpoints):
        return None
    with contextlib.suppress(OSError, json.JSONDecodeError, KeyError):
        return str(parse_json(path.read_text(encoding="utf-8"))["run_id"])
    return None


def restore_or_init(manager: Any, program: TrainProgram, loader: Any, meta: dict[str, Any],
                    ledger: Any, init_state: Callable[[], dict[str, Any]] | None = None) -> tuple[dict[str, Any], int]:
    """The newest checkpoint that passes its checksums, or, when there is none, ``init_state()``
    (default: the program's fresh initialisation).

    Damaged newer steps are moved aside (the run trains and saves them again); when every step
    is damaged the run stops with one error line rather than starting over on its own.
    """
    # a step Orbax finished but whose checksums were never written is a save the kill interrupted, not
    # a damaged checkpoint: set it aside (kept for inspection) and resume from the step before, or from 0
    complete = finished_steps(checkpoint.checkpoint_location(manager.directory))
    interrupted = [step for step in manager.all_steps() if step not in complete]
    if interrupted:
        log.warning("checkpoint step(s) %s have no checksums: their save was interrupted; training them again",
                    ", ".join(map(str, sorted(interrupted))))
        checkpoint_integrity.set_aside(manager, interrupted)
    if not complete:
        log.info("no checkpoint: starting from step 0")
        # earlier sessions killed before their first checkpoint trained steps this one trains again:
        # the ledger must not count their tokens too
        ledger.mark_resume(0)
        return (init_state or program.init_state)(), 0

    def read(step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        saved_meta = checkpoint.read_meta(manager, step)
        check_same_run(saved_meta, meta, manager.directory)
        state, items = checkpoint.restore_any_layout(manager, step, program, saved_meta)
        loader.set_state(items["loader"])
        return state, items

    latest, (state, items), damaged = checkpoint_integrity.restore_verified(manager, read, complete)
    checkpoint_integrity.set_aside(manager, damaged)
    ledger.mark_resume(latest, items["ledger"])
    log.info("resumed from the checkpoint of step %d in %s", latest, manager.directory)
    return state, latest


def check_steps_left(start_step: int, steps: int, checkpoint_dir: Any) -> None:
    """A run restored at or past ``train.steps`` has nothing to train: say so instead of logging a NaN loss."""
    if start_step > steps:
        raise ConfigError(f"config key 'train.steps': {steps} is below step {start_step}, which the checkpoints in "
                          f"{checkpoint_dir} already reached: set train.steps above {start_step} to train further, "
                          "or use another experiment.name to start over")
    if start_step == steps:
        log.info("the checkpoints in %s already reached train.steps=%d: nothing to train (raise train.steps to "
                 "train further)", checkpoint_dir, steps)


def trim_train_log(path: RunPath, step: int) -> float:
    """Keep the lines of ``train_log.jsonl`` up to the restored step; the resumed run retraces the rest.

    A killed session may have logged steps after its last checkpoint (and a half-written last
    line, dropped here): without this the retraced steps would get a second line. A damaged line
    before the end is a DataError naming the file and line. Returns the last loss kept.
    """
    if not appendlog.exists(path):
        return math.nan
    contents = read_jsonl(path, torn_tail="ignore")  # the torn tail is counted among the dropped lines
    kept: list[str] = []
    dropped = int(contents.torn_tail is not None)
    last_loss = math.nan
    for line in contents.records:
        record = line.value
        try:
            keep = int(record["train/step"]) <= step
        except (KeyError, TypeError, ValueError):
            keep = False  # not a metrics line of a step
        if keep:
            kept.append(line.text)
            last_loss = float(record.get("train/loss", last_loss))
        else:
            dropped += 1
    if dropped:
        appendlog.rewrite(path, "".join(f"{line}\n" for line in kept))
        log.info("%s: dropped %d line(s) after step %d, which this run trains again", path, dropped, step)
    return last_loss


def latest_meta(checkpoint_dir: RunPath, steps: list[int]) -> dict[str, Any] | None:
    """The meta of the newest of ``steps`` whose meta passes its checksums (None: none does); the step's
    other files are verified once, by the restore that follows (trainer.resume)."""
    latest = latest_step_meta(checkpoint_dir, steps)
    return None if latest is None else latest[1]


def latest_step_meta(checkpoint_dir: RunPath, steps: list[int]) -> tuple[int, dict[str, Any]] | None:
    """``(step, meta)`` of ``latest_meta``."""
    manager = checkpoint.open_manager(checkpoint_dir)
    try:
        def read(step: int) -> dict[str, Any]:
            return checkpoint.read_meta(manager, step)

        step, meta, _ = checkpoint_integrity.restore_verified(manager, read, steps, item="meta")
        return step, meta
    except checkpoint_integrity.CheckpointDamaged:
        return None  # resume reports it, with the damaged steps set aside
    finally:
        manager.close()


def check_schedule(saved_meta: dict[str, Any], train_cfg: TrainConfig, step: int,
                   where: Any) -> dict[str, tuple[Any, Any]] | None:
    """The schedule change of a run restored at ``step`` from a checkpoint with ``saved_meta`` (None: the same
    optimization, or a checkpoint too old to say); a ConfigError naming the key, its old and new value,
    unless ``train.allow_schedule_change``."""
    saved = saved_meta.get("schedule")
    if saved is None:
        log.warning("the checkpoints in %s do not record their learning-rate schedule (an older version wrote "
                    "them): resuming with train's schedule unchecked", where)
        return None
    change = schedule_change(saved, train_cfg, step)
    if change and not train_cfg.allow_schedule_change:
        key, (old, new) = next(iter(change.items()))
        others = "".join(f", {k} {a!r} -> {b!r}" for k, (a, b) in list(change.items())[1:])
        raise ConfigError(f"config key 'train.{key}': {old!r} -> {new!r}{others} changes the learning rate of steps "
                          f"the checkpoints in {where} already trained (restored at step {step}): set it back, or set "
                          "train.allow_schedule_change=true to train on with the new schedule")
    return change


RESUME_ADVICE = "use another experiment.name, or delete the checkpoints to start over"


def _field_defaults(family: str) -> dict[str, Any]:
    """The defaults of a family's model section (none for a family this process does not know)."""
    try:
        cls = model_section_class(family)
    except ConfigError:
        return {}
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def check_same_run(saved: dict[str, Any], current: dict[str, Any], where: Any, advice: str = RESUME_ADVICE,
                   stage: bool = False) -> None:
    """Refuse to resume checkpoints made for another model or data (the parameters would not fit); a ``stage``
    starts from them with another sequence length and the keys ``is_stage_key`` names."""
    def model_of(meta: dict[str, Any]) -> dict[str, Any]:  # checkpoints from before model families are Llama ones
        model = {"family": "llama", **(meta.get("model") or {})}
        # a field added to the section since the checkpoint was written reads as its default (e.g. qkv_bias)
        return {k: v for k, v in {**_field_defaults(model["family"]), **model}.items()
                if k not in EXECUTION_KEYS + START_KEYS and not (stage and is_stage_key(k))}

    saved, current = {**saved, "model": model_of(saved)}, {**current, "model": model_of(current)}
    for key in ("model", "vocab_size", "tokenizer_sha256", *(() if stage else ("seq_len",)), "param_dtype"):
        if saved.get(key) != current.get(key):
            if key == "model":
                diff = {k: (saved["model"].get(k), v) for k, v in current["model"].items()
                        if saved["model"].get(k) != v}
                detail = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in diff.items())
            else:
                detail = f"{saved.get(key)} -> {current.get(key)}"
            raise DataError(f"checkpoints in {where} were made with a different {key} ({detail}): {advice}")
