"""Continued pretraining: recipe 04 from a Hugging Face folder (model.init_from), vocabulary adaptation,
the embeddings-only phase.

The base "HF folder" is built without transformers: our own Llama exported by its HF adapter
(config.json + model.safetensors) and a byte-level BPE tokenizer.json trained with the tokenizers
library on a few Russian and English lines.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from model.llama.config import LlamaConfig
from model.vocab_adaptation import adapt_embeddings
from tests.fixture_run import assert_same_checkpoint, checkpoint_contents, run_copy
from tests.recipe_runner import error_line, run_recipe

BASE_VOCAB = 300
# the tiny experiment's shape (tests/configs/tiny.yaml), so the YAML's explicit model keys agree
BASE_MODEL = LlamaConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=64,
                         tie_embeddings=False)
LINES = ["Мой дядя самых честных правил, когда не в шутку занемог.",
         "Он уважать себя заставил и лучше выдумать не мог.",
         "The quick brown fox jumps over the lazy dog.", "Капитанская дочка, Дубровский, повести Белкина."] * 20


def hf_base_folder(folder: Path, model_cfg: Any) -> Path:
    """``folder`` as a Hugging Face model folder: ``model_cfg``'s family's model (seed 7) exported by its adapter,
    and a byte-level BPE tokenizer.json of BASE_VOCAB pieces."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from model.registry import family_of

    family = family_of(model_cfg)
    state_dict, config = family.hf_adapter.export(family.init(model_cfg, BASE_VOCAB, seed=7), model_cfg, BASE_VOCAB,
                                                  {"eos": 1})
    save_file(state_dict, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(LINES, trainers.BpeTrainer(vocab_size=BASE_VOCAB, special_tokens=["<unk>", "</s>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert tokenizer.get_vocab_size() == BASE_VOCAB
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_base_folder(tmp_path_factory.mktemp("base-hf"), BASE_MODEL)


def continue_config(stages: Path, root: Path, base: Path, **train: Any) -> Path:
    return run_copy(stages, root, model={"init_from": str(base), "vocab_adaptation": "mean"},
                    train={"warmup_steps": 2, "checkpoint_every": 100, "log_every": 1, **train})


def param_of(arrays: dict[str, np.ndarray], path: str) -> np.ndarray:
    """A parameter of ``tests.fixture_run.checkpoint_contents`` by its path in the model."""
    return arrays[f"params{path}['value']"]


def run_texts(run_dir: Path) -> list[str | None]:
    from experiment.runfolder import RunFolder
    from trainer.init_from import run_token_texts

    return run_token_texts(RunFolder(run_dir))[0]


def test_mean_adaptation_step0_then_exact_resume(fixture_stages: Path, base_folder: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    config = continue_config(fixture_stages, tmp_path / "a", base_folder, steps=0)
    run_recipe("04_pretrain.py", config)
    run_dir = tmp_path / "a" / "runs" / "tiny"
    arrays, items = checkpoint_contents(run_dir, 0)
    param = functools.partial(param_of, arrays)
    base = load_file(str(base_folder / "model.safetensors"))
    # every weight but the embeddings is the base model's, bit for bit
    # (layer 1 of the stacked w_down: the HF tensors were stacked on the way in)
    assert np.array_equal(param("['blocks']['mlp']['w_down']")[1], base["model.layers.1.mlp.down_proj.weight"].T)
    assert np.array_equal(param("['final_norm']['scale']"), base["model.norm.weight"])
    embed, head = param("['embed']"), param("['lm_head']").T
    assert embed.shape == (600, 64)
    encode = Tokenizer.from_file(str(base_folder / "tokenizer.json"))
    pieces = {i: encode.encode(t, add_special_tokens=False).ids for i, t in enumerate(run_texts(run_dir)) if t}
    whole = next(i for i, p in pieces.items() if len(p) == 1)
    split = next(i for i, p in pieces.items() if len(p) >= 3)
    for table, base_table in ((embed, base["model.embed_tokens.weight"]), (head, base["lm_head.weight"])):
        assert np.array_equal(table[whole], base_table[pieces[whole][0]])  # present in both: copied exactly
        want = base_table[pieces[split]].astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(table[split], want, rtol=1e-6, atol=1e-7)
    lineage = items["meta"]["init_from"]
    assert lineage["files"]["model.safetensors"] == hashlib.sha256(
        (base_folder / "model.safetensors").read_bytes()).hexdigest()
    assert lineage["vocab_adaptation"]["copied"] > 0 and lineage["vocab_adaptation"]["averaged"] > 0
    assert lineage["max_position_embeddings"] == BASE_MODEL.max_seq_len  # what an export of this run declares
    assert json.loads((run_dir / "checkpoints" / "init_from.json").read_text(encoding="utf-8")) == lineage

    # the next session resumes from step 0 (init_from is not read again) and trains exactly like one
    # that starts from the base model and trains straight through
    run_recipe("04_pretrain.py", config, "train.steps=4")
    straight = continue_config(fixture_stages, tmp_path / "b", base_folder, steps=4)
    run_recipe("04_pretrain.py", straight)
    assert_same_checkpoint(run_dir, tmp_path / "b" / "runs" / "tiny", 4)
    trained, _ = checkpoint_contents(run_dir, 4)
    assert not np.array_equal(param_of(trained, "['final_norm']['scale']"), base["model.norm.weight"])


def test_a_branch_of_a_continued_run_takes_its_model_from_the_parent_checkpoint(
        fixture_stages: Path, base_folder: Path, tmp_path: Path) -> None:
    """A branch's YAML is its parent's, model.init_from included: its first session restores the parent's
    checkpoint and must not read (or need) the base model again."""
    import shutil

    base = shutil.copytree(base_folder, tmp_path / "base")
    config = continue_config(fixture_stages, tmp_path / "a", base, steps=2, checkpoint_every=1, warmup_steps=1)
    run_recipe("04_pretrain.py", config)
    shutil.rmtree(base)
    run_recipe("04_pretrain.py", config, "experiment.name=branch", "train.branch_from=tiny", "train.branch_step=1")
    runs = tmp_path / "a" / "runs"
    _, parent = checkpoint_contents(runs / "tiny", 1)
    _, branch = checkpoint_contents(runs / "branch", 2)
    assert branch["meta"]["init_from"] == parent["meta"]["init_from"]


def test_shape_key_against_config_json_is_one_error_line(fixture_stages: Path, base_folder: Path,
                                                         tmp_path: Path) -> None:
    config = continue_config(fixture_stages, tmp_path, base_folder, steps=0)
    proc = run_recipe("04_pretrain.py", config, "model.d_ff=128", check=False)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "model.d_ff" in line and "128" in line and "192" in line and "config.json" in line
    proc = run_recipe("04_pretrain.py", config, "model.vocab_adaptation=none", check=False)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "model.vocab_adaptation" in line and "600" in line and str(BASE_VOCAB) in line


def test_adaptation_rules() -> None:
    base = np.arange(12, dtype=np.float32).reshape(6, 2)
    vocab = {"a": [0], "bc": [1, 2], "xyz": [3, 4, 5]}
    texts = ["bc", None, "a", "xyz", "<nothing>"]

    def encode(text: str) -> list[int]:
        return vocab.get(text, [])

    mean, report = adapt_embeddings({"embed": base}, texts, encode, "mean", special_map={1: 5})
    assert np.array_equal(mean["embed"][2], base[0]) and np.array_equal(mean["embed"][1], base[5])
    np.testing.assert_allclose(mean["embed"][0], base[1:3].mean(axis=0))
    np.testing.assert_allclose(mean["embed"][3], base[3:6].mean(axis=0))
    assert (report.copied, report.averaged, report.unknown) == (2, 2, 1)
    random, report = adapt_embeddings({"embed": base}, texts, encode, "random")
    assert (report.copied, report.averaged, report.unknown) == (0, 0, 5)
    assert not np.isclose(random["embed"][:4], mean["embed"][:4]).any()  # the unknown row is fresh in both
    assert random["embed"].dtype == np.float32 and random["embed"].shape == (5, 2)


@pytest.mark.parametrize("groups", [{"embeddings_only_steps": 2}, {"trainable": "embeddings"}])
def test_embeddings_only_steps_freeze_the_body_then_train_it(groups: dict[str, Any]) -> None:
    """The first N steps (or every step under trainable=embeddings) change only the embeddings and head."""
    from experiment.sections.train import TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    model = dataclasses.replace(BASE_MODEL, d_model=32, n_layers=1, d_ff=64, max_seq_len=16)
    train = TrainConfig(steps=10, batch_size=4, learning_rate=1e-2, warmup_steps=0, **groups)
    prog = TrainProgram(model, train, 64, build_mesh(train.mesh), seed=0)
    rows = np.random.default_rng(0).integers(0, 64, (4, 17)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, prog.batch_sharding)

    def leaves(state: dict[str, Any]) -> dict[str, np.ndarray]:
        return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(state["params"])}

    state = prog.init_state()
    start = leaves(state)
    body = [k for k in start if not k.startswith(("['embed']", "['lm_head']"))]
    embed, head = (next(k for k in start if k.startswith(name)) for name in ("['embed']", "['lm_head']"))
    # what the log and W&B say trains: the two tables while the body is frozen, of every parameter
    assert prog.param_trainable_frozen == start[embed].size + start[head].size
    assert sum(v.size for v in start.values()) > prog.param_trainable_frozen
    for _ in range(2):
        state, _ = prog.step(state, batch)
        now = leaves(state)
        assert all(np.array_equal(now[k], start[k]) for k in body)
        assert not np.array_equal(now[embed], start[embed]) and not np.array_equal(now[head], start[head])
    state, _ = prog.step(state, batch)
    now = leaves(state)
    changed = [not np.array_equal(now[k], start[k]) for k in body]
    assert all(changed) if "embeddings_only_steps" in groups else not any(changed)


def test_adapting_to_an_adopted_tokenizer_json_is_one_error_line(tmp_path: Path) -> None:
    """An adopted tokenizer.json is the base's own vocabulary: mean/random say to use none, naming the folder."""
    from experiment.errors import ConfigError
    from experiment.runfolder import RunFolder
    from experiment.stages import TOKENIZER
    from trainer.init_from import run_token_texts

    folder = RunFolder(tmp_path)
    TOKENIZER.write_manifest(folder.tokenizer, {"sha256": "ab", "vocab_size": 300, "kind": "hf_tokenizer_json"})
    with pytest.raises(ConfigError, match=r"^config key 'model.vocab_adaptation': .* holds an adopted "
                                          r"hf_tokenizer_json tokenizer: use model.vocab_adaptation=none with it$"):
        run_token_texts(folder)


def test_continued_pretraining_trains_on_another_experiments_shards_through_data_from(
        fixture_stages: Path, tmp_path: Path, base_folder: Path) -> None:
    """A Hugging Face base model, continued on the fixture experiment's data without recipes 01-03 of its
    own (experiment.data_from): it trains, and the data it reads through the links stays byte-identical."""
    import shutil

    from tests.fixture_run import fixture_config

    data = tmp_path / "runs" / "tiny"
    shutil.copytree(fixture_stages / "runs" / "tiny", data, ignore=shutil.ignore_patterns("wandb"))

    def hashes() -> dict[str, str]:
        return {str(p.relative_to(data)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(data.rglob("*")) if p.is_file() and ".locks" not in p.parts}

    before = hashes()
    config = fixture_config(tmp_path, experiment={"name": "cpt", "data_from": "tiny"},
                            model={"init_from": str(base_folder), "vocab_adaptation": "mean"},
                            train={"steps": 3, "checkpoint_every": 3, "warmup_steps": 1, "log_every": 1},
                            wandb={"mode": "disabled"})
    run_recipe("04_pretrain.py", config)
    cpt = tmp_path / "runs" / "cpt"
    assert all((cpt / stage).is_symlink() and (cpt / stage).resolve() == data / stage
               for stage in ("corpus", "tokenizer", "shards"))
    _, items = checkpoint_contents(cpt, 3)
    assert items["meta"]["init_from"]["files"]["model.safetensors"] == hashlib.sha256(
        (base_folder / "model.safetensors").read_bytes()).hexdigest()  # the base model's weights, not a fresh init
    losses = [json.loads(line)["train/loss"] for line in (cpt / "train_log.jsonl").read_text("utf-8").splitlines()
              if "train/loss" in json.loads(line)]
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert hashes() == before


def test_the_switch_to_full_training_is_logged_once_with_its_step(caplog: pytest.LogCaptureFixture) -> None:
    """train.embeddings_only_steps=3: the hook is due at 3, 6, ...; it says once, at step 3, that step 4 trains
    everything, and records that step in W&B's summary; under trainable=embeddings it never fires."""
    import logging
    from types import SimpleNamespace

    from experiment.sections.train import TrainConfig
    from trainer.hooks import BodyUnfreezes

    hook, summary = BodyUnfreezes(), {}
    train = TrainConfig(steps=10, embeddings_only_steps=3)
    assert hook.schedule(TrainConfig(steps=10, trainable="embeddings", embeddings_only_steps=3)).every == 0
    schedule = hook.schedule(train)
    with caplog.at_level(logging.INFO, logger="trainer"):
        for step in range(1, 10):
            ctx = SimpleNamespace(step=step, at_end=False, signalled=False, cfg=SimpleNamespace(train=train),
                                  meta={"n_params": 1_234_567},
                                  wandb_run=SimpleNamespace(summary=summary))
            if schedule.due(ctx):
                hook(ctx)
    lines = [r.getMessage() for r in caplog.records if "warm-up done" in r.getMessage()]
    assert lines == ["step 3: embeddings-only warm-up done (train.embeddings_only_steps); from step 4 all 1.23M "
                     "parameters train"]
    assert summary == {"train/full_training_from_step": 4}


def test_recipe_05_scores_the_base_model_beside_the_trained_step(fixture_stages: Path, base_folder: Path,
                                                                 tmp_path: Path) -> None:
    """A continued run's evaluation re-imports the base model it started from and scores it on the same texts and
    items: at step 0 (the base as imported) its figures are the trained step's exactly; after training, the report
    gives the change in bits per byte; a base whose files changed is named and not scored."""
    import shutil

    from eval.run import flat_metrics

    base = shutil.copytree(base_folder, tmp_path / "base")
    config = continue_config(fixture_stages, tmp_path / "a", base, steps=0)
    # the fixture's validation split is empty: a held-out text gives the bits per byte
    text = sorted((Path(__file__).parent / "fixtures" / "corpus").glob("ru_*.txt"))[0]
    evaluate = ("05_evaluate.py", config, "eval.random_init_baseline=false", f"eval.heldout_text_files=[{text}]")
    run_recipe("04_pretrain.py", config)
    run_recipe(*evaluate)
    eval_dir = tmp_path / "a" / "runs" / "tiny" / "eval"
    step0 = json.loads((eval_dir / "step_0000000.json").read_text(encoding="utf-8"))
    at_start = step0["base_model"]
    assert at_start["heldout"] == step0["heldout"]
    assert at_start["tasks"], "no task was scored with the base model"
    for task, scored in at_start["tasks"].items():
        assert scored["metrics"]["acc"] == step0["tasks"][task]["metrics"]["acc"]
        assert step0["tasks"][task]["baselines"]["base_model"]["value"] == scored["metrics"]["acc"]["value"]

    run_recipe("04_pretrain.py", config, "train.steps=4")
    run_recipe(*evaluate)
    step4 = json.loads((eval_dir / "step_0000004.json").read_text(encoding="utf-8"))
    assert step4["base_model"]["heldout"] == at_start["heldout"]  # the same base on the same text
    name = str(text)
    change = step4["heldout"][name]["bits_per_byte"] - at_start["heldout"][name]["bits_per_byte"]
    assert change < 0  # four steps on this Russian text lowered it
    assert flat_metrics(step4)[f"eval/base_model/heldout/{text.stem}/bpb"] == at_start["heldout"][name]["bits_per_byte"]
    report = (eval_dir / "step_0000004.md").read_text(encoding="utf-8")
    assert "## Against the base model" in report and f"{change:+.4f}" in report

    config_json = base / "config.json"
    config_json.write_text(config_json.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    run_recipe(*evaluate)
    again = json.loads((eval_dir / "step_0000004.json").read_text(encoding="utf-8"))
    assert "base_model" not in again and "config.json" in again["base_model_skipped"]
    assert again["heldout"] == step4["heldout"]


def test_a_mixture_of_experts_base_is_continued_and_evaluated_with_its_balancing_loss_logged(
        fixture_stages: Path, tmp_path: Path) -> None:
    """A Qwen3-MoE base (our tiny qwen3_moe exported as a Hugging Face folder) continued on the fixture
    experiment's data (experiment.data_from) by recipe 04, then scored by recipe 05: every logged step has the
    load-balancing and router-z losses, and the evaluation reads the MoE checkpoint."""


    from model.registry import get_family
    from tests.fixture_run import data_from_config

    (tmp_path / "moe-base").mkdir()
    base = hf_base_folder(tmp_path / "moe-base", get_family("qwen3_moe").tiny_config(max_seq_len=64))
    # the router z-loss weight is the run's own (config.json has none): kept from the YAML
    config = data_from_config(
        fixture_stages, tmp_path, "moe-cpt", {"family": "qwen3_moe", "init_from": str(base),
                                              "vocab_adaptation": "mean", "max_seq_len": 64,
                                              "router_z_loss_coef": 0.001},
        train={"steps": 3, "checkpoint_every": 3, "warmup_steps": 1, "log_every": 1},
        eval={"tasks": [], "train_tasks": [], "max_validation_batches": 2, "missing_tasks": "skip"},
        wandb={"mode": "disabled"})
    run_recipe("04_pretrain.py", config)
    run = tmp_path / "runs" / "moe-cpt"
    steps = [json.loads(line) for line in (run / "train_log.jsonl").read_text("utf-8").splitlines()
             if "train/loss" in json.loads(line)]
    assert [r["train/step"] for r in steps] == [1, 2, 3]
    for record in steps:
        assert record["train/aux/load_balance"] > 0 and record["train/aux/router_z"] > 0
        assert np.isfinite(record["train/loss"])
    # the fixture's validation split is empty: a held-out text gives the bits per byte
    text = sorted((Path(__file__).parent / "fixtures" / "corpus").glob("ru_*.txt"))[0]
    run_recipe("05_evaluate.py", config, "eval.random_init_baseline=false", f"eval.heldout_text_files=[{text}]")
    manifest = json.loads((run / "eval" / "manifest.json").read_text(encoding="utf-8"))
    result = json.loads((run / "eval" / manifest["latest"]).read_text(encoding="utf-8"))
    assert result["step"] == 3
    assert 0 < result["heldout"][str(text)]["bits_per_byte"] < 20, result["heldout"]


def test_a_shipped_config_names_its_base_models_preset_which_config_json_must_agree_with() -> None:
    """A shipped continued-pretraining config names the base model's preset (the fit check and the planner need its
    shape before any weights): under model.init_from the preset's shape fields are checked against config.json
    (Qwen3-30B-A3B's published file; GigaChat 3 Lightning's as our adapter writes it, the hub's being unreachable
    here), the run's own keys kept; a config.json of another shape is one line naming the preset and the field."""
    from experiment.config import load_config
    from experiment.errors import ConfigError
    from model.hf_checkpoint import hf_model_config
    from model.registry import family_of
    from trainer.init_from import merge_model_config

    repo = Path(__file__).resolve().parents[1]
    qwen = load_config(repo / "recipes" / "configs" / "qwen3-30b-a3b-ru-v5p-64.yaml")
    published = json.loads((repo / "cost" / "hf_configs" / "Qwen3-30B-A3B" / "config.json").read_text("utf-8"))
    _, base, _ = hf_model_config(published)
    merged = merge_model_config(qwen, base, "config.json")
    assert (merged.n_layers, merged.n_experts, merged.router_aux_loss_coef) == (48, 128, 0.001)
    giga = load_config(repo / "recipes" / "configs" / "gigachat3-lightning-ru-v6e-32.yaml")
    adapter = family_of(giga.model).hf_adapter
    _, base, _ = hf_model_config(adapter.to_config(giga.model, 128_256, None))
    assert merge_model_config(giga, base, "config.json").mtp_loss_weight == 0.1
    other = dataclasses.replace(base, n_layers=27)
    with pytest.raises(ConfigError, match="config key 'model.preset': 'gigachat3-lightning' sets n_layers 26, which "
                                          "disagrees with 27 of config.json"):
        merge_model_config(giga, other, "config.json")


def test_vocab_adaptation_none_needs_the_base_models_own_tokenizer_not_one_of_its_size(
        fixture_stages: Path, base_folder: Path, tmp_path: Path) -> None:
    """``none`` keeps the base's ids: a run tokenizer of the base's size whose ids decode to other text (the
    fixture's Russian SentencePiece over a base whose tokenizer.json has as many other tokens) is one error line
    naming an id, before any weights are read; the base's own tokenizer adopted passes."""
    import shutil

    from tokenizers import Tokenizer, models

    from experiment.errors import ConfigError
    from experiment.runfolder import RunFolder
    from trainer.init_from import EmbeddingPlan

    foreign = tmp_path / "foreign-base"
    foreign.mkdir()
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(600)}, unk_token="w0")).save(str(foreign / "tokenizer.json"))
    run = RunFolder(fixture_stages / "runs" / "tiny")
    with pytest.raises(ConfigError, match=r"none keeps the base model's token ids, but the run's tokenizer .* is not "
                                          r".*tokenizer.json's: 600 of 600 ids decode to other text \(id 0: "):
        EmbeddingPlan.for_mode("none", foreign, run, {"vocab_size": 600}, 600, 600)
    config = run_copy(fixture_stages, tmp_path / "adopted")
    shutil.rmtree(tmp_path / "adopted" / "runs" / "tiny" / "tokenizer")
    run_recipe("02_train_tokenizer.py", config, f"tokenizer.adopt_from={base_folder}")
    plan = EmbeddingPlan.for_mode("none", base_folder, RunFolder(tmp_path / "adopted" / "runs" / "tiny"),
                                  {"vocab_size": BASE_VOCAB}, BASE_VOCAB, BASE_VOCAB)
    assert plan.mode == "none"


def test_a_stage_of_a_continued_run_takes_its_rope_keys_from_the_yaml_a_run_does_not() -> None:
    """The checkpoints of a run from a Hugging Face base hold the base's shape; a stage from them
    (``train.branch_data: own``) may set the RoPE scaling and length of its longer context in its YAML, while any
    other run, and a stage's other shape keys, are checked against the checkpoints as before."""
    from experiment.config import load_config
    from experiment.errors import ConfigError
    from model.hf_checkpoint import hf_model_config
    from trainer.init_from import merge_model_config

    repo = Path(__file__).resolve().parents[1]
    published = json.loads((repo / "cost" / "hf_configs" / "Qwen3-30B-A3B" / "config.json").read_text("utf-8"))
    _, base, _ = hf_model_config(published)
    config = repo / "recipes" / "configs" / "qwen3-30b-a3b-ru-v5p-64.yaml"
    long = ["model.rope_theta=5000000.0", "model.max_seq_len=131072"]
    stage = load_config(config, [*long, "train.branch_from=/runs/parent", "train.branch_step=100",
                                 "train.branch_data=own"])
    merged = merge_model_config(stage, base, "the checkpoints", stage=True)
    assert (merged.rope_theta, merged.max_seq_len, merged.n_experts) == (5_000_000.0, 131_072, 128)
    with pytest.raises(ConfigError, match="config key 'model.rope_theta': 5000000.0 disagrees with 1000000.0"):
        merge_model_config(load_config(config, long), base, "the checkpoints")
    with pytest.raises(ConfigError, match="config key 'model.n_layers'"):
        merge_model_config(load_config(config, [*long, "model.n_layers=47", "train.branch_from=/runs/parent",
                                                "train.branch_step=100", "train.branch_data=own"]),
                           base, "the checkpoints", stage=True)
