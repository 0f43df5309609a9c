"""The price and hardware catalogs: real published figures, each with its source and date.

``cost/catalog.csv`` holds prices: accelerators in USD per chip-hour by cloud, region and pricing
mode (on-demand, spot, 1y, 3y), infrastructure rows (CPU hosts per hour, a disk per GB-month, egress
per GB), and object storage rows (kind ``storage``: one row per figure of a bucket's storage class, the
GB-month, 1,000 write-class and 1,000 read-class requests, and egress per GB; ``cost.storage`` names
the class, ``cost/storage.py`` prices it). A provider that prices in rubles is written in rubles: the
optional ``rub`` column holds such a figure (accelerator and storage rows), never a conversion of it, and the
optional ``vat`` column says whether a figure includes VAT (``included``, or empty: the figure is what is billed)
or not (``added``: ``cost.vat_rate`` is added to it, as a Russian price list "без НДС" asks).
``cost/hardware.csv`` holds peak dense bf16 TFLOP/s and HBM per chip, and how many JAX devices one
chip shows (two on TPU7x). Every row, with a figure or without, names where it was
read (a page or a machine-readable catalog with its version and row), the day it was read, and how
strong that source is (``source_kind``: a provider's own list, a snapshot of a catalog built from
them, a third party's page, or none published). A cell we have no published figure for stays empty:
asking for it is an error naming the missing figure, never a silent zero, unless the config gives
the team's own contract rate (``cost.contract_rates``). A user catalog with the same columns extends
the bundled one (its rows are of kind ``user catalog`` unless it says otherwise); a row with the
same key replaces it.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import difflib
import hashlib
import io
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from experiment.errors import ConfigError, DataError
from experiment.sections.cost import ContractRate, CostConfig

BUNDLED_PRICES = Path(__file__).with_name("catalog.csv")
BUNDLED_HARDWARE = Path(__file__).with_name("hardware.csv")

PRICE_COLUMNS = ("kind", "name", "cloud", "region", "pricing", "usd", "unit", "source", "date", "note")
HARDWARE_COLUMNS = ("name", "vendor", "peak_bf16_tflops", "hbm_gib", "source", "date", "note")
# storage: a bucket's storage class, one row per figure (GB-month; 1,000 write-class requests: PUT, POST, COPY,
# LIST; 1,000 read-class requests: GET, HEAD; egress per GB), the rows of one class sharing its name
STORAGE_UNITS = ("gb-month", "1000-writes", "1000-reads", "gb")
UNITS_BY_KIND = {"accelerator": ("chip-hour",), "infra": ("hour", "gb-month", "gb"), "storage": STORAGE_UNITS}
PRICING_MODES = ("on-demand", "spot", "1y", "3y")
# How strong a figure's source is, strongest first. The bundled catalogs must say it on every row; a user's
# catalog may (its rows are "user catalog" otherwise); "contract" is a rate given in cost.contract_rates.
SOURCE_KINDS = ("provider list", "catalog snapshot", "third-party", "none published", "user catalog", "contract")
RUB_KINDS = ("accelerator", "storage")  # rows a provider may price in rubles (column 'rub')
VAT_MODES = ("included", "added")  # a figure as billed (VAT included or none due), or before VAT (cost.vat_rate added)
# A figure's date: when it was published, or when we recorded it (the note says which); year or month
# precision is allowed for figures recalled from a price list rather than read from a dated page.
_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")


class CatalogError(ConfigError):
    """An accelerator, price or infrastructure row the config asks for is not in the catalog."""


class UnpricedError(CatalogError):
    """The catalog knows the choice but publishes no figure for it (``row``): a plan says so and asks for a rate."""

    def __init__(self, message: str, row: PriceRow) -> None:
        super().__init__(message)
        self.row = row


@dataclass(frozen=True)
class PriceRow:
    kind: str
    name: str
    cloud: str
    region: str
    pricing: str
    usd: float | None  # None: no published figure
    unit: str
    source: str
    date: str
    note: str = ""
    origin: str = ""  # the file the row came from
    source_kind: str = "user catalog"
    rub: float | None = None  # the figure of a provider that prices in rubles (usd is then None)
    vat: str = ""  # "added": the figure is before VAT, cost.vat_rate is added; "" or "included": the figure as billed

    @property
    def key(self) -> tuple[str, ...]:
        """What a user catalog's row replaces the bundled one by; a storage class's rows differ by their unit."""
        base = (self.kind, self.name, self.cloud, self.region, self.pricing)
        return (*base, self.unit) if self.kind == "storage" else base

    @property
    def currency(self) -> str:
        return "RUB" if self.rub is not None else "USD"

    @property
    def figure(self) -> float | None:
        """The price in the row's own currency (``currency``); None: no published figure."""
        return self.rub if self.rub is not None else self.usd

    def billed(self, vat_rate: float) -> float | None:
        """The figure as the invoice charges it, in ``currency``: with ``vat_rate`` added to a price before VAT."""
        if self.figure is None:
            return None
        return self.figure * (1.0 + vat_rate) if self.vat == "added" else self.figure

    def cost_of(self, chip_hours: float, vat_rate: float, usd_rub_rate: float) -> tuple[float, float] | None:
        """(USD, RUB) of ``chip_hours`` at this row as billed (``billed``): counted in the row's own currency, the
        other derived at ``usd_rub_rate`` (rubles are multiplied as rubles, never through the USD rate); None for
        a row without a figure."""
        billed = self.billed(vat_rate)
        if billed is None:
            return None
        if self.currency == "RUB":
            rub = chip_hours * billed
            return rub / usd_rub_rate, rub
        usd = chip_hours * billed
        return usd, usd * usd_rub_rate

    @classmethod
    def stored(cls, fields: Mapping[str, Any]) -> PriceRow:
        """A row as a ledger or W&B keeps it (``as_dict`` less ``origin``), read back; a key of a newer or older
        version that the row does not have is left out."""
        return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})

    def usd_equivalent(self, usd_rub_rate: float | None, vat_rate: float = 0.0) -> float:
        """The figure as billed (``vat_rate`` added to a price before VAT) in USD, for ordering rows of both
        currencies (a ruble row without a rate sorts last)."""
        billed = self.billed(vat_rate)
        if billed is None:
            return math.inf
        if self.currency == "USD":
            return billed
        return billed / usd_rub_rate if usd_rub_rate else math.inf

    def describe_figure(self) -> str:
        if self.figure is None:
            return "no published figure"
        return f"{self.figure:g} {self.currency} per {self.unit}" + (" before VAT" if self.vat == "added" else "")

    @property
    def price_key(self) -> str:
        """What names this figure in an error: the config key of a contract rate, else the catalog row."""
        if self.source_kind == "contract":
            return self.source
        return f"{self.origin or 'the catalog'}: {self.kind} {self.describe()}"

    def describe(self) -> str:
        where = "/".join(p for p in (self.cloud, self.region) if p) or "any cloud"
        return f"{self.name} {self.pricing} ({where})"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class HardwareRow:
    name: str
    vendor: str
    peak_bf16_tflops: float | None
    hbm_gib: float | None
    source: str
    date: str
    note: str = ""
    devices_per_chip: int = 1  # JAX devices one chip shows (TPU7x: two TensorCores, each its own device)
    source_kind: str = "user catalog"

    @property
    def peak_bf16_tflops_per_device(self) -> float | None:
        return None if self.peak_bf16_tflops is None else self.peak_bf16_tflops / self.devices_per_chip


