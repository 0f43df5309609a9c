"""The price and hardware catalogs: every figure sourced and dated, lookups that fail loudly."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import pytest

import cost.catalog as catalog_module
from cost.catalog import BUNDLED_HARDWARE, BUNDLED_PRICES, SOURCE_KINDS, Catalog, CatalogError, read_prices
from experiment.errors import DataError


def test_bundled_catalog_every_row_names_a_source_a_reader_can_open_and_the_day_read() -> None:
    catalog = Catalog.load()  # read_prices validates; check the rule here too so it cannot silently loosen
    with BUNDLED_PRICES.open(encoding="utf-8") as handle:
        raw = list(csv.DictReader(handle))
    assert len([row for row in raw if row["usd"].strip()]) >= 20
    for row in raw:  # priced or not: a link to open and the day it was read (no year-only "recalled" dates)
        if row["source_kind"] == "third-party" and not row["source"].startswith("https://"):
            # the one figure found for a price nobody publishes: the document and its date, and that it has no link
            assert "could not be recovered" in row["source"] and re.fullmatch(r"\d{4}-\d{2}", row["date"]), row
            continue
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


# SkyPilot's catalog files (catalogs/v8/<cloud>/vms.csv): where the price columns sit, counted from a row's
# end, since the quoted rows elide their middle columns with '...'
GCP_COLUMNS = {"region": -4, "on-demand": -2, "spot": -1}  # ..., Region, AvailabilityZone, Price, SpotPrice
AWS_COLUMNS = {"region": -3, "on-demand": -5, "spot": -4}  # ..., Price, SpotPrice, Region, AvailabilityZone, Arch


def quoted_rows(source: str) -> list[list[str]]:
    """The catalog rows a price row's source quotes (``row '...'`` or ``rows '...' + '...'``), split into cells."""
    match = re.search(r"; rows? (.*)\)$", source)
    return [quoted.split(",") for quoted in re.findall(r"'([^']*)'", match.group(1))] if match else []


def chips_in(cells: list[str], cloud: str) -> float:
    """Chips one quoted instance holds: AWS and GCP GPU rows count accelerators; a GCP TPU row is named by its
    size (tpu-v5p-N counts TensorCores, two per v5p chip: https://cloud.google.com/tpu/docs/v5p); a plain VM is
    priced as one 'chip'."""
    if cloud == "aws":
        return float(cells[2])
    tpu = re.fullmatch(r"tpu-(v5litepod|v6e|v5p)-(\d+)", cells[3])
    if tpu:
        return int(tpu.group(2)) / (2 if tpu.group(1) == "v5p" else 1)
    return float(cells[4]) if cells[3] else 1.0


def test_every_skypilot_price_is_the_quoted_row_per_chip() -> None:
    """Each price is what the row its source quotes says: the Price (on-demand) or SpotPrice (spot) column,
    summed over the quoted rows (GCP prices a GPU VM's GPUs and machine in two rows), divided by the chips the
    instance holds, in the row's own region; a row without a figure quotes empty price cells or none at all.
    Checked through ``Catalog.load``, the reader every recipe uses."""
    checked = 0
    for row in Catalog.load().prices:
        if "skypilot-catalog" not in row.source:
            continue
        cloud = re.search(r"/catalogs/v\d+/(\w+)/", row.source).group(1)
        assert cloud == row.cloud, row
        columns = AWS_COLUMNS if cloud == "aws" else GCP_COLUMNS
        quoted = quoted_rows(row.source)
        if row.usd is None:
            assert all(not cells[columns[row.pricing]] for cells in quoted), row
            continue
        assert quoted, f"{row.describe()}: a figure whose source quotes no row"
        assert {cells[columns["region"]] for cells in quoted} == {row.region}, row
        chips = chips_in(quoted[0], cloud) if row.kind == "accelerator" else 1.0
        assert row.usd == pytest.approx(sum(float(c[columns[row.pricing]]) for c in quoted) / chips, rel=1e-12), row
        checked += 1
    assert checked >= 20


def test_spot_is_cheaper_and_every_tpu_and_nvidia_gpu_has_both_modes_on_its_clouds() -> None:
    catalog = Catalog.load()
    priced = {row.key: row.usd for row in catalog.prices if row.usd is not None}
    pairs = [(key, priced.get((*key[:4], "spot"))) for key in priced if key[4] == "on-demand"]
    assert all(spot < priced[key] for key, spot in pairs if spot is not None), pairs
    for name in catalog.names("accelerator"):
        clouds = {(row.cloud, row.pricing) for row in catalog.prices if row.name == name and row.usd is not None}
        if name.startswith("tpu-") and clouds:  # a TPU generation with no published price has neither
            assert clouds == {("gcp", "on-demand"), ("gcp", "spot")}, name
        if name.startswith("nvidia-") and clouds:  # an A100 only Russian clouds sell publishes neither
            assert clouds == {(c, m) for c in ("aws", "gcp") for m in ("on-demand", "spot")}, name


