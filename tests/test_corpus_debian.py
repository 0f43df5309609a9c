"""The Debian demo source, offline: a .deb built here stands in for apt-get's download."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

import pytest

from data_prep.corpus.debian import html_to_text, render_man_page, split_fortunes
from data_prep.corpus.sources import iter_raw_documents
from experiment.errors import DataError
from experiment.sections.corpus import SourceConfig

# skipped where the command is missing, a failure in CI (tests/conftest.py: needs_tools)
needs_dpkg = pytest.mark.tools("dpkg-deb", "dpkg")
needs_groff = pytest.mark.tools("groff")

MAN_PAGE = r""".TH ПРИМЕР 1 "2024" "test" "Пользовательские команды"
.SH ИМЯ
пример \- показывает, как \fBgroff\fR выводит русский текст
.SH ОПИСАНИЕ
Эта страница нужна для проверки: буквы ё и й должны сохраниться, а жирный шрифт
не должен превращаться в повторённые символы. Длинный абзац остаётся одной строкой,
хотя в исходном файле он занимает несколько строк.
.TP
.B \-v
выводить подробные сообщения о работе.
"""

FORTUNES = "Первая мудрость.\n\t\t-- Автор\n%\nВторая мудрость,\nв две строки.\n%\n%\nТретья.\n"

HTML = """<html><head><title>Заголовок</title><style>p {color: red}</style></head>
<body><h1>Глава 1. Введение</h1><p>Первый абзац,
перенесённый в исходнике &laquo;HTML&raquo;.</p><ul><li>пункт один</li><li>пункт два</li></ul>
<script>var x = "не текст";</script></body></html>"""


@needs_groff
def test_man_page_keeps_cyrillic_and_drops_overstrike(tmp_path: Path) -> None:
    page = tmp_path / "пример.1.gz"
    page.write_bytes(gzip.compress(MAN_PAGE.encode("utf-8")))
    text = render_man_page(page)
    assert text is not None
    assert "ИМЯ" in text and "буквы ё и й должны сохраниться" in text
    assert "\b" not in text and "ggrrooffff" not in text and "groff выводит русский текст" in text
    # the paragraph is on one line: no hard wraps inside it
    assert "а жирный шрифт не должен превращаться в повторённые символы." in text
    assert "ПРИМЕР(1)" not in text, "running header and footer are dropped"


def test_man_page_alias_is_skipped(tmp_path: Path) -> None:
    page = tmp_path / "alias.1"
    page.write_text(".so man1/other.1\n", encoding="utf-8")
    assert render_man_page(page) is None


def test_fortunes_split_on_percent_lines() -> None:
    assert split_fortunes(FORTUNES) == ["Первая мудрость.\n\t\t-- Автор", "Вторая мудрость,\nв две строки.", "Третья."]


def test_html_is_stripped_to_paragraphs() -> None:
    text = " ".join(html_to_text(HTML).split(" "))
    assert "Глава 1. Введение" in text and "«HTML»" in text and "перенесённый" in text
    assert "color" not in text and "не текст" not in text
    assert "Первый абзац, перенесённый" in " ".join(text.split())


def build_deb(tmp_path: Path, cache: Path) -> None:
    """A tiny package with the three kinds of files the demo reads."""
    tree = tmp_path / "pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        "Package: ru-test-docs\nVersion: 1.0\nArchitecture: all\nMaintainer: Test <test@example.org>\n"
        "Description: test\n", encoding="utf-8")
    man = tree / "usr/share/man/ru/man1"
    man.mkdir(parents=True)
    (man / "example.1.gz").write_bytes(gzip.compress(MAN_PAGE.encode("utf-8")))
    fortunes = tree / "usr/share/games/fortunes/ru"
    fortunes.mkdir(parents=True)
    (fortunes / "wisdom").write_text(FORTUNES * 3, encoding="utf-8")
    os.symlink("wisdom", fortunes / "wisdom.u8")
    doc = tree / "usr/share/doc/ru-test-docs"
    doc.mkdir(parents=True)
    (doc / "index.ru.html").write_text(HTML, encoding="utf-8")
    cache.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(cache / "ru-test-docs_1.0_all.deb")],
                   check=True, capture_output=True)


@needs_dpkg
@needs_groff
@pytest.mark.integration
def test_debian_source_reads_a_cached_package_without_network(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "debian"
    build_deb(tmp_path, cache)
    cfg = SourceConfig(kind="debian", name="deb", packages=["ru-test-docs"], fortune_group_chars=60)
    docs = list(iter_raw_documents([cfg], tmp_path / "cache"))
    origins = [d.origin for d in docs]
    assert any(o.endswith("man1/example.1.gz") for o in origins)
    assert any("wisdom.u8#" in o for o in origins) and sum("wisdom.u8#" in o for o in origins) >= 2
    assert any(o.endswith("index.ru.html") for o in origins)
    assert all(d.text and d.reject is None for d in docs)
    assert (cache / "unpacked" / "ru-test-docs_1.0_all" / ".unpacked").is_file()
    # the second run reuses the unpacked tree and the rendered man pages
    assert [d.text for d in iter_raw_documents([cfg], tmp_path / "cache")] == [d.text for d in docs]


def test_missing_apt_get_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get, dpkg or groff here
    cfg = SourceConfig(kind="debian", packages=["fortunes-ru"])
    with pytest.raises(DataError, match="apt-get is not installed; point corpus.sources at local files"):
        list(iter_raw_documents([cfg], tmp_path / "cache"))


@pytest.mark.tools("apt-get")
def test_unknown_package_is_one_clear_error(tmp_path: Path) -> None:
    cfg = SourceConfig(kind="debian", packages=["no-such-package-ru-xyz"])
    with pytest.raises(DataError, match="no-such-package-ru-xyz: apt-get download failed .*kind: files") as info:
        list(iter_raw_documents([cfg], tmp_path / "cache"))
    assert "\n" not in str(info.value)


def test_a_missing_tool_skips_here_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI (RU_REQUIRE_SHARED_DATA=1, set by .ci/run) is never green on the tests above skipped for a missing dpkg."""
    from tests.conftest import needs_tools

    monkeypatch.delenv("RU_REQUIRE_SHARED_DATA", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not installed: no-such-tool-xyz"):
        needs_tools("sh", "no-such-tool-xyz")
    monkeypatch.setenv("RU_REQUIRE_SHARED_DATA", "1")
    with pytest.raises(pytest.fail.Exception, match="not installed: no-such-tool-xyz .*makes this a failure"):
        needs_tools("sh", "no-such-tool-xyz")
    needs_tools("sh")  # present: neither
