"""Object storage in the bill: the catalog's storage rows, cost.storage, the ledger's GB-months and requests, and
the planner's storage line, each checked against arithmetic done here by hand from the cited catalog rows."""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import re
from pathlib import Path

import pytest

from cost.catalog import BUNDLED_PRICES, Catalog, CatalogError, read_prices
from cost.ledger import Ledger, price_rows
from cost.ledger_format import read_sessions
from cost.ledger_pricing import summarize_ledger
from cost.ledger_report import summarize_sessions
from cost.planner import plan, plan_costs, storage_plan
from cost.rates import UsdRubRate
from cost.storage import default_storage, folder_bytes, listing_requests
from experiment.config import load_config
from experiment.errors import ConfigError, DataError
from experiment.runfolder import RunFolder
from experiment.sections.cost import CostConfig
from experiment.storage import location
from tests.fake_clock import FakeClock

GIB = 1024**3
MONTH_HOURS = 730.0  # the hours of a GB-month, as Google publishes it: $0.000027397 per GiB-hour x 730 = $0.020
RATE = 100.0
REPO = Path(__file__).resolve().parents[1]
TODAY = dt.date.today().isoformat()


def bundled(name: str, unit: str) -> dict[str, str]:
    """The bundled catalog's storage row, read with the csv module (not the code under test)."""
    with BUNDLED_PRICES.open(encoding="utf-8") as handle:
        (row,) = [r for r in csv.DictReader(handle)
                  if r["kind"] == "storage" and r["name"] == name and r["unit"] == unit]
    return row


def usd(name: str, unit: str) -> float:
    return float(bundled(name, unit)["usd"])




def storage_cfg(**changes: object) -> CostConfig:
    values = {"accelerator": "tpu-v5e", "pricing": "on-demand", "chips": 8, "usd_rub_rate": RATE,
              "usd_rub_date": TODAY, "flush_seconds": 1.0, "storage": "gcs-standard"}
    values.update(changes)
    return CostConfig(**values)


def open_ledger(run: Path, clock: FakeClock, cfg: CostConfig, measured=None, rate: float = RATE) -> Ledger:
    return Ledger.open(run / "ledger", cfg, "run-1", rate=UsdRubRate(rate, dt.date.today(), "test"), clock=clock,
                       started_at=clock(), background=False, measure_storage=measured)


# ------------------------------------------------------------------------------------------- the catalog


def test_every_storage_class_prices_all_four_figures_each_with_a_source_to_open_and_a_day() -> None:
    catalog = Catalog.load()
    assert catalog.names("storage") == ["gcs-standard", "s3-standard"]
    with BUNDLED_PRICES.open(encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["kind"] == "storage"]
    assert len(rows) == 8
    for row in rows:
        assert row["source"].startswith("https://") and re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row
        assert row["source_kind"] in ("provider list", "third-party") and float(row["usd"]) > 0, row
    for name in catalog.names("storage"):
        assert set(catalog.storage_rows(name)) == {"gb-month", "1000-writes", "1000-reads", "gb"}
    # the two clouds' own regions, where the bundled accelerators are priced
    assert {(r["name"], r["cloud"], r["region"]) for r in rows} == {("gcs-standard", "gcp", "us-central1"),
                                                                    ("s3-standard", "aws", "us-east-1")}


def test_the_gcs_gb_month_is_the_cited_per_gib_hour_price_times_730_hours() -> None:
    """Google's page gives Standard storage in us-central1 as $0.000027397 per GiB-hour (the row's note cites it);
    x 730 hours that is the $0.020 per GB-month the row holds, to the page's rounding."""
    row = bundled("gcs-standard", "gb-month")
    per_gib_hour = float(re.search(r"'\$(0\.0000\d+) / 1 gibibyte hour'", row["note"]).group(1))
    assert per_gib_hour * MONTH_HOURS == pytest.approx(float(row["usd"]), rel=1e-5)
    assert "$0.020" in row["source"]
    for unit, quoted in (("1000-writes", "$0.005 per 1,000"), ("1000-reads", "$0.0004 per 1,000"),
                         ("gb", "$0.12 per GB")):
        assert quoted in bundled("gcs-standard", unit)["source"]
        assert float(quoted.split()[0].lstrip("$")) == usd("gcs-standard", unit)