def test_hardware_rows_read_back_as_written() -> None:
    catalog = Catalog.load()
    with BUNDLED_HARDWARE.open(encoding="utf-8") as handle:
        raw = list(csv.DictReader(handle))
    assert {row["name"] for row in raw} == set(catalog.hardware)
    for row in raw:
        chip = catalog.chip(row["name"])
        for column in ("peak_bf16_tflops", "hbm_gib"):
            want = float(row[column]) if row[column].strip() else None
            assert getattr(chip, column) == want, (row["name"], column)


@pytest.mark.parametrize(("name", "pricing"), [("tpu7x", "on-demand"), ("tpu7x", "spot"),
                                               ("aws-trainium3", "on-demand"), ("aws-trainium2", "spot")])
def test_an_unpublished_price_is_a_row_without_a_figure_and_asking_for_it_names_the_figure(name: str,
                                                                                          pricing: str) -> None:
    catalog = Catalog.load()
    assert name in catalog.names("accelerator")
    with pytest.raises(CatalogError, match=rf"no {pricing} price for {name} \(.*\): no price published.*"
                                           rf"cost.catalog_path.*cost.contract_rates: {{{name}: "):
        catalog.lookup(name, pricing)
    message = ""
    try:
        catalog.lookup(name, pricing)
    except CatalogError as exc:
        message = str(exc)
    # each said once: the missing figure, and the remedies (the catalog's notes leave those to the message)
    assert message.count("no price published") + message.count("no " + pricing + " price") == 2
    assert message.count("user catalog") == 1 and message.count("contract rate") == 1


def test_unknown_accelerator_names_the_key_and_suggests() -> None:
    with pytest.raises(CatalogError, match=r"cost.accelerator.*unknown accelerator 'tpu-v6'.*did you mean 'tpu-v6e'"):
        Catalog.load().lookup("tpu-v6", "on-demand")


def test_missing_price_for_mode_is_an_error_not_zero() -> None:
    catalog = Catalog.load()
    with pytest.raises(CatalogError, match=r"no spot price for aws-trainium2 \(aws/us-east-2\): .*empty Price"):
        catalog.lookup("aws-trainium2", "spot")
    with pytest.raises(CatalogError, match=r"tpu-v5p has no '1y' price.*available: on-demand, spot"):
        catalog.lookup("tpu-v5p", "1y")


def test_ambiguous_cloud_asks_to_choose_unless_the_cheapest_is_asked_for() -> None:
    catalog = Catalog.load()
    with pytest.raises(CatalogError, match=r"several clouds.*cloud=gcp.*5.38.*cloud=aws.*6.88"):
        catalog.lookup("nvidia-h100", "on-demand")
    rows = catalog.priced_rows("nvidia-h100", "on-demand", cheapest=True)
    assert [(r.cloud, r.usd) for r in rows] == sorted(((r.cloud, r.usd) for r in rows), key=lambda cu: cu[1])
    assert catalog.lookup("nvidia-h100", "on-demand", cheapest=True) == rows[0]
    assert {r.cloud for r in rows} == {"aws", "gcp"}


def test_a_contract_rate_is_the_price_named_as_such_whatever_the_catalog_says() -> None:
    catalog = Catalog.load(contract_rates={"aws-trainium3": 3.5, "nvidia-h100": 2.0})
    unpublished = catalog.lookup("aws-trainium3", "on-demand")
    assert (unpublished.usd, unpublished.source_kind, unpublished.source) == (3.5, "contract",
                                                                            "cost.contract_rates.aws-trainium3")
    assert catalog.lookup("nvidia-h100", "spot", cloud="aws").usd == 2.0  # a negotiated rate beats the list
    assert Catalog.load().lookup("nvidia-h100", "spot", cloud="aws").usd != 2.0


def test_every_bundled_row_says_how_strong_its_source_is() -> None:
    for path, column in ((BUNDLED_PRICES, "usd"), (BUNDLED_HARDWARE, "peak_bf16_tflops")):
        with path.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        for line, row in enumerate(rows, start=2):
            assert row["source_kind"] in SOURCE_KINDS[:4], (path.name, line)
            if path == BUNDLED_PRICES:
                assert (row["source_kind"] == "none published") == (not row[column].strip()), (path.name, line)
    catalog = Catalog.load()
    assert {row.source_kind for row in catalog.prices} <= set(SOURCE_KINDS[:4])


def test_a_bundled_row_without_a_source_kind_or_with_a_false_one_is_refused(tmp_path: Path) -> None:
    header = "kind,name,cloud,region,pricing,usd,unit,source,source_kind,date,note\n"
    for kind, why in (("", "empty 'source_kind'"), ("vendor", "source_kind 'vendor' is not one of"),
                      ("none published", "on a row with a figure")):
        path = tmp_path / "c.csv"
        path.write_text(header + f"accelerator,x,,,spot,1.0,chip-hour,s,{kind},2025,\n", encoding="utf-8")
        with pytest.raises(DataError, match=rf"c.csv line 2: .*{why}"):
            read_prices(path, bundled=True)
    path.write_text(header + "accelerator,x,,,spot,,chip-hour,s,third-party,2025,\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c.csv line 2: .*say 'none published'"):
        read_prices(path, bundled=True)


