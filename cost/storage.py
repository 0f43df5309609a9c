"""Where a run's data lives, in the bill: object storage priced per GB-month and per request.

A run keeps its whole folder (corpus, tokenizer, shards, checkpoints, ledger) under ``experiment.run_root``,
a local folder or a bucket (``gs://``, ``s3://``). A bucket is billed for what it holds over time and for
the requests made to it:

    rubles = GB-months x GB-month price + writes / 1,000 x write price + reads / 1,000 x read price
             + egress GB x egress price
    GB-months = the integral of the bytes held over the session's wall time / 2^30 / 730 hours

each figure in the currency its catalog row gives (a provider that prices in rubles is priced in rubles; USD
figures at the session's dated USD->RUB rate). 1 GB = 2^30 bytes and a month is 730 hours, the convention of
the GB-month prices read (Google publishes its GB-month price as a price per GiB-hour x 730).

Which price: ``cost.storage`` names a storage class of the catalog (rows of kind ``storage``: ``gcs-standard``,
``s3-standard``, or a user catalog's, e.g. a Russian provider's in rubles), ``none`` prices no storage, and
``auto`` (the default) reads where the run folder is: a ``gs://`` bucket (no emulator) is ``gcs-standard``; an
``s3://`` bucket on AWS (no custom endpoint, or an ``*.amazonaws.com`` one) is ``s3-standard``; a bucket at
another endpoint (an S3-compatible provider, an emulator) is not priced, with a warning that asks for its class
by name; a local folder is not object storage (a disk is ``cost.infrastructure``'s). The planner, for a local
``run_root``, prices the data in the planned option's own cloud (``gcs-standard`` on gcp, ``s3-standard`` on
aws), where a run on those accelerators would keep it.

What the run folder holds: the ledger measures it (every object's size, one listing) when a session opens and
at every durable checkpoint (``Ledger.mark_checkpoint``), and a caller that knows better sets it
(``Ledger.set_stored_bytes``). The bytes held between two measurements are the earlier one's: checkpoints
appear and old ones are deleted between marks, so this is a step function sampled at the marks, not a meter.
Each listing is itself billed: ceil(objects / 1,000) LIST requests (write class), counted. Other requests
and egress count when a caller reports them (``Ledger.add_requests``); nothing else counts them.

Left out, and said here: the time between sessions (a preempted run's bucket still bills while no session
runs, and after the run until the data is deleted); free tiers (they are per account and month, not per run);
volume tiers past a price's first; minimum storage durations of cold classes; a provider's rounding.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from cost.catalog import STORAGE_UNITS, Catalog, PriceRow
from cost.summary import price_dict
from experiment.sections.cost import CostConfig
from experiment.storage import BucketPath, RunPath, endpoint

GIB = 2**30  # the GB of every storage price read
HOURS_PER_MONTH = 730.0  # the cloud billing convention for GB-month prices
MONTH_SECONDS = HOURS_PER_MONTH * 3600
AUTO, NONE = "auto", "none"
LIST_PAGE = 1000  # objects one LIST request returns (S3 ListObjectsV2 and the GCS JSON API both page at 1,000)
# the storage class ``auto`` prices each cloud's bucket at (the planner: the option's cloud)
CLOUD_STORAGE = {"gcp": "gcs-standard", "aws": "s3-standard"}
# unit -> what a session counts of it
COMPONENTS = {"gb-month": "stored", "1000-writes": "writes", "1000-reads": "reads", "gb": "egress"}


@dataclass
class StorageUse:
    """What one session held and asked of its bucket: byte-seconds held, requests and egress counted."""

    byte_seconds: float = 0.0
    writes: int = 0  # PUT, POST, COPY, LIST
    reads: int = 0  # GET, HEAD
    egress_bytes: int = 0
    last_bytes: int | None = None  # the latest level measured or set (None: none this session)

    @property
    def gb_months(self) -> float:
        return self.byte_seconds / GIB / MONTH_SECONDS

    def quantities(self) -> dict[str, float]:
        """The billed quantity of each unit: GB-months, thousands of writes and of reads, egress GB."""
        return {"gb-month": self.gb_months, "1000-writes": self.writes / 1000, "1000-reads": self.reads / 1000,
                "gb": self.egress_bytes / GIB}

    def copy(self) -> StorageUse:
        return dataclasses.replace(self)


@dataclass(frozen=True)
class StorageChoice:
    """The storage class a run's data is priced at (``rows``, by unit), or none, and why."""

    name: str  # the catalog's storage class; "" when no storage is priced
    where: str  # the run folder (or run_root) it was chosen for
    why: str  # what chose it, or why nothing is priced
    rows: Mapping[str, PriceRow] = field(default_factory=dict)

    @property
    def priced(self) -> bool:
        return bool(self.name)

    def meta(self) -> dict[str, Any]:
        """What a ledger session records of it (its open record's ``storage``)."""
        return {"name": self.name, "where": self.where, "why": self.why,
                "rows": {unit: price_dict(row) for unit, row in self.rows.items()}}

    def unpriced_units(self) -> list[str]:
        return [unit for unit in STORAGE_UNITS if unit not in self.rows]


