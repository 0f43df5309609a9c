"""Rubles where Russian teams pay: contract rates in RUB or USD with VAT, the Russian clouds' catalog rows, and
plans a reader can act on (the console plan, MaxText's anchors with their remat, slices a batch cannot split)."""

from __future__ import annotations

import csv
import datetime as dt
import math
from pathlib import Path

import pytest

from cost.catalog import Catalog, CatalogError, read_prices
from cost.ledger import Ledger
from cost.planner import TERMINAL_COLUMNS, plan, plan_costs, plan_figure, read_anchors, recompute_factor
from cost.rates import UsdRubRate
from cost.report import significant, to_terminal
from experiment.config import load_config
from experiment.errors import ConfigError, DataError
from experiment.runfolder import RunFolder
from experiment.sections.cost import ContractRate, CostConfig

REPO = Path(__file__).resolve().parents[1]
TODAY = dt.date.today()
HOUR = 3600.0
A100_PEAK = 312e12  # NVIDIA's A100 datasheet: dense bf16 per GPU
RUB_RATE = ("cost.contract_rates={nvidia-a100: {price: 450, currency: RUB, vat: added}}", 450.0)
YANDEX = "cost.plan_options=[{accelerator: nvidia-a100, cloud: yandex, chips: 8, mfu: 0.4}]"


def demo(*overrides: str):
    return load_config(REPO / "recipes" / "configs" / "demo.yaml",
                       ["cost.plan_model=1b", "cost.plan_tokens=2000000000", *overrides])


