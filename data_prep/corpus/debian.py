"""The demo source: Russian documentation from Debian packages, fetched and unpacked offline-friendly.

``apt-get download`` fetches each package's .deb into a cache folder (reused on later runs) and
``dpkg -x`` unpacks it beside (nothing is installed). Then every file becomes text by its kind:
man pages rendered by groff (``-k`` runs preconv, without which every Cyrillic letter is lost;
``-P -cbou`` drops overstrike bold and underline; a very long line length keeps each paragraph on
one line), fortunes split on ``%`` lines and grouped into documents of a useful size, HTML stripped
to text with block elements as paragraph breaks.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

from data_prep.corpus.documents import DocumentNumberer, RawDocument, pack_pieces
from experiment.errors import DataError
from experiment.files import atomic_write_json
from experiment.jsontext import parse_json
from experiment.progress import progress
from experiment.sections.corpus import SourceConfig

log = logging.getLogger("data_prep.corpus.debian")

GROFF_COMMAND = ["groff", "-k", "-t", "-Tutf8", "-man", "-rLL=3000n", "-rHY=0", "-dAD=l", "-P", "-cbou"]
_HOW_TO_AVOID = ("point corpus.sources at local files instead (kind: files, paths: [...]) "
                 "or at a Hugging Face dataset (kind: hub, dataset: ...)")
_UNPACKED_MARK = ".unpacked"
_RENDERED_CACHE = ".rendered-man-pages-v1.json"  # bump when GROFF_COMMAND changes


def _run_tool(command: list[str], what: str, cwd: Path | None = None, stdin: bytes | None = None) -> bytes:
    try:
        result = subprocess.run(command, cwd=cwd, input=stdin, capture_output=True, timeout=600, check=False)
    except FileNotFoundError as exc:
        raise DataError(f"{what}: {command[0]} is not installed; {_HOW_TO_AVOID}") from exc
    except subprocess.TimeoutExpired as exc:
        raise DataError(f"{what}: {command[0]} did not finish in 600 s; {_HOW_TO_AVOID}") from exc
    if result.returncode != 0:
        detail = (result.stderr.decode("utf-8", "replace").strip().splitlines() or ["no message"])[-1]
        raise DataError(f"{what}: {' '.join(command[:2])} failed ({detail}); {_HOW_TO_AVOID}")
    return result.stdout


def fetch_package(package: str, cache_dir: Path) -> Path:
    """The package's .deb in the cache, downloaded with ``apt-get download`` only when missing."""
    cached = sorted(cache_dir.glob(f"{package}_*.deb"))
    if cached:
        return cached[-1]
    cache_dir.mkdir(parents=True, exist_ok=True)
    log.info("downloading Debian package %s into %s", package, cache_dir)
    # download into a scratch folder and move the finished file in: an interrupted download never
    # leaves a truncated .deb that a later run would trust
    scratch = Path(tempfile.mkdtemp(prefix=f".download-{package}-", dir=cache_dir))
    try:
        _run_tool(["apt-get", "download", package], f"Debian package {package}", cwd=scratch)
        downloaded = sorted(scratch.glob(f"{package}_*.deb"))
        if not downloaded:
            raise DataError(f"Debian package {package}: apt-get download left no .deb; {_HOW_TO_AVOID}")
        target = cache_dir / downloaded[-1].name
        os.replace(downloaded[-1], target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def unpack_package(deb: Path) -> Path:
    """``dpkg -x`` into a folder beside the .deb; a finished unpack is marked and reused."""
    target = deb.parent / "unpacked" / deb.stem
    if (target / _UNPACKED_MARK).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{deb.stem}.", dir=target.parent))
    try:
        _run_tool(["dpkg", "-x", str(deb), str(staging)], f"unpacking {deb.name}")
        (staging / _UNPACKED_MARK).write_text("ok\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# ---------------------------------------------------------------- man pages

def render_man_page(path: Path) -> str | None:
    """Plain text of a (possibly gzipped) man page; None for a ``.so`` redirect or an empty render."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    if data.lstrip().startswith(b".so "):
        return None  # an alias of another page, which is rendered under its own name
    try:
        result = subprocess.run(GROFF_COMMAND, input=data, capture_output=True, timeout=120, check=False)
    except FileNotFoundError as exc:
        raise DataError(f"rendering {path.name}: groff is not installed; {_HOW_TO_AVOID}") from exc
    lines = result.stdout.decode("utf-8", "replace").split("\n")
    content = [line for line in lines if line.strip()]
    if len(content) < 3:
        return None
    # the first and last non-blank lines are the running header and footer ("CAT(1) ... CAT(1)")
    first, last = lines.index(content[0]), len(lines) - 1 - lines[::-1].index(content[-1])
    return "\n".join(line.strip() for line in lines[first + 1:last]).strip()


def render_man_pages(root: Path, pages: list[Path]) -> dict[str, str | None]:
    """Render an unpacked package's man pages once; later runs read the cached texts."""
    cache = root / _RENDERED_CACHE
    if cache.is_file():
        return parse_json(cache.read_text(encoding="utf-8"))
    if pages:
        log.info("rendering %d man pages with groff", len(pages))
    # groff runs in subprocesses, so threads render pages in parallel
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        texts = list(progress(pool.map(render_man_page, pages), total=len(pages), desc="man pages",
                          unit="page", disable=not pages, leave=False))
    rendered = {path.relative_to(root).as_posix(): text for path, text in zip(pages, texts, strict=True)}
    atomic_write_json(cache, rendered)
    return rendered


# ---------------------------------------------------------------- fortunes

def split_fortunes(text: str) -> list[str]:
    """A fortune file is fortunes separated by lines holding a single ``%``."""
    fortunes, current = [], []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line.strip() == "%":
            if any(part.strip() for part in current):
                fortunes.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    if any(part.strip() for part in current):
        fortunes.append("\n".join(current).strip())
    return fortunes


# ---------------------------------------------------------------- HTML

class _TextExtractor(HTMLParser):
    BLOCKS = frozenset(["p", "div", "br", "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul", "ol", "dl", "dt", "dd", "pre",
                        "table", "tr", "blockquote", "title", "section"])
    SKIPPED = frozenset(("script", "style", "head"))

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIPPED:
            self.skip_depth += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIPPED:
            self.skip_depth = max(0, self.skip_depth - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skip_depth:
            # inside a paragraph, source line breaks are only wrapping
            self.parts.append(data.replace("\n", " "))


def html_to_text(html: str) -> str:
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


# ---------------------------------------------------------------- the source

def classify_file(relative: str) -> str | None:
    """``man`` / ``fortune`` / ``html`` for the files the demo reads, None for the rest."""
    parts = relative.split("/")
    if "man" in parts and len(parts) >= 2 and parts[-2].startswith("man"):
        return "man"
    if "fortunes" in parts and relative.endswith(".u8"):
        return "fortune"
    if relative.endswith((".html", ".htm")):
        return "html"
    return None


def _package_files(root: Path) -> list[tuple[str, Path]]:
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file():  # follows symlinks: fortunes' *.u8 are links to the real files
            relative = path.relative_to(root).as_posix()
            kind = classify_file(relative)
            if kind:
                files.append((kind, path))
    return files


def iter_debian_source(cfg: SourceConfig, numberer: DocumentNumberer, key: str,
                       cache_root: Path) -> Iterator[RawDocument]:
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else Path(cache_root) / "debian"
    for package in cfg.packages:
        root = unpack_package(fetch_package(package, cache_dir))
        files = _package_files(root)
        log.info("package %s: %d man pages, %d fortune files, %d HTML pages", package,
                 *(sum(kind == k for kind, _ in files) for k in ("man", "fortune", "html")))
        rendered = render_man_pages(root, [path for kind, path in files if kind == "man"])
        for kind, path in files:
            relative = path.relative_to(root).as_posix()
            origin = f"{package}:{relative}"
            if kind == "man":
                if rendered.get(relative):
                    yield numberer.make(rendered[relative], origin)
            elif kind == "fortune":
                text = path.read_bytes().decode("utf-8", "replace")
                groups = pack_pieces(split_fortunes(text), cfg.fortune_group_chars, "\n\n")
                for i, group in enumerate(groups):
                    yield numberer.make(group, f"{origin}#{i}")
            else:
                yield numberer.make(html_to_text(path.read_text(encoding="utf-8", errors="replace")), origin)