def default_storage(location: RunPath | None, cloud: str = "") -> tuple[str, str]:
    """(storage class, why) for ``cost.storage: auto``: what the run folder's location says; "" for none."""
    if isinstance(location, BucketPath):
        custom = endpoint(location.scheme)
        if location.scheme == "gs":
            if custom:
                return "", f"{location} is served by {custom}, not Google Cloud Storage"
            return CLOUD_STORAGE["gcp"], f"{location} is a Google Cloud Storage bucket"
        host = (urlparse(custom).hostname or custom) if custom else ""
        if not custom or host.endswith(".amazonaws.com"):
            return CLOUD_STORAGE["aws"], f"{location} is an S3 bucket on AWS"
        return "", (f"{location} is at {custom}, an S3-compatible endpoint the catalog cannot tell the provider of: "
                    "name its storage class in cost.storage (rows of kind storage, in cost.catalog_path)")
    if cloud in CLOUD_STORAGE:
        return CLOUD_STORAGE[cloud], f"a local run_root: a run on {cloud} keeps its data in {cloud}'s object storage"
    if cloud:
        return "", f"the option's cloud ({cloud}) has no storage class in the catalog: name one in cost.storage"
    return "", "a local folder: not object storage (cost.infrastructure prices a disk)"


def resolve_storage(cost_cfg: CostConfig, location: RunPath | None, catalog: Catalog, cloud: str = "") -> StorageChoice:
    """The storage class ``cost.storage`` prices the run folder at ``location`` by (``cloud``: the planner's
    option, for a local run_root). An unknown class or region is a CatalogError naming the key."""
    setting = getattr(cost_cfg, "storage", AUTO) or AUTO
    region = getattr(cost_cfg, "storage_region", "")
    where = "" if location is None else str(location)
    if setting == NONE:
        return StorageChoice("", where, "cost.storage: none")
    if setting == AUTO:
        name, why = default_storage(location, cloud)
        if not name:
            return StorageChoice("", where, why)
        why = f"cost.storage: auto ({why})"
    else:
        name, why = setting, "cost.storage"
    return StorageChoice(name, where, why, catalog.storage_rows(name, region, key="cost.storage"))


def folder_bytes(path: RunPath) -> tuple[int, int]:
    """(bytes, objects) a run folder holds now: every object's size in a bucket (one listing), every file's on a
    disk. Links (a stage folder another run owns) are not followed: that run's folder holds those bytes."""
    if isinstance(path, BucketPath):
        objects = path.list_objects()
        return sum(stat.size for stat in objects.values()), len(objects)
    total = count = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # removed while walking (an old checkpoint being deleted)
                continue
            count += 1
    return total, count


def listing_requests(path: RunPath, objects: int) -> int:
    """LIST requests one listing of ``objects`` objects takes (none on a disk)."""
    return max(1, math.ceil(objects / LIST_PAGE)) if isinstance(path, BucketPath) else 0


def figure_of(row: Mapping[str, Any]) -> tuple[float, str]:
    """A stored price row's figure and currency (a row priced in rubles has ``rub``)."""
    rub = row.get("rub")
    return (float(rub), "RUB") if rub is not None else (float(row["usd"]), "USD")


def cost_by_unit(rows: Mapping[str, Mapping[str, Any]], use: StorageUse, usd_rub_rate: float) -> dict[str, float]:
    """USD of each priced unit of ``use`` (a ruble price divided by the session's rate, so that the session's
    rubles are the provider's own figure again)."""
    usd = {}
    for unit, quantity in use.quantities().items():
        row = rows.get(unit)
        if row is None:
            continue
        figure, currency = figure_of(row)
        usd[unit] = quantity * figure / (usd_rub_rate if currency == "RUB" else 1.0)
    return usd


def storage_usd(storage: Mapping[str, Any], use: StorageUse, usd_rub_rate: float) -> float:
    """USD of a session's storage (its open record's ``storage``) at its own rate."""
    return sum(cost_by_unit(storage["rows"], use, usd_rub_rate).values())