def test_a_plan_with_a_rub_contract_rate_and_vat_prints_rubles_equal_to_the_hand_sum(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """8 A100s at 450 RUB per GPU-hour before VAT, VAT 22% added, 2B tokens at 40% MFU: hours x chips x 450 x 1.22,
    whatever the USD->RUB rate (rubles never go through dollars)."""
    override, price = RUB_RATE
    cfg = demo(override, YANDEX, f"experiment.run_root={tmp_path}", "cost.usd_rub_rate=80",
               f"cost.usd_rub_date={TODAY.isoformat()}")
    model, tokens, (row,), _ = plan(cfg, None, rate=UsdRubRate(80.0, TODAY, "test"))
    hours = tokens / (0.4 * A100_PEAK / model.flops_per_token * 8) / HOUR
    hand = hours * 8 * price * (1 + 0.22)
    assert row["rub"] == pytest.approx(hand, rel=1e-12)
    assert row["usd"] == pytest.approx(hand / 80.0, rel=1e-12)
    assert (row["price_kind"], row["chip_hour_price"]) == ("contract", "450 RUB + 22% VAT")
    _, _, (at_another_rate,), _ = plan(cfg, None, rate=UsdRubRate(95.5, TODAY, "test"))
    assert at_another_rate["rub"] == row["rub"]  # bit for bit: the rate never touches a ruble price
    plan_costs(cfg, RunFolder(tmp_path / "demo"), None)
    printed = capsys.readouterr().out
    assert significant(hand) in printed  # the console plan prints the hand sum
    with (tmp_path / "demo" / "reports" / "plan.csv").open(encoding="utf-8", newline="") as handle:
        (written,) = csv.DictReader(handle)
    assert float(written["rub"]) == pytest.approx(hand, rel=1e-12)
    # VAT already in the figure (a price list "с НДС"): the figure as it is; another cost.vat_rate: that rate
    included = demo("cost.contract_rates={nvidia-a100: {price: 450, currency: RUB, vat: included}}", YANDEX)
    assert plan(included, None, rate=UsdRubRate(80.0, TODAY, "t"))[2][0]["rub"] == pytest.approx(hours * 8 * 450)
    twenty = demo(override, YANDEX, "cost.vat_rate=0.2")
    assert plan(twenty, None, rate=UsdRubRate(80.0, TODAY, "t"))[2][0]["rub"] == pytest.approx(hours * 8 * 540)


def test_the_ledger_books_a_rub_rate_in_rubles_without_the_usd_rate(tmp_path: Path) -> None:
    """Two A100s for one hour at 300 RUB before VAT: 2 x 300 x 1.22 = 732 RUB, at a rate of 80 or of 95.5."""
    totals = []
    t = [1_000_000.0]
    for rate in (80.0, 95.5):
        cfg = CostConfig(accelerator="nvidia-a100", cloud="yandex", chips=2, usd_rub_rate=rate,
                         usd_rub_date=TODAY.isoformat(),
                         contract_rates={"nvidia-a100": ContractRate(300.0, "RUB", "added")})
        ledger = Ledger.open(tmp_path / f"ledger-{rate}", cfg, "run", rate=UsdRubRate(rate, TODAY, "test"),
                             clock=lambda: t[0], started_at=t[0], background=False)
        with ledger.phase("train"):
            t[0] += HOUR
            ledger.add_tokens(1, 1000)
        ledger.close()
        summary = ledger.summary()
        assert summary.usd_total == pytest.approx(summary.rub_total / rate, rel=1e-12)
        totals.append(summary.rub_total)
        report = (tmp_path / f"ledger-{rate}" / "cost_report.md").read_text(encoding="utf-8")
        assert "| 366 RUB |" in report  # the chip-hour as billed: 300 + 22%
    assert totals == [2 * 300 * 1.22] * 2


def test_a_russian_cloud_row_without_a_public_rate_says_so_and_asks_for_one(tmp_path: Path) -> None:
    catalog = Catalog.load()
    russian = [row for row in catalog.prices if row.cloud in ("yandex", "cloud.ru", "selectel", "vk")]
    assert {row.cloud for row in russian} == {"yandex", "cloud.ru", "selectel", "vk"}
    for row in russian:  # no page read gives a GPU price: none published, a source where we looked, a date
        assert row.figure is None and row.source_kind == "none published" and row.source.startswith("https://")
        assert row.note.startswith("none published: give your rate") and "currency: RUB" in row.note
    _, _, (row,), _ = plan(demo(YANDEX), None, rate=UsdRubRate(80.0, TODAY, "t"))
    assert row["rub"] is None and row["usd"] is None and row["hours"] > 0  # planned in hours, never priced at 0
    assert row["not_planned"].startswith("not priced: none published: give your rate")
    assert "cost.contract_rates: {nvidia-a100:" in row["not_planned"] and row["rub_cell"] == "give a rate"
    cfg = CostConfig(accelerator="nvidia-a100", cloud="yandex", chips=8, usd_rub_rate=80.0,
                     usd_rub_date=TODAY.isoformat())
    with pytest.raises(CatalogError, match=r"no on-demand price for nvidia-a100 \(yandex/ru-central1\).*"
                                           r"currency: RUB"):
        Ledger.open(tmp_path / "ledger", cfg, "run", rate=UsdRubRate(80.0, TODAY, "t"))
    assert not (tmp_path / "ledger").exists()


@pytest.mark.parametrize("override", ["cost.contract_rates={nvidia-a100: {price: 0, currency: RUB}}",
                                      "cost.contract_rates={nvidia-a100: 0}", "cost.vat_rate=1.2",
                                      "cost.contract_rates={nvidia-a100: {price: 10, currency: EUR}}"])
def test_bad_rates_are_one_line_naming_the_key(override: str) -> None:
    with pytest.raises(ConfigError, match=r"config key 'cost\.(contract_rates\.nvidia-a100|vat_rate)"):
        demo(override)


NOT_FINITE, NOT_POSITIVE = "expected a finite number", "must be a finite positive number"


@pytest.mark.parametrize(("rate", "key", "said"), [
    (".nan", "nvidia-a100", NOT_FINITE), ("nan", "nvidia-a100", NOT_FINITE), (".inf", "nvidia-a100", NOT_FINITE),
    ("-.inf", "nvidia-a100", NOT_FINITE), ("-2", "nvidia-a100", NOT_POSITIVE),
    ("{price: .nan, currency: RUB}", "nvidia-a100.price", NOT_FINITE),
    ("{price: .inf}", "nvidia-a100.price", NOT_FINITE),
    ("{price: -2, currency: RUB}", "nvidia-a100.price", NOT_POSITIVE)])
def test_a_rate_that_is_no_finite_positive_number_is_one_line_saying_so(rate: str, key: str, said: str) -> None:
    """NaN passes no range check and inf passes most: a contract rate of either, or a negative one, bare or as
    a price, is refused in one line naming the rate's own key and what it must be (not as a value that fits none
    of float | ContractRate)."""
    with pytest.raises(ConfigError) as refused:
        demo(f"cost.contract_rates={{nvidia-a100: {rate}}}")
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"config key 'cost.contract_rates.{key}': {said}"), line