def _number(text: str, path: Path, line: int, column: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise DataError(f"{path} line {line}: column '{column}' is not a number: {text!r}") from exc
    if not math.isfinite(value):  # float() reads nan and inf, which would price a run at "nan RUB"
        raise DataError(f"{path} line {line}: column '{column}' is not a finite number: {text!r}")
    if value < 0:
        raise DataError(f"{path} line {line}: column '{column}' is negative: {text!r}")
    return value


def _read_csv(path: Path, text: str, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)} (expected {', '.join(columns)})")
    # line 1 is the header; DictReader yields data rows from line 2
    return [(i + 2, {k: (v or "").strip() for k, v in row.items() if k}) for i, row in enumerate(reader)]


Row = TypeVar("Row", PriceRow, HardwareRow)
# The rows parsed from each catalog file, by (reader, path as given, bundled), with the digest of the text they
# came from. Recipe 04 loads the catalog for its plan, its launch target, the ledger and the throughput figures;
# each load re-validated the same CSVs. The key is the file's content, not its mtime (an edit within one mtime
# tick leaving the size as it was is still seen); the rows are frozen and every load gets its own list, so no
# caller's catalog changes another's. A file that fails validation is never stored.
_PARSED: dict[tuple[str, str, bool], tuple[str, tuple[Any, ...]]] = {}


