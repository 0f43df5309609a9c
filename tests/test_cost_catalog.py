"""The price and hardware catalogs: every figure sourced and dated, lookups that fail loudly."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from cost.catalog import BUNDLED_HARDWARE, BUNDLED_PRICES, Catalog, CatalogError, read_prices
from experiment.errors import DataError


def test_bundled_catalog_every_price_has_source_and_date() -> None:
    catalog = Catalog.load()  # read_prices validates; check the rule here too so it cannot silently loosen
    with BUNDLED_PRICES.open(encoding="utf-8") as handle:
        raw = list(csv.DictReader(handle))
    priced = [row for row in raw if row["usd"].strip()]
    assert len(priced) >= 15
    for row in priced:
        assert row["source"].strip() and row["date"].strip(), row
    with BUNDLED_HARDWARE.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["peak_bf16_tflops"].strip() or row["hbm_gib"].strip():
                assert row["source"].strip() and row["date"].strip(), row
    # the seeds' comparison set and the demo host are all there
    for name in ("cpu-e2-standard-2", "tpu-v5e", "tpu-v5p", "tpu-v6e", "nvidia-h100", "nvidia-b200", "aws-trainium2"):
        assert name in catalog.names("accelerator")
    assert catalog.chip("tpu-v6e").peak_bf16_tflops == 918


def test_issue_reference_figures() -> None:
    catalog = Catalog.load()
    assert catalog.lookup("tpu-v5e", "3y").usd == 0.54
    assert catalog.lookup("tpu-v6e", "1y").usd == 1.89
    assert catalog.lookup("nvidia-h100", "on-demand", cloud="aws").usd == pytest.approx(55.04 / 8)
    assert catalog.lookup("nvidia-b200", "on-demand").usd == pytest.approx(113.93 / 8, abs=0.01)


def test_unknown_accelerator_names_the_key_and_suggests() -> None:
    with pytest.raises(CatalogError, match=r"cost.accelerator.*unknown accelerator 'tpu-v6'.*did you mean 'tpu-v6e'"):
        Catalog.load().lookup("tpu-v6", "on-demand")


def test_missing_price_for_mode_is_an_error_not_zero() -> None:
    catalog = Catalog.load()
    with pytest.raises(CatalogError, match=r"no published on-demand price for aws-trainium2.*Capacity Blocks"):
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
        ["accelerator", "tpu-v6e", "gcp", "us", "on-demand", "2.50", "chip-hour", "our contract", "2026-11-01", ""],
        ["accelerator", "tpu-v6e", "gcp", "europe-west4", "spot", "1.10", "chip-hour", "console", "2026-11-02", ""],
    ])
    catalog = Catalog.load(str(user))
    assert catalog.lookup("tpu-v6e", "on-demand").usd == 2.50
    assert catalog.lookup("tpu-v6e", "spot", region="europe-west4").usd == 1.10


def test_unsourced_or_undated_price_is_refused(tmp_path: Path) -> None:
    undated = write_user_catalog(tmp_path / "a.csv", [["accelerator", "x", "", "", "spot", "1.0", "chip-hour", "s", "", ""]])
    with pytest.raises(DataError, match=r"a.csv line 2: a figure without a date"):
        read_prices(undated)
    unsourced = write_user_catalog(tmp_path / "b.csv", [["accelerator", "x", "", "", "spot", "1", "chip-hour", "", "2025", ""]])
    with pytest.raises(DataError, match=r"b.csv line 2: a figure without a source"):
        read_prices(unsourced)
    bad_unit = write_user_catalog(tmp_path / "c.csv", [["infra", "disk", "", "", "on-demand", "1", "chip-hour", "s", "2025", ""]])
    with pytest.raises(DataError, match=r"c.csv line 2: unit 'chip-hour'"):
        read_prices(bad_unit)
