"""USD->RUB: the Bank of Russia's XML (windows-1251, decimal comma, Nominal), cache, offline fallback, age."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import time
from pathlib import Path

import pytest

from cost import rates
from cost.rates import parse_cbr_xml, resolve_usd_rub
from experiment.errors import ConfigError, DataError
from experiment.sections.cost import CostConfig

SAMPLE = Path(__file__).parent / "fixtures" / "cbr" / "XML_daily-2025-01-01.xml"
TODAY = dt.date(2025, 1, 1)


def test_parse_sample_decimal_comma_and_nominal() -> None:
    data = SAMPLE.read_bytes()
    assert "Доллар".encode("windows-1251") in data  # the sample really is windows-1251
    daily = parse_cbr_xml(data)
    assert daily.date == dt.date(2024, 12, 28)  # ValCurs Date: the day the rates are set for
    assert daily.per_unit["USD"] == pytest.approx(101.6797)
    assert daily.per_unit["JPY"] == pytest.approx(64.5240 / 100)  # Nominal 100
    assert daily.per_unit["AMD"] == pytest.approx(25.6214 / 100)
    assert rates.usd_from_daily(daily, "sample") == pytest.approx(101.6797)


def test_parse_rejects_broken_files() -> None:
    with pytest.raises(DataError, match="not valid XML"):
        parse_cbr_xml(b"<ValCurs Date='01.01.2025'><Valute>", "x.xml")
    bad_value = SAMPLE.read_bytes().replace(b"101,6797", b"abc")
    with pytest.raises(DataError, match=r"R01235.*USD.*<Value>.*'abc'"):
        parse_cbr_xml(bad_value, "x.xml")
    with pytest.raises(DataError, match=r"R01235.*USD.*<Value>.*'NaN' is not a finite number"):
        parse_cbr_xml(SAMPLE.read_bytes().replace(b"101,6797", b"NaN"), "x.xml")


def cfg_for(cache: Path, **changes: object) -> CostConfig:
    values: dict[str, object] = {"rate_cache_dir": str(cache), "fetch_timeout_s": 0.5, "max_rate_age_days": 30}
    values.update(changes)
    return CostConfig(**values)


def test_configured_rate_needs_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rates, "fetch_cbr_xml", lambda *a: pytest.fail("must not fetch"))
    rate = resolve_usd_rub(cfg_for(tmp_path, usd_rub_rate=101.6797, usd_rub_date="2024-12-28"), today=TODAY)
    assert (rate.rate, rate.date, rate.source, rate.notes) == (101.6797, dt.date(2024, 12, 28), "config", [])


def test_stale_rate_warns_or_fails_when_configured(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = {"usd_rub_rate": 90.0, "usd_rub_date": "2024-10-01"}
    with caplog.at_level(logging.WARNING, logger="cost.rates"):
        rate = resolve_usd_rub(cfg_for(tmp_path, **old), today=TODAY)
    assert rate.rate == 90.0 and "92 days old" in rate.notes[0] and "92 days old" in caplog.text
    with pytest.raises(ConfigError, match=r"cost.usd_rub_date.*92 days old"):
        resolve_usd_rub(cfg_for(tmp_path, stale_rate="error", **old), today=TODAY)


def test_fetch_caches_and_offline_falls_back_to_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rates, "fetch_cbr_xml", lambda date, timeout: SAMPLE.read_bytes())
    first = resolve_usd_rub(cfg_for(tmp_path), today=TODAY)
    assert first.rate == pytest.approx(101.6797) and first.source == "cbr.ru"
    assert (tmp_path / "XML_daily-2025-01-01.xml").read_bytes() == SAMPLE.read_bytes()

    def offline(date: dt.date, timeout: float) -> bytes:
        raise OSError("Network is unreachable")

    monkeypatch.setattr(rates, "fetch_cbr_xml", offline)
    later = resolve_usd_rub(cfg_for(tmp_path), today=TODAY + dt.timedelta(days=3))
    assert later.rate == pytest.approx(101.6797)
    assert "unreachable" in later.notes[0] and "2024-12-28" in later.notes[0]


def test_no_rate_anywhere_falls_back_to_the_shipped_dated_rate_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(rates, "fetch_cbr_xml", lambda *a: (_ for _ in ()).throw(OSError("timed out")))
    today = dt.date(2026, 12, 2)
    with caplog.at_level(logging.WARNING, logger="cost.rates"):
        rate = resolve_usd_rub(cfg_for(tmp_path / "empty"), today=today)
    shipped = (Path(rates.__file__).parent / "usd_rub_fallback.csv").read_text(encoding="utf-8").splitlines()[1]
    date, value = shipped.split(",")[:2]
    assert (rate.rate, rate.date.isoformat()) == (float(value), date)
    assert "https://" in rate.source and "usd_rub_fallback.csv" in rate.source  # where the figure was read
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "cbr.ru unreachable" in warned and f"set by the Bank of Russia for {date}" in warned
    assert "days old" in warned  # and its age is said, as for any old rate
    assert any("shipped with the catalog" in note for note in rate.notes)
    with pytest.raises(ConfigError, match=r"cost.usd_rub_date.*days old"):  # unless old rates are refused
        resolve_usd_rub(cfg_for(tmp_path / "empty", stale_rate="error"), today=today)


def test_a_damaged_shipped_rate_is_one_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "usd_rub_fallback.csv"
    bad.write_text("date,usd_rub,source,note\n2024-12-28,nan,https://www.cbr.ru,x\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"usd_rub_fallback.csv line 2: .*positive finite"):
        rates.shipped_fallback(bad)


def test_real_fetch_never_hangs(tmp_path: Path) -> None:
    """Whatever the network does here, the answer (a rate or a clear error) comes within the timeout."""
    shutil.rmtree(tmp_path, ignore_errors=True)
    started = time.monotonic()
    rate = resolve_usd_rub(cfg_for(tmp_path, fetch_timeout_s=1.0), today=dt.date.today())
    assert rate.source == "cbr.ru" or "usd_rub_fallback.csv" in rate.source
    assert time.monotonic() - started < 10  # DNS + connect + read, each bounded


def test_the_shipped_fallback_rate_is_within_a_year_of_the_prices_beside_it() -> None:
    """The offline rate must not be years older than the catalog's prices (it was 708 days older): rubles of a
    2026 price at a 2024 rate are wrong by the ruble's move since."""
    import csv

    shipped = rates.shipped_fallback()
    with (Path(rates.__file__).parent / "catalog.csv").open(encoding="utf-8", newline="") as handle:
        newest = max(dt.date.fromisoformat(row["date"]) for row in csv.DictReader(handle)
                     if len(row["date"]) == 10 and row["usd"])
    assert (newest - shipped.date).days <= 366, (shipped.date, newest)
    note = (Path(rates.__file__).parent / "usd_rub_fallback.csv").read_text(encoding="utf-8")
    assert shipped.date.strftime("%d.%m.%Y") in note  # the day the rate was set for, as the source writes it