def test_the_s3_rows_quote_their_figures_and_say_they_are_third_party() -> None:
    for unit, quoted in (("gb-month", "$0.023/GB/month"), ("1000-writes", "$0.005 per 1,000"),
                         ("1000-reads", "$0.0004 per 1,000"), ("gb", "$0.09 per GB")):
        row = bundled("s3-standard", unit)
        assert quoted in row["source"] and row["source_kind"] == "third-party"
        assert float(re.search(r"[\d.]+", quoted.lstrip("$")).group()) == float(row["usd"])


def write_catalog(path: Path, rows: list[list[str]]) -> Path:
    header = ["kind", "name", "cloud", "region", "pricing", "usd", "rub", "unit", "source", "date", "note"]
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])
    return path


def rub_class(path: Path, gb_month_rub: str = "2.0") -> Path:
    """A provider priced in rubles, as a user would add one (the figures are this test's, not a provider's)."""
    return write_catalog(path, [
        ["storage", "my-s3-standard", "", "ru-central1", "on-demand", "", gb_month_rub, "gb-month", "our quote",
         "2026-12-01", ""],
        ["storage", "my-s3-standard", "", "ru-central1", "on-demand", "", "0.5", "1000-writes", "our quote",
         "2026-12-01", ""],
    ])


def test_a_ruble_price_is_kept_in_rubles_and_only_a_storage_row_may_have_one(tmp_path: Path) -> None:
    catalog = Catalog.load(str(rub_class(tmp_path / "mine.csv")))
    rows = catalog.storage_rows("my-s3-standard")
    assert (rows["gb-month"].rub, rows["gb-month"].usd, rows["gb-month"].currency) == (2.0, None, "RUB")
    assert set(rows) == {"gb-month", "1000-writes"}  # no read or egress figure: not priced, never a zero
    bad = write_catalog(tmp_path / "bad.csv", [["infra", "disk", "", "", "on-demand", "", "1", "gb-month", "s",
                                                "2026-12-01", ""]])
    with pytest.raises(DataError, match=r"bad.csv line 2: only accelerator and storage rows may be priced in RUB"):
        read_prices(bad)
    both = write_catalog(tmp_path / "both.csv", [["storage", "x", "", "", "on-demand", "1", "1", "gb-month", "s",
                                                  "2026-12-01", ""]])
    with pytest.raises(DataError, match=r"both.csv line 2: a row is priced in one currency"):
        read_prices(both)


def test_a_user_row_replaces_the_bundled_figure_of_its_own_unit_only(tmp_path: Path) -> None:
    mine = write_catalog(tmp_path / "mine.csv", [["storage", "gcs-standard", "gcp", "us-central1", "on-demand",
                                                  "0.018", "", "gb-month", "our contract", "2026-12-01", ""]])
    rows = Catalog.load(str(mine)).storage_rows("gcs-standard")
    assert rows["gb-month"].usd == 0.018 and rows["gb-month"].source_kind == "user catalog"
    assert rows["1000-writes"].usd == usd("gcs-standard", "1000-writes")


# ------------------------------------------------------------------------------------------- the config


@pytest.mark.parametrize(("override", "message"), [
    ("cost.storage='GCS Standard'", r"config key 'cost.storage': 'GCS Standard' is not a storage class name"),
    ("cost.storage=gs://bucket", r"config key 'cost.storage': 'gs://bucket' is not a storage class name"),
])
def test_a_storage_setting_that_is_no_name_is_one_line_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "recipes" / "configs" / "demo.yaml", [override])


def test_a_region_with_nothing_to_price_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"config key 'cost.storage_region': set with cost.storage: none"):
        load_config(REPO / "recipes" / "configs" / "demo.yaml", ["cost.storage=none", "cost.storage_region=x"])


