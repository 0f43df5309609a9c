"""The whole recipe chain on a tiny experiment, as a user runs it, including a SIGKILL mid-training.

Two Pushkin novels -> corpus -> 1k tokenizer -> shards -> a tiny decoder trained 40 steps with a
checkpoint every 10 (killed with SIGKILL after its step-20 checkpoint, then resumed) -> eval ->
ruble comparison table.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.recipe_runner import REPO, recipe_env, run_recipe, tiny_config
from trainer.reporting import TRAIN_LOG
from trainer.resume import finished_steps

pytestmark = pytest.mark.integration


def start_pretrain(cfg: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(REPO / "recipes" / "04_pretrain.py"), "--config", str(cfg)]
    # the run folder's own compilation cache (recipe 04's default), as a user's run has it, not the tests' shared one
    return subprocess.Popen(cmd, cwd=REPO, env=recipe_env(cfg.parent, shared_xla_cache=False), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def kill_after_checkpoint(proc: subprocess.Popen[str], checkpoints: Path, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"pretrain ended (exit {proc.returncode}) before its step-{step} checkpoint:\n"
                                 f"{proc.stdout.read()[-4000:] if proc.stdout else ''}")
        if any(s >= step for s in finished_steps(checkpoints)):
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no step-{step} checkpoint within {timeout} s")


def read_train_log(run: Path) -> list[dict]:
    path = run / TRAIN_LOG
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_recipe_chain_end_to_end_with_sigkill_resume(tmp_path, shared_data):
    cfg = tiny_config(tmp_path)
    run = tmp_path / "runs" / "tiny"

    run_recipe("01_build_corpus.py", cfg)
    corpus = json.loads((run / "corpus" / "manifest.json").read_text(encoding="utf-8"))
    assert corpus["documents"] > 50

    run_recipe("02_train_tokenizer.py", cfg)
    assert (run / "tokenizer" / "spm.model").is_file()
    assert json.loads((run / "tokenizer" / "manifest.json").read_text(encoding="utf-8"))["vocab_size"] == 1000

    run_recipe("03_shard.py", cfg)
    shards = json.loads((run / "shards" / "manifest.json").read_text(encoding="utf-8"))
    assert shards["splits"]["train"]["records"] > 0 and shards["splits"]["validation"]["records"] > 0
    assert list((run / "shards").glob("train-*.tfrecord"))
    # W&B records the shards by reference: no second copy of them anywhere (offline staging included)
    shard_bytes = {p.read_bytes() for p in (run / "shards").glob("*.tfrecord")}
    sizes = {len(data) for data in shard_bytes}
    copies = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != run / "shards"
              and p.stat().st_size in sizes and p.read_bytes() in shard_bytes]
    assert not copies, copies[:3]  # add_dir staged each one (under wandb/.data/artifacts/staging)

    checkpoints = run / "checkpoints"
    first = start_pretrain(cfg)
    kill_after_checkpoint(first, checkpoints, step=20, timeout=420)
    killed_at = max(finished_steps(checkpoints))
    assert killed_at < 40, "the run finished before it could be killed: make it longer"

    resumed = run_recipe("04_pretrain.py", cfg, shared_xla_cache=False)
    assert f"resumed from the checkpoint of step {killed_at}" in resumed.stdout + resumed.stderr
    # captured output is not a terminal: plain progress lines, no carriage-return frames of a bar
    assert "\r" not in resumed.stdout + resumed.stderr
    assert any(line.startswith("pretrain: 40/40 step (100%), ") for line in resumed.stderr.splitlines())
    # the kernel auto picked on this platform is logged (and recorded in the W&B run's summary and config)
    assert "attention kernel: dot_product (model.attention=auto on cpu)" in resumed.stderr
    wandb_cli = Path(sys.executable).parent / "wandb"
    summaries = [json.loads(subprocess.run([str(wandb_cli), "leet", "inspect", "--summary", "--json", str(folder)],
                                           capture_output=True, text=True, timeout=120).stdout or "{}").get("summary", {})
                 for folder in sorted((run / "wandb" / "wandb").glob("offline-run-*"))]
    assert {s.get("model/attention_kernel") for s in summaries} >= {"dot_product"}
    assert max(finished_steps(checkpoints)) == 40
    assert len(finished_steps(checkpoints)) >= 2

    history = read_train_log(run)
    steps = [r["train/step"] for r in history]
    assert steps[-1] == 40
    first_loss, last_loss = history[0]["train/loss"], history[-1]["train/loss"]
    assert last_loss < first_loss - 0.5, f"loss did not fall: {first_loss} -> {last_loss}"

    run_recipe("05_evaluate.py", cfg)
    results = sorted((run / "eval").glob("step_*.json"))
    assert results, "no eval results written"
    body = json.loads(results[-1].read_text(encoding="utf-8"))
    assert "rublimp" in json.dumps(body)

    compare = run_recipe("06_compare_costs.py", cfg)
    assert "RUB" in compare.stdout or "₽" in compare.stdout
    assert list((run / "reports").glob("*.png"))

    # a changed model.max_seq_len against the existing shards is refused before any training
    stale = run_recipe("04_pretrain.py", cfg, "model.max_seq_len=32", "train.steps=60", check=False)
    assert stale.returncode == 2, stale.stderr[-2000:]
    assert "seq_len 64" in stale.stderr and "model.max_seq_len=32" in stale.stderr
    assert "run recipes/03_shard.py again" in stale.stderr