def _parsed_once(path: Path, bundled: bool, parse: Callable[[Path, str, bool], list[Row]]) -> list[Row]:
    """``parse`` of the file's text, or the rows it gave for the same text before."""
    if not path.is_file():
        raise DataError(f"catalog file {path} does not exist")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    key = (parse.__name__, str(path), bundled)  # the path as given: each row's origin names it
    stored = _PARSED.get(key)
    if stored is None or stored[0] != digest:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        stored = _PARSED[key] = (digest, tuple(parse(path, text, bundled)))
    return list(stored[1])


def _check_sourced(path: Path, line: int, has_number: bool, source: str, date: str) -> None:
    """A figure needs a source and a date; so does a price row without one (where we looked, and when)."""
    what = "a figure" if has_number else "a row"
    if not source:
        raise DataError(f"{path} line {line}: {what} without a source (fill the 'source' column)")
    if not date:
        raise DataError(f"{path} line {line}: {what} without a date (fill the 'date' column)")
    if date and not _DATE.match(date):
        raise DataError(f"{path} line {line}: date {date!r} is not YYYY, YYYY-MM or YYYY-MM-DD")


def _source_kind(raw: dict[str, str], path: Path, line: int, bundled: bool, has_number: bool) -> str:
    kind = raw.get("source_kind", "")
    if not kind:
        if bundled:
            raise DataError(f"{path} line {line}: empty 'source_kind' (one of {list(SOURCE_KINDS)})")
        return "user catalog"
    if kind not in SOURCE_KINDS or kind == "contract":
        raise DataError(f"{path} line {line}: source_kind {kind!r} is not one of {list(SOURCE_KINDS[:-1])}")
    if (kind == "none published") == has_number:
        raise DataError(f"{path} line {line}: source_kind {kind!r} " + (
            "on a row with a figure" if has_number else "on a row without one: say 'none published'"))
    return kind


def read_prices(path: Path, bundled: bool = False) -> list[PriceRow]:
    """Read and validate a price CSV: known kinds, units and modes; every price sourced, dated and of a kind."""
    return _parsed_once(path, bundled, _parse_prices)


