"""The USD->RUB rate: from the config, or the Bank of Russia's daily XML, always with its date.

The CBR publishes ``https://www.cbr.ru/scripts/XML_daily.asp?date_req=DD/MM/YYYY``: windows-1251
XML, ``<ValCurs Date="DD.MM.YYYY">`` (the date the rates are set for), one ``<Valute ID=...>`` per
currency with ``<Nominal>`` units costing ``<Value>`` rubles written with a decimal comma (100 JPY,
10 CNY, ...). The request has a short timeout; offline it falls back to the newest cached file, and
with no cache to the dated rate shipped in ``cost/usd_rub_fallback.csv`` (a Bank of Russia rate with its
source), saying so each time. A rate older than ``cost.max_rate_age_days`` gives a warning, or an error
when configured (``cost.stale_rate: error``).
"""

from __future__ import annotations

import csv
import datetime as dt
import logging
import math
import threading
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment.errors import ConfigError, DataError
from experiment.files import atomic_write_bytes
from experiment.sections.cost import CostConfig

log = logging.getLogger("cost.rates")

CBR_URL = "https://www.cbr.ru/scripts/XML_daily.asp?date_req={date:%d/%m/%Y}"
USD_VALUTE_ID = "R01235"
SHIPPED_FALLBACK = Path(__file__).with_name("usd_rub_fallback.csv")


@dataclass
class UsdRubRate:
    rate: float  # rubles per 1 USD
    date: dt.date  # the day the rate is set for
    source: str  # "config", "cbr.ru", or "cache <file>"
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"usd_rub_rate": self.rate, "rate_date": self.date.isoformat(), "rate_source": self.source,
                "rate_notes": list(self.notes)}


@dataclass
class CbrDaily:
    date: dt.date
    per_unit: dict[str, float]  # char code -> rubles per ONE unit of the currency
    by_id: dict[str, str]  # CBR Valute ID -> char code


def _decimal_comma(text: str | None, where: str) -> float:
    if text is None or not text.strip():
        raise DataError(f"{where}: empty number")
    try:
        value = float(text.strip().replace("\u00a0", "").replace(" ", "").replace(",", "."))
    except ValueError as exc:
        raise DataError(f"{where}: {text!r} is not a number") from exc
    if not math.isfinite(value):
        raise DataError(f"{where}: {text!r} is not a finite number")
    return value


