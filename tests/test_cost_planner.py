"""The planner: FLOPs arithmetic against a published anchor, a worked example, bad options, recipe 07."""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import re
from pathlib import Path
from typing import Any

import jax
import pytest

from cost.catalog import Catalog, CatalogError
from cost.planner import ANCHORS, anchor_check, experiment_model, plan, read_anchors, tokens_per_s_per_chip
from cost.rates import UsdRubRate
from experiment.config import load_config
from experiment.errors import ConfigError, DataError
from experiment.runfolder import RunFolder
from model.llama.flops import attention_forward_flops_per_token
from tests.recipe_runner import error_line, run_recipe, tiny_config

REPO = Path(__file__).resolve().parents[1]
RATE = UsdRubRate(100.0, dt.date.today(), "test")


@pytest.mark.parametrize(("label", "tokens", "mfu", "params"), [
    ("llama3.1-8b", 7207, 0.4546, 8.03e9), ("llama3.1-70b", 960, 0.5033, 70.6e9)])
def test_maxtext_v6e_anchors_within_their_published_rounding(label: str, tokens: int, mfu: float,
                                                             params: float) -> None:
    """MaxText's Trillium Gold table: Llama-3.1-8B at 45.46% MFU, 7,207 tokens/s per chip, and Llama-3.1-70B at
    50.33%, 960. At the published MFU our FLOP count and the v6e peak must give the published throughput to within
    what the figures' rounding allows (half a unit of the last printed digit of each), a few hundredths of a percent.

    The published MFUs count attention over the full T x T matrix, as model/llama/flops.py does; MaxText's current count
    halves causal attention, which would miss both rows by 7-13%: the tolerance tells the two conventions apart."""
    anchor = next(a for a in read_anchors() if a.model.label == label and a.accelerator == "tpu-v6e")
    assert (anchor.tokens_per_s_per_chip, anchor.mfu) == (tokens, mfu)
    assert anchor.model.params == pytest.approx(params, rel=0.001)  # parameter counts as published
    rounding = 0.5 / tokens + 0.00005 / mfu
    check = anchor_check(anchor, Catalog.load())
    assert abs(check["relative_error"]) < rounding, check
    causal = anchor.model.flops_per_token - 3 * attention_forward_flops_per_token(anchor.model.cfg,
                                                                                  anchor.model.seq_len) / 2
    causal_error = tokens_per_s_per_chip(mfu, 918, causal) / tokens - 1
    assert causal_error > 0.05, causal_error


def palm_train_flops_per_token(cfg: Any, vocab_size: int, seq_len: int) -> float:
    """PaLM's MFU count (Chowdhery et al. 2022, appendix B): 6 N + 12 L H Q T per token, N the parameters that
    take part in a matmul, counted here from the module's own parameter shapes (an abstract build, nothing
    allocated), not from model.flops: the norm scales are elementwise, a tied table is the output head once."""
    from flax import nnx

    from model.llama.model import Decoder

    with nnx.use_eager_sharding(False):  # no mesh: shapes only
        state = nnx.state(nnx.eval_shape(lambda: Decoder(cfg, vocab_size, nnx.Rngs(0))), nnx.Param)
    sizes = {jax.tree_util.keystr(path): math.prod(leaf.shape)
             for path, leaf in jax.tree_util.tree_leaves_with_path(state)}
    norms = sum(size for path, size in sizes.items() if "norm" in path)  # RMSNorm scales (every layer's, the final)
    embedding = 0 if cfg.tie_embeddings else vocab_size * cfg.d_model  # an untied table is a gather, not a matmul
    matmul = sum(sizes.values()) - norms - embedding
    return 6.0 * matmul + 12.0 * cfg.n_layers * cfg.n_heads * cfg.resolved_head_dim * seq_len