def write_user_catalog(path: Path, rows: list[list[str]]) -> Path:
    header = ["kind", "name", "cloud", "region", "pricing", "usd", "unit", "source", "date", "note"]
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])
    return path


def test_user_catalog_overrides_and_extends(tmp_path: Path) -> None:
    user = write_user_catalog(tmp_path / "mine.csv", [
        ["accelerator", "tpu-v6e", "gcp", "us-central1", "on-demand", "2.50", "chip-hour", "our contract", "2026-11-01",
         ""],
        ["accelerator", "tpu-v6e", "gcp", "europe-west4", "spot", "1.10", "chip-hour", "console", "2026-11-02", ""],
    ])
    catalog = Catalog.load(str(user))
    assert catalog.lookup("tpu-v6e", "on-demand").usd == 2.50
    assert catalog.lookup("tpu-v6e", "spot", region="europe-west4").usd == 1.10


def test_unsourced_or_undated_row_is_refused(tmp_path: Path) -> None:
    undated = write_user_catalog(tmp_path / "a.csv",
                                 [["accelerator", "x", "", "", "spot", "1.0", "chip-hour", "s", "", ""]])
    with pytest.raises(DataError, match=r"a.csv line 2: a figure without a date"):
        read_prices(undated)
    unsourced = write_user_catalog(tmp_path / "b.csv",
                                   [["accelerator", "x", "", "", "spot", "1", "chip-hour", "", "2025", ""]])
    with pytest.raises(DataError, match=r"b.csv line 2: a figure without a source"):
        read_prices(unsourced)
    unpriced = write_user_catalog(tmp_path / "d.csv",
                                  [["accelerator", "x", "", "", "spot", "", "chip-hour", "", "", ""]])
    with pytest.raises(DataError, match=r"d.csv line 2: a row without a source"):
        read_prices(unpriced)
    bad_unit = write_user_catalog(tmp_path / "c.csv",
                                  [["infra", "disk", "", "", "on-demand", "1", "chip-hour", "s", "2025", ""]])
    with pytest.raises(DataError, match=r"c.csv line 2: unit 'chip-hour'"):
        read_prices(bad_unit)


@pytest.mark.parametrize("figure", ["nan", "inf", "-inf"])
def test_a_price_or_hardware_figure_that_is_not_finite_names_the_file_and_line(tmp_path: Path, figure: str) -> None:
    prices = write_user_catalog(tmp_path / "p.csv", [
        ["accelerator", "x", "", "", "spot", "1", "chip-hour", "s", "2025", ""],
        ["accelerator", "y", "", "", "spot", figure, "chip-hour", "s", "2025", ""],
    ])
    with pytest.raises(DataError, match=rf"p.csv line 3: column 'usd' is not a finite number: '{figure}'"):
        Catalog.load(str(prices))
    hardware = tmp_path / "h.csv"
    hardware.write_text("name,vendor,peak_bf16_tflops,hbm_gib,source,date,note\n"
                        f"x,v,100,{figure},s,2025,\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"h.csv line 2: column 'hbm_gib' is not a finite number"):
        Catalog.load(hardware_path=str(hardware))


def test_loading_the_same_catalogs_again_parses_them_once_and_an_edited_file_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recipe 04 builds the catalog for the plan, the launch target, the ledger and the throughput figures: each
    load must not re-validate the same CSVs, yet a catalog edited between two loads is the one priced."""
    def rate_row(usd: str) -> list[str]:
        return ["accelerator", "tpu-v6e", "gcp", "us-central1", "on-demand", usd, "chip-hour", "ours", "2026-11", ""]

    user = write_user_catalog(tmp_path / "mine.csv", [rate_row("2.50")])
    parsed: list[Path] = []
    real_read_csv = catalog_module._read_csv

    def counting_read_csv(path: Path, *args: object) -> object:
        parsed.append(path)
        return real_read_csv(path, *args)

    monkeypatch.setattr(catalog_module, "_read_csv", counting_read_csv)
    first = Catalog.load(str(user))
    second = Catalog.load(str(user))
    assert parsed.count(user) == 1, parsed
    assert second.lookup("tpu-v6e", "on-demand").usd == 2.50
    # a caller changing its catalog changes no later load's
    first.prices.clear()
    first.hardware.clear()
    assert Catalog.load(str(user)).lookup("tpu-v6e", "on-demand").usd == 2.50
    assert Catalog.load().chip("tpu-v6e").hbm_gib
    # an edit of the same size within one mtime tick (set back here to be sure): only the content says it changed
    before = user.stat()
    write_user_catalog(user, [rate_row("2.75")])
    assert user.stat().st_size == before.st_size
    os.utime(user, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert Catalog.load(str(user)).lookup("tpu-v6e", "on-demand").usd == 2.75
    assert parsed.count(user) == 2, parsed
