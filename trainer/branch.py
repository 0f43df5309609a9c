"""Decay branches: a run that starts from another run's checkpoint and trains on with its own schedule.

One long run on a constant or WSD schedule saves checkpoints; each branch starts from one of them
(parameters, optimizer state, step counter, RNG and data position) and decays over its own steps,
so comparing token budgets costs one stable run plus short decays:

    train: {schedule: wsd, decay_steps: 200, steps: 2200, branch_from: long-run, branch_step: 2000}

``train.branch_from`` is the parent's run folder: an experiment name under the same
``experiment.run_root``, or a path. The branch is its own experiment (another ``experiment.name``):
it uses the parent's tokenizer and shards (linked into its folder when it has none), keeps the
parent's model, and once it has saved a checkpoint of its own it resumes from that like any run.
Its cost ledger starts with the parent's rubles up to the branch step (``cost.ledger``'s inherit
record, from ``summarize_ledger_at`` on the parent's ledger), and its W&B run names the parent run (config
``branch_parent_run_id``, summary ``branch/parent_run_id``).

A *stage* (``train.branch_data: own``; YandexGPT-5's 32k "Powerup" after its 8k pretraining, a long-context or
mixture stage) starts from the parent's step N the same way, but reads data of its own: its shards (recipe 03
in its folder, with the parent's tokenizer, packed at its own ``model.max_seq_len``) or its ``train.mixture``,
from the start of a stream that begins at step N (the loader's ``stream_start_step``, recorded in its state; its
``train.mixture_schedule`` names steps after N). It may change the context length, RoPE's base and scaling and
``model.context_attention`` (``trainer.resume.is_stage_key``); any other model key is refused in one line.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from cost.ledger_pricing import summarize_ledger_at
from experiment.errors import ConfigError
from experiment.links import branch_links, branch_parent, link_stages
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import PRETRAIN
from trainer import checkpoint, checkpoint_integrity
from trainer.distributed import is_primary
from trainer.resume import check_same_run, finished_steps, latest_step_meta, restore_or_init
from trainer.step import TrainProgram

log = logging.getLogger("trainer")
# checkpoint meta of a stage: the tokens its ancestors trained before its stream began (its train/tokens_seen
# counts on from there; a run's own stream is step x tokens a step)
TOKENS_BEFORE_STREAM = "tokens_before_stream"
STREAM_START = "stream_start_step"  # checkpoint meta: the step the run's data stream began at (absent: 0)


def tokens_at(meta: dict[str, Any], loader_state: dict[str, Any]) -> int:
    """The tokens trained up to a checkpoint with ``meta`` and ``loader_state``: its stream's rows times its
    sequence length, after what came before its stream."""
    rows = int(loader_state["next_global_batch"]) * int(loader_state["global_batch_size"])
    return int(meta.get(TOKENS_BEFORE_STREAM, 0)) + rows * int(meta["seq_len"])


def tokens_seen(meta: dict[str, Any], step: int, tokens_per_step: int) -> int:
    """train/tokens_seen at ``step`` of a run whose checkpoints carry ``meta``."""
    return int(meta.get(TOKENS_BEFORE_STREAM, 0)) + (step - int(meta.get(STREAM_START, 0))) * tokens_per_step


def carry_stream(meta: dict[str, Any], saved: dict[str, Any]) -> None:
    """Where the data stream of the checkpoint with meta ``saved`` began, into this session's ``meta``."""
    meta.update({key: saved[key] for key in (STREAM_START, TOKENS_BEFORE_STREAM) if key in saved})


@dataclasses.dataclass(frozen=True)
class Branch:
    parent: RunFolder
    step: int
    own_data: bool = False  # a stage: its own data from a stream of its own, its own length and RoPE
    # the step this run's data stream began at: a stage's branch step, or (a decay branch) its parent's
    stream_start_step: int = 0

    @property
    def advice(self) -> str:
        if self.own_data:
            return ("a stage (train.branch_data=own) keeps its parent's model shape and tokenizer: it may change "
                    "model.max_seq_len, the model's rope_* keys and model.context_attention")
        return "a branch keeps its parent's model, tokenizer and shards (train.branch_from)"


