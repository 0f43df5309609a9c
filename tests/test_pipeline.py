"""The whole recipe chain on a tiny experiment, as a user runs it, including a SIGKILL and a SIGTERM
mid-training.

Two Pushkin novels -> corpus -> 1k tokenizer -> shards -> a tiny decoder trained 24 steps with a
checkpoint every 8 (SIGKILLed after its step-8 checkpoint, resumed, SIGTERMed, resumed to the end: bit
for bit the uninterrupted run) -> eval -> ruble comparison table. Recipes 01-03 are conftest.py's
``data_root`` and the uninterrupted run its ``straight_run`` (made once, in this process, and shared with
the resume and checkpoint tests); the sessions killed and signalled are processes of their own.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from cost.ledger_pricing import summarize_ledger
from tests.fixture_run import assert_same_checkpoint, assert_same_log
from tests.recipe_runner import (
    in_process_devices,
    logged_steps,
    read_train_log,
    run_recipe,
    signal_when,
    start_pretrain,
    wait_until,
)
from tests.test_train_resume import STEPS, TRAIN, experiment_copy, losses, step_reached
from tracking.readback import find_offline_runs, read_offline_run
from trainer.resume import finished_steps

pytestmark = pytest.mark.integration


def test_stages_01_to_03_on_real_text(data_root: Path) -> None:
    """Recipes 01-03 of the tiny experiment (conftest.py's ``data_root``, which the tests after it train on):
    the corpus, the 1k tokenizer, the shards, and no second copy of a shard anywhere under the run root."""
    run = data_root / "runs" / "tiny"
    corpus = json.loads((run / "corpus" / "manifest.json").read_text(encoding="utf-8"))
    assert corpus["documents"] > 50
    assert (run / "tokenizer" / "spm.model").is_file()
    assert json.loads((run / "tokenizer" / "manifest.json").read_text(encoding="utf-8"))["vocab_size"] == 1000
    shards = json.loads((run / "shards" / "manifest.json").read_text(encoding="utf-8"))
    assert shards["splits"]["train"]["records"] > 0 and shards["splits"]["validation"]["records"] > 0
    assert list((run / "shards").glob("train-*.tfrecord"))
    # W&B records the shards by reference: no second copy of them anywhere (offline staging included)
    shard_bytes = {p.read_bytes() for p in (run / "shards").glob("*.tfrecord")}
    sizes = {len(data) for data in shard_bytes}
    copies = [p for p in data_root.rglob("*") if p.is_file() and p.parent != run / "shards"
              and p.stat().st_size in sizes and p.read_bytes() in shard_bytes]
    assert not copies, copies[:3]  # add_dir staged each one (under wandb/.data/artifacts/staging)


def test_recipe_chain_end_to_end_with_sigkill_and_sigterm_resume(data_root: Path, straight_run: Path,
                                                                 tmp_path: Path) -> None:
    """Recipes 04-06 on ``data_root``'s stages (test_stages_01_to_03_on_real_text checks them). Recipe 04
    is SIGKILLed after its step-8 checkpoint, resumed and SIGTERMed a few steps later, then resumed to the
    end: it retraces conftest.py's uninterrupted ``straight_run`` bit for bit, continuing one W&B run
    without gaps or duplicate steps, with each step in the cost ledger once."""
    reference = losses(straight_run.parent / "runs" / "tiny")
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert reference[STEPS] < reference[1] - 1.0, "the loss should fall on real Russian text"

    cfg = experiment_copy(data_root, tmp_path, "chain")
    run = cfg.parent / "runs" / "tiny"
    checkpoints = run / "checkpoints"
    # every session compiles into the run folder's own compilation cache (recipe 04's default), as a user's
    # run does, not the tests' shared one; the killed ones run on as many devices as straight_run (made in
    # this process) to compare bit for bit
    devices = in_process_devices()

    # 1. SIGKILL after the checkpoint of step 8 has landed: the steps after the latest one are lost
    output = tmp_path / "killed.log"
    signal_when(start_pretrain(cfg, output, shared_xla_cache=False, devices=devices),
                step_reached(run, 10, checkpoint=8), signal.SIGKILL, output=output)
    killed_at = max(losses(run))
    landed = max(int(p.parent.name) for p in checkpoints.glob("*/checksums.json"))
    assert 8 <= landed < killed_at < STEPS - 3

    # 2. resume; SIGTERM a few steps later saves that step and exits 143 within the grace period
    output = tmp_path / "preempted.log"
    proc = start_pretrain(cfg, output, shared_xla_cache=False, devices=devices)
    wait_until(proc, step_reached(run, killed_at + 3), output=output)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=TRAIN["preemption_grace_s"])
    stderr = output.read_text()
    assert proc.returncode == 143, stderr[-3000:]
    assert time.monotonic() - signalled < TRAIN["preemption_grace_s"]
    assert f"resumed from the checkpoint of step {landed}" in stderr
    preempted_at = max(losses(run))
    assert f"SIGTERM: checkpoint of step {preempted_at} saved" in stderr
    assert (checkpoints / str(preempted_at)).is_dir()

    # 3. resume to the end (in this process, on straight_run's devices)
    resumed = run_recipe("04_pretrain.py", cfg, shared_xla_cache=False)
    assert f"resumed from the checkpoint of step {preempted_at}" in resumed.stdout + resumed.stderr
    # captured output is not a terminal: plain progress lines, no carriage-return frames of a bar
    assert "\r" not in resumed.stdout + resumed.stderr
    # its share done counts the steps this session had to do, from the step it resumed at
    assert any(line.startswith(f"pretrain: {STEPS}/{STEPS} step (100% of {STEPS - preempted_at} from step "
                               f"{preempted_at}), ") for line in resumed.stderr.splitlines())
    # the kernel auto picked on this platform is logged (and recorded in the W&B run's summary and config)
    assert "attention kernel: dot_product (model.attention=auto on cpu)" in resumed.stderr
    last_session = sorted((run / "wandb" / "wandb").glob("offline-run-*"))[-1]
    assert read_offline_run(last_session).summary.get("model/attention_kernel") == "dot_product"
    assert max(finished_steps(checkpoints)) == STEPS
    assert len(finished_steps(checkpoints)) >= 2

    history = read_train_log(run)
    assert logged_steps(run)[-1] == STEPS
    first_loss, last_loss = history[0]["train/loss"], history[-1]["train/loss"]
    assert last_loss < first_loss - 0.5, f"loss did not fall: {first_loss} -> {last_loss}"
    assert losses(run) == reference, "losses after SIGKILL/SIGTERM and resume differ from the uninterrupted run"
    # one log line per step, and every array of the final checkpoint (params, optimizer state, step,
    # RNG) and the loader state as the uninterrupted run's
    assert_same_log(run, straight_run.parent / "runs" / "tiny", STEPS)
    assert_same_checkpoint(run, straight_run.parent / "runs" / "tiny", STEPS)
    check_wandb_history_continues(run, killed_at)
    # the cost ledger counts each step once: the SIGKILLed session's steps up to its checkpoint too
    ledger = summarize_ledger(run / "ledger")
    assert ledger.sessions == 3 and ledger.last_step == STEPS
    assert ledger.tokens == STEPS * 8 * 64  # train.batch_size x model.max_seq_len of the tiny config
    records = [json.loads(line) for line in (run / "ledger" / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["clean"] for r in records if r["e"] == "close"] == [True, True]  # the SIGTERM exit closes clean

    run_recipe("05_evaluate.py", cfg)
    results = sorted((run / "eval").glob("step_*.json"))
    assert results, "no eval results written"
    body = json.loads(results[-1].read_text(encoding="utf-8"))
    assert "rublimp" in json.dumps(body)

    compare = run_recipe("06_compare_costs.py", cfg)
    assert "RUB" in compare.stdout or "₽" in compare.stdout
    assert list((run / "reports").glob("*.png"))

    # a changed model.max_seq_len against the existing shards is refused before any training
    stale = run_recipe("04_pretrain.py", cfg, "model.max_seq_len=32", f"train.steps={STEPS + 20}", check=False)
    assert stale.returncode == 2, stale.stderr[-2000:]
    assert "seq_len 64" in stale.stderr and "model.max_seq_len=32" in stale.stderr
    assert "run recipes/03_shard.py again" in stale.stderr


def check_wandb_history_continues(run_dir: Path, killed_at: int) -> None:
    """The three local W&B folders are one run id; synced in order (W&B keeps the first value of a
    step and drops later ones), the history is steps 1..STEPS once each."""
    runs = [read_offline_run(d) for d in find_offline_runs(run_dir / "wandb")]
    pretrain = sorted((r for r in runs if r.job_type == "pretrain"), key=lambda r: r.start_time)
    # a folder SIGKILLed before wandb flushed its first block holds no record and is not listed
    assert len(pretrain) in (2, 3) and len({r.run_id for r in pretrain}) == 1
    kept: list[int] = []
    for run in pretrain:
        steps = [int(row["_step"]) for row in run.history]
        assert steps == sorted(set(steps)), "each folder logs increasing steps"
        kept += [s for s in steps if not kept or s > kept[-1]]
    assert kept == list(range(1, STEPS + 1))
    # wandb writes offline history in blocks: the SIGKILLed folder may have kept none of it, and the
    # resumed session re-logs what is missing up to its checkpoint (tracking.history.backfill_offline_history)
    if len(pretrain) == 3:
        assert all(int(row["_step"]) <= killed_at for row in pretrain[0].history)