def _parse_prices(path: Path, text: str, bundled: bool) -> list[PriceRow]:
    rows = []
    columns = (*PRICE_COLUMNS, "source_kind") if bundled else PRICE_COLUMNS
    for line, raw in _read_csv(path, text, columns):
        kind = raw["kind"]
        if kind not in UNITS_BY_KIND:
            raise DataError(f"{path} line {line}: kind {kind!r} is not one of {list(UNITS_BY_KIND)}")
        if raw["unit"] not in UNITS_BY_KIND[kind]:
            raise DataError(f"{path} line {line}: unit {raw['unit']!r} is not one of {list(UNITS_BY_KIND[kind])} "
                            f"for kind {kind}")
        if raw["pricing"] not in PRICING_MODES:
            raise DataError(f"{path} line {line}: pricing {raw['pricing']!r} is not one of {list(PRICING_MODES)}")
        if not raw["name"]:
            raise DataError(f"{path} line {line}: empty 'name'")
        usd = _number(raw["usd"], path, line, "usd")
        rub = _number(raw.get("rub", ""), path, line, "rub")  # an optional column
        for column, value in (("usd", usd), ("rub", rub)):
            if value == 0:  # as a contract rate of 0 is refused: a price of 0 would make the run cost nothing
                raise DataError(f"{path} line {line}: column '{column}' is 0 for {kind} {raw['name']} "
                                f"{raw['pricing']} ({raw['cloud'] or 'any cloud'}): a price must be positive; leave "
                                "it empty when none is published")
        if rub is not None and kind not in RUB_KINDS:
            raise DataError(f"{path} line {line}: only {' and '.join(RUB_KINDS)} rows may be priced in RUB (column "
                            f"'rub'); {kind} rows are priced in USD")
        vat = raw.get("vat", "")  # an optional column
        if vat and vat not in VAT_MODES:
            raise DataError(f"{path} line {line}: vat {vat!r} is not one of {list(VAT_MODES)} (empty: as billed)")
        if vat == "added" and kind != "accelerator":
            raise DataError(f"{path} line {line}: vat 'added' on a {kind} row: give {kind} figures as billed "
                            "(VAT included)")
        if rub is not None and usd is not None:
            raise DataError(f"{path} line {line}: a row is priced in one currency: fill 'usd' or 'rub', not both")
        priced = usd is not None or rub is not None
        _check_sourced(path, line, priced, raw["source"], raw["date"])  # every row, priced or not
        rows.append(PriceRow(kind=kind, name=raw["name"], cloud=raw["cloud"], region=raw["region"],
                             pricing=raw["pricing"], usd=usd, unit=raw["unit"], source=raw["source"],
                             date=raw["date"], note=raw.get("note", ""), origin=str(path),
                             source_kind=_source_kind(raw, path, line, bundled, priced), rub=rub, vat=vat))
    return rows


def read_hardware(path: Path, bundled: bool = False) -> list[HardwareRow]:
    """Read and validate a hardware CSV: figures finite, sourced and dated; devices per chip a whole number."""
    return _parsed_once(path, bundled, _parse_hardware)


def _parse_hardware(path: Path, text: str, bundled: bool) -> list[HardwareRow]:
    rows = []
    columns = (*HARDWARE_COLUMNS, "devices_per_chip", "source_kind") if bundled else HARDWARE_COLUMNS
    for line, raw in _read_csv(path, text, columns):
        peak = _number(raw["peak_bf16_tflops"], path, line, "peak_bf16_tflops")
        hbm = _number(raw["hbm_gib"], path, line, "hbm_gib")
        if peak is not None or hbm is not None:
            _check_sourced(path, line, True, raw["source"], raw["date"])
        devices = raw.get("devices_per_chip") or "1"
        if not devices.isdigit() or int(devices) < 1:
            raise DataError(f"{path} line {line}: column 'devices_per_chip' must be a whole number >= 1: {devices!r}")
        rows.append(HardwareRow(name=raw["name"], vendor=raw["vendor"], peak_bf16_tflops=peak, hbm_gib=hbm,
                                source=raw["source"], date=raw["date"], note=raw.get("note", ""),
                                devices_per_chip=int(devices),
                                source_kind=_source_kind(raw, path, line, bundled,
                                                         peak is not None or hbm is not None)))
    return rows


