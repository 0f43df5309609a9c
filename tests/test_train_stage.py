"""Stages: recipe 04 with ``train.branch_data: own`` starts from a parent's checkpoint of step N with data of its
own (shards packed by recipe 03 at a longer ``model.max_seq_len`` with the parent's tokenizer, mixed with
another set by a schedule), RoPE scaled for the longer context, and a stream that begins at step N; it trains,
resumes bitwise after SIGKILL, and its ledger starts from the parent's rubles up to N."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from cost.ledger_format import LEDGER_FILE
from cost.ledger_pricing import summarize_ledger, summarize_ledger_at
from tests.fixture_run import (
    PRETRAINED_TRAIN,
    assert_same_checkpoint,
    assert_same_log,
    checkpoint_contents,
    fixture_config,
    log_records,
    pretrained_copy,
)
from tests.recipe_runner import error_line, in_process_devices, run_recipe, signal_when, start_pretrain
from tracking.readback import find_offline_runs, read_offline_run
from trainer.checkpoint_integrity import CHECKSUMS

pytestmark = pytest.mark.integration
N, END, CHANGE = 3, 15, 9  # the parent's step the stage starts from, its last step, its mixture's change
PARENT_LEN, STAGE_LEN, BATCH = 64, 128, 8


def stage_config(parent_config: Path, other_shards: Path) -> Path:
    """The stage's YAML beside the parent's: own shards (recipe 03 here, at STAGE_LEN, half the documents held
    out), mixed 3 : 1 with ``other_shards`` and 1 : 1 from step CHANGE; RoPE slowed 2x (linear)."""
    cfg = yaml.safe_load(parent_config.read_text(encoding="utf-8"))
    cfg["experiment"]["name"] = "stage"
    cfg["shards"]["validation_percent"] = 50.0
    cfg["model"].update(max_seq_len=STAGE_LEN, rope_scaling="linear", rope_factor=STAGE_LEN / PARENT_LEN)
    cfg["train"].update({"steps": END, "checkpoint_every": 3, "keep_checkpoints": 10,
                    "schedule": "constant", "branch_from": "tiny", "branch_step": N, "branch_data": "own",
                    "mixture": [{"name": "own", "weight": 3.0}, {"name": "other", "shards": str(other_shards),
                                                                  "weight": 1.0}],
                    "mixture_schedule": [{"step": CHANGE, "weights": {"own": 1.0, "other": 1.0}}]})
    assert cfg["train"]["batch_size"] == BATCH
    config = parent_config.parent / "stage.yaml"
    config.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return config


@pytest.fixture(scope="module")
def stage(fixture_pretrained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The parent (a copy of conftest.py's ``fixture_pretrained``: 6 steps at 64 tokens, checkpoints 3 and 6), the
    stage's shards packed at 128 by recipe 03 (the parent's corpus and tokenizer linked in), a second set (a copy
    of them) and the stage trained from step 3 to 15 uninterrupted; the stage's config."""
    root = tmp_path_factory.mktemp("stage")
    parent_config = pretrained_copy(fixture_pretrained, root)
    other = root / "other-shards"
    config = stage_config(parent_config, other)
    run_recipe("03_shard.py", config)
    shutil.copytree(root / "runs" / "stage" / "shards", other)
    trained = run_recipe("04_pretrain.py", config)
    (root / "stage-pretrain.stderr").write_text(trained.stderr, encoding="utf-8")  # its progress lines
    return config