def test_our_h200_measurement_is_an_anchor_an_h200_plan_uses() -> None:
    """bench/bench_gpu_step.py's 1B run on one H200 (tokens/s and MFU in cost/anchors.csv) is our 1b preset's
    shape, and its MFU is its throughput under PaLM's FLOP count of that shape (counted from the module, not
    from model.flops, whose count the bench itself used) and the H200's published peak, within the CSV's
    rounding; a plan on H200s takes its MFU (recompute-adjusted) instead of cost.plan_mfu."""
    from experiment.presets import preset_model_config

    anchor = next(a for a in read_anchors() if a.accelerator == "nvidia-h200")
    preset = preset_model_config("1b")
    shape_keys = ("d_model", "n_layers", "n_heads", "n_kv_heads", "resolved_head_dim", "d_ff", "tie_embeddings")
    assert {k: getattr(anchor.model.cfg, k) for k in shape_keys} == {k: getattr(preset, k) for k in shape_keys}
    assert anchor.model.seq_len == preset.max_seq_len
    peak = Catalog.load().chip("nvidia-h200").peak_bf16_tflops * 1e12
    mfu = anchor.tokens_per_s_per_chip * palm_train_flops_per_token(anchor.model.cfg, anchor.model.vocab_size,
                                                                    anchor.model.seq_len) / peak
    rounding = 0.5 / anchor.tokens_per_s_per_chip + 0.000005 / anchor.mfu  # half a unit of each printed digit
    assert mfu / anchor.mfu - 1 == pytest.approx(0, abs=rounding), (mfu, anchor.mfu)
    _, _, (row,), _ = plan(demo_cfg("cost.plan_model=1b",
                                    "cost.plan_options=[{accelerator: nvidia-h200, chips: 8, cloud: aws}]"),
                           None, rate=RATE)
    assert row["mfu_source"].startswith("anchor ru-pretrain-1b-unrolled")
    assert row["mfu"] == pytest.approx(0.51497 * anchor.recompute / row["recompute"])


def demo_cfg(*overrides: str):
    return load_config(REPO / "recipes" / "configs" / "demo.yaml", list(overrides))


def test_worked_example_one_option() -> None:
    """7b preset, 100B tokens, 8 v6e chips at 40% MFU: hours and rubles follow the formula by hand."""
    cfg = demo_cfg("cost.plan_model=7b", "cost.plan_tokens=100000000000",
                   "cost.plan_options=[{accelerator: tpu-v6e, chips: 8, mfu: 0.4}]")
    model, tokens, rows, _ = plan(cfg, None, rate=RATE)
    assert model.seq_len == 4096  # the preset's own length, not the demo's model.max_seq_len
    (row,) = rows
    per_chip = 0.4 * 918e12 / model.flops_per_token
    hours = 100e9 / (per_chip * 8) / 3600
    assert row["tokens_per_s_per_chip"] == pytest.approx(per_chip)
    assert row["hours"] == pytest.approx(hours)
    assert row["rub"] == pytest.approx(hours * 8 * 2.70 * 100.0)
    assert row["mfu_source"] == "option"
    assert row["fits"] == "state only: yes"  # 16 B x ~6.6B params / 8 chips = ~12.5 GiB < 32 GiB (no fit check ran)
    assert tokens == 100_000_000_000
    assert tokens_per_s_per_chip(0.5, 100, 1e9) == pytest.approx(50_000)


def test_seed_comparison_set_is_planned_by_default_on_demand_and_spot_at_the_cheapest_cloud() -> None:
    # a batch of 64 splits over every seed slice (Trainium2 x 16 is 64 devices; the demo's 16 does not: see
    # test_an_option_whose_devices_cannot_split_the_batch_is_not_planned_and_says_why)
    _, _, rows, _ = plan(demo_cfg("cost.plan_model=1b", "train.batch_size=64"), None, rate=RATE)
    pairs = [(r["accelerator"], r["pricing"]) for r in rows]
    for accelerator in ("tpu-v5e", "tpu-v5p", "tpu-v6e", "nvidia-h100", "nvidia-h200", "nvidia-b200", "aws-trainium1"):
        assert (accelerator, "on-demand") in pairs and (accelerator, "spot") in pairs, accelerator
    assert ("aws-trainium2", "on-demand") in pairs
    assert all(r["rub"] > 0 and r["hours"] > 0 for r in rows)
    catalog = Catalog.load()
    for row in rows:  # no cloud given: the cheapest that sells it, the others named beside it
        offers = catalog.priced_rows(row["accelerator"], row["pricing"], cheapest=True)
        assert row["usd_per_chip_hour"] == min(r.usd for r in offers)
        assert (row["other_clouds"] is None) == (len(offers) == 1)
    h100 = next(r for r in rows if (r["accelerator"], r["pricing"]) == ("nvidia-h100", "on-demand"))
    assert (h100["cloud"], h100["other_clouds"]) == ("gcp", "aws 6.880")  # GCP's H100 is the cheaper on demand
    _, _, rows, _ = plan(demo_cfg("cost.plan_model=1b", "cost.plan_mfu_from_anchors=false", "train.batch_size=64"),
                         None, rate=RATE)
    assert {r["mfu_source"].split(" (")[0].split(",")[0] for r in rows} == {"cost.plan_mfu"}


