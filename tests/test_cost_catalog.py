"""The price and hardware catalogs: every figure sourced and dated, lookups that fail loudly."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from cost.catalog import BUNDLED_HARDWARE, BUNDLED_PRICES, Catalog, CatalogError, read_prices
from experiment.errors import DataError


def test_bundled_catalog_every_row_names_a_source_a_reader_can_open_and_the_day_read() -> None:
    catalog = Catalog.load()  # read_prices validates; check the rule here too so it cannot silently loosen
    with BUNDLED_PRICES.open(encoding="utf-8") as handle:
        raw = list(csv.DictReader(handle))
    assert len([row for row in raw if row["usd"].strip()]) >= 20
    for row in raw:  # priced or not: a link to open and the day it was read (no year-only "recalled" dates)
        assert row["source"].startswith("https://"), row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row
        if "skypilot-catalog" in row["source"]:  # a catalog file at a fixed commit, and the row read in it
            assert re.search(r"/blob/[0-9a-f]{40}/catalogs/v\d+/", row["source"]) and "row" in row["source"], row
    with BUNDLED_HARDWARE.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["peak_bf16_tflops"].strip() or row["hbm_gib"].strip():
                assert row["source"].strip() and row["date"].strip(), row
    # the seeds' comparison set and the demo host are all there
    for name in ("cpu-e2-standard-2", "tpu-v5e", "tpu-v5p", "tpu-v6e", "nvidia-h100", "nvidia-b200", "aws-trainium2"):
        assert name in catalog.names("accelerator")
    assert catalog.chip("tpu-v6e").peak_bf16_tflops == 918


def test_spot_and_on_demand_for_every_tpu_and_two_clouds_for_each_nvidia_gpu() -> None:
    catalog = Catalog.load()
    # SkyPilot catalog v8, gcp/vms.csv, us-central1 (per chip: v5p-16 is 8 chips)
    assert catalog.lookup("tpu-v5e", "on-demand").usd == 1.2 and catalog.lookup("tpu-v5e", "spot").usd == 0.24493
    assert catalog.lookup("tpu-v5p", "on-demand").usd == 4.2
    assert catalog.lookup("tpu-v5p", "spot").usd == pytest.approx(7.42846 / 8)
    assert catalog.lookup("tpu-v6e", "on-demand").usd == 2.7 and catalog.lookup("tpu-v6e", "spot").usd == 0.57285
    for gpu in ("nvidia-h100", "nvidia-h200", "nvidia-b200"):
        for pricing in ("on-demand", "spot"):
            clouds = {row.cloud for row in catalog.prices if row.name == gpu and row.pricing == pricing and row.usd}
            assert clouds == {"aws", "gcp"}, (gpu, pricing)
    assert catalog.lookup("nvidia-h100", "on-demand", cloud="aws").usd == pytest.approx(55.04 / 8)
    assert catalog.lookup("nvidia-b200", "on-demand", cloud="aws").usd == pytest.approx(113.9328 / 8)
    # GCP prices the GPUs and the VM in two rows of its file: a chip-hour is their sum / 8
    assert catalog.lookup("nvidia-h200", "on-demand", cloud="gcp").usd == pytest.approx((74.49392 + 12.266) / 8)


@pytest.mark.parametrize(("name", "pricing"), [("tpu-ironwood", "on-demand"), ("tpu-ironwood", "spot"),
                                               ("aws-trainium3", "on-demand"), ("aws-trainium2", "on-demand"),
                                               ("aws-trainium2", "spot")])
def test_an_unpublished_price_is_a_row_without_a_figure_and_asking_for_it_names_the_figure(name: str,
                                                                                          pricing: str) -> None:
    catalog = Catalog.load()
    assert name in catalog.names("accelerator")
    with pytest.raises(CatalogError, match=rf"no published {pricing} price \(USD per chip-hour\) for {name}"):
        catalog.lookup(name, pricing)


def test_unknown_accelerator_names_the_key_and_suggests() -> None:
    with pytest.raises(CatalogError, match=r"cost.accelerator.*unknown accelerator 'tpu-v6'.*did you mean 'tpu-v6e'"):
        Catalog.load().lookup("tpu-v6", "on-demand")


def test_missing_price_for_mode_is_an_error_not_zero() -> None:
    catalog = Catalog.load()
    with pytest.raises(CatalogError, match=r"no published on-demand price .* for aws-trainium2.*Capacity Blocks"):
        catalog.lookup("aws-trainium2", "on-demand")
    with pytest.raises(CatalogError, match=r"tpu-v5p has no '1y' price.*available: on-demand, spot"):
        catalog.lookup("tpu-v5p", "1y")


def test_ambiguous_cloud_asks_to_choose() -> None:
    with pytest.raises(CatalogError, match=r"several clouds.*cloud=aws.*cloud=gcp"):
        Catalog.load().lookup("nvidia-h100", "on-demand")


def write_user_catalog(path: Path, rows: list[list[str]]) -> Path:
    header = ["kind", "name", "cloud", "region", "pricing", "usd", "unit", "source", "date", "note"]
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])
    return path


def test_user_catalog_overrides_and_extends(tmp_path: Path) -> None:
    user = write_user_catalog(tmp_path / "mine.csv", [
        ["accelerator", "tpu-v6e", "gcp", "us-central1", "on-demand", "2.50", "chip-hour", "our contract", "2026-11-01", ""],
        ["accelerator", "tpu-v6e", "gcp", "europe-west4", "spot", "1.10", "chip-hour", "console", "2026-11-02", ""],
    ])
    catalog = Catalog.load(str(user))
    assert catalog.lookup("tpu-v6e", "on-demand").usd == 2.50
    assert catalog.lookup("tpu-v6e", "spot", region="europe-west4").usd == 1.10


def test_unsourced_or_undated_row_is_refused(tmp_path: Path) -> None:
    undated = write_user_catalog(tmp_path / "a.csv", [["accelerator", "x", "", "", "spot", "1.0", "chip-hour", "s", "", ""]])
    with pytest.raises(DataError, match=r"a.csv line 2: a figure without a date"):
        read_prices(undated)
    unsourced = write_user_catalog(tmp_path / "b.csv", [["accelerator", "x", "", "", "spot", "1", "chip-hour", "", "2025", ""]])
    with pytest.raises(DataError, match=r"b.csv line 2: a figure without a source"):
        read_prices(unsourced)
    unpriced = write_user_catalog(tmp_path / "d.csv", [["accelerator", "x", "", "", "spot", "", "chip-hour", "", "", ""]])
    with pytest.raises(DataError, match=r"d.csv line 2: a row without a source"):
        read_prices(unpriced)
    bad_unit = write_user_catalog(tmp_path / "c.csv", [["infra", "disk", "", "", "on-demand", "1", "chip-hour", "s", "2025", ""]])
    with pytest.raises(DataError, match=r"c.csv line 2: unit 'chip-hour'"):
        read_prices(bad_unit)