def test_recipe_03_packs_the_stage_at_its_length_with_the_parents_tokenizer(stage: Path) -> None:
    runs = stage.parent / "runs"
    assert (runs / "stage" / "tokenizer").resolve() == (runs / "tiny" / "tokenizer").resolve()
    assert (runs / "stage" / "corpus").resolve() == (runs / "tiny" / "corpus").resolve()
    assert not (runs / "stage" / "shards").is_symlink()
    manifest = json.loads((runs / "stage" / "shards" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["seq_len"] == STAGE_LEN


def test_the_stage_trains_its_own_stream_from_step_n_with_the_scheduled_shares(stage: Path) -> None:
    runs = stage.parent / "runs"
    records = log_records(runs / "stage")
    assert [r["train/step"] for r in records] == list(range(N + 1, END + 1))
    # the shares counted from the batches the loader gave: 3 : 1 until CHANGE, then 1 : 1
    assert [r["data/own/share"] for r in records] == [0.75 if s <= CHANGE else 0.5 for s in range(N + 1, END + 1)]
    assert records[-1]["data/other/tokens_seen"] == ((CHANGE - N) * 2 + (END - CHANGE) * 4) * STAGE_LEN
    _, items = checkpoint_contents(runs / "stage", END)
    assert items["loader"]["stream_start_step"] == N and items["loader"]["next_global_batch"] == END - N
    assert items["loader"]["mixture_schedule"] == [[CHANGE, {"own": 1.0, "other": 1.0}]]
    assert items["meta"]["seq_len"] == STAGE_LEN and items["meta"]["model"]["rope_scaling"] == "linear"
    assert records[0]["train/loss"] > records[-1]["train/loss"]
    # tokens seen go on from the parent's at N (at its length), as the ledger counts them
    assert records[-1]["train/tokens_seen"] == N * BATCH * PARENT_LEN + (END - N) * BATCH * STAGE_LEN
    (run,) = [r for r in map(read_offline_run, find_offline_runs(runs / "stage" / "wandb")) if r.job_type == "pretrain"]
    assert run.config["branch_data"] == "own" and run.config["branch_step"] == N


def test_the_stages_progress_line_counts_its_own_steps_from_n(stage: Path) -> None:
    """Its last line (the stage's stderr is no terminal): the absolute step, and 100% of the END - N steps it
    trained from its parent's step N; not a share of steps 0..END, which read N/END at its first step."""
    printed = (stage.parent / "stage-pretrain.stderr").read_text(encoding="utf-8")
    assert f"pretrain: {END}/{END} step (100% of {END - N} from step {N}), " in printed, printed[-2000:]


def test_the_stage_ledger_starts_from_the_parents_rubles_at_n(stage: Path) -> None:
    runs = stage.parent / "runs"
    _, items = checkpoint_contents(runs / "tiny", N)
    at_n = summarize_ledger_at(runs / "tiny" / "ledger", items["ledger"])
    total = summarize_ledger(runs / "stage" / "ledger")
    inherit = [json.loads(line) for line in (runs / "stage" / "ledger" / LEDGER_FILE).read_text().splitlines()
               if json.loads(line)["e"] == "inherit"]
    assert len(inherit) == 1 and at_n.rub_total > 0
    assert total.tokens == N * BATCH * PARENT_LEN + (END - N) * BATCH * STAGE_LEN and total.last_step == END
    assert total.rub_total > at_n.rub_total


def test_held_out_bits_per_byte_beyond_the_parents_length_fall(stage: Path) -> None:
    """Recipe 05 on the stage's first checkpoint after N and on its last: bits per byte at positions 64-128 (past
    what the parent trained at) on the stage's held-out documents fall."""
    bpb = {}
    for step in (N + 3, END):
        run_recipe("05_evaluate.py", stage, f"eval.checkpoint_step={step}", "eval.tasks=[]",
                   f"eval.bpb_position_buckets=[0,{PARENT_LEN}]", "eval.max_validation_batches=null",
                   "eval.random_init_baseline=false")
        results = json.loads((stage.parent / "runs" / "stage" / "eval" / f"step_{step:07d}.json").read_text())
        buckets = results["validation_by_position"]["buckets"]
        assert [(b["start"], b["end"]) for b in buckets] == [(0, PARENT_LEN), (PARENT_LEN, STAGE_LEN)]
        bpb[step] = buckets[1]["bits_per_byte"]
    assert bpb[END] < bpb[N + 3]


def test_a_stage_killed_after_a_checkpoint_resumes_bitwise(stage: Path, tmp_path: Path) -> None:
    """The stage again in another run root (the parent and the stage's shards copied), SIGKILLed once its
    checkpoint of step CHANGE is written, then rerun: its log and last checkpoint are the uninterrupted stage's."""
    root = tmp_path / "killed"
    runs = stage.parent / "runs"
    shutil.copytree(runs / "tiny", root / "runs" / "tiny")
    shutil.copytree(runs / "stage" / "shards", root / "runs" / "stage" / "shards")
    shutil.copytree(stage.parent / "other-shards", root / "other-shards")
    config = stage_config(fixture_config(root, train=PRETRAINED_TRAIN), root / "other-shards")
    output = tmp_path / "killed.log"
    proc = start_pretrain(config, output, devices=in_process_devices())  # as many devices as the uninterrupted run
    saved = root / "runs" / "stage" / "checkpoints" / str(CHANGE) / CHECKSUMS  # written last: the step is finished
    assert signal_when(proc, saved.is_file, output=output) == -9
    resumed = run_recipe("04_pretrain.py", config)
    assert f"resumed from the checkpoint of step {CHANGE}" in resumed.stderr
    assert f"pretrain: {END}/{END} step (100% of {END - CHANGE} from step {CHANGE}), " in resumed.stderr
    assert_same_log(root / "runs" / "stage", runs / "stage", END, first=N + 1)
    assert_same_checkpoint(root / "runs" / "stage", runs / "stage", END)


def test_a_stage_may_not_change_the_models_shape_or_a_branch_its_length(stage: Path) -> None:
    runs = stage.parent / "runs"
    shutil.copytree(runs / "stage" / "shards", runs / "wider" / "shards")
    proc = run_recipe("04_pretrain.py", stage, "experiment.name=wider", "model.d_ff=96", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert error_line(proc).endswith("(d_ff: 192 -> 96): a stage (train.branch_data=own) keeps its parent's model "
                                     "shape and tokenizer: it may change model.max_seq_len, the model's rope_* keys "
                                     "and model.context_attention")
    proc = run_recipe("04_pretrain.py", stage, "experiment.name=decay", "train.branch_data=parent",
                      "train.mixture=[]", "train.mixture_schedule=[]", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "seq_len" in error_line(proc) or "max_seq_len" in error_line(proc), error_line(proc)
    assert not (runs / "wider" / "checkpoints").exists() and not (runs / "wider" / "ledger").exists()
    proc = run_recipe("02_train_tokenizer.py", stage, check=False)  # a stage's tokenizer is its parent's
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert error_line(proc).startswith(f"error: {runs / 'stage' / 'tokenizer'} is a link to "), error_line(proc)


def test_a_decay_branch_of_the_stage_reads_on_in_the_stages_stream(stage: Path) -> None:
    """A decay branch (``branch_data: parent``) from the stage's step CHANGE keeps the stage's stream, which began
    at N (read from the stage's checkpoint): with the stage's schedule it retraces the stage bitwise."""
    runs = stage.parent / "runs"
    run_recipe("04_pretrain.py", stage, "experiment.name=stage-decay", "train.branch_from=stage",
               f"train.branch_step={CHANGE}", "train.branch_data=parent")
    stage_log = {r["train/step"]: r for r in log_records(runs / "stage")}
    decay = log_records(runs / "stage-decay")
    assert [r["train/step"] for r in decay] == list(range(CHANGE + 1, END + 1))
    for key in ("train/loss", "train/tokens_seen", "data/own/share", "data/other/tokens_seen"):
        assert [r[key] for r in decay] == [stage_log[r["train/step"]][key] for r in decay], key
    _, items = checkpoint_contents(runs / "stage-decay", END)
    assert items["loader"]["stream_start_step"] == N and items["meta"]["stream_start_step"] == N
    # its schedule names steps of that stream: one at or before N is one line before anything is written
    proc = run_recipe("04_pretrain.py", stage, "experiment.name=stage-decay-2", "train.branch_from=stage",
                      f"train.branch_step={CHANGE}", "train.branch_data=parent",
                      f"train.mixture_schedule=[{{step: {N}, weights: {{own: 1.0, other: 1.0}}}}]", check=False)
    assert proc.returncode == 2 and error_line(proc).startswith(
        f"error: config key 'train.mixture_schedule[0].step': {N} must be above {N}"), proc.stderr[-2000:]
    assert not (runs / "stage-decay-2" / "checkpoints").exists() and not (runs / "stage-decay-2" / "wandb").exists()