@dataclass
class Catalog:
    prices: list[PriceRow]
    hardware: dict[str, HardwareRow]

    # accelerator -> the team's own rate per chip-hour (a bare number: USD as billed)
    contract_rates: dict[str, float | ContractRate] = dataclasses.field(default_factory=dict)
    vat_rate: float = 0.0  # cost.vat_rate: the cheapest row is the cheapest as billed, VAT added where it is not in

    @classmethod
    def load(cls, catalog_path: str = "", hardware_path: str = "",
             contract_rates: dict[str, float | ContractRate] | None = None) -> Catalog:
        """The bundled catalogs, extended or overridden by user CSVs (same columns) when given."""
        merged: dict[tuple[str, ...], PriceRow] = {row.key: row for row in read_prices(BUNDLED_PRICES, bundled=True)}
        if catalog_path:
            merged.update({row.key: row for row in read_prices(Path(catalog_path).expanduser())})
        hardware = {row.name: row for row in read_hardware(BUNDLED_HARDWARE, bundled=True)}
        if hardware_path:
            hardware.update({row.name: row for row in read_hardware(Path(hardware_path).expanduser())})
        return cls(prices=list(merged.values()), hardware=hardware, contract_rates=dict(contract_rates or {}))

    @classmethod
    def from_config(cls, cost_cfg: CostConfig) -> Catalog:
        return dataclasses.replace(cls.load(cost_cfg.catalog_path, cost_cfg.hardware_path, cost_cfg.contract_rates),
                                   vat_rate=cost_cfg.vat_rate)

    def contract(self, name: str, pricing: str, cloud: str = "", region: str = "") -> PriceRow:
        """The team's own rate for ``name`` (``cost.contract_rates``), whatever the list price or mode; on the
        cloud and region asked for, when one is (where the contract runs)."""
        given = self.contract_rates[name]
        rate = given if isinstance(given, ContractRate) else ContractRate(float(given))
        return PriceRow(kind="accelerator", name=name, cloud=cloud, region=region, pricing=pricing,
                        usd=rate.price if rate.currency == "USD" else None, unit="chip-hour",
                        source=f"cost.contract_rates.{name}", date=dt.date.today().isoformat(),
                        note="your contract rate", origin="config", source_kind="contract",
                        rub=rate.price if rate.currency == "RUB" else None, vat=rate.vat)

    def names(self, kind: str) -> list[str]:
        return sorted({row.name for row in self.prices if row.kind == kind})

    def lookup(self, name: str, pricing: str, cloud: str = "", region: str = "", kind: str = "accelerator",
               key: str = "cost.accelerator", cheapest: bool = False, usd_rub_rate: float | None = None) -> PriceRow:
        """The one priced row for this choice; an unknown name, a missing price or an ambiguity is an error
        (``cheapest``: the cheapest of several clouds/regions instead, as a planner compares them). A
        contract rate for the accelerator (``cost.contract_rates``) is the price, whatever the catalog says."""
        return self.priced_rows(name, pricing, cloud, region, kind, key, cheapest, usd_rub_rate)[0]

    def priced_rows(self, name: str, pricing: str, cloud: str = "", region: str = "", kind: str = "accelerator",
                    key: str = "cost.accelerator", cheapest: bool = False,
                    usd_rub_rate: float | None = None) -> list[PriceRow]:
        """The priced rows for this choice, cheapest first (one unless ``cheapest``; only the contract rate
        when one is given; rows in rubles and dollars compared at ``usd_rub_rate``); errors as ``lookup``, and
        ``UnpricedError`` (holding the row) when the catalog knows the choice but publishes no figure for it."""
        if kind == "accelerator" and name in self.contract_rates:
            return [self.contract(name, pricing, cloud, region)]
        candidates = [row for row in self.prices if row.kind == kind and row.name == name]
        if not candidates:
            known = self.names(kind)
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise CatalogError(f"config key '{key}': unknown {kind} '{name}'{hint}; known: {', '.join(known)}")
        if cloud:
            candidates = [row for row in candidates if row.cloud == cloud]
        if region:
            candidates = [row for row in candidates if row.region == region]
        if not candidates:
            raise CatalogError(f"config key '{key}': no {name} row for cloud={cloud or '*'} region={region or '*'} "
                               "in the catalog")
        moded = [row for row in candidates if row.pricing == pricing]
        if not moded:
            modes = sorted({row.pricing for row in candidates})
            # the pricing is the key to fix (cost.pricing, cost.plan_options[i].pricing), not the accelerator
            pricing_key = key.removesuffix(".accelerator") + ".pricing" if key.endswith(".accelerator") else key
            near = difflib.get_close_matches(pricing, modes, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise CatalogError(f"config key '{pricing_key}': {name} has no '{pricing}' price in the catalog{hint} "
                               f"(available: {', '.join(modes)})")
        priced = sorted((row for row in moded if row.figure is not None),
                        key=lambda row: row.usd_equivalent(usd_rub_rate, self.vat_rate))
        if not priced:
            row = moded[0]
            where = "/".join(p for p in (row.cloud, row.region) if p) or "any cloud"
            why = f": {row.note}" if row.note else ""
            contract = (f" or your contract rate (cost.contract_rates: {{{name}: <USD per chip-hour>}}, or "
                        f"{{{name}: {{price: <RUB per chip-hour>, currency: RUB, vat: included}}}})"
                        if kind == "accelerator" else "")
            raise UnpricedError(f"config key '{key}': the catalog has no {pricing} price for {name} ({where}){why}; "
                                f"give one in a user catalog (cost.catalog_path){contract}", row)
        if len(priced) > 1 and not cheapest:
            options = "; ".join(f"cloud={r.cloud} region={r.region} ({r.figure} {r.currency}/{r.unit})"
                                for r in priced)
            raise CatalogError(f"config key '{key}': {name} {pricing} is sold by several clouds/regions, choose "
                               f"one with cost.cloud / cost.region: {options}")
        return priced

    def storage_rows(self, name: str, region: str = "", key: str = "cost.storage") -> dict[str, PriceRow]:
        """The rows of the storage class ``name`` (in ``region`` when its rows name several), by unit: the GB-month
        row is required and priced; a request or egress figure without a row (or without a figure) is left out,
        and whoever prices a count of it says so (``cost.storage``). An unknown name, a region without rows or a
        class sold in several regions without ``region`` is a CatalogError naming ``key``."""
        candidates = [row for row in self.prices if row.kind == "storage" and row.name == name]
        if not candidates:
            known = self.names("storage")
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise CatalogError(f"config key '{key}': unknown storage class '{name}'{hint}; known: "
                               f"{', '.join(known) or 'none'} (add rows of kind storage with cost.catalog_path)")
        regions = sorted({row.region for row in candidates})
        if region:
            candidates = [row for row in candidates if row.region == region]
            if not candidates:
                raise CatalogError(f"config key '{key}_region': no {name} rows for region {region} (the catalog has "
                                   f"{', '.join(regions)})")
        elif len(regions) > 1:
            raise CatalogError(f"config key '{key}_region': {name} is priced in several regions, choose one: "
                               f"{', '.join(regions)}")
        rows = {row.unit: row for row in candidates if row.figure is not None}
        if "gb-month" not in rows:
            row = next((r for r in candidates if r.unit == "gb-month"), None)
            why = f": {row.note}" if row is not None and row.note else ""
            raise CatalogError(f"config key '{key}': the catalog has no GB-month price for {name}{why}; give one in a "
                               "user catalog (cost.catalog_path)")
        return rows

    def chip(self, name: str, key: str = "cost.accelerator") -> HardwareRow:
        row = self.hardware.get(name)
        if row is None:
            near = difflib.get_close_matches(name, sorted(self.hardware), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise CatalogError(f"config key '{key}': no hardware figures for '{name}'{hint} in cost/hardware.csv")
        return row
