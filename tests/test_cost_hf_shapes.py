"""The planner and the fit check read a model straight from a Hugging Face config.json (``hf:``).

The two shipped shapes (cost/hf_configs/: Llama-3.2-1B, Qwen3-1.7B) are priced on v5e, v6e and H100
rows of the catalog, and their parameter counts match the publishers' model cards.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from cost.hf_shapes import SHIPPED_CONFIGS, hf_model_shape
from cost.planner import plan
from cost.rates import UsdRubRate
from experiment.config import load_config
from experiment.errors import ConfigError
from experiment.runfolder import RunFolder
from tests.recipe_runner import run_recipe, tiny_config

REPO = Path(__file__).resolve().parents[1]
RATE = UsdRubRate(100.0, dt.date.today(), "test")
OPTIONS = ("cost.plan_options=[{accelerator: tpu-v5e, chips: 16}, {accelerator: tpu-v6e, chips: 8}, "
           "{accelerator: nvidia-h100, chips: 8, cloud: aws}]")


def demo_cfg(*overrides: str):
    return load_config(REPO / "recipes" / "configs" / "demo.yaml", list(overrides))


# model card parameter counts: Llama-3.2-1B 1.23B; Qwen3-1.7B 1.7B of which 1.4B without embeddings
@pytest.mark.parametrize(("name", "family", "params", "vocab", "layers"), [
    ("Llama-3.2-1B", "llama", 1.2358e9, 128_256, 16), ("Qwen3-1.7B", "qwen3", 1.7206e9, 151_936, 28)])
def test_shipped_configs_are_priced_on_v5e_v6e_and_h100(name: str, family: str, params: float, vocab: int,
                                                         layers: int) -> None:
    cfg = demo_cfg(f"cost.plan_model=hf:{SHIPPED_CONFIGS / name}", "cost.plan_tokens=10000000000", OPTIONS)
    model, tokens, rows, _ = plan(cfg, None, rate=RATE)
    assert (model.label, model.cfg.family, model.vocab_size, model.cfg.n_layers) == (name, family, vocab, layers)
    assert model.params == pytest.approx(params, rel=1e-4)
    assert model.cfg.tie_embeddings
    assert model.seq_len == cfg.model.max_seq_len  # the experiment's training length, not the 40k/128k context
    assert [r["accelerator"] for r in rows] == ["tpu-v5e", "tpu-v6e", "nvidia-h100"]
    for row in rows:
        hours = tokens / (row["tokens_per_s_per_chip"] * row["chips"]) / 3600
        assert row["hours"] == pytest.approx(hours)
        assert row["rub"] == pytest.approx(hours * row["chips"] * row["usd_per_chip_hour"] * RATE.rate)
        # 16 B per parameter, fully sharded: ~2-3 GiB per chip (TPUs: the state; the H100: the whole step's estimate)
        assert row["fits"] == ("yes (estimate)" if row["accelerator"] == "nvidia-h100" else "state only: yes")
    if name == "Qwen3-1.7B":
        # Qwen3 sets head_dim 128 with 16 heads of a 2048 model: the query projection is 2048 x 2048
        assert (model.cfg.resolved_head_dim, model.cfg.qk_norm) == (128, True)
    else:
        assert (model.cfg.rope_scaling, model.cfg.rope_factor) == ("llama3", 32.0)


def test_bare_names_and_config_json_paths_find_the_same_shape() -> None:
    demo = demo_cfg().model
    by_name = hf_model_shape("hf:Qwen3-1.7B", "cost.plan_model", demo)
    by_file = hf_model_shape(f"hf:{SHIPPED_CONFIGS / 'Qwen3-1.7B' / 'config.json'}", "cost.plan_model", demo)
    assert by_name == by_file


def test_fit_check_compiles_the_hf_shape(tmp_path: Path) -> None:
    """``train.fit_model`` hands the fit check the config.json's shape and vocabulary at model.max_seq_len
    (the compile itself needs libtpu: tests/test_fit_check.py)."""
    from trainer.fit_check import fit_model

    cfg = demo_cfg("train.fit_model=hf:Llama-3.2-1B", "model.remat=full")
    model_cfg, vocab, seq_len = fit_model(cfg, RunFolder(tmp_path))
    assert (model_cfg.d_model, model_cfg.n_heads, model_cfg.n_kv_heads, model_cfg.d_ff) == (2048, 32, 8, 8192)
    assert (vocab, seq_len, model_cfg.remat) == (128_256, cfg.model.max_seq_len, "full")
    with pytest.raises(ConfigError, match="train.fit_model"):
        demo_cfg("train.fit_model=Llama-3.2-1B")


def test_bad_hf_configs_are_one_line_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cost.plan_model.*does not exist"):
        plan(demo_cfg(f"cost.plan_model=hf:{tmp_path / 'nowhere'}"), None, rate=RATE)
    config = tmp_path / "gemma" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "gemma2", "hidden_size": 64}), encoding="utf-8")
    with pytest.raises(ConfigError, match=f"{config}: model_type 'gemma2' is not supported"):
        plan(demo_cfg(f"cost.plan_model=hf:{config.parent}"), None, rate=RATE)
    config.write_text("{broken", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"config key 'cost.plan_model': {config} is not readable JSON"):
        plan(demo_cfg(f"cost.plan_model=hf:{config.parent}"), None, rate=RATE)


@pytest.mark.integration
def test_recipe_07_prices_a_hugging_face_model_folder(tmp_path: Path) -> None:
    """A team's own download: a folder holding config.json (here a copy of the shipped Qwen3-1.7B)."""
    folder = tmp_path / "my-models" / "Qwen3-1.7B-Base"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes((SHIPPED_CONFIGS / "Qwen3-1.7B" / "config.json").read_bytes())
    config = tiny_config(tmp_path, cost={"plan_model": f"hf:{folder}", "plan_tokens": 10_000_000_000})
    proc = run_recipe("07_plan_costs.py", config, timeout=120)
    md = (tmp_path / "runs" / "tiny" / "reports" / "plan.md").read_text(encoding="utf-8")
    assert "Qwen3-1.7B-Base: 1.72B parameters, vocabulary 151936" in md, md[:600]
    assert "tpu-v6e" in proc.stdout