def parse_cbr_xml(data: bytes, label: str = "CBR XML") -> CbrDaily:
    """Parse a ``XML_daily.asp`` answer (any encoding it declares, windows-1251 in practice)."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise DataError(f"{label}: not valid XML ({exc})") from exc
    if root.tag != "ValCurs":
        raise DataError(f"{label}: root element is <{root.tag}>, expected <ValCurs>")
    try:
        date = dt.datetime.strptime(root.get("Date", ""), "%d.%m.%Y").date()
    except ValueError as exc:
        raise DataError(f"{label}: <ValCurs Date={root.get('Date')!r}> is not DD.MM.YYYY") from exc
    per_unit: dict[str, float] = {}
    by_id: dict[str, str] = {}
    for valute in root.iter("Valute"):
        code = (valute.findtext("CharCode") or "").strip()
        where = f"{label}: <Valute ID={valute.get('ID')!r}> ({code or '?'})"
        nominal = _decimal_comma(valute.findtext("Nominal"), f"{where} <Nominal>")
        value = _decimal_comma(valute.findtext("Value"), f"{where} <Value>")
        if nominal <= 0:
            raise DataError(f"{where}: <Nominal> must be positive, got {nominal}")
        per_unit[code] = value / nominal
        by_id[valute.get("ID", "")] = code
    if not per_unit:
        raise DataError(f"{label}: no <Valute> entries")
    return CbrDaily(date=date, per_unit=per_unit, by_id=by_id)


def usd_from_daily(daily: CbrDaily, label: str) -> float:
    code = daily.by_id.get(USD_VALUTE_ID, "USD")
    if code not in daily.per_unit:
        raise DataError(f"{label}: no USD (<Valute ID=\"{USD_VALUTE_ID}\">) in the file")
    return daily.per_unit[code]


def fetch_cbr_xml(date: dt.date, timeout_s: float) -> bytes:
    """One short request to cbr.ru; raises OSError when it is unreachable or slow.

    The socket timeout does not cover name resolution, so the request runs in a daemon thread
    that we stop waiting for after twice the timeout: a broken DNS never hangs a recipe.
    """
    url = CBR_URL.format(date=date)
    request = urllib.request.Request(url, headers={"User-Agent": "ru-pretrain cost ledger"})
    result: dict[str, Any] = {}

    def fetch() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (fixed https URL)
                result["data"] = response.read()
        except Exception as exc:  # handed to the caller's thread below
            result["error"] = exc

    worker = threading.Thread(target=fetch, name="cbr-fetch", daemon=True)
    worker.start()
    worker.join(2 * timeout_s)
    if "data" in result:
        return result["data"]
    error = result.get("error")
    if isinstance(error, OSError):
        raise error
    raise OSError(f"no answer from {url} within {2 * timeout_s:.1f} s" if error is None else f"{url}: {error}")


def cache_file(cache_dir: Path, date: dt.date) -> Path:
    return cache_dir / f"XML_daily-{date.isoformat()}.xml"


def newest_cached(cache_dir: Path) -> Path | None:
    files = sorted(cache_dir.glob("XML_daily-*.xml")) if cache_dir.is_dir() else []
    return files[-1] if files else None


def _from_cbr(cost_cfg: CostConfig, today: dt.date) -> UsdRubRate:
    cache_dir = Path(cost_cfg.rate_cache_dir).expanduser()
    cached_today = cache_file(cache_dir, today)
    if cached_today.is_file():
        daily = parse_cbr_xml(cached_today.read_bytes(), str(cached_today))
        return UsdRubRate(usd_from_daily(daily, str(cached_today)), daily.date, f"cache {cached_today}")
    failure = "fetching disabled (cost.fetch_rate=false)"
    if cost_cfg.fetch_rate:
        try:
            data = fetch_cbr_xml(today, cost_cfg.fetch_timeout_s)
            daily = parse_cbr_xml(data, f"cbr.ru XML_daily for {today}")
            rate = usd_from_daily(daily, f"cbr.ru XML_daily for {today}")
            atomic_write_bytes(cached_today, data)
            log.info("USD->RUB %.4f set by the Bank of Russia for %s (cached in %s)", rate, daily.date, cache_dir)
            return UsdRubRate(rate, daily.date, "cbr.ru")
        except (OSError, DataError) as exc:  # URLError and timeouts are OSErrors
            failure = f"cbr.ru unreachable or unreadable ({exc})"
    fallback = newest_cached(cache_dir)
    if fallback is None:
        shipped = shipped_fallback()
        note = (f"{failure} and no cached CBR file in {cache_dir}; using the rate shipped with the catalog: "
                f"{shipped.rate:.4f} set by the Bank of Russia for {shipped.date} ({shipped.source}); set "
                "cost.usd_rub_rate and cost.usd_rub_date for the rate of your own date")
        log.warning("%s", note)
        shipped.notes.append(note)
        return shipped
    daily = parse_cbr_xml(fallback.read_bytes(), str(fallback))
    note = f"{failure}; using the cached CBR rate set for {daily.date} ({fallback.name})"
    log.warning("%s", note)
    return UsdRubRate(usd_from_daily(daily, str(fallback)), daily.date, f"cache {fallback}", [note])


def shipped_fallback(path: Path = SHIPPED_FALLBACK) -> UsdRubRate:
    """The dated Bank of Russia rate shipped beside the catalog (its one row: date, usd_rub, source)."""
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    if len(rows) != 1:
        raise DataError(f"{path}: expected one rate row (date,usd_rub,source,note), found {len(rows)}")
    row = rows[0]
    try:
        date = dt.date.fromisoformat(row["date"])
        rate = float(row["usd_rub"])
        source = row["source"].strip()
    except (KeyError, ValueError, AttributeError) as exc:
        raise DataError(f"{path} line 2: not a dated rate row ({exc})") from exc
    if not (math.isfinite(rate) and rate > 0) or not source:
        raise DataError(f"{path} line 2: the rate must be a positive finite number with its source")
    return UsdRubRate(rate, date, f"shipped fallback {path.name} ({source})")


def check_age(rate: UsdRubRate, cost_cfg: CostConfig, today: dt.date) -> UsdRubRate:
    """Warn (or fail, with ``cost.stale_rate: error``) when the rate is older than allowed."""
    age = (today - rate.date).days
    if age > cost_cfg.max_rate_age_days:
        message = (f"USD->RUB rate {rate.rate:.4f} of {rate.date} is {age} days old (more than "
                   f"cost.max_rate_age_days={cost_cfg.max_rate_age_days})")
        if cost_cfg.stale_rate == "error":
            raise ConfigError(f"config key 'cost.usd_rub_date': {message}; update cost.usd_rub_rate/usd_rub_date")
        log.warning("%s: rubles are computed with it anyway", message)
        rate.notes.append(f"stale rate: {message}")
    return rate


def resolve_usd_rub(cost_cfg: CostConfig, today: dt.date | None = None) -> UsdRubRate:
    """The rate for this run: the configured one, else the CBR's (cache, then a short fetch, then old cache)."""
    today = today or dt.date.today()
    if cost_cfg.usd_rub_rate is not None:
        rate = UsdRubRate(float(cost_cfg.usd_rub_rate), dt.date.fromisoformat(cost_cfg.usd_rub_date), "config")
    else:
        rate = _from_cbr(cost_cfg, today)
    return check_age(rate, cost_cfg, today)
