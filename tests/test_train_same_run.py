"""Recipe 04 refuses to resume checkpoints made for another model shape or tokenizer: one error line
naming the checkpoint folder and what changed, exit 2, and the checkpoints left as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixture_run import run_copy
from tests.recipe_runner import error_line, run_recipe

pytestmark = pytest.mark.integration
PRICED_CHIPS = 2  # cost.chips of the fixture run: a CPU host may price "as if" on a slice (cost/chips.py)


@pytest.fixture(scope="module")
def trained(fixture_stages: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 steps on the fixture corpus with its checkpoint, priced as 2 chips while one CPU host trains
    (so that the ledger's two chip counts differ); returns its config."""
    config = run_copy(fixture_stages, tmp_path_factory.mktemp("same-run"),
                      train={"steps": 4, "checkpoint_every": 4, "warmup_steps": 1}, wandb={"mode": "disabled"},
                      cost={"chips": PRICED_CHIPS})
    run_recipe("04_pretrain.py", config)
    return config


def refused(config: Path, *overrides: str) -> str:
    checkpoints = config.parent / "runs" / "tiny" / "checkpoints"
    before = sorted(p.name for p in checkpoints.iterdir())
    proc = run_recipe("04_pretrain.py", config, "train.steps=8", *overrides, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert sorted(p.name for p in checkpoints.iterdir()) == before, "a refused resume leaves the checkpoints alone"
    return error_line(proc)


def test_another_model_shape_is_refused(trained: Path) -> None:
    checkpoints = trained.parent / "runs" / "tiny" / "checkpoints"
    assert refused(trained, "model.d_model=32", "model.d_ff=96") == (
        f"error: checkpoints in {checkpoints} were made with a different model (d_model: 64 -> 32, d_ff: 192 -> 96): "
        "use another experiment.name, or delete the checkpoints to start over")


def test_another_tokenizer_is_refused(trained: Path) -> None:
    """Same vocabulary size, another tokenizer (BPE instead of unigram, shards rebuilt with it)."""
    checkpoints = trained.parent / "runs" / "tiny" / "checkpoints"
    for script in ("02_train_tokenizer.py", "03_shard.py"):
        run_recipe(script, trained, "tokenizer.model_type=bpe")
    line = refused(trained, "tokenizer.model_type=bpe")
    assert line.startswith(f"error: checkpoints in {checkpoints} were made with a different tokenizer_sha256 ("), line
    assert line.endswith("): use another experiment.name, or delete the checkpoints to start over"), line


def test_another_attention_kernel_or_remat_resumes() -> None:
    """A run may continue on another slice with the kernel and remat that fit there (and checkpoints of the
    version whose default kernel was dot_product resume under auto); the shape may not change."""
    from experiment.errors import DataError
    from trainer.resume import check_same_run

    saved = {"model": {"d_model": 64, "attention": "dot_product", "remat": "none"}, "vocab_size": 600}
    check_same_run(saved, {"model": {"d_model": 64, "attention": "auto", "remat": "full"}, "vocab_size": 600}, "x")
    with pytest.raises(DataError, match="different model .*d_model: 64 -> 128"):
        check_same_run(saved, {"model": {"d_model": 128, "attention": "auto"}, "vocab_size": 600}, "x")


def test_the_ledger_records_the_chips_in_use_beside_the_priced_ones(trained: Path) -> None:
    """The trainer hands the ledger the chips that train (a CPU host counts once, whatever its JAX device
    count) beside the chips priced, for the W&B summary; the bill counts the priced ones."""
    from cost.ledger_pricing import summarize_ledger

    summary = summarize_ledger(trained.parent / "runs" / "tiny" / "ledger")
    assert (summary.chips, summary.chips_in_use) == (PRICED_CHIPS, 1)
    assert summary.chip_hours == pytest.approx(summary.hours * PRICED_CHIPS)
