"""Recipe 04: pretrain the decoder, resuming from the latest checkpoint when there is one.

    shards + tokenizer manifests -> mesh -> compiled state init and train step
    -> restore (params, optimizer, step, RNG, loader position) or init
    -> loop: batch -> step -> metrics (W&B, tqdm, train_log.jsonl) -> checkpoint every N steps
    -> final checkpoint

A run can stop at any point: SIGKILL loses only the steps since the last checkpoint (and the
resumed run retraces them bit for bit on CPU); SIGTERM, how spot and preemptible VMs are
stopped, saves a checkpoint and exits within ``train.preemption_grace_s``. A non-finite loss
stops the run before it is checkpointed (``train.nan_policy: stop``) or skips that update
(``skip``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import jax
from tqdm import tqdm

from data_prep.loader import make_train_iterator, read_shards_manifest
from experiment.errors import ConfigError, DataError, RecipeError
from experiment.files import atomic_write_json, atomic_write_text
from experiment.manifest import read_manifest
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from model.attention import resolve_attention
from model.flops import param_count, train_flops_per_token
from model.sharding import build_mesh
from tokenizer.spm import TOKENIZER_RECIPE, TOKENIZER_STAGE
from tracking.metrics import cost_entries, define_cost_metrics, log_cost_summary, log_step
from trainer import checkpoint
from trainer.step import DTYPES, TrainProgram, build_program, global_batch

log = logging.getLogger("trainer")
STAGE = "pretrain"
WANDB_ID_FILE = "wandb_run.json"
TRAIN_LOG = "train_log.jsonl"
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what schedulers expect from a job stopped by SIGTERM


class TrainingDiverged(RecipeError):
    """The loss or gradient became NaN/Inf."""


# ---------------------------------------------------------------------------------------------
# Inputs: what the earlier stages made, and where this run resumes


@dataclasses.dataclass(frozen=True)
class DataSpec:
    seq_len: int
    vocab_size: int
    tokenizer_sha256: str


def read_inputs(cfg: ExperimentConfig, run_folder: RunFolder) -> DataSpec:
    read_shards_manifest(run_folder.shards)  # the stage right before this one is the first to ask for
    tokenizer = read_manifest(run_folder.tokenizer, TOKENIZER_STAGE, TOKENIZER_RECIPE)
    # the shards were packed at model.max_seq_len: a changed length means shards to rebuild
    shards = read_shards_manifest(run_folder.shards, tokenizer_sha256=tokenizer["sha256"],
                                  seq_len=cfg.model.max_seq_len)
    return DataSpec(seq_len=int(shards["seq_len"]), vocab_size=int(tokenizer["vocab_size"]),
                    tokenizer_sha256=str(tokenizer["sha256"]))


def resume_wandb_run_id(cfg: Any, run_folder: RunFolder) -> str | None:
    """The W&B run id of the run these checkpoints belong to, so a resumed run continues it.

    Only when a finished checkpoint exists: a run killed before its first checkpoint starts over
    from step 0, and is a new W&B run.
    """
    path = Path(run_folder.checkpoints) / WANDB_ID_FILE
    if not path.is_file() or not finished_steps(Path(run_folder.checkpoints)):
        return None
    with contextlib.suppress(OSError, json.JSONDecodeError, KeyError):
        return str(json.loads(path.read_text(encoding="utf-8"))["run_id"])
    return None


def finished_steps(checkpoint_dir: Path) -> list[int]:
    """Steps Orbax finished and whose checksums are written (an interrupted save stays a
    ``*.orbax-checkpoint-tmp*`` folder; a step without checksums is not resumed from), or every
    finished step of a folder an older version wrote (``checkpoint.uses_checksums``)."""
    if not checkpoint_dir.is_dir():
        return []
    verified = checkpoint.uses_checksums(checkpoint_dir)
    return sorted(int(p.name) for p in checkpoint_dir.iterdir()
                  if p.name.isdigit() and (not verified or (p / checkpoint.CHECKSUMS).is_file()))


def maybe_initialize_distributed(train_cfg: Any) -> None:
    """Join the other hosts (TPU VM slices, multi-node GPUs) before anything touches a device.

    ``jax.distributed.initialize()`` finds its peers on Cloud TPU, SLURM and similar clusters;
    elsewhere set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID.
    """
    if not train_cfg.distributed:
        return
    env = os.environ
    kwargs: dict[str, Any] = {}
    if env.get("JAX_COORDINATOR_ADDRESS"):
        kwargs = {"coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
                  "num_processes": int(env.get("JAX_NUM_PROCESSES", "1")),
                  "process_id": int(env.get("JAX_PROCESS_ID", "0"))}
    if jax.config.jax_platforms == "cpu" or env.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)
    log.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())


def peak_flops_per_device(cfg: Any) -> float | None:
    """Peak bf16 FLOP/s of one chip: ``train.peak_flops_per_chip`` or the cost catalog's figure."""
    if cfg.train.peak_flops_per_chip:
        return cfg.train.peak_flops_per_chip
    try:
        from cost.catalog import Catalog

        tflops = Catalog.from_config(cfg.cost).chip(cfg.cost.accelerator).peak_bf16_tflops
    except (RecipeError, OSError) as exc:
        log.info("no peak FLOP/s for MFU (%s)", exc)
        return None
    return tflops * 1e12 if tflops else None