@pytest.mark.integration
def test_recipe_07_refuses_a_nan_rate_before_it_writes(tmp_path: Path) -> None:
    from tests.recipe_runner import error_line, run_recipe, tiny_config

    config = tiny_config(tmp_path, cost={"contract_rates": {"nvidia-a100": float("nan")}})
    proc = run_recipe("07_plan_costs.py", config, timeout=120, check=False)
    assert proc.returncode == 2
    assert error_line(proc) == "error: config key 'cost.contract_rates.nvidia-a100': expected a finite number, got nan"
    assert not any(tmp_path.rglob("config.resolved.yaml"))  # no run folder begun


def test_a_catalog_price_of_zero_is_refused_as_a_contract_rate_of_zero_is(tmp_path: Path) -> None:
    user = tmp_path / "prices.csv"
    user.write_text("kind,name,cloud,region,pricing,usd,unit,source,date,note\n"
                    "accelerator,nvidia-h100,mycloud,,on-demand,0,chip-hour,https://example.org/prices,2026-12-01,\n",
                    encoding="utf-8")
    with pytest.raises(DataError, match=r"prices.csv line 2: column 'usd' is 0 for accelerator nvidia-h100"):
        read_prices(user)


def test_rubles_that_are_not_a_finite_number_are_refused_naming_the_key(tmp_path: Path) -> None:
    absurd = "cost.contract_rates={tpu-v6e: 1.0e+308}"
    options = "cost.plan_options=[{accelerator: tpu-v6e, chips: 8}]"
    with pytest.raises(ConfigError, match=r"config key 'cost.contract_rates.tpu-v6e'.*not a finite number of rubles"):
        plan(demo(absurd, options), None, rate=UsdRubRate(100.0, TODAY, "t"))
    cfg = CostConfig(accelerator="tpu-v6e", chips=8, usd_rub_rate=100.0, usd_rub_date=TODAY.isoformat(),
                     contract_rates={"tpu-v6e": 1e308})
    with pytest.raises(ConfigError, match=r"config key 'cost.contract_rates.tpu-v6e'.*not a finite number"):
        Ledger.open(tmp_path / "ledger", cfg, "run", rate=UsdRubRate(100.0, TODAY, "t"))
    assert not (tmp_path / "ledger").exists()  # refused before anything was written


