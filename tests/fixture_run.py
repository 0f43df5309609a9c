"""Recipe 04 on the fixture corpus (tests/fixtures/corpus, no shared data): stages 01-03 made once,
and every array of a checkpoint read back to compare. Starting, signalling and reading runs is
tests/recipe_runner.py's (``start_pretrain``, ``signal_when``, ``read_train_log``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tests.recipe_runner import read_train_log, run_recipe, tiny_config

FIXTURE_TEXTS = Path(__file__).parent / "fixtures" / "corpus"
# ~7 KB of Russian: 37 train records of 64 tokens; 600 pieces is what the byte, special and
# required-character pieces leave room for
FIXTURE_STAGES = {
    # workers 1: a plain loop; a pool's processes would each import the cleaning stack to clean seven
    # documents (the pool is tests/test_corpus_build.py's, checked against the loop)
    "corpus": {"sources": [{"kind": "files", "name": "fixture", "paths": [str(FIXTURE_TEXTS / "ru_*.txt")]}],
               "workers": 1},
    "tokenizer": {"vocab_size": 600},
}
# train_log.jsonl keys that an interrupted run must reproduce exactly (the rest are timings and rubles)
DETERMINISTIC_KEYS = ("train/step", "train/loss", "train/total_loss", "train/grad_norm", "train/lr", "train/skipped",
                      "train/tokens_seen")


def fixture_config(root: Path, **sections: dict) -> Path:
    """The tiny experiment on the fixture corpus, run root in ``root``; ``sections`` replace keys."""
    root.mkdir(parents=True, exist_ok=True)
    return tiny_config(root, **FIXTURE_STAGES, **sections)


def prepare_stages(root: Path) -> Path:
    """Run recipes 01-03 on the fixture corpus in ``root``; returns ``root``."""
    config = fixture_config(root)
    for script in ("01_build_corpus.py", "02_train_tokenizer.py", "03_shard.py"):
        run_recipe(script, config)
    return root


def run_copy(stages_root: Path, root: Path, **sections: dict) -> Path:
    """A fresh run root holding copies of the prepared stages; returns its config."""
    for stage in ("corpus", "tokenizer", "shards"):
        shutil.copytree(stages_root / "runs" / "tiny" / stage, root / "runs" / "tiny" / stage)
    return fixture_config(root, **sections)


def data_from_config(stages_root: Path, root: Path, name: str, model: dict[str, Any], **sections: dict) -> Path:
    """Experiment ``name`` in ``root`` training on a copy of the prepared stages' data (``experiment.data_from``),
    its ``model:`` section ``model`` whole (another family's keys, a ``model.init_from``); returns its config."""
    import yaml

    shutil.copytree(stages_root / "runs" / "tiny", root / "runs" / "tiny", ignore=shutil.ignore_patterns("wandb"))
    config = fixture_config(root, experiment={"name": name, "data_from": "tiny"}, **sections)
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    cfg["model"] = model
    config.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return config


# conftest.py's ``fixture_pretrained``: one short run of recipe 04 on the fixture stages, made once per
# session, which tests read (or copy with ``pretrained_copy`` to resume, branch or change it)
PRETRAINED_TRAIN = {"steps": 6, "checkpoint_every": 3, "warmup_steps": 1, "log_every": 1}


def pretrain_fixture_run(stages_root: Path, root: Path) -> Path:
    """Recipe 04 (PRETRAINED_TRAIN: checkpoints 3 and 6) on a copy of the prepared stages; returns its config."""
    config = run_copy(stages_root, root, train=PRETRAINED_TRAIN)
    run_recipe("04_pretrain.py", config)
    return config


def pretrained_copy(pretrained: Path, root: Path) -> Path:
    """A copy of ``fixture_pretrained``'s whole run root in ``root`` (another run root); returns its config."""
    shutil.copytree(pretrained.parent / "runs", root / "runs")
    return fixture_config(root, train=PRETRAINED_TRAIN)


def log_records(run_dir: Path) -> list[dict[str, Any]]:
    """The complete lines of ``train_log.jsonl`` (a line being written, or cut by a kill, is not one)."""
    return read_train_log(run_dir)


def assert_same_log(run_dir: Path, reference_dir: Path, steps: int, first: int = 1) -> None:
    """Each step first..steps logged exactly once, in order, with the uninterrupted run's values."""
    records = log_records(run_dir)
    assert [r["train/step"] for r in records] == list(range(first, steps + 1)), "each step logged once, in order"
    reference = log_records(reference_dir)
    for key in DETERMINISTIC_KEYS:
        assert [r[key] for r in records] == [r[key] for r in reference], key


def checkpoint_contents(run_dir: Path, step: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every array of checkpoint ``step`` (params, optimizer state, step counter, RNG key data) by
    tree path, and its JSON items (loader state, ledger item, meta), read through trainer.checkpoint
    onto this process's first device (whatever device count saved it)."""
    import jax
    import orbax.checkpoint as ocp

    from trainer import checkpoint, checkpoint_integrity

    step_dir = run_dir / "checkpoints" / str(step)
    checkpoint_integrity.verify_checksums(step_dir)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def target(item: str) -> Any:
        tree = ocp.StandardCheckpointer().metadata(step_dir / item).item_metadata
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), tree)

    manager = checkpoint.open_manager(run_dir / "checkpoints")
    try:
        restored = manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target("params")), train=ocp.args.StandardRestore(target("train")),
            loader=ocp.args.JsonRestore(), ledger=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
    finally:
        manager.close()
    arrays = {f"{item}{jax.tree_util.keystr(path)}": np.asarray(leaf)
              for item in ("params", "train") for path, leaf in jax.tree_util.tree_leaves_with_path(restored[item])}
    return arrays, {k: restored[k] for k in ("loader", "ledger", "meta")}


def assert_same_checkpoint(run_dir: Path, reference_dir: Path, step: int) -> None:
    """Checkpoint ``step`` of both runs: every array bitwise equal (same paths, dtypes, shapes and
    bytes), the same loader state, and the same meta but for the W&B run id and the NaN guard's record."""
    arrays, items = checkpoint_contents(run_dir, step)
    want_arrays, want_items = checkpoint_contents(reference_dir, step)
    assert sorted(arrays) == sorted(want_arrays)
    assert any(k.startswith("train['opt_state']") for k in arrays) and "train['rng']" in arrays
    differ = [k for k in arrays if arrays[k].dtype != want_arrays[k].dtype or arrays[k].shape != want_arrays[k].shape
              or arrays[k].tobytes() != want_arrays[k].tobytes()]
    assert not differ, f"{len(differ)} of {len(arrays)} arrays differ from the uninterrupted run's: {differ[:5]}"
    assert items["loader"] == want_items["loader"]
    # the NaN guard's record lists the earlier checkpoints' measured losses: an interrupted run saved others
    without_run_id = [{k: v for k, v in i["meta"].items() if k not in ("wandb_run_id", "guard")}
                      for i in (items, want_items)]
    assert without_run_id[0] == without_run_id[1]