# ---------------------------------------------------------------------------------------------
# Preemption: SIGTERM asks for a checkpoint at the next step boundary


class PreemptionWatch:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested_at: float | None = None
        self._previous: Any = None

    def __enter__(self) -> PreemptionWatch:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.requested_at is not None:
            return
        self.requested_at = time.monotonic()
        # the last resort if the save outlives the grace period: the VM would be killed anyway
        timer = threading.Timer(self.grace_s, self._deadline)
        timer.daemon = True
        timer.start()

    def _deadline(self) -> None:
        log.error("SIGTERM grace period of %.0f s ran out before the checkpoint was saved: exiting now", self.grace_s)
        os._exit(PREEMPTED_EXIT_CODE)

    @property
    def requested(self) -> bool:
        return self.requested_at is not None


# ---------------------------------------------------------------------------------------------
# Metrics


def chips_in_use() -> int:
    """Accelerator chips training this run; a CPU host counts once however many JAX devices it shows."""
    return jax.process_count() if jax.devices()[0].platform == "cpu" else jax.device_count()


class MetricsWindow:
    """Accumulates steps between two log points into tokens/s, step time and MFU."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float | None) -> None:
        self.tokens_per_step, self.flops_per_token, self.peak_flops = tokens_per_step, flops_per_token, peak_flops
        self.start = time.perf_counter()
        self.steps = 0

    def add(self) -> None:
        self.steps += 1

    def flush(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        tokens_per_s = self.steps * self.tokens_per_step / elapsed
        out = {"train/tokens_per_s": tokens_per_s, "train/step_time_s": elapsed / max(self.steps, 1),
               "train/model_tflops_per_s": tokens_per_s * self.flops_per_token / 1e12}
        if self.peak_flops:
            out["train/mfu"] = tokens_per_s * self.flops_per_token / (self.peak_flops * chips_in_use())
        self.start, self.steps = time.perf_counter(), 0
        return out


class OtherHostLedger:
    """Hosts other than process 0 book nothing: process 0's ledger prices the whole slice (cost.chips)."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def add_tokens(self, step: int, tokens: int) -> None: ...

    def checkpoint_record(self, step: int) -> dict[str, Any]:
        return {}

    def mark_checkpoint(self, step: int) -> None: ...

    def mark_resume(self, step: int, checkpoint_item: dict[str, Any] | None = None) -> None: ...

    def summary(self) -> dict[str, Any]:
        return {}

    def __enter__(self) -> OtherHostLedger:
        return self

    def __exit__(self, *exc: Any) -> None: ...


def open_ledger(cfg: Any, run_folder: RunFolder, run_id: str) -> Any:
    from cost.ledger import Ledger

    if jax.process_index() != 0:
        return OtherHostLedger()
    return Ledger.open(run_folder.ledger, cfg.cost, run_id)


# ---------------------------------------------------------------------------------------------
# The run


