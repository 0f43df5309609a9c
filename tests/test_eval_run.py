"""Recipe 05 end to end on a small run folder built here through the other stages' contracts:
a SentencePiece tokenizer, validation shards, and a randomly initialised checkpoint.

A random model must sit at chance on every task (its interval must hold the chance level), and
its bits per byte must be what a near-uniform model gives: log2(V) bits per token.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from statistics import NormalDist
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from experiment.config import load_config
from experiment.errors import DataError
from experiment.runfolder import RunFolder
from model.stacking import layout_meta

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RU_SHARED_DATA", REPO.parent / "shared" / "data"))
PUSHKIN = SHARED / "text" / "ruslit" / "prose" / "Pushkin" / "Капитанская дочка.txt"
pytestmark = [pytest.mark.integration, pytest.mark.shared_data,
              pytest.mark.shared_data(PUSHKIN)]

VOCAB = 600
# typeset prose: no-break spaces after initials, in numbers and before dashes, a stress mark, curly quotes
TYPESET = " ".join(["В 1812\u00a0г. А.\u00a0С.\u00a0Пушкин писал:\u00a0— Москва\u0301 и т.\u00a0д. — «ёлка» "
                    "стоила 1\u202f000\u00a0руб.; it\u2019s the ‘book’."] * 6)
LOCAL_TASKS = ["rublimp", "parus", "terra", "rcb", "rucola", "ruworldtree"]


def write_config(tmp_path: Path, **eval_keys: object) -> Path:
    # balanced labels: a random model prefers one answer string, so on skewed labels (RCB: 58% "1")
    # it would score the majority share, not chance; balanced, both are 1/choices
    eval_section = {"tasks": LOCAL_TASKS, "max_items_per_task": 30, "balance_labels": True, "batch_size": 32,
                    **eval_keys}
    cfg = {
        "experiment": {"name": "evaltest", "run_root": str(tmp_path / "runs")},
        "tokenizer": {"vocab_size": VOCAB, "model_type": "unigram"},
        "shards": {"validation_percent": 50.0, "packing": "concat"},
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 64, "max_seq_len": 64},
        "eval": eval_section,
        "wandb": {"project": "eval-tests", "mode": "offline"},
    }
    path = tmp_path / "evaltest.yaml"
    path.write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")  # JSON is YAML
    return path


def build_run_folder(cfg: Any, run_folder: RunFolder) -> None:
    """Tokenizer (B's trainer), shards (C's writer) and a random checkpoint (D's saver), per CONTRACTS.md."""
    import jax
    import sentencepiece as spm
    from flax import nnx

    from data_prep.shards.build import write_splits
    from data_prep.shards.layout import feature_schema
    from experiment.files import atomic_write_bytes, sha256_file
    from experiment.manifest import write_manifest
    from model.llama.model import Decoder
    from tokenizer.loaded import sentencepiece_run_tokenizer
    from tokenizer.train import special_ids, train_sentencepiece, trainer_options
    from trainer import checkpoint

    text = PUSHKIN.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()][:800]
    docs = [{"id": f"doc-{i}", "source": "pushkin", "text": "\n".join(lines[i:i + 20])}
            for i in range(0, len(lines), 20)]

    model_bytes = train_sentencepiece(iter(lines), trainer_options(cfg.tokenizer, 0))
    atomic_write_bytes(run_folder.tokenizer / "spm.model", model_bytes)
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    ids = special_ids(cfg.tokenizer)
    write_manifest(run_folder.tokenizer, "tokenizer", {
        "model_file": "spm.model", "sha256": sha256_file(run_folder.tokenizer / "spm.model"),
        "vocab_size": sp.get_piece_size(), "special_ids": ids})

    shards_cfg = SimpleNamespace(**vars(cfg.shards))
    seq_len = cfg.model.max_seq_len
    splits = write_splits(iter(docs), sentencepiece_run_tokenizer(sp), run_folder.shards, shards_cfg, seq_len,
                          eos_id=ids["eos"], pad_id=ids["pad"], threads=1)
    write_manifest(run_folder.shards, "shards", {
        "tokenizer_sha256": sha256_file(run_folder.tokenizer / "spm.model"), "seq_len": seq_len,
        "packing": "concat", "feature_schema": feature_schema(seq_len, "concat"),
        "validation_percent": cfg.shards.validation_percent, "splits": splits})

    model_cfg = cfg.model
    with nnx.use_eager_sharding(False):
        model = nnx.jit(lambda: Decoder(model_cfg, VOCAB, nnx.Rngs(0)))()
    params = nnx.state(model, nnx.Param)
    state = {"params": params, "opt_state": {}, "step": jax.numpy.int32(7),
             "rng": jax.random.key_data(jax.random.key(0))}
    meta = {"model": vars(model_cfg), "vocab_size": VOCAB, "seq_len": seq_len,
            "tokenizer_sha256": sha256_file(run_folder.tokenizer / "spm.model"),
            "layout": layout_meta(model_cfg.scan_layers)}  # as the trainer records it
    manager = checkpoint.open_manager(run_folder.checkpoints, cfg.train)
    checkpoint.save(manager, 7, state, {}, {}, meta, force=True)
    manager.wait_until_finished()
    manager.close()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory):
    """Run recipe 05's function once on the random checkpoint; tests read its outputs."""
    from eval.run import evaluate
    from tracking.wandb_run import open_run

    tmp_path = tmp_path_factory.mktemp("evalrun")
    heldout = tmp_path / "heldout.txt"
    heldout.write_text(PUSHKIN.read_text(encoding="utf-8")[-3000:], encoding="utf-8")
    typeset = tmp_path / "typeset.txt"
    typeset.write_text(TYPESET, encoding="utf-8")
    cfg = load_config(write_config(tmp_path, heldout_text_files=[str(heldout), str(typeset)], export_hf=True))
    run_folder = RunFolder.for_config(cfg)
    build_run_folder(cfg, run_folder)
    # the config now asks for a longer context than the checkpoint was trained on: eval keeps the trained one
    longer = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, max_seq_len=2 * cfg.model.max_seq_len))
    with open_run(cfg, run_folder, job_type="eval") as wandb_run:
        results = evaluate(longer, run_folder, wandb_run)
    return SimpleNamespace(cfg=cfg, run_folder=run_folder, results=results, tmp_path=tmp_path)