def test_the_console_plan_is_one_row_per_option_within_120_columns() -> None:
    """The shipped 8B plan with a Russian row: every option on one line of one table (its key column filled, the MFU
    source short and whole), the rows a reader must act on flagged; plan.md keeps every column."""
    cfg = load_config(REPO / "recipes" / "configs" / "ru-8b-v6e-64.yaml")
    cfg.cost.plan_options.append(type(cfg.cost.plan_options[0])("nvidia-a100", 64, cloud="yandex"))
    _, _, rows, _ = plan(cfg, None, rate=UsdRubRate(80.0, TODAY, "t"))
    text = to_terminal(rows, TERMINAL_COLUMNS, "Plan: llama 8b (8.0B parameters), 167.8B tokens", width=120)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120 and "(1/2)" not in text  # one block
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == len(rows)
    for line, row in zip(body, rows, strict=True):
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells[0] == row["accelerator"] and cells[2] == f"{row['pricing']} ({row['cloud']})"  # never blank
        assert cells[4] == row["rub_cell"] and cells[6] == row["mfu_from"] != ""
        if row["hours"] is not None:  # a planned row's source in short, not cut
            assert row["mfu_source"].startswith((f"anchor {row['mfu_from']}", row["mfu_from"]))
    assert [c.key for c in TERMINAL_COLUMNS] == ["accelerator", "chips", "pricing_cloud", "hours", "rub_cell", "mfu",
                                                 "mfu_from"]


def test_maxtexts_llama_anchors_are_read_with_their_custom_remat() -> None:
    """MaxText's Llama-3.1-8B (remat_policy custom: q/k/v/out offloaded, the rest recomputed) and -70B (q/k/v
    offloaded) both lend their MFU, each at full remat's recompute less its kept projections' forward matmuls; the
    shipped 8B config (full remat) on v6e is then planned near MaxText's 45.5% (not 34%)."""
    anchors = {a.model.label: a for a in read_anchors() if a.accelerator == "tpu-v6e"}
    for label, kept_per_layer in (("llama3.1-8b", 2 * 4096 * (4096 + 1024 + 1024 + 4096)),
                                  ("llama3.1-70b", 2 * 8192 * (8192 + 1024 + 1024))):
        anchor = anchors[label]
        assert anchor.plannable and anchor.remat.startswith("custom:")
        cfg = anchor.model.cfg
        full = recompute_factor(type(cfg)(**{**cfg.__dict__, "remat": "full"}), anchor.model.vocab_size,
                                anchor.model.seq_len, "tpu", "bfloat16", 0)
        kept = kept_per_layer * cfg.n_layers / anchor.model.flops_per_token
        assert anchor.recompute == pytest.approx(full - kept)
        assert 1.2 < anchor.recompute < full
    cfg = load_config(REPO / "recipes" / "configs" / "ru-8b-v6e-64.yaml")
    _, _, rows, _ = plan(cfg, None, rate=UsdRubRate(80.0, TODAY, "t"))
    v6e = rows[0]
    assert v6e["mfu_source"].startswith("anchor llama3.1-8b,") and v6e["mfu"] > 0.42
    seventy = load_config(REPO / "recipes" / "configs" / "ru-70b-v5p-128.yaml")
    _, _, rows, _ = plan(seventy, None, rate=UsdRubRate(80.0, TODAY, "t"))
    assert all("llama3.1-8b" not in row["mfu_source"] for row in rows)  # never "the nearest anchor" for a 70B


def test_an_option_whose_devices_cannot_split_the_batch_is_not_planned_and_says_why() -> None:
    """The shipped 8B config's 320 sequences do not split over a v6e-256's 256 devices: that row has no hours and
    no rubles and says why; the 70B's 256 sequences do split over it."""
    # (recipe 07's checks refuse such an option named in the config, before planning: cost.checks.check_plan)
    cfg = load_config(REPO / "recipes" / "configs" / "ru-8b-v6e-64.yaml",
                      ["cost.plan_options=[{accelerator: tpu-v6e, chips: 64}, {accelerator: tpu-v6e, chips: 256}]"])
    _, _, rows, _ = plan(cfg, None, rate=UsdRubRate(80.0, TODAY, "t"))
    (v6e256,) = [row for row in rows if (row["accelerator"], row["chips"]) == ("tpu-v6e", 256)]
    assert v6e256["hours"] is None and v6e256["rub"] is None and v6e256["rub_cell"] == "not planned"
    assert "train.batch_size 320" in v6e256["not_planned"] and "256 data-parallel devices" in v6e256["not_planned"]
    assert all(row["hours"] for row in rows if row is not v6e256)
    seventy = load_config(REPO / "recipes" / "configs" / "ru-70b-v5p-128.yaml")
    _, _, rows, _ = plan(seventy, None, rate=UsdRubRate(80.0, TODAY, "t"))
    assert all(row["hours"] and not row["not_planned"] for row in rows)