def pretrain(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any) -> dict[str, Any]:
    maybe_initialize_distributed(cfg.train)
    train_cfg = cfg.train
    if train_cfg.compilation_cache and not jax.config.jax_compilation_cache_dir:
        # a resumed (preempted) run reuses the compiled step instead of paying for the compile again
        jax.config.update("jax_compilation_cache_dir", str((Path(run_folder.root) / "xla_cache").resolve()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    model_cfg = cfg.model
    data = read_inputs(cfg, run_folder)
    run_id = getattr(wandb_run, "id", None) or "offline"
    if jax.process_index() != 0:
        wandb_run = None  # one host reports for the whole slice
    ledger = open_ledger(cfg, run_folder, run_id)
    with ledger:
        return _pretrain(cfg, model_cfg, train_cfg, data, run_folder, wandb_run, ledger, run_id)


def _pretrain(cfg: Any, model_cfg: Any, train_cfg: Any, data: DataSpec, run_folder: RunFolder, wandb_run: Any,
              ledger: Any, run_id: str) -> dict[str, Any]:
    with ledger.phase("startup"):
        mesh = build_mesh(train_cfg.mesh)
        log.info("mesh %s over %d %s devices", dict(mesh.shape), mesh.size, jax.devices()[0].platform)
        program = build_program(model_cfg, train_cfg, data.vocab_size, mesh, seed=cfg.experiment.seed)
        n_params = param_count(model_cfg, data.vocab_size)
        log.info("model: %.2fM parameters (%d layers, d_model %d, %d heads / %d KV heads, vocab %d)",
                 n_params / 1e6, model_cfg.n_layers, model_cfg.d_model, model_cfg.n_heads, model_cfg.n_kv_heads,
                 data.vocab_size)
        kernel = resolve_attention(model_cfg.attention, mesh.devices.flat[0].platform, DTYPES[train_cfg.compute_dtype],
                                   model_cfg.resolved_head_dim, data.seq_len)
        log.info("attention kernel: %s (model.attention=%s on %s); remat %s; loss logits in chunks of %s positions",
                 kernel, model_cfg.attention, mesh.devices.flat[0].platform, model_cfg.remat,
                 train_cfg.loss_chunk_len if 0 < train_cfg.loss_chunk_len < data.seq_len else "all")
        meta = {
            "model": dataclasses.asdict(model_cfg), "vocab_size": data.vocab_size,
            "tokenizer_sha256": data.tokenizer_sha256, "seq_len": data.seq_len,
            "param_dtype": train_cfg.param_dtype, "n_params": n_params, "wandb_run_id": run_id,
        }
        loader = make_train_iterator(run_folder.shards, train_cfg.batch_size, cfg.experiment.seed,
                                     jax.process_index(), jax.process_count(),
                                     tokenizer_sha256=data.tokenizer_sha256, seq_len=data.seq_len,
                                     on_corrupt=cfg.shards.on_corrupt)
        manager = checkpoint.open_manager(run_folder.checkpoints, train_cfg)
        try:
            state, start_step = restore_or_init(manager, program, loader, meta, ledger)
            check_steps_left(start_step, train_cfg.steps, manager.directory)
        except BaseException:
            manager.close()
            raise
        last_loss = math.nan
        if jax.process_index() == 0:
            atomic_write_json(Path(run_folder.checkpoints) / WANDB_ID_FILE, {"run_id": run_id})
            last_loss = trim_train_log(Path(run_folder.root) / TRAIN_LOG, start_step)

    if start_step and wandb_run is not None and getattr(wandb_run, "offline", False):
        backfill_offline_history(wandb_run, Path(run_folder.root) / TRAIN_LOG, start_step)
    tokens_per_step = train_cfg.batch_size * data.seq_len
    window = MetricsWindow(tokens_per_step, train_flops_per_token(model_cfg, data.vocab_size, data.seq_len),
                           peak_flops_per_device(cfg))
    if wandb_run is not None:
        define_cost_metrics(wandb_run)
        wandb_run.summary["model/n_params"] = n_params
        wandb_run.config.update({"model_attention_kernel": kernel}, allow_val_change=True)
        wandb_run.summary["model/attention_kernel"] = kernel

    unconfirmed: list[int] = []  # async saves not yet known to be on disk

    def save(step: int) -> None:
        with ledger.phase("checkpoint"):
            # Orbax finishes the previous async save before it starts this one
            checkpoint.save(manager, step, state, loader.get_state(), ledger.checkpoint_record(step), meta,
                            force=True)
        for done in unconfirmed:
            ledger.mark_checkpoint(done)
        unconfirmed[:] = [step]

    def wait_for_saves() -> None:
        with ledger.phase("checkpoint"):
            manager.wait_until_finished()
        for done in unconfirmed:
            ledger.mark_checkpoint(done)
        unconfirmed.clear()

    step = start_step
    train_log = (Path(run_folder.root) / TRAIN_LOG).open("a", encoding="utf-8") if jax.process_index() == 0 else None
    progress = tqdm(total=train_cfg.steps, initial=start_step, desc="pretrain", unit="step", dynamic_ncols=True,
                    disable=jax.process_index() != 0)
    try:
        with PreemptionWatch(train_cfg.preemption_grace_s) as preemption:
            while step < train_cfg.steps:
                phase = "compile" if step == start_step else "train"
                with ledger.phase(phase):
                    batch = global_batch(next(loader), program.batch_sharding)
                    state, metrics = program.train_step(state, batch)
                    metrics = jax.device_get(metrics)  # tiny; also where a NaN is caught before any save
                step += 1
                window.add()
                ledger.add_tokens(step, tokens_per_step)
                last_loss = float(metrics["loss"])
                check_finite(metrics, step, train_cfg, Path(run_folder.checkpoints))
                if phase == "compile":
                    log.info("first step (with compilation) done, loss %.4f", last_loss)
                    window.flush()  # keep compilation out of tokens/s
                progress.update(1)
                progress.set_postfix(loss=f"{last_loss:.4f}")
                if step % train_cfg.log_every == 0 or step == train_cfg.steps:
                    record = {"train/step": step, "train/loss": last_loss,
                              "train/total_loss": float(metrics["total_loss"]),
                              "train/grad_norm": float(metrics["grad_norm"]), "train/lr": float(metrics["lr"]),
                              "train/skipped": int(not metrics["finite"]),
                              "train/tokens_seen": step * tokens_per_step, **window.flush()}
                    if loader.skipped_records:  # shards.on_corrupt=skip; each one was logged with file and offset
                        record["data/skipped_records"] = loader.skipped_records
                        if wandb_run is not None:
                            wandb_run.summary["data/skipped_at"] = [f"{f}@{o}" for f, o in loader.skipped_at]
                    log_metrics(wandb_run, train_log, step, record, ledger.summary())
                if train_cfg.eval_every and step % train_cfg.eval_every == 0:
                    run_eval(cfg, run_folder, program, state, step, wandb_run, train_log, ledger)
                if step % train_cfg.checkpoint_every == 0 or step == train_cfg.steps or preemption.requested:
                    save(step)
                if preemption.requested:
                    wait_for_saves()
                    waited = time.monotonic() - (preemption.requested_at or time.monotonic())
                    log.warning("SIGTERM: checkpoint of step %d saved %.1f s after the signal; rerun the same "
                                "command to resume", step, waited)
                    raise SystemExit(PREEMPTED_EXIT_CODE)
        wait_for_saves()
    except BaseException:
        # the first error is the one to report: a failed save raises again when the manager closes
        with contextlib.suppress(Exception):
            manager.close()
        raise
    else:
        manager.close()
    finally:
        progress.close()
        if train_log is not None:
            train_log.close()
    summary = {"final_step": step, "final_loss": last_loss, "n_params": n_params, **ledger.summary()}
    log.info("pretraining done at step %d: loss %.4f, %.2f RUB so far", step, last_loss,
             summary.get("rub_total", math.nan))
    if wandb_run is not None:
        wandb_run.summary["train/final_loss"] = last_loss
        log_cost_summary(wandb_run, ledger.summary())
    return summary


def restore_or_init(manager: Any, program: TrainProgram, loader: Any, meta: dict[str, Any],
                    ledger: Any) -> tuple[dict[str, Any], int]:
    """The newest checkpoint that passes its checksums, or a fresh state when there is none.

    Damaged newer steps are moved aside (the run trains and saves them again); when every step
    is damaged the run stops with one error line rather than starting over on its own.
    """
    if not manager.all_steps():
        log.info("no checkpoint: starting from step 0")
        # earlier sessions killed before their first checkpoint trained steps this one trains again:
        # the ledger must not count their tokens too
        ledger.mark_resume(0)
        return program.init_state(), 0

    def read(step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        check_same_run(checkpoint.read_meta(manager, step), meta, manager.directory)
        state, items = checkpoint.restore(manager, step, program.abstract_state)
        loader.set_state(items["loader"])
        return state, items

    latest, (state, items), damaged = checkpoint.restore_verified(manager, read)
    checkpoint.set_aside(manager, damaged)
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


def trim_train_log(path: Path, step: int) -> float:
    """Keep the lines of ``train_log.jsonl`` up to the restored step; the resumed run retraces the rest.

    A killed session may have logged steps after its last checkpoint (and a half-written last
    line): without this the retraced steps would get a second line. Returns the last loss kept.
    """
    if not path.is_file():
        return math.nan
    kept: list[str] = []
    dropped = 0
    last_loss = math.nan
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            keep = int(record["train/step"]) <= step
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            keep = False
        if keep:
            kept.append(line)
            last_loss = float(record.get("train/loss", last_loss))
        else:
            dropped += 1
    if dropped:
        atomic_write_text(path, "".join(f"{line}\n" for line in kept))
        log.info("%s: dropped %d line(s) after step %d, which this run trains again", path, dropped, step)
    return last_loss


# how the step runs, not what it computes: a run may resume on another slice with another kernel or remat
EXECUTION_KEYS = ("attention", "remat")


def check_same_run(saved: dict[str, Any], current: dict[str, Any], where: Any) -> None:
    """Refuse to resume checkpoints made for another model or data (the parameters would not fit)."""
    def model_of(meta: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in (meta.get("model") or {}).items() if k not in EXECUTION_KEYS}

    saved, current = {**saved, "model": model_of(saved)}, {**current, "model": model_of(current)}
    for key in ("model", "vocab_size", "tokenizer_sha256", "seq_len", "param_dtype"):
        if saved.get(key) != current.get(key):
            if key == "model":
                diff = {k: (saved["model"].get(k), v) for k, v in current["model"].items() if saved["model"].get(k) != v}
                detail = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in diff.items())
            else:
                detail = f"{saved.get(key)} -> {current.get(key)}"
            raise DataError(f"checkpoints in {where} were made with a different {key} ({detail}): use another "
                            "experiment.name, or delete the checkpoints to start over")


def check_finite(metrics: dict[str, Any], step: int, train_cfg: Any, checkpoint_dir: Path) -> None:
    if bool(metrics["finite"]):
        return
    what = f"loss {float(metrics['total_loss'])}, gradient norm {float(metrics['grad_norm'])}"
    if train_cfg.nan_policy == "skip":
        log.warning("step %d: %s; update skipped (train.nan_policy=skip)", step, what)
        return
    saved = finished_steps(checkpoint_dir)  # none is newer than the last finite step: we stop before saving
    last = f"the last good checkpoint is step {saved[-1]}" if saved else "no checkpoint was saved"
    raise TrainingDiverged(f"training diverged at step {step} ({what}); {last}. Lower train.learning_rate, "
                           "or set train.nan_policy=skip to skip such steps")


def backfill_offline_history(wandb_run: Any, train_log: Path, resumed_step: int) -> None:
    """Re-log steps up to the checkpoint that earlier local folders of this W&B run lost.

    wandb writes offline history in blocks, so a SIGKILLed session can leave nothing of what it
    logged. Synced in order, W&B keeps the first value of each step; we re-log, from
    train_log.jsonl, the steps after the last one any earlier folder kept, so the synced history
    has no gap. (Steps after the checkpoint are retraced by training itself.)
    """
    from tracking.readback import find_offline_runs, read_offline_run

    this_folder = Path(wandb_run.dir).parent.resolve()
    kept = 0
    for folder in find_offline_runs(this_folder.parent):
        if folder.resolve() != this_folder and folder.name.endswith(f"-{wandb_run.id}"):
            with contextlib.suppress(RecipeError):
                kept = max([kept, *(int(row["_step"]) for row in read_offline_run(folder).history if "_step" in row)])
    if kept >= resumed_step or not train_log.is_file():
        return
    records: dict[int, dict[str, Any]] = {}
    for line in train_log.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
            record = json.loads(line)
            if kept < record["train/step"] <= resumed_step:
                records[record["train/step"]] = {**records.get(record["train/step"], {}), **record}
    for step in sorted(records):
        wandb_run.log(records[step], step=step)
    log.info("W&B: re-logged %d step(s) up to %d that the interrupted session's local files lost",
             len(records), resumed_step)


def log_metrics(wandb_run: Any, train_log: Any, step: int, record: dict[str, Any],
                ledger_summary: dict[str, Any]) -> None:
    """To W&B at an explicit step (a resumed run, a new local folder offline, continues the axis),
    with the rubles spent so far; and one JSON line per log step to ``train_log.jsonl``."""
    payload = log_step(wandb_run, step, record, ledger_summary) if wandb_run is not None else {
        **record, **cost_entries(ledger_summary)}
    if train_log is not None:
        train_log.write(json.dumps(payload) + "\n")
        train_log.flush()
    if "train/loss" in record:
        log.info("step %d: loss %.4f, grad norm %.3f, lr %.2e, %.0f tokens/s, %.2f RUB", step, record["train/loss"],
                 record["train/grad_norm"], record["train/lr"], record["train/tokens_per_s"],
                 payload.get("cost/rub_spent", math.nan))


def run_eval(cfg: Any, run_folder: RunFolder, program: TrainProgram, state: dict[str, Any], step: int,
             wandb_run: Any, train_log: Any, ledger: Any) -> None:
    try:
        from eval.run import evaluate_model
    except ImportError as exc:
        log.warning("eval during training skipped: %s", exc)
        return
    with ledger.phase("eval"):
        metrics = evaluate_model(program.model(state["params"]), cfg, run_folder, step=step)
    log_metrics(wandb_run, train_log, step, {"train/step": step, **metrics}, ledger.summary())
