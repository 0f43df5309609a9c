"""Recipe 04: pretrain the decoder, resuming from the latest checkpoint when there is one.

The whole session reads in this file, and what one step computes in trainer/step.py::

    pretrain:   shards + tokenizer manifests -> open_session: mesh -> TrainProgram (trainer/step.py)
                -> restore (params, optimizer, step, RNG, loader position) or init  (trainer.resume, trainer.branch)
                -> announce (W&B) -> train_session
    run_loop:   batch -> program.step(state, batch) -> NaN policy -> hooks: metrics, eval, checkpoint,
                SIGTERM (trainer.hooks) -> until train.steps
                -> final checkpoint

Before this runs, the recipe's ``prepare`` hook (``trainer.distributed.prepare_processes``) joined
the other JAX processes, and the harness opened W&B on process 0 only.

A run can stop at any point: SIGKILL loses only the steps since the last checkpoint (and the
resumed run retraces them bit for bit on CPU); SIGTERM, how spot and preemptible VMs are
stopped, saves a checkpoint and exits within ``train.preemption_grace_s``. A step whose loss,
gradient or updated state is not finite stops the run before it is checkpointed (``train.nan_policy:
stop``) or skips that update (``skip``, up to ``train.max_skipped_steps`` in a row): it is checked right
after the step, before any hook can log or save it, and the run names the newest checkpoint still worth
resuming from (trainer/guard.py). Under ``train.skip_spikes`` a step whose loss or gradient norm is far above the
last steps' is skipped the same way. A step or a checkpoint save past its deadline (``train.step_deadline_s``,
``train.save_deadline_s``) dumps every thread's stack and exits with ``HUNG_EXIT_CODE`` (trainer/watchdog.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import Mesh

from data_prep.shards.layout import VERIFIED_DIR
from data_prep.shards.loader import (
    TrainIterator,
    log_mixture,
    make_train_iterator,
    mixture_changes,
    mixture_sets,
    read_shards_manifest,
)
from experiment.config import to_dict
from experiment.errors import WriteError
from experiment.files import atomic_write_json
from experiment.progress import progress as progress_bar
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.train import TrainConfig, check_mixture
from experiment.stages import TOKENIZER
from experiment.storage.backends import storage_failure_reason
from model.family import params_label
from model.registry import family_of
from model.sharding import build_mesh
from model.stacking import LAYOUT_KEY, layout_meta
from tracking.history import backfill_offline_history
from tracking.metrics import commit_step, define_cost_metrics
from trainer import checkpoint, checkpoint_integrity
from trainer.branch import Branch, carry_stream, link_wandb, open_branch, restore_or_branch
from trainer.distributed import is_primary
from trainer.guard import (
    DIVERGED_DIR,
    NAN_ADVICE,
    SPIKE_ADVICE,
    Guard,
    SpikeWindow,
    TrainingDiverged,
    describe,
    is_spike,
    stop_message,
    usable_step,
)
from trainer.hooks import BodyUnfreezes, CheckpointSaves, Hook, LogMetrics, LoopContext, SaveCheckpoint, StopOnSignal
from trainer.init_from import StartPoint, check_init_from, record_lineage, start_point
from trainer.preemption import PreemptionWatch
from trainer.profiling import StepTrace
from trainer.reporting import TRAIN_LOG, TrainLedger, open_ledger, open_train_log
from trainer.resume import (
    WANDB_ID_FILE,
    check_same_run,
    check_schedule,
    check_steps_left,
    finished_steps,
    latest_step_meta,
    trim_train_log,
)
from trainer.schedules import schedule_change, schedule_record
from trainer.step import State, TrainProgram, global_batch
from trainer.throughput import MetricsWindow, peak_flops_per_device
from trainer.watchdog import Watchdog

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

    from tracking.wandb_run import WandbRun

log = logging.getLogger("trainer")


@dataclasses.dataclass(frozen=True)
class DataSpec:
    seq_len: int
    vocab_size: int
    tokenizer_sha256: str


def read_inputs(cfg: ExperimentConfig, run_folder: RunFolder) -> DataSpec:
    read_shards_manifest(run_folder.shards)  # the stage right before this one is the first to ask for
    tokenizer = TOKENIZER.read_manifest(run_folder.tokenizer)
    # the shards were packed at model.max_seq_len: a changed length means shards to rebuild
    shards = read_shards_manifest(run_folder.shards, tokenizer_sha256=tokenizer["sha256"],
                                  seq_len=cfg.model.max_seq_len)
    return DataSpec(seq_len=int(shards["seq_len"]), vocab_size=int(tokenizer["vocab_size"]),
                    tokenizer_sha256=str(tokenizer["sha256"]))


def check(cfg: ExperimentConfig, run_folder: RunFolder) -> None:
    """What recipe 04 checks before the harness opens a W&B run and the ledger a session (so a rerun that
    fails here leaves a finished run's W&B id and ledger untouched): the branch's parent, the input
    manifests, and, on a run with checkpoints, that the resume is the same optimization
    (trainer.resume.check_schedule) and the same base model (trainer.init_from.check_init_from). The config's own
    checks (the cost catalog's rows, eval tasks, the base model) ran before, as the stage's (experiment/check.py)."""
    branch = None
    if cfg.train.branch_from:
        run_folder.root.mkdir(parents=True, exist_ok=True)  # the parent's tokenizer and shards are linked in
        branch = open_branch(cfg, run_folder)
        if branch.stream_start_step and not branch.own_data:  # a decay branch of a stage: its stream began at N
            check_mixture([m.name for m in cfg.train.mixture], [m.weight for m in cfg.train.mixture],
                          mixture_changes(cfg.train.mixture_schedule), steps=cfg.train.steps,
                          first=branch.stream_start_step)
    data = read_inputs(cfg, run_folder)
    checkpoint_dir = run_folder.checkpoints
    steps = finished_steps(checkpoint_dir)
    latest = latest_step_meta(checkpoint_dir, steps) if steps else None
    if latest is None and branch is not None and not cfg.model.init_from:  # the parent's model, before anything
        check_branch_parent(cfg, data, branch)
    if latest is None:  # a fresh run, or none readable: resume reports the damaged steps
        return
    step, saved_meta = latest
    # another model or data first: that, not the schedule, is what the user changed (trainer.resume);
    # with model.init_from the model is the checkpoints' (check_init_from checks the base)
    model = saved_meta.get("model") if cfg.model.init_from else dataclasses.asdict(cfg.model)
    check_same_run(saved_meta, {"model": model, "vocab_size": data.vocab_size,
                                "tokenizer_sha256": data.tokenizer_sha256,
                                "seq_len": data.seq_len, "param_dtype": cfg.train.param_dtype}, checkpoint_dir)
    check_init_from(cfg, saved_meta, checkpoint_dir)
    if step > cfg.train.steps:  # nothing left to train: that, not the schedule it would change, is the error
        check_steps_left(step, cfg.train.steps, checkpoint_dir)
    check_schedule(saved_meta, cfg.train, step, checkpoint_dir)


def check_branch_parent(cfg: ExperimentConfig, data: DataSpec, branch: Branch) -> None:
    """A branch's first session: the parent's checkpoint of the branch step is of this model and data (a stage's:
    but for what a stage may change), checked before the W&B run and the ledger open; restore checks it again."""
    parent = latest_step_meta(branch.parent.checkpoints, [branch.step])
    if parent is None:
        return  # restore says which step is damaged
    check_same_run(parent[1], {"model": dataclasses.asdict(cfg.model), "vocab_size": data.vocab_size,
                               "tokenizer_sha256": data.tokenizer_sha256, "seq_len": data.seq_len,
                               "param_dtype": cfg.train.param_dtype},
                   branch.parent.checkpoints, branch.advice, stage=branch.own_data)


def log_trainable(program: TrainProgram, train_cfg: TrainConfig, total: int) -> None:
    """Say what trains of the ``total`` parameters: everything, the embeddings and head only, or those first
    and everything after."""
    frozen = program.param_trainable_frozen
    if frozen is None:
        log.info("trainable: all %s parameters", params_label(total))
    elif train_cfg.trainable == "embeddings":
        log.info("trainable: the embeddings and output head only, %s of %s parameters (train.trainable=embeddings)",
                 params_label(frozen), params_label(total))
    else:
        log.info("trainable: the embeddings and output head only (%s of %s parameters) for steps 1-%d "
                 "(train.embeddings_only_steps), then all %s", params_label(frozen), params_label(total),
                 train_cfg.embeddings_only_steps, params_label(total))


def pretrain(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: WandbRun,
             hooks: Sequence[Hook] = ()) -> dict[str, Any]:
    """Train to ``train.steps``; ``hooks`` (the recipe's, such as eval during training) run after the
    metrics are logged and before the checkpoint of the same step."""
    branch = open_branch(cfg, run_folder)  # train.branch_from: links the parent's tokenizer and shards
    data = read_inputs(cfg, run_folder)
    run_id = getattr(wandb_run, "id", None) or "offline"
    ledger = open_ledger(cfg, run_folder, run_id)
    trace = StepTrace()  # train.profile_steps: stops first, starts last (trainer/profiling.py)
    with ledger:
        return _pretrain(cfg, data, run_folder, wandb_run, ledger, run_id, branch,
                         [trace.stop, LogMetrics(), BodyUnfreezes(), *hooks, SaveCheckpoint(), StopOnSignal(),
                          trace.start])


@dataclasses.dataclass
class TrainSession:
    """A pretraining session ready to train (``open_session``): the model's program on its mesh, the data
    loader, the checkpoint manager and the state restored from it (or started afresh), and what every
    checkpoint of the session records beside the state (``meta``)."""

    cfg: ExperimentConfig  # the run's config; under model.init_from its model section is the base model's
    run_folder: RunFolder
    branch: Branch | None  # train.branch_from's parent run and step (None: no branch)
    program: TrainProgram
    n_params: int  # the family's count
    kernel: str  # the attention kernel model.attention stands for on the mesh's platform
    lineage: dict[str, Any] | None  # the base model's (model.init_from), None without one
    meta: dict[str, Any]
    loader: TrainIterator
    manager: ocp.CheckpointManager
    untrained: bool  # the run had no finished checkpoint when the session started
    from_base: bool  # the step-0 state is the base model's weights (model.init_from's first session)
    state: State
    start_step: int
    parent_run_id: str | None  # the W&B run of a branch's parent checkpoint (its first session)
    guard: Guard
    schedule_changes: list[dict[str, Any]]  # the learning-rate schedule changes allowed so far (record_schedule)
    last_loss: float  # the loss train_log.jsonl holds for start_step (NaN: none, or not process 0)


def _pretrain(cfg: ExperimentConfig, data: DataSpec, run_folder: RunFolder, wandb_run: WandbRun,
              ledger: TrainLedger, run_id: str, branch: Branch | None, hooks: Sequence[Hook]) -> dict[str, Any]:
    """One session of recipe 04: build it (``open_session``), announce it to W&B (``announce``), train it
    (``train_session``), and report the final step, loss and cost."""
    session = open_session(cfg, data, run_folder, ledger, run_id, branch)
    if session.start_step and getattr(wandb_run, "offline", False):
        backfill_offline_history(wandb_run, run_folder.root / TRAIN_LOG, session.start_step)
    model_cfg, tokens_per_step = session.cfg.model, session.cfg.train.batch_size * data.seq_len
    window = MetricsWindow(tokens_per_step, family_of(model_cfg).flops(model_cfg, data.vocab_size, data.seq_len),
                           peak_flops_per_device(session.cfg))
    announce(session, wandb_run)
    train_log = open_train_log(run_folder)
    watchdog = Watchdog(ledger, session.cfg.train)  # steps and saves past their deadline end the process
    ctx = LoopContext(cfg=session.cfg, run_folder=run_folder, program=session.program, loader=session.loader,
                      ledger=ledger, wandb_run=wandb_run, train_log=train_log,
                      saves=CheckpointSaves(session.manager, ledger, session.guard, train_log, watchdog),
                      window=window, meta=session.meta, tokens_per_step=tokens_per_step,
                      start_step=session.start_step, state=session.state, step=session.start_step,
                      last_loss=session.last_loss)
    with watchdog:
        train_session(session, ctx, hooks)
    cost = ledger.summary()  # None on processes other than 0
    log.info("pretraining done at step %d: loss %.4f, %.2f RUB so far", ctx.step, ctx.last_loss,
             cost.rub_total if cost is not None else math.nan)
    wandb_run.summary["train/final_loss"] = ctx.last_loss
    if cost is not None:
        commit_step(wandb_run, ctx.step)  # the last step's row first: the summary below is the newer cost
        cost.log_to(wandb_run)
    return {"final_step": ctx.step, "final_loss": ctx.last_loss, "n_params": session.n_params, "cost": cost}


def open_session(cfg: ExperimentConfig, data: DataSpec, run_folder: RunFolder, ledger: TrainLedger, run_id: str,
                 branch: Branch | None) -> TrainSession:
    """Build the session, booked as the ledger's startup phase: the mesh, the model (``cfg.model``, or the base
    model of ``model.init_from``: ``start_point``) and its program (``build_program``), the checkpoints' meta,
    the loader, the checkpoint manager, and the state (``restore_state``) with the NaN guard and the schedule
    it resumes with. Process 0 also records the W&B run id beside the checkpoints and cuts ``train_log.jsonl``
    back to the restored step."""
    with ledger.phase("startup"):
        mesh = build_mesh(cfg.train.mesh)
        start = start_point(cfg, run_folder, data.vocab_size, mesh, branch)
        if start.model_cfg is not cfg.model:  # the base model's shape (model.init_from)
            cfg = dataclasses.replace(cfg, model=start.model_cfg)
            if jax.process_index() == 0:  # the run's records name the model it trains, not the YAML's section
                run_folder.save_resolved_config(cfg, "pretrain")
        log.info("mesh %s over %d %s devices", dict(mesh.shape), mesh.size, jax.devices()[0].platform)
        program, n_params, kernel = build_program(cfg, data, mesh)
        meta = checkpoint_meta(cfg, data, n_params, run_id, start.lineage)
        loader = make_train_iterator(run_folder.shards, cfg.train.batch_size, cfg.experiment.seed,
                                     jax.process_index(), jax.process_count(),
                                     tokenizer_sha256=data.tokenizer_sha256, seq_len=data.seq_len,
                                     on_corrupt=cfg.shards.on_corrupt,
                                     mixture=mixture_sets(cfg.train.mixture, run_folder.shards),
                                     schedule=mixture_changes(cfg.train.mixture_schedule),
                                     verified_dir=run_folder.root / VERIFIED_DIR,
                                     stream_start_step=branch.stream_start_step if branch else 0)
        manager = checkpoint.open_manager(run_folder.checkpoints, cfg.train)
        untrained = not finished_steps(checkpoint.checkpoint_location(manager.directory))
        from_base = start.params is not None
        steps = None if untrained and cfg.train.steps == 0 else cfg.train.steps  # 0: the step-0 checkpoint alone
        state, start_step, parent_run_id = restore_state(manager, program, loader, meta, ledger, branch, start, steps)
        saved_meta = checkpoint.read_meta(manager, start_step) if start_step in manager.all_steps() else None
        if saved_meta is not None:  # where a stage's stream began, set by its (or its parent's) first session
            carry_stream(meta, saved_meta)
        spikes = SpikeWindow(cfg.train.spike_window, cfg.train.spike_sigma) if cfg.train.skip_spikes else None
        guard = Guard.resumed(saved_meta, start_step, spikes)
        schedule_changes = record_schedule(meta, saved_meta, cfg.train, start_step)
        last_loss = math.nan
        if is_primary():
            atomic_write_json(run_folder.checkpoints / WANDB_ID_FILE, {"run_id": run_id})
            last_loss = trim_train_log(run_folder.root / TRAIN_LOG, start_step)
    return TrainSession(cfg=cfg, run_folder=run_folder, branch=branch, program=program, n_params=n_params,
                        kernel=kernel, lineage=start.lineage, meta=meta, loader=loader, manager=manager,
                        untrained=untrained, from_base=from_base, state=state, start_step=start_step,
                        parent_run_id=parent_run_id, guard=guard, schedule_changes=schedule_changes,
                        last_loss=last_loss)


def build_program(cfg: ExperimentConfig, data: DataSpec, mesh: Mesh) -> tuple[TrainProgram, int, str]:
    """The session's ``TrainProgram`` of ``cfg.model`` on ``mesh``, with the family's parameter count and the
    attention kernel ``model.attention`` stands for on the mesh's platform; logs the model, what trains, the
    kernel, remat and the loss's chunking."""
    model_cfg, train_cfg = cfg.model, cfg.train
    program = TrainProgram(model_cfg, train_cfg, data.vocab_size, mesh, seed=cfg.experiment.seed)
    family = family_of(model_cfg)
    n_params = family.param_count(model_cfg, data.vocab_size)
    log.info("model: %s family, %s parameters (%s, vocab %d)",
             family.name, params_label(n_params), family.describe(model_cfg), data.vocab_size)
    log_trainable(program, train_cfg, n_params)
    kernel, _, _ = family.train_costs(model_cfg, data.vocab_size, data.seq_len, mesh.devices.flat[0].platform,
                                      train_cfg.compute_dtype, train_cfg.loss_chunk_len)
    log.info("attention kernel: %s (model.attention=%s on %s); remat %s; loss logits in chunks of %s positions",
             kernel, model_cfg.attention, mesh.devices.flat[0].platform, model_cfg.remat,
             train_cfg.loss_chunk_len if 0 < train_cfg.loss_chunk_len < data.seq_len else "all")
    return program, n_params, kernel


def checkpoint_meta(cfg: ExperimentConfig, data: DataSpec, n_params: int, run_id: str,
                    lineage: dict[str, Any] | None) -> dict[str, Any]:
    """What every checkpoint of the session records beside the state: the model (family, section, layer
    layout), the data it trains on, the parameter dtype and count, the W&B run, the seed, and a base model's
    lineage (``record_schedule`` adds the schedule)."""
    model_cfg = cfg.model
    meta = {
        "family": family_of(model_cfg).name, "model": dataclasses.asdict(model_cfg), "vocab_size": data.vocab_size,
        "tokenizer_sha256": data.tokenizer_sha256, "seq_len": data.seq_len,
        "param_dtype": cfg.train.param_dtype, "n_params": n_params, "wandb_run_id": run_id,
        "seed": cfg.experiment.seed,  # step 0's parameters (trainer.step.initial_params): eval's random init
        LAYOUT_KEY: layout_meta(model_cfg.scan_layers),  # how the layers' parameters are stacked
    }
    if lineage is not None:
        meta["init_from"] = lineage
    return meta


def restore_state(manager: ocp.CheckpointManager, program: TrainProgram, loader: TrainIterator,
                  meta: dict[str, Any], ledger: TrainLedger, branch: Branch | None, start: StartPoint,
                  steps: int | None) -> tuple[State, int, str | None]:
    """``(state, step, the parent's W&B run id or None)`` the session starts from (``restore_or_branch``: the
    run's newest checkpoint, a branch's parent's, the base model's weights in ``start``, or a fresh init),
    checked against ``train.steps`` = ``steps`` (``check_steps_left``; None: not checked). The manager is closed
    on any error."""
    from_base = None if start.params is None else functools.partial(program.init_state_from, start.params)
    try:
        state, start_step, parent_run_id = restore_or_branch(manager, program, loader, meta, ledger, branch,
                                                             from_base)
        start.params = None  # on the devices now
        if steps is not None:
            check_steps_left(start_step, steps, manager.directory)
    except BaseException:
        manager.close()
        raise
    return state, start_step, parent_run_id


def announce(session: TrainSession, wandb_run: WandbRun) -> None:
    """Tell W&B what the session trains: the cost metrics' axes, the parameter counts and the attention
    kernel (summary and config), the data mixture, a branch's parent run, the schedule changes allowed so
    far, and a base model's lineage (``record_lineage``)."""
    program, kernel = session.program, session.kernel
    define_cost_metrics(wandb_run)
    wandb_run.summary["model/n_params"] = session.n_params
    if program.param_trainable_frozen is not None:  # what trains while the body is frozen
        wandb_run.summary["model/trainable_params_frozen_body"] = program.param_trainable_frozen
    wandb_run.config.update({"model_attention_kernel": kernel}, allow_val_change=True)
    if session.cfg.model.init_from:  # the base model's section, as config.resolved.yaml now has it
        wandb_run.config.update({"model": to_dict(session.cfg)["model"]}, allow_val_change=True)
    wandb_run.summary["model/attention_kernel"] = kernel
    log_mixture(wandb_run, session.loader.mixture, session.loader.mixture_schedule)
    link_wandb(wandb_run, session.branch, session.parent_run_id)
    if session.schedule_changes:
        wandb_run.config.update({"schedule_changes": session.schedule_changes}, allow_val_change=True)
        wandb_run.summary["train/schedule_changed_at_step"] = session.schedule_changes[-1]["step"]
    if session.lineage is not None:
        record_lineage(wandb_run, session.run_folder.checkpoints, session.lineage,
                       first_session=session.from_base and is_primary())


def train_session(session: TrainSession, ctx: LoopContext, hooks: Sequence[Hook]) -> None:
    """Train from the restored step to ``train.steps`` (``run_loop``), or, with ``train.steps=0`` on a run
    without checkpoints, save the step-0 state alone (an imported model), refused when not finite. The
    checkpoint manager is closed and ``train_log.jsonl`` closed either way; its last segment is not published
    after a storage failure."""
    manager, base = session.manager, session.cfg.model.init_from or "none"
    try:
        if session.untrained and session.cfg.train.steps == 0:  # the step-0 checkpoint alone (an imported model)
            ctx.guard.state_finite = bool(session.program.state_finite(ctx.state))  # no step checked this one
            if not ctx.guard.state_finite:
                raise TrainingDiverged(f"the step-0 state has non-finite parameters (model.init_from={base}): "
                                       "no checkpoint written")
            ctx.saves.save(0, ctx.state, session.loader.get_state(), session.meta)
        run_loop(ctx, hooks)
    except BaseException:
        # the first error is the one to report: a failed save raises again when the manager closes
        with contextlib.suppress(Exception):
            manager.close()
        raise
    else:
        manager.close()
    finally:
        if ctx.train_log is not None:
            failing = sys.exc_info()[1]
            # a storage that just failed would make the last segment wait out the retries again, a full disk fail
            # again over the first error; its lines are after the last checkpoint, which a resume retraces anyway
            ctx.train_log.close(publish=failing is None or (storage_failure_reason(failing) is None
                                                            and not isinstance(failing, WriteError)))


def record_schedule(meta: dict[str, Any], saved_meta: dict[str, Any] | None, train_cfg: TrainConfig,
                    step: int) -> list[dict[str, Any]]:
    """Put this session's schedule, and the changes allowed so far (``train.allow_schedule_change``), in the
    checkpoints' ``meta``; returns those changes (the restored checkpoint's, and this session's if any)."""
    changes = list((saved_meta or {}).get("schedule_changes") or [])
    saved = (saved_meta or {}).get("schedule")  # check() already refused a change that is not allowed
    change = schedule_change(saved, train_cfg, step) if saved is not None else None
    if change:
        log.warning("train.allow_schedule_change: the learning-rate schedule changes at step %d (%s)", step,
                    ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in change.items()))
        changes.append({"step": step, "changed": {k: [a, b] for k, (a, b) in change.items()}})
    meta["schedule"] = schedule_record(train_cfg)
    meta["schedule_changes"] = changes
    return changes


def run_loop(ctx: LoopContext, hooks: Sequence[Hook]) -> None:
    """Train from ``ctx.step`` to ``train.steps``; each hook runs, in list order, after every step its
    schedule is due. Pending checkpoint saves are finished before it returns."""
    train_cfg = ctx.train_cfg
    scheduled = [(hook, hook.schedule(train_cfg)) for hook in hooks]
    progress = progress_bar(total=train_cfg.steps, initial=ctx.step, desc="pretrain", unit="step", dynamic_ncols=True,
                    disable=not is_primary())
    try:
        with PreemptionWatch(train_cfg.preemption_grace_s) as preemption:
            ctx.preemption = preemption
            while ctx.step < train_cfg.steps:
                train_one_step(ctx)
                progress.update(1)
                progress.set_postfix(loss=f"{ctx.last_loss:.4f}")
                for hook, schedule in scheduled:
                    if schedule.due(ctx):
                        hook(ctx)
        ctx.saves.wait()
    finally:
        progress.close()


def train_one_step(ctx: LoopContext) -> None:
    """One optimizer step, booked in the ledger (the first one of a session as compilation, a skipped
    one as lost; a skipped first step stays compilation: nearly all of its time is the compiler's)."""
    phase = "compile" if ctx.step == ctx.start_step else "train"
    watched = ctx.watchdog.step(ctx.step + 1, first=phase == "compile") if ctx.watchdog else contextlib.nullcontext()
    with watched, ctx.ledger.phase(phase):
        with ctx.ledger.phase("data"):  # waiting for the loader is badput of its own, not training
            host_batch = next(ctx.loader)
        batch = global_batch(host_batch, ctx.program.batch_sharding)
        limits = ctx.guard.spike_limits()  # train.skip_spikes: from the steps before, on the host already
        if limits is None:
            ctx.state, metrics = ctx.program.step(ctx.state, batch)
        else:
            ctx.state, metrics = ctx.program.step_skipping_spikes(ctx.state, batch, limits)
        ctx.metrics = jax.device_get(metrics)  # tiny; also where a NaN is caught before any save
        trained = ctx.guard.after_step(ctx.step + 1, ctx.metrics, kept_previous=ctx.train_cfg.nan_policy == "skip")
        if not trained and phase == "train":
            ctx.ledger.book_as_lost()
    ctx.step += 1
    ctx.window.add()
    by_set = ctx.loader.tokens_by_set(ctx.step, ctx.tokens_per_step) if trained else None  # a mixture's sets
    ctx.ledger.add_tokens(ctx.step, ctx.tokens_per_step if trained else 0, by_set)  # a skipped step trained no token
    ctx.last_loss = float(ctx.metrics["loss"])
    if not trained:
        guard_step(ctx)
    if phase == "compile":
        log.info("first step (with compilation) done, loss %.4f", ctx.last_loss)
        ctx.window.flush()  # keep compilation out of tokens/s


def guard_step(ctx: LoopContext) -> None:
    """A step that was not finite, or a spike: skipped (``train.nan_policy: skip``, ``train.skip_spikes``, up to
    ``train.max_skipped_steps`` in a row), or the run stops naming the newest checkpoint worth resuming from, the
    newer ones set aside."""
    train_cfg, spike = ctx.train_cfg, is_spike(ctx.metrics)
    what = describe(ctx.metrics, ctx.guard.checked_against)
    if spike or train_cfg.nan_policy == "skip":
        if ctx.guard.skipped_in_a_row <= train_cfg.max_skipped_steps:
            log.warning("step %d: %s; update skipped (%s, %d in a row of at most train.max_skipped_steps=%d)",
                        ctx.step, what, "train.skip_spikes" if spike else "train.nan_policy=skip",
                        ctx.guard.skipped_in_a_row, train_cfg.max_skipped_steps)
            return
        what += f"; {ctx.guard.skipped_in_a_row} steps in a row skipped, more than train.max_skipped_steps=" \
                f"{train_cfg.max_skipped_steps}"
    ctx.saves.wait()  # every checkpoint of the run on disk before one is chosen
    manager = ctx.saves.manager
    steps = finished_steps(checkpoint.checkpoint_location(manager.directory))
    usable = usable_step(steps, ctx.guard.measured)
    moved = [s for s in steps if usable is None or s > usable]
    checkpoint_integrity.set_aside(manager, moved, into=DIVERGED_DIR, why="diverged")
    raise TrainingDiverged(stop_message(ctx.step, what, usable, moved,
                                        checkpoint.checkpoint_location(manager.directory),
                                        SPIKE_ADVICE if spike else NAN_ADVICE))