def test_the_plan_chart_writes_rubles_plainly_without_an_offset() -> None:
    rows = [{"accelerator": "tpu-v6e", "chips": 64, "pricing": p, "cloud": "gcp", "rub": rub, "hours": 66.0}
            for p, rub in (("on-demand", 11_452_471.0), ("spot", 2_429_000.0))]
    fig = plan_figure([*rows, {**rows[0], "pricing": "1y", "rub": None, "hours": None}], "plan")
    fig.canvas.draw()
    ax_rub = fig.axes[0]
    assert ax_rub.xaxis.get_offset_text().get_text() == ""  # no "1e7" beside the axis
    labels = [tick.get_text() for tick in ax_rub.get_xticklabels() if tick.get_text()]
    assert any("," in label and float(label.replace(",", "")) >= 1e6 for label in labels), labels
    assert [math.isnan(bar.get_width()) for bar in ax_rub.patches] == [False, False, True]  # no bar at 0 rubles


def test_a_small_cost_report_shows_its_dollars_not_zero(tmp_path: Path) -> None:
    """One minute of the 0.06701 USD/h CPU host: 0.00112 USD, which two decimals printed as "0.00 USD"."""
    t = [1_000_000.0]
    cfg = CostConfig(usd_rub_rate=100.0, usd_rub_date=TODAY.isoformat())
    ledger = Ledger.open(tmp_path / "ledger", cfg, "run", rate=UsdRubRate(100.0, TODAY, "test"),
                         clock=lambda: t[0], started_at=t[0], background=False)
    with ledger.phase("train"):
        t[0] += 60.0
    ledger.close()
    usd = 0.06701 / 60
    head = (tmp_path / "ledger" / "cost_report.md").read_text(encoding="utf-8").splitlines()[2]
    assert head.startswith(f"{usd * 100:.3g} RUB = {usd:.3g} USD at USD->RUB 100.0000"), head


def test_the_cheapest_row_is_the_cheapest_as_billed_with_vat() -> None:
    """110 RUB with VAT in is cheaper than 100 RUB before 22% VAT (122 billed): the row picked for an option
    without a cloud is the one the invoice charges least for."""
    from cost.catalog import PriceRow

    def row(cloud: str, rub: float, vat: str) -> PriceRow:
        return PriceRow(kind="accelerator", name="nvidia-a100", cloud=cloud, region="ru-central1", pricing="on-demand",
                        usd=None, unit="chip-hour", source="test", date="2026-12-01", rub=rub, vat=vat)

    catalog = Catalog(prices=[row("a", 100.0, "added"), row("b", 110.0, "included")], hardware={}, vat_rate=0.22)
    assert catalog.lookup("nvidia-a100", "on-demand", cheapest=True, usd_rub_rate=80.0).cloud == "b"
    assert [r.cloud for r in catalog.priced_rows("nvidia-a100", "on-demand", cheapest=True, usd_rub_rate=80.0)] == [
        "b", "a"]


def test_a_plan_for_a_run_priced_on_a_row_without_a_figure_still_plans() -> None:
    """The run's own accelerator on a Russian cloud's row without a published rate: its check lets the plan through
    (a note), so the planner must not refuse it either (it raised UnpricedError after the check had passed)."""
    cfg = load_config(REPO / "recipes" / "configs" / "demo.yaml", ["cost.accelerator=nvidia-a100", "cost.cloud=yandex"])
    _, _, rows, _ = plan(cfg, None, rate=UsdRubRate(80.0, TODAY, "t"))
    assert rows