def open_branch(cfg: ExperimentConfig, run_folder: RunFolder) -> Branch | None:
    """The parent run and step of ``train.branch_from``/``branch_step`` (None for a run that is no
    branch), checked to have that checkpoint; links the parent's tokenizer and shards into this run
    folder where it has none."""
    train_cfg = cfg.train
    parent = branch_parent(cfg)
    if parent is None:
        return None
    if parent.root == run_folder.root.resolve():
        raise ConfigError(f"config key 'train.branch_from': {parent.root} is this run's own folder: a branch is "
                          "another experiment.name")
    if not parent.checkpoints.is_dir():
        raise ConfigError(f"config key 'train.branch_from': {parent.root} holds no checkpoints/ folder: give the "
                          "folder (or experiment name) of a run of recipes/04_pretrain.py")
    steps = finished_steps(parent.checkpoints)
    if train_cfg.branch_step not in steps:
        raise ConfigError(f"config key 'train.branch_step': no finished checkpoint of step {train_cfg.branch_step} in "
                          f"{parent.checkpoints} (its steps: {', '.join(map(str, steps)) or 'none'})")
    link_stages(run_folder, parent, branch_links(cfg, PRETRAIN), "branch")  # read-only here (experiment/links.py)
    if train_cfg.branch_data == "own":
        return Branch(parent, train_cfg.branch_step, own_data=True, stream_start_step=train_cfg.branch_step)
    # a decay branch reads on in its parent's stream, which began where the parent's checkpoint says (a stage's)
    saved = latest_step_meta(parent.checkpoints, [train_cfg.branch_step])
    start = int(saved[1].get(STREAM_START, 0)) if saved is not None else 0  # damaged: restore says so
    return Branch(parent, train_cfg.branch_step, stream_start_step=start)


def restore_or_branch(manager: Any, program: TrainProgram, loader: Any, meta: dict[str, Any], ledger: Any,
                      branch: Branch | None, init_state: Callable[[], dict[str, Any]] | None = None,
                      ) -> tuple[dict[str, Any], int, str | None]:
    """This run's newest checkpoint when it has one (a branch resumes like any run), else the parent's
    checkpoint of the branch step. Returns ``(state, step, parent W&B run id or None)``."""
    if branch is None or manager.all_steps():
        return (*restore_or_init(manager, program, loader, meta, ledger, init_state), None)
    parent_manager = checkpoint.open_manager(branch.parent.checkpoints)  # read-only: the parent may still train

    def read(step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        parent_meta = checkpoint.read_meta(parent_manager, step)
        check_same_run(parent_meta, meta, parent_manager.directory, branch.advice, stage=branch.own_data)
        state, items = checkpoint.restore_any_layout(parent_manager, step, program, parent_meta)
        if branch.own_data:  # a stage's loader starts its own stream at the branch step (loader.stream_start_step)
            meta.update({STREAM_START: branch.step, TOKENS_BEFORE_STREAM: tokens_at(parent_meta, items["loader"])})
        else:
            carry_stream(meta, parent_meta)
            loader.set_state(items["loader"])
        return state, items

    try:
        _, (state, items), _ = checkpoint_integrity.restore_verified(parent_manager, read, [branch.step],
                                                                     advice=checkpoint_integrity.READER_ADVICE)
    finally:
        parent_manager.close()
    ledger.mark_resume(branch.step)  # an earlier session of this branch that saved nothing was redone
    if is_primary():  # process 0 books the ledger for the whole slice (trainer.reporting)
        parent_cost = summarize_ledger_at(branch.parent.ledger, items["ledger"])
        ledger.inherit(parent_cost, str(branch.parent.root), branch.step)
    parent_run_id = items["meta"].get("wandb_run_id")
    log.info("%s: started from the checkpoint of step %d of %s (W&B run %s)%s", "stage" if branch.own_data else
             "branch", branch.step, branch.parent.root, parent_run_id,
             f"; its own data stream begins at step {branch.step}" if branch.own_data else "")
    return state, branch.step, parent_run_id


def link_wandb(wandb_run: Any, branch: Branch | None, parent_run_id: str | None) -> None:
    """Name the parent run in the branch's W&B run (a resumed branch has them from its first session)."""
    if branch is None or parent_run_id is None:
        return
    wandb_run.config.update({"branch_parent_run_id": parent_run_id, "branch_parent_folder": str(branch.parent.root),
                             "branch_step": branch.step, "branch_data": "own" if branch.own_data else "parent"},
                            allow_val_change=True)
    wandb_run.summary["branch/parent_run_id"] = parent_run_id
    wandb_run.summary["branch/step"] = branch.step