def test_results_files_and_manifest(evaluated) -> None:
    assert evaluated.results["max_len"] == 64  # the checkpoint's trained length, not the config's 128
    eval_dir = evaluated.run_folder.eval
    manifest = json.loads((eval_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["stage"] == "eval" and manifest["latest"] == "step_0000007.json" and manifest["steps"] == [7]
    on_disk = json.loads((eval_dir / "step_0000007.json").read_text(encoding="utf-8"))
    assert on_disk["step"] == 7 and set(on_disk["tasks"]) == set(LOCAL_TASKS)
    markdown = (eval_dir / "step_0000007.md").read_text(encoding="utf-8")
    assert "| rublimp | acc |" in markdown and "## rublimp by group" in markdown and "silver" in markdown


def test_results_say_per_task_whether_the_training_corpus_was_decontaminated(evaluated) -> None:
    # this run folder has no corpus (recipe 01 did not run in it): recipe 05 cannot know, and says so per task
    on_disk = json.loads((evaluated.run_folder.eval / "step_0000007.json").read_text(encoding="utf-8"))
    assert on_disk["corpus_decontamination"] == {
        task: f"unknown: no finished corpus in {evaluated.run_folder.corpus}" for task in LOCAL_TASKS}


def test_hf_export_of_the_checkpoint(evaluated) -> None:
    export = Path(evaluated.results["hf_export"])
    assert export == evaluated.run_folder.eval / "hf" / "step_0000007"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (export / name).is_file(), name
    config = json.loads((export / "config.json").read_text(encoding="utf-8"))
    assert config["vocab_size"] == VOCAB and config["num_hidden_layers"] == 1


def test_random_model_bits_per_byte_is_log2_vocab_per_token(evaluated) -> None:
    for acc in [evaluated.results["validation"], *evaluated.results["heldout"].values()]:
        assert acc["tokens"] > 100 and acc["bytes"] > acc["tokens"]
        # a random init with std 0.02 is all but uniform: ln(V) nats per token
        assert acc["nats_per_token"] == pytest.approx(math.log(VOCAB), rel=0.01)
        expected = acc["nats_per_token"] * acc["tokens"] / math.log(2) / acc["bytes"]
        assert acc["bits_per_byte"] == pytest.approx(expected, rel=1e-9)
        assert acc["perplexity"] == pytest.approx(VOCAB, rel=0.05)


def test_heldout_text_is_scored_as_recipes_01_and_03_would_shard_it(evaluated) -> None:
    """A no-break-space-rich held-out file is normalized as recipe 01 normalizes the corpus and counted in
    the tokens recipe 03 would write for it: the same tokens and UTF-8 bytes either way."""
    from data_prep.corpus.normalize import normalize_text
    from tokenizer.loaded import load_run_tokenizer

    tok = load_run_tokenizer(evaluated.run_folder.tokenizer)
    corpus_text = normalize_text(TYPESET)  # recipe 01
    assert "\u00a0" in TYPESET and "\u00a0" not in corpus_text
    sharded = tok.encode_batch([corpus_text])[0]  # recipe 03
    scored = evaluated.results["heldout"][str(evaluated.tmp_path / "typeset.txt")]
    assert scored["bytes"] == len(corpus_text.encode("utf-8")) and scored["tokens"] == len(sharded)


def bonferroni_z(results: dict[str, Any]) -> float:
    """z of a 95% family-wise interval over every accuracy checked (about 20 of them): at 95% each,
    one of 20 intervals misses the chance level by luck more often than not."""
    count = sum(1 for r in results["tasks"].values() for m in r["metrics"] if m != "mcc")
    return NormalDist().inv_cdf(1 - 0.05 / 2 / count)


@pytest.mark.parametrize("task", LOCAL_TASKS)
def test_random_model_scores_at_chance(evaluated, task: str) -> None:
    from eval.stats import wilson_interval

    z = bonferroni_z(evaluated.results)
    for name, metric in evaluated.results["tasks"][task]["metrics"].items():
        if task == "rublimp" and name != "acc":
            continue  # per-byte / per-token means of an untrained model follow the sentences' lengths, not chance
        if name == "mcc" and metric["ci95"] is None:  # one answer throughout: undefined, not [0, 0]
            assert metric["undefined"] and metric["value"] == 0.0
            continue
        if name == "mcc":
            lo, hi = metric["ci95"]
        else:
            lo, hi = wilson_interval(metric["value"] * metric["n"], metric["n"], z=z)
        assert lo <= metric["chance"] <= hi, f"{task} {name}: {metric['value']:.3f} [{lo:.3f}, {hi:.3f}]"


def test_rublimp_reports_every_phenomenon_with_an_interval(evaluated) -> None:
    groups = evaluated.results["tasks"]["rublimp"]["groups"]
    assert len(groups) == len(list((SHARED / "bench" / "rublimp").glob("*.csv")))
    for summary in groups.values():
        assert summary["n"] == 30 and summary["chance"] == 0.5
        assert 0.0 <= summary["ci95"][0] <= summary["value"] <= summary["ci95"][1] <= 1.0


def test_evaluate_model_gives_flat_metrics_for_the_trainer(evaluated) -> None:
    from eval.run import evaluate_model
    from trainer.trained_model import load_trained_model

    model, _, _ = load_trained_model(evaluated.run_folder)
    metrics = evaluate_model(model, evaluated.cfg, evaluated.run_folder, step=7)
    assert {"eval/val_bpb", "eval/val_ppl", "eval/rublimp/acc", "eval/seconds"} <= set(metrics)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    # the held-out texts are scored whole during training too, to the figure recipe 05 gives them
    for name, acc in evaluated.results["heldout"].items():
        assert metrics[f"eval/heldout/{Path(name).stem}/bpb"] == pytest.approx(acc["bits_per_byte"], rel=1e-5)


def test_a_checkpoint_trained_with_another_tokenizer_is_refused(evaluated, monkeypatch) -> None:
    from eval.run import evaluate
    from trainer import trained_model

    real = trained_model.load_trained_model

    def other_tokenizer(run_folder, step=None):
        model, step, meta = real(run_folder, step)
        return model, step, {**meta, "tokenizer_sha256": "0" * 64}

    monkeypatch.setattr(trained_model, "load_trained_model", other_tokenizer)
    with pytest.raises(DataError, match="trained with tokenizer 000000000000"):
        evaluate(evaluated.cfg, evaluated.run_folder, None)


def test_wandb_summary_and_table_are_logged(evaluated) -> None:
    import subprocess

    from tracking.readback import inspect_command

    runs = sorted((evaluated.run_folder.wandb / "wandb").glob("offline-run-*"))
    assert runs, "no offline W&B run folder"
    summary = json.loads(subprocess.run(inspect_command(runs[-1], summary=True), capture_output=True,
                                        text=True, timeout=120, check=True).stdout)["summary"]
    assert summary["eval/step"] == 7
    assert summary["eval/rublimp/acc"] == pytest.approx(
        evaluated.results["tasks"]["rublimp"]["metrics"]["acc"]["value"])
    assert summary["eval/val_bpb"] == pytest.approx(evaluated.results["validation"]["bits_per_byte"])
    assert summary["eval/results"]["_type"] == "table-file"


def test_shards_of_another_tokenizer_are_refused(evaluated) -> None:
    from eval.run import evaluate
    from experiment.manifest import read_manifest, write_manifest

    shards = evaluated.run_folder.shards
    manifest = read_manifest(shards, "shards", "recipes/03_shard.py")
    body = {k: v for k, v in manifest.items() if k not in ("stage", "schema_version", "created_at")}
    try:
        write_manifest(shards, "shards", {**body, "tokenizer_sha256": "1" * 64})
        with pytest.raises(DataError, match="made with tokenizer 111111111111"):
            evaluate(evaluated.cfg, evaluated.run_folder, None)
    finally:
        write_manifest(shards, "shards", body)


def test_baselines_random_init_and_answers_are_reported(evaluated) -> None:
    """Every task carries its no-model baselines, the headline against the strongest, the random-init
    model's score on the same items and the answers given; the report and W&B show them."""
    for task, result in evaluated.results["tasks"].items():
        baselines = result["baselines"]
        assert {"chance", "fewer_bytes", "fewer_tokens", "strongest"} <= set(baselines), task
        assert result["vs_strongest_baseline"]["baseline"] == baselines["strongest"]
        random_acc = result["random_init"]["metrics"]["acc"]
        # the trainer's step-0 init (trainer.step.initial_params), the config's seed: the checkpoint names none
        assert result["random_init"]["seed"] == evaluated.cfg.experiment.seed, task
        assert result["random_init"]["init"] == "trainer.step.initial_params" and result["random_init"]["run_step0"]
        assert random_acc["n"] == result["metrics"]["acc"]["n"] and 0.0 <= random_acc["value"] <= 1.0
        assert abs(sum(result["answers"]["predicted"].values()) - 1.0) < 1e-5
    rublimp = evaluated.results["tasks"]["rublimp"]
    assert {"acc", "acc_per_token", "acc_norm_bytes"} <= set(rublimp["metrics"])
    assert all("baselines" in g for g in rublimp["groups"].values())
    assert set(rublimp["random_init"]["groups"]) == set(rublimp["groups"])
    markdown = (evaluated.run_folder.eval / "step_0000007.md").read_text(encoding="utf-8")
    assert "## Against the strongest baseline" in markdown and "## Answers given" in markdown
    assert f"initialised by the trainer's own code with seed {evaluated.cfg.experiment.seed};" in markdown
    from eval.run import flat_metrics

    flat = flat_metrics(evaluated.results)
    assert {"eval/rublimp/random_init_acc", "eval/rucola/one_answer", "eval/rucola/baseline_strongest",
            "eval/rucola/acc_minus_strongest_baseline"} <= set(flat)