def test_an_unknown_class_or_region_fails_before_anything_opens() -> None:
    """price_rows is what recipe 04 checks before a W&B run or a ledger session exists."""
    with pytest.raises(CatalogError, match=r"config key 'cost.storage': unknown storage class 'gcs-standart' "
                                           r"\(did you mean 'gcs-standard'\?\)"):
        price_rows(storage_cfg(storage="gcs-standart"))
    with pytest.raises(CatalogError, match=r"config key 'cost.storage_region': no gcs-standard rows for region "
                                           r"europe-west4 \(the catalog has us-central1\)"):
        price_rows(storage_cfg(storage_region="europe-west4"))
    price_rows(storage_cfg())  # a known class
    price_rows(storage_cfg(storage="auto"))  # auto needs the run folder: checked when the ledger opens


def test_auto_reads_where_the_run_folder_is(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("STORAGE_EMULATOR_HOST", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(variable, raising=False)
    assert default_storage(location("gs://my-runs/x"))[0] == "gcs-standard"
    assert default_storage(location("s3://my-runs/x"))[0] == "s3-standard"
    assert default_storage(Path("runs/x")) == ("", "a local folder: not object storage (cost.infrastructure "
                                                   "prices a disk)")
    assert default_storage(None, "gcp")[0] == "gcs-standard" and default_storage(None, "aws")[0] == "s3-standard"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://s3.eu-west-1.amazonaws.com")
    assert default_storage(location("s3://my-runs/x"))[0] == "s3-standard"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://storage.example.ru")
    name, why = default_storage(location("s3://my-runs/x"))
    assert name == "" and "https://storage.example.ru" in why and "cost.storage" in why
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    assert default_storage(location("gs://my-runs/x"))[0] == ""


# ------------------------------------------------------------------------------------------- the ledger


def test_a_session_of_known_length_and_size_costs_its_gb_months_and_requests(tmp_path: Path) -> None:
    """50 GiB held for 10 h of training, then 150 GiB for 20 h idle; 3,000 writes, 50,000 reads and 2 GiB out:
    the storage line is those GB-months and counts at the cited gcs-standard rows, at 100 RUB per USD."""
    clock = FakeClock()
    ledger = open_ledger(tmp_path / "run", clock, storage_cfg(), measured=lambda: (50 * GIB, 7))
    with ledger.phase("train"):
        clock.advance(10)
        ledger.add_requests(writes=3000, reads=50_000, egress_bytes=2 * GIB)
    ledger.set_stored_bytes(150 * GIB)
    clock.advance(20)
    ledger.close()
    gb_months = (50 * 10 + 150 * 20) / MONTH_HOURS
    expected_usd = (gb_months * usd("gcs-standard", "gb-month") + 3 * usd("gcs-standard", "1000-writes")
                    + 50 * usd("gcs-standard", "1000-reads") + 2 * usd("gcs-standard", "gb"))
    assert expected_usd == pytest.approx(4.7945205 * 0.02 + 0.015 + 0.02 + 0.24, rel=1e-6)  # 0.3709 USD
    on_disk = summarize_ledger(tmp_path / "run" / "ledger")
    assert on_disk.rub_by_phase["storage"] == pytest.approx(expected_usd * RATE)
    assert on_disk.rub_total == pytest.approx(30 * 8 * 1.20 * RATE + expected_usd * RATE)
    assert on_disk.hours == pytest.approx(30.0)  # storage is money, not time
    assert ledger.summary().rub_by_phase == pytest.approx(on_disk.rub_by_phase)
    records = [json.loads(line) for line in (tmp_path / "run" / "ledger" / "ledger.jsonl").read_text().splitlines()]
    assert records[0]["storage"]["name"] == "gcs-standard" and records[0]["storage"]["rows"]["gb-month"]["usd"] == 0.02
    assert [(r["bytes"], r.get("objects")) for r in records if r["e"] == "stored"] == [(50 * GIB, 7), (150 * GIB, None)]
    assert [(r["writes"], r["reads"], r["egress_bytes"]) for r in records if r["e"] == "requests"] == [
        (3000, 50_000, 2 * GIB)]
    report = (tmp_path / "run" / "ledger" / "cost_report.md").read_text(encoding="utf-8")
    assert "## Storage" in report and "| storage | other |" in report and "4.795" in report  # GB-months
    assert "https://cloud.google.com/storage/pricing" in report
    with (tmp_path / "run" / "ledger" / "cost_sessions.csv").open(encoding="utf-8") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["storage_rub"]) == pytest.approx(expected_usd * RATE)


def test_each_checkpoint_mark_measures_the_run_folder_on_its_disk(tmp_path: Path) -> None:
    """The default measurement: every file's size under the run folder, the ledger's own file as far as it was
    written (a disk lists for free: no requests); 2 h at the first level, 1 h at the level after the mark."""
    run = tmp_path / "run"
    (run / "shards").mkdir(parents=True)
    (run / "shards" / "train-00000.tfrecord").write_bytes(b"x" * 1000)
    clock = FakeClock()
    ledger = open_ledger(run, clock, storage_cfg())
    clock.advance(2)
    (run / "checkpoints" / "100").mkdir(parents=True)
    (run / "checkpoints" / "100" / "state").write_bytes(b"y" * 3000)
    ledger.mark_checkpoint(100)
    clock.advance(1)
    ledger.close()
    lines = (run / "ledger" / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    stored = [i for i, r in enumerate(records) if r["e"] == "stored"]
    # each listing saw the ledger's lines written before its own record
    expected = [1000 + sum(map(len, lines[:stored[0]])), 1000 + 3000 + sum(map(len, lines[:stored[1]]))]
    assert [records[i]["bytes"] for i in stored] == expected and records[stored[1] - 1]["e"] == "ckpt"
    byte_hours = expected[0] * 2 + expected[1] * 1
    assert summarize_ledger(run / "ledger").rub_by_phase["storage"] == pytest.approx(
        byte_hours / GIB / MONTH_HOURS * 0.02 * RATE)
    assert not [r for r in records if r["e"] == "requests"]


def test_a_run_folder_in_a_bucket_is_listed_and_each_listing_counted(bucket, caplog: pytest.LogCaptureFixture) -> None:
    """On fake-gcs-server and moto: auto prices nothing at an emulator's endpoint, and says so; a named class lists
    the folder at the open and at each checkpoint mark, one LIST request per listing of under 1,000 objects, each
    priced at the class's write-class row."""
    run = bucket / "runs" / "demo"
    (run / "shards" / "train-00000.tfrecord").write_bytes(b"x" * 1000)
    assert folder_bytes(run) == (1000, 1)
    clock = FakeClock()
    with caplog.at_level(logging.WARNING, logger="cost.ledger"):
        unpriced = open_ledger(run, clock, storage_cfg(storage="auto"))
    unpriced.close()
    assert f"cost.storage: auto prices no object storage for {run}" in caplog.text
    assert "storage" not in summarize_ledger(run / "ledger").rub_by_phase
    ledger = open_ledger(run, clock, storage_cfg(storage="s3-standard"))
    clock.advance(1)
    (run / "checkpoints" / "6" / "state").write_bytes(b"y" * 3000)
    ledger.mark_checkpoint(6)
    clock.advance(1)
    ledger.close()
    records = [r for session in read_sessions(run / "ledger")[1:] for r in session.stored]
    assert len(records) == 2 and records[1][1] - records[0][1] >= 3000
    summary = summarize_sessions(run / "ledger")[1]
    assert summary["writes"] == 2 and summary["reads"] == 0  # two listings, one LIST request each
    byte_hours = records[0][1] * 1 + records[1][1] * 1
    assert summary["storage_rub"] == pytest.approx((byte_hours / GIB / MONTH_HOURS * usd("s3-standard", "gb-month")
                                                    + 2 / 1000 * usd("s3-standard", "1000-writes")) * RATE)


def test_a_bucket_listing_is_billed_as_its_list_requests() -> None:
    assert listing_requests(location("gs://runs/x"), 2500) == 3
    assert listing_requests(location("gs://runs/x"), 0) == 1
    assert listing_requests(Path("runs/x"), 2500) == 0


def test_a_resumed_session_starts_at_the_level_the_last_one_left(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    first = open_ledger(tmp_path / "run", clock, storage_cfg(), measured=lambda: (10 * GIB, 3))
    clock.advance(1)
    first.close()
    clock.advance(5)  # between sessions: not in the ledger

    def unreachable() -> tuple[int, int]:
        raise OSError("bucket unreachable")

    with caplog.at_level(logging.WARNING, logger="cost.ledger"):
        second = open_ledger(tmp_path / "run", clock, storage_cfg(), measured=unreachable)
    assert "could not measure the run folder's storage (bucket unreachable): keeping 10737418240 bytes" in caplog.text
    clock.advance(2)
    second.close()
    summary = summarize_ledger(tmp_path / "run" / "ledger")
    assert summary.rub_by_phase["storage"] == pytest.approx(10 * 3 / MONTH_HOURS * 0.02 * RATE)
    assert second.summary().rub_by_phase["storage"] == pytest.approx(summary.rub_by_phase["storage"])


@pytest.mark.parametrize("rate", [100.0, 50.0])
def test_a_ruble_price_costs_the_same_rubles_whatever_the_dollar(tmp_path: Path, rate: float) -> None:
    clock = FakeClock()
    cfg = storage_cfg(storage="my-s3-standard", catalog_path=str(rub_class(tmp_path / "mine.csv")), usd_rub_rate=rate)
    ledger = open_ledger(tmp_path / "run", clock, cfg, measured=lambda: (73 * GIB, 1), rate=rate)
    clock.advance(100)
    ledger.add_requests(writes=4000)
    ledger.close()
    summary = summarize_ledger(tmp_path / "run" / "ledger")
    assert summary.rub_by_phase["storage"] == pytest.approx(73 * 100 / MONTH_HOURS * 2.0 + 4 * 0.5)  # 12 RUB
    assert summary.rub_total - summary.rub_by_phase["storage"] == pytest.approx(100 * 8 * 1.20 * rate)


def test_a_local_run_folder_under_auto_prices_no_storage_and_old_ledgers_still_read(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = open_ledger(tmp_path / "run", clock, storage_cfg(storage="auto"))
    clock.advance(1)
    ledger.close()
    assert "storage" not in summarize_ledger(tmp_path / "run" / "ledger").rub_by_phase
    old = tmp_path / "old" / "ledger"
    old.mkdir(parents=True)
    price = {**Catalog.load().lookup("tpu-v5e", "on-demand").as_dict()}
    price.pop("rub")
    price.pop("origin")
    records = [{"e": "open", "session": 0, "run_id": "r", "t": 0.0, "opened": 0.0, "pid": 1, "chips": 8,
                "price": price, "infra": [], "usd_rub_rate": RATE, "rate_date": TODAY, "rate_source": "config"},
               {"e": "time", "t0": 0.0, "t1": 3600.0, "seconds": {"train": 3600.0}},
               {"e": "close", "clean": True, "t": 3600.0}]
    (old / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    summary = summarize_ledger(old)
    assert summary.rub_total == pytest.approx(8 * 1.20 * RATE) and "storage" not in summary.rub_by_phase


# ------------------------------------------------------------------------------------------- the planner


def eight_b(*overrides: str):
    return load_config(REPO / "recipes" / "configs" / "ru-8b-v6e-64.yaml",
                       ["experiment.run_root=runs", f"cost.usd_rub_rate={RATE}", f"cost.usd_rub_date={TODAY}",
                        *overrides])


def test_the_shipped_8b_plan_prices_its_data_and_checkpoints_for_its_hours() -> None:
    """40,000 steps of 320 x 8,192 tokens, a checkpoint every 500 (80 saves, the latest 3 kept: (0+1+2+3x77)/80
    = 2.925 held on average) and every 5,000th kept (8, half on average): 6.925 checkpoints of 12 bytes per
    parameter (fp32 weights and Adam's two moments), and 104,857,600,000 tokens at 4 bytes, held for each
    option's hours at its cloud's GB-month price."""
    cfg = eight_b()
    model, tokens, rows, _ = plan(cfg, None, rate=UsdRubRate(RATE, dt.date.today(), "test"))
    assert tokens == 104_857_600_000 and tokens // (320 * 8192) == 40_000
    stored = model.params * 12 * (234 / 80 + 8 / 2) + tokens * 4
    assert storage_plan(cfg, None, model, tokens).stored_bytes == pytest.approx(stored)
    v6e = next(r for r in rows if (r["accelerator"], r["chips"], r["pricing"]) == ("tpu-v6e", 64, "on-demand"))
    assert v6e["storage"] == "gcs-standard" and v6e["storage_gb"] == pytest.approx(stored / GIB)
    expected = stored / GIB * v6e["hours"] / MONTH_HOURS * usd("gcs-standard", "gb-month") * RATE
    assert v6e["storage_rub"] == pytest.approx(expected)
    assert v6e["rub_with_storage"] == pytest.approx(v6e["rub"] + expected)
    # what cost/README.md says of it: 391 GB of tokens + 6.925 x 89.7 GB of checkpoints = 1,012 GB, under 0.1% of
    # each option's compute rubles
    assert (round(tokens * 4 / GIB), round(model.params * 12 / GIB, 1), round(v6e["storage_gb"])) == (391, 89.7, 1012)
    planned = [r for r in rows if r["hours"] is not None]  # v6e-256 cannot split this batch: not planned
    assert all(r["storage_rub"] < 0.001 * r["rub"] for r in planned)
    h100 = next(r for r in rows if r["accelerator"] == "nvidia-h100")
    assert h100["cloud"] == "aws" and h100["storage"] == "s3-standard"
    assert h100["storage_rub"] == pytest.approx(stored / GIB * h100["hours"] / MONTH_HOURS * 0.023 * RATE)


def test_the_plan_writes_its_storage_column_and_says_how_it_got_it(tmp_path: Path) -> None:
    cfg = eight_b(f"experiment.run_root={tmp_path}", "cost.plan_options=[{accelerator: tpu-v6e, chips: 64}]")
    run_folder = RunFolder(tmp_path / "ru-8b-v6e-64")
    (row,) = plan_costs(cfg, run_folder, None)
    with (run_folder.reports / "plan.csv").open(encoding="utf-8") as handle:
        (written,) = list(csv.DictReader(handle))
    assert float(written["storage_rub"]) == pytest.approx(row["storage_rub"]) and written["storage"] == "gcs-standard"
    md = (run_folder.reports / "plan.md").read_text(encoding="utf-8")
    assert "storage RUB" in md and "RUB with storage" in md and "6.92 checkpoints held on average" in md
    assert "an int32 per token: no shards manifest to measure" in md


def test_a_bucket_run_root_prices_every_option_there_and_none_prices_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("STORAGE_EMULATOR_HOST", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(variable, raising=False)
    rate = UsdRubRate(RATE, dt.date.today(), "test")
    _, _, rows, _ = plan(eight_b("experiment.run_root=s3://my-runs/ru"), None, rate=rate)
    rows = [r for r in rows if r["hours"] is not None]  # v6e-256 cannot split this batch: not planned
    assert {r["storage"] for r in rows} == {"s3-standard"}  # the TPU options too: the data lives in that bucket
    _, _, rows, _ = plan(eight_b("cost.storage=none"), None, rate=rate)
    assert all(r["storage_rub"] is None and r["rub_with_storage"] is None for r in rows)


def test_a_shards_manifest_gives_the_bytes_per_token(tmp_path: Path) -> None:
    run_folder = RunFolder(tmp_path / "x")
    Path(run_folder.shards).mkdir(parents=True)
    splits = {"train": {"shards": [{"file": "train-00000.tfrecord", "bytes": 6000, "tokens": 500}], "tokens": 500},
              "validation": {"shards": [{"file": "validation-00000.tfrecord", "bytes": 1500, "tokens": 100}],
                             "tokens": 100}}
    manifest = {"stage": "shards", "schema_version": 1, "tokenizer_sha256": "0" * 64, "seq_len": 8192, "splits": splits}
    (Path(run_folder.shards) / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    cfg = eight_b()
    model, tokens, _, _ = plan(cfg, None, rate=UsdRubRate(RATE, dt.date.today(), "test"))
    measured = storage_plan(cfg, run_folder, model, tokens)
    assert measured.bytes_per_token == pytest.approx(7500 / 600) and measured.data_bytes == pytest.approx(tokens * 12.5)