def test_an_anchor_lends_its_mfu_only_to_its_vendor_and_a_similar_size() -> None:
    """The 8b plan on v6e and v5e takes MaxText's v6e Llama-3.1-8B MFU (same vendor, same size; named with
    the chip it ran on); the 1b plan does not (10x smaller: cost.plan_mfu, saying why), nor do AWS rows; a
    wider cost.plan_anchor_size_ratio lends it; a 70B plan takes the 70B anchor (its custom remat modelled), not
    the 8B's."""
    anchor = next(a for a in read_anchors() if a.model.label == "llama3.1-8b")
    options = ("cost.plan_options=[{accelerator: tpu-v6e}, {accelerator: tpu-v5e}, "
               "{accelerator: aws-trainium1, chips: 16}]")
    _, _, (v6e, v5e, trn), _ = plan(demo_cfg("cost.plan_model=llama3.1-8b", options, "train.batch_size=32"), None,
                                    rate=RATE)
    assert v6e["mfu_source"].startswith("anchor llama3.1-8b,")
    assert v5e["mfu_source"].startswith("anchor llama3.1-8b on tpu-v6e,")
    assert v5e["mfu"] == pytest.approx(anchor.mfu * anchor.recompute / v5e["recompute"])
    assert trn["mfu_source"].startswith("cost.plan_mfu (no dense anchor on aws hardware)")
    _, _, (small, _, _), _ = plan(demo_cfg("cost.plan_model=1b", options), None, rate=RATE)
    assert re.match(r"cost.plan_mfu \(nearest dense google anchor llama3.1-8b is 1\dx the size", small["mfu_source"])
    _, _, (wide, _, _), _ = plan(demo_cfg("cost.plan_model=1b", "cost.plan_anchor_size_ratio=12", options), None,
                                 rate=RATE)
    assert wide["mfu_source"].startswith("anchor llama3.1-8b")
    _, _, (big, _, _), _ = plan(demo_cfg("cost.plan_model=70b", "cost.plan_anchor_size_ratio=100", options), None,
                                rate=RATE)
    assert big["mfu_source"].startswith("anchor llama3.1-70b,") and "llama3.1-8b" not in big["mfu_source"]


def test_each_gpu_option_gets_the_setting_its_memory_holds() -> None:
    """The shipped 1B config's save_dots is what its TPU v6e-8 needs; an 80 GB H100 or a 141 GB H200 holds the
    step without remat, so they are planned (and priced) without it; an 8B step on 8 x 16 GiB v5e-sized chips
    needs micro-batches or remat, chosen from the estimate, and a too-small device says it does not fit."""
    from cost.memory import HBM_BUDGET, step_bytes

    cfg = load_config(REPO / "recipes" / "configs" / "ru-1b-fineweb2-v6e-8.yaml",
                      ["cost.plan_options=[{accelerator: tpu-v6e}, {accelerator: nvidia-h100}, "
                       "{accelerator: nvidia-h200}]"])
    model, _, (v6e, h100, h200), _ = plan(cfg, None, rate=RATE)
    assert (v6e["remat"], v6e["setting_from"]) == ("save_dots", "config")
    for row, hbm in ((h100, 80), (h200, 141)):
        assert (row["remat"], row["grad_accum_steps"]) == ("none", 1)
        assert row["setting_from"].startswith("memory estimate") and row["fits"] == "yes (estimate)"
        need = step_bytes(model.cfg, model.params, model.vocab_size, model.seq_len, 128 / 8, 8, "none", 1024)
        assert need <= HBM_BUDGET * hbm * 2**30 and row["memory_gib_per_device"] == pytest.approx(need / 2**30)
        assert row["recompute"] < v6e["recompute"]  # no recompute of attention charged to the GPUs
    tight = demo_cfg("cost.plan_model=llama3.1-8b", "train.batch_size=64",
                     "cost.plan_options=[{accelerator: nvidia-h100}, {accelerator: aws-trainium1, chips: 2}]")
    _, _, (h100_8b, tiny), _ = plan(tight, None, rate=RATE)
    assert (h100_8b["remat"], h100_8b["grad_accum_steps"]) != ("none", 1) and h100_8b["fits"] == "yes (estimate)"
    assert tiny["fits"] == "no" and tiny["setting_from"].startswith("does not fit")


@pytest.mark.integration
def test_the_shipped_1b_plan_runs_offline_with_the_dated_fallback_and_fair_gpu_rows(tmp_path: Path) -> None:
    """Recipe 07 on the shipped 1B config, no rate configured, cbr.ru unreachable, no cache: it warns and plans
    at the Bank of Russia rate shipped beside the catalog; the H100 and H200 rows run without remat at our
    H200 bench's MFU, the anchor named in the row."""
    from cost.rates import shipped_fallback

    config = REPO / "recipes" / "configs" / "ru-1b-fineweb2-v6e-8.yaml"
    proc = run_recipe("07_plan_costs.py", config, f"experiment.run_root={tmp_path}", "wandb.mode=disabled",
                      f"cost.rate_cache_dir={tmp_path / 'cbr'}", "cost.fetch_rate=false")
    fallback = shipped_fallback()
    assert "using the rate shipped with the catalog" in proc.stderr and f"for {fallback.date}" in proc.stderr
    with (tmp_path / "ru-1b-fineweb2-v6e-8" / "reports" / "plan.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert "787M parameters" in (tmp_path / "ru-1b-fineweb2-v6e-8" / "reports" / "plan.md").read_text(encoding="utf-8")
    anchor = next(a for a in read_anchors() if a.accelerator == "nvidia-h200")
    gpus = [r for r in rows if r["accelerator"] in ("nvidia-h100", "nvidia-h200")]
    assert len(gpus) == 4  # on demand and spot each
    for row in gpus:
        assert row["remat"] == "none" and row["mfu_source"].startswith(f"anchor {anchor.model.label}")
        assert float(row["rub"]) == pytest.approx(float(row["usd"]) * fallback.rate)
        assert float(row["mfu"]) == pytest.approx(anchor.mfu)  # the bench's own setting: no recompute adjustment


def test_full_remat_is_priced_by_hand() -> None:
    """1b at 2,048 tokens on v5e at cost.plan_mfu 40%: full remat re-runs every block's forward, the splash
    backward re-runs QK^T; the hardware holds 40% utilisation, so the plan runs at 40% / recompute."""
    cfg = demo_cfg("cost.plan_model=1b", "cost.plan_mfu_from_anchors=false", "train.loss_chunk_len=0",
                   "cost.plan_options=[{accelerator: tpu-v5e, chips: 16}]")
    (none,) = plan(cfg, None, rate=RATE)[2]
    model, _, (full,), _ = plan(demo_cfg("cost.plan_model=1b", "cost.plan_mfu_from_anchors=false", "model.remat=full",
                                         "train.loss_chunk_len=0",
                                         "cost.plan_options=[{accelerator: tpu-v5e, chips: 16}]"),
                                None, rate=RATE)
    d, layers, heads, hd, kv, ff, vocab, t = 2048, 16, 32, 64, 8, 5632, model.vocab_size, 2048
    matmuls = layers * (d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * ff)  # per token, no head
    attention = 2 * 2 * t * heads * hd * layers
    train = 3 * (2 * (matmuls + d * vocab) + attention)
    assert none["recompute"] == pytest.approx((train + attention / 2) / train)
    assert full["recompute"] == pytest.approx((train + 2 * matmuls + attention + attention / 2) / train)
    assert full["mfu"] == pytest.approx(0.4 / full["recompute"]) and full["hfu"] == pytest.approx(0.4)
    assert full["rub"] / none["rub"] == pytest.approx(full["recompute"] / none["recompute"])
    assert (full["remat"], full["setting_from"]) == ("full", "config")


def test_plan_uses_the_setting_the_fit_check_chose(tmp_path: Path) -> None:
    cfg = demo_cfg(f"experiment.run_root={tmp_path}", "cost.plan_mfu_from_anchors=false",
                   "cost.plan_options=[{accelerator: tpu-v6e, chips: 8}, {accelerator: tpu-v5e, chips: 16}]")
    folder = RunFolder.for_config(cfg)
    folder.reports.mkdir(parents=True)
    (folder.reports / "fit_check.json").write_text(json.dumps([
        {"slice": "v6e-8", "devices": 8, "fits": True, "remat": "full", "grad_accum_steps": 2},
        {"slice": "v5e-16", "devices": 16, "fits": False, "remat": "none", "grad_accum_steps": 1}]), encoding="utf-8")
    _, _, (v6e, v5e), _ = plan(cfg, folder, rate=RATE)
    assert (v6e["remat"], v6e["grad_accum_steps"], v6e["setting_from"]) == ("full", 2, "fit check v6e-8")
    assert (v5e["remat"], v5e["setting_from"]) == ("none", "config")  # did not fit there: the config's setting
    assert v6e["recompute"] > v5e["recompute"]
    (folder.reports / "fit_check.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match="fit_check.json: not a fit-check report"):
        plan(cfg, folder, rate=RATE)


def test_bad_options_name_the_key() -> None:
    with pytest.raises(CatalogError, match=r"cost.plan_options\[0\].accelerator.*unknown accelerator 'h100'"):
        plan(demo_cfg("cost.plan_options=[{accelerator: h100}]"), None, rate=RATE)
    # a mode the catalog knows without a figure is planned in hours, not priced, and the row asks for a rate
    _, _, (_, trn2), _ = plan(demo_cfg("cost.plan_options=[{accelerator: tpu-v5e}, {accelerator: aws-trainium2, "
                                       "pricing: spot, chips: 4}]"), None, rate=RATE)
    assert trn2["rub"] is None and trn2["usd"] is None and trn2["hours"] > 0
    assert "give your rate: cost.contract_rates.aws-trainium2" in trn2["not_planned"]
    with pytest.raises(CatalogError, match=r"cost.plan_options\[1\].pricing.*no '1y' price"):
        plan(demo_cfg("cost.plan_options=[{accelerator: tpu-v5e}, {accelerator: aws-trainium2, pricing: 1y}]"), None,
             rate=RATE)
    with pytest.raises(CatalogError, match=r"no peak bf16 TFLOP/s for cpu-e2-standard-2"):
        plan(demo_cfg("cost.plan_options=[{accelerator: cpu-e2-standard-2, chips: 1}]"), None, rate=RATE)


@pytest.mark.integration
def test_recipe_07_writes_table_and_chart(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, cost={"plan_model": "1b", "plan_tokens": 20_000_000_000})
    proc = run_recipe("07_plan_costs.py", config, timeout=120)
    reports = tmp_path / "runs" / "tiny" / "reports"
    assert "tpu-v6e" in proc.stdout and "rubles" in proc.stdout
    md = (reports / "plan.md").read_text(encoding="utf-8")
    assert "| accelerator |" in md and "anchor: llama3.1-8b on tpu-v6e" in md
    assert (reports / "plan.csv").read_text(encoding="utf-8").startswith("accelerator,cloud,pricing,chips")
    assert (reports / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
def test_recipe_07_unknown_accelerator_is_one_line(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, cost={"plan_options": [{"accelerator": "tpu-v7x"}]})
    proc = run_recipe("07_plan_costs.py", config, timeout=120, check=False)
    assert proc.returncode == 2
    assert error_line(proc).startswith("error: config key 'cost.plan_options[0].accelerator': unknown accelerator")


def one_train_hour(cfg: Any, tokens: int) -> RunFolder:
    """The experiment's ledger: one hour of train phase that trained ``tokens`` by step 100."""
    from cost.ledger import Ledger

    folder = RunFolder.for_config(cfg)
    clock = [1000.0]
    ledger = Ledger.open(folder.ledger, cfg.cost, "r", rate=RATE, clock=lambda: clock[0], started_at=1000.0,
                         background=False)
    with ledger.phase("train"):
        clock[0] += 3600.0
        ledger.add_tokens(100, tokens)
    ledger.close()
    return folder


def test_mfu_calibrated_from_our_own_ledger(tmp_path: Path) -> None:
    """A run of ours on v5e trained 1.2e9 tokens in 1 h of train phase on 8 chips: the plan uses its MFU."""

    cfg = demo_cfg("cost.plan_model=1b", f"experiment.run_root={tmp_path}", "cost.accelerator=tpu-v5e", "cost.chips=8",
                   "cost.plan_options=[{accelerator: tpu-v5e, chips: 16}, {accelerator: tpu-v6e, chips: 8}]")
    folder = one_train_hour(cfg, 1_200_000_000)
    _, _, rows, _ = plan(cfg, folder, rate=RATE)
    trained = experiment_model(cfg, folder)  # the demo model measured by the ledger, not the planned 1b
    expected = 1.2e9 / 3600 / 8 * trained.flops_per_token / 197e12
    assert rows[0]["mfu_source"] == "our run" and rows[0]["mfu"] == pytest.approx(expected)
    assert rows[1]["mfu_source"].startswith("cost.plan_mfu")  # not measured on v6e; the 8B anchor is 10x the size


def test_a_damaged_tokenizer_manifest_is_one_error_naming_it(tmp_path: Path) -> None:
    """The planner reads the tokenizer's vocabulary through the stage registry's checked reader."""
    cfg = demo_cfg(f"experiment.run_root={tmp_path}")
    folder = RunFolder.for_config(cfg)
    folder.tokenizer.mkdir(parents=True)
    (folder.tokenizer / "manifest.json").write_text('{"stage": "tokenizer", "schema_', encoding="utf-8")
    with pytest.raises(DataError, match=r"tokenizer/manifest.json is not a readable manifest .*run "
                                        r"recipes/02_train_tokenizer.py again"):
        experiment_model(cfg, folder)


def test_planned_length_is_the_planned_models_own(tmp_path: Path) -> None:
    """No cost.plan_model: the config's resolved model (preset plus the keys it sets) at model.max_seq_len;
    an anchor at its CSV length, whatever the config's model says."""
    config = tmp_path / "p.yaml"
    config.write_text("experiment: {name: p}\nmodel: {preset: '1b', n_kv_heads: 2}\n"
                      "cost: {plan_options: [{accelerator: tpu-v6e, chips: 8, mfu: 0.4}]}\n", encoding="utf-8")
    model, tokens, _, _ = plan(load_config(config), None, rate=RATE)
    assert (model.cfg.d_model, model.cfg.n_kv_heads, model.seq_len) == (2048, 2, 2048)
    assert model.label == "1b" and tokens == 1000 * 32 * 2048  # train.steps x batch_size x model.max_seq_len
    anchor = read_anchors()[0].model
    model, _, _, _ = plan(load_config(config, [f"cost.plan_model={anchor.label}"]), None, rate=RATE)
    assert model.seq_len == anchor.seq_len != 2048


def test_measured_rubles_to_target_projected_onto_each_option(tmp_path: Path) -> None:
    """Our run on 8 v5e chips trained 1.2e9 tokens per train hour and logged bits per byte 2.0 at 0.4e9 tokens and
    1.6 at 0.8e9: target 1.7 is 3/4 of the way, 0.7e9 tokens. At its own measured 41,667 tokens/s/chip, 16 v5e chips
    take 0.7e9 / (41,667 x 16) s = 0.2917 h to reach it: 0.2917 h x 16 chips x 1.20 USD x 100 RUB = 560 RUB."""

    measured = demo_cfg(f"experiment.run_root={tmp_path}", "experiment.name=measured", "cost.accelerator=tpu-v5e",
                        "cost.chips=8")
    folder = one_train_hour(measured, 1_200_000_000)
    folder.save_resolved_config(measured, "pretrain")
    log = [{"train/step": 10, "eval/val_bpb": 2.0, "cost/rub_spent": 400.0, "cost/tokens": 4e8, "cost/hours": 0.33},
           {"train/step": 15, "train/loss": 3.0, "cost/rub_spent": 500.0},
           {"train/step": 20, "eval/val_bpb": 1.6, "cost/rub_spent": 800.0, "cost/tokens": 8e8, "cost/hours": 0.67}]
    (folder.root / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log), encoding="utf-8")

    cfg = demo_cfg(f"experiment.run_root={tmp_path}", "cost.target_bpb=1.7", "cost.plan_target_from=measured",
                   "cost.plan_options=[{accelerator: tpu-v5e, chips: 16}]")
    model, _, (row,), _ = plan(cfg, None, rate=RATE)
    assert model.cfg.d_model == measured.model.d_model  # the measured run's model, not cost.plan_model's 1b
    assert row["mfu_source"] == "our run" and row["tokens_per_s_per_chip"] == pytest.approx(1.2e9 / 3600 / 8)
    assert row["tokens_to_target"] == pytest.approx(7e8)
    assert row["hours_to_target"] == pytest.approx(7e8 / (1.2e9 / 3600 / 8 * 16) / 3600)
    assert row["rub_to_target"] == pytest.approx(row["hours_to_target"] * 16 * 1.20 * 100.0) == pytest.approx(560.0)

    missed = demo_cfg(f"experiment.run_root={tmp_path}", "cost.target_bpb=1.5", "cost.plan_target_from=measured")
    with pytest.raises(DataError, match=r"'measured' not reached \(best 1.6\)"):
        plan(missed, None, rate=RATE)


@pytest.mark.parametrize(("config", "accelerator", "chips", "mfu_from"), [
    ("ru-8b-v6e-64.yaml", "tpu-v6e", 64, "anchor llama3.1-8b"),  # MaxText's published MFU of this shape on v6e
    # MaxText's Llama-3.1-70B on v6e (its custom remat modelled): the nearest in size on Google's hardware
    ("ru-70b-v5p-128.yaml", "tpu-v5p", 64, "anchor llama3.1-70b on tpu-v6e"),
    ("qwen3-30b-a3b-ru-v5p-64.yaml", "tpu-v5p", 32, "anchor mixtral-8x7b"),  # MaxText's MoE on v5p
    # Mixtral (46.7B) is more than cost.plan_anchor_size_ratio 4 times GigaChat 3 Lightning's 11.1B: not lent
    ("gigachat3-lightning-ru-v6e-32.yaml", "tpu-v6e", 32, "cost.plan_mfu (nearest sparse google anchor mixtral-8x7b"),
])
def test_the_shipped_8b_and_70b_configs_are_priced_on_their_own_slices(config: str, accelerator: str, chips: int,
                                                                      mfu_from: str) -> None:
    cfg = load_config(REPO / "recipes" / "configs" / config)
    model, tokens, rows, _ = plan(cfg, None, rate=RATE)
    assert tokens == cfg.cost.token_budget == cfg.train.steps * cfg.train.batch_size * cfg.model.max_seq_len
    first = rows[0]
    assert (first["accelerator"], first["chips"], first["pricing"]) == (accelerator, chips, "on-demand")
    assert first["mfu_source"].startswith(mfu_from) and first["remat"] == cfg.model.remat
    assert first["hours"] == pytest.approx(tokens / (first["tokens_per_s_per_chip"] * chips) / 3600)
    assert first["rub"] == pytest.approx(first["hours"] * chips * first["usd_per_chip_hour"] * 100.0)
    spot = next(r for r in rows if r["pricing"] == "spot")
    assert spot["rub"] < first["rub"] and spot["hours"] == first["hours"]


def test_an_anchor_figure_that_is_not_finite_names_the_file_and_line(tmp_path: Path) -> None:
    with ANCHORS.open(encoding="utf-8", newline="") as handle:
        header, first, *_ = csv.reader(handle)
    first[header.index("mfu")] = "nan"
    anchors = tmp_path / "anchors.csv"
    with anchors.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([header, first])
    with pytest.raises(DataError, match=r"anchors.csv line 2: bad anchor row \(.*must be finite numbers\)"):
        read_anchors(anchors)


def test_a_tpu7x_plan_divides_by_devices_not_chips(tmp_path: Path) -> None:
    """Ironwood shows each chip as two JAX devices with half its peak (2,307 / 2 TFLOP/s) and half its HBM: 4
    chips are 8 devices. At a given MFU per device the 4-chip slice runs 8 x (MFU x 1,153.5 TFLOP/s) / FLOPs per
    token and pays 4 chip-hours an hour; the state is spread over 8 devices; a fit check of tpu7x-8 (8 devices)
    is the setting of the 4-chip option."""
    cfg = demo_cfg("cost.plan_model=1b", "cost.contract_rates={tpu7x: 5.0}", f"experiment.run_root={tmp_path}",
                   "cost.plan_options=[{accelerator: tpu7x, chips: 4, mfu: 0.5}]")
    model, tokens, (row,), _ = plan(cfg, None, rate=RATE)
    per_device = 0.5 * 2307e12 / 2 / model.flops_per_token
    assert row["devices"] == 8 and row["tokens_per_s_per_device"] == pytest.approx(per_device)
    assert row["tokens_per_s_per_chip"] == pytest.approx(2 * per_device)
    assert row["hours"] == pytest.approx(tokens / (8 * per_device) / 3600)
    assert row["usd"] == pytest.approx(row["hours"] * 4 * 5.0)
    assert row["state_gib_per_device"] == pytest.approx(model.params * 16 / 8 / 2**30)
    assert row["price_kind"] == "contract"
    folder = RunFolder.for_config(cfg)
    folder.reports.mkdir(parents=True)
    (folder.reports / "fit_check.json").write_text(json.dumps([
        {"slice": "tpu7x-8", "devices": 8, "fits": True, "remat": "full", "grad_accum_steps": 2}]), encoding="utf-8")
    (checked,) = plan(cfg, folder, rate=RATE)[2]
    assert (checked["remat"], checked["grad_accum_steps"], checked["setting_from"]) == ("full", 2, "fit check tpu7x-8")


def test_training_mfu_on_tpu7x_is_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 8 TPU7x devices (4 chips) the run pays for 4 chips and its MFU divides by 8 half-chip peaks."""
    from types import SimpleNamespace

    from experiment.sections.cost import CostConfig
    from trainer import throughput

    class FakeDevice:
        platform = "tpu"

    monkeypatch.setattr(throughput.jax, "devices", lambda: [FakeDevice()] * 8)
    monkeypatch.setattr(throughput.jax, "device_count", lambda: 8)
    cfg = SimpleNamespace(cost=CostConfig(accelerator="tpu7x", chips=4),
                          train=SimpleNamespace(peak_flops_per_chip=None))
    assert throughput.devices_per_chip(cfg) == 2 and throughput.chips_in_use(2) == 4
    peak = throughput.peak_flops_per_device(cfg)
    assert peak == pytest.approx(2307e12 / 2)
    window = throughput.MetricsWindow(tokens_per_step=1000, flops_per_token=1e9, peak_flops=peak)
    window.add()
    out = window.flush()
    assert out["train/mfu"] == pytest.approx(out["train/tokens_per_s"] * 1e9 / (8 * 2307e12 / 2))
    with pytest.raises(Exception, match="not a whole number of chips"):
        monkeypatch.setattr(throughput.jax, "device_count", lambda: 7)
        throughput.chips_in_use(2)


def test_a_trainium2_plan_says_which_figure_priced_it() -> None:
    """No provider publishes a Trainium2 on-demand price: the plan uses the third party's figure and says so
    (kind and source in the row, a note under the table); a contract rate replaces it and is named."""
    option = "cost.plan_options=[{accelerator: aws-trainium2, chips: 16}]"
    batch = "train.batch_size=64"  # 16 chips x 4 devices
    _, _, (row,), _ = plan(demo_cfg("cost.plan_model=1b", option, batch), None, rate=RATE)
    assert (row["usd_per_chip_hour"], row["price_kind"], row["price_date"]) == (2.235, "third-party", "2026-05")
    assert "benchmark report" in row["price_source"]
    _, _, (mine,), _ = plan(demo_cfg("cost.plan_model=1b", option, batch, "cost.contract_rates={aws-trainium2: 1.5}"),
                            None, rate=RATE)
    assert (mine["usd_per_chip_hour"], mine["price_kind"]) == (1.5, "contract")
    assert mine["usd"] == pytest.approx(row["usd"] * 1.5 / 2.235)
    with pytest.raises(ConfigError, match=r"cost.contract_rates.aws-trainium2': must be a finite positive number"):
        demo_cfg("cost.contract_rates={aws-trainium2: -1}")


def test_maxtexts_mixtral_rows_are_rederived_from_active_parameters_and_lend_only_to_sparse_plans() -> None:
    """MaxText's Mixtral-8x7B rows (v5p 52.56% MFU at 2,909 tokens/s per chip, v6e 35.23% at 3,899), counted as the
    qwen3_moe family: at the published MFU our hand count (the active parameters: the router and 2 of 8 experts per
    token) gives the published throughput within the figures' rounding; a count over all 46.7B parameters would
    miss by more than half. The plans: a mixture of experts takes the plannable sparse anchor (v5p; the v6e row's
    offloading remat is not modelled), a dense model never does, and a sparse one never takes a dense anchor."""
    rows = {a.accelerator: a for a in read_anchors() if a.model.label == "mixtral-8x7b"}
    assert sorted(rows) == ["tpu-v5p", "tpu-v6e"]
    assert [rows[k].plannable for k in ("tpu-v5p", "tpu-v6e")] == [True, False]
    for accelerator, (tokens, mfu, peak) in {"tpu-v5p": (2909, 0.5256, 459), "tpu-v6e": (3899, 0.3523, 918)}.items():
        anchor = rows[accelerator]
        assert anchor.model.sparse and anchor.model.params == pytest.approx(46.7e9, rel=0.001)  # as published
        check = anchor_check(anchor, Catalog.load())
        assert abs(check["relative_error"]) < 0.5 / tokens + 0.00005 / mfu, check
        dense_count = 6.0 * anchor.model.params  # as if every expert ran for every token
        assert tokens_per_s_per_chip(mfu, peak, dense_count) / tokens - 1 < -0.5
    options = ("cost.plan_options=[{accelerator: tpu-v6e, chips: 64}, {accelerator: tpu-v5p, chips: 32}, "
               "{accelerator: nvidia-h100, chips: 32, cloud: aws}]")
    sparse = load_config(REPO / "recipes" / "configs" / "qwen3-30b-a3b-ru-v5p-64.yaml", [options])
    model, _, (v6e, v5p, h100), _ = plan(sparse, None, rate=RATE)
    assert model.sparse
    assert v5p["mfu_source"].startswith("anchor mixtral-8x7b,") and v6e["mfu_source"].startswith(
        "anchor mixtral-8x7b on tpu-v5p,")
    assert v5p["mfu"] == pytest.approx(rows["tpu-v5p"].mfu * rows["tpu-v5p"].recompute / v5p["recompute"])
    assert h100["mfu_source"].startswith("cost.plan_mfu (no sparse anchor on nvidia hardware)")
    # a dense model of about Mixtral's size (70b, 1.5x) is lent the dense anchor or none, never the sparse one
    _, _, dense_rows, _ = plan(demo_cfg("cost.plan_model=70b", "cost.plan_anchor_size_ratio=100", options,
                                        "train.batch_size=64"), None, rate=RATE)
    assert not any("mixtral" in row["mfu_source"] for row in dense_rows)


@pytest.mark.parametrize(("override", "message"), [
    ("cost.pricing=spott", "config key 'cost.pricing': cpu-e2-standard-2 has no 'spott' price in the catalog (did"),
    ("cost.accelerator=tpu-v7", "config key 'cost.accelerator': unknown accelerator 'tpu-v7' (did you mean"),
])
def test_the_runs_own_accelerator_and_pricing_are_checked_even_when_the_options_do_not_use_them(
        override: str, message: str) -> None:
    """What recipe 04 books (cost.accelerator at cost.pricing) is checked by the planner too: a typo there is one
    error line, not a plan of the other options."""
    with pytest.raises(CatalogError, match=re.escape(message)):
        plan(demo_cfg(override), None, rate=RATE)
