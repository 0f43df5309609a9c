"""Corpus sources: local files, Hugging Face datasets and the Debian demo, as raw documents.

Every source yields ``RawDocument``s in a stable order. A document's id is
``<source>:<position>:<content hash>``, so it is the same on every run over the same input, and
the train/validation split (a hash of the id) never moves a document. Input that cannot become
text (an unreadable, binary, empty or wrongly encoded file, a malformed JSON line) is not an error:
it is a raw document with a rejection reason, counted in the manifest like any filter.
"""

from __future__ import annotations

import glob
import gzip
import io
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from data_prep.corpus.debian import iter_debian_source
from data_prep.corpus.documents import DocumentNumberer, RawDocument, pack_pieces
from data_prep.corpus.normalize import decode_bytes, normalize_text
from experiment.errors import ConfigError, DataError
from experiment.jsonl import iter_jsonl
from experiment.sections.corpus import SourceConfig
from experiment.storage import BucketPath, is_bucket_url, location

log = logging.getLogger("data_prep.corpus.sources")

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)


def split_text(text: str, rule: str, chunk_chars: int) -> list[str]:
    """Cut one work into documents: whole, by blank-line paragraphs, or into chunks of paragraphs.

    ``chunk`` packs blank-line blocks (a block longer than ``chunk_chars`` is cut at line ends) into
    documents of at most about ``chunk_chars`` characters, so a novel becomes many documents of a
    pretraining-friendly size while verse stanzas and prose paragraphs stay whole.
    """
    if rule == "file":
        return [text]
    blocks = [b.strip("\n") for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    if rule == "paragraph":
        return blocks
    pieces: list[str] = []
    for block in blocks:
        if len(block) <= chunk_chars:
            pieces.append(block)
            continue
        current: list[str] = []
        size = 0
        for line in block.split("\n"):
            if current and size + len(line) > chunk_chars:
                pieces.append("\n".join(current))
                current, size = [], 0
            current.append(line)
            size += len(line) + 1
        if current:
            pieces.append("\n".join(current))
    return pack_pieces(pieces, chunk_chars, "\n\n")


# ---------------------------------------------------------------- local files

def expand_paths(patterns: list[str], key: str) -> list[Path | str]:
    """Globs and folders to a sorted list of files; a pattern that matches nothing is an error.

    A bucket URL (``gs://bucket/dir/*.jsonl.zst``, ``s3://...``) is listed through the run's storage layer
    (``experiment.storage``: names only, nothing read), and read through it by either runner; another URL
    (``hdfs://``...) through Beam's FileSystems, for the Beam runner, whose workers read it."""
    files: list[Path | str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if is_bucket_url(expanded):
            files.extend(_match_bucket(expanded, key))
            continue
        if "://" in expanded:
            files.extend(_match_urls(expanded, key))
            continue
        if os.path.isdir(expanded):
            matches = sorted(p for p in Path(expanded).rglob("*.txt") if p.is_file())
            if not matches:
                raise DataError(f"{key}: folder {expanded} holds no .txt files")
        else:
            matches = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
            if not matches:
                what = "does not exist" if not any(ch in expanded for ch in "*?[") else "matches no files"
                raise DataError(f"{key}: {expanded} {what} (give existing files, folders or globs)")
        files.extend(matches)
    return files


def _match_bucket(pattern: str, key: str) -> list[str]:
    """A bucket glob's objects, sorted; a URL without glob characters names an object, or a prefix of .txt files."""
    root = location(pattern, key)
    assert isinstance(root, BucketPath)
    if any(ch in pattern for ch in "*?["):
        found = [f"{root.scheme}://{name}" for name in root.fs.glob(root.fs_path) if root.fs.isfile(name)]
    elif root.is_file():
        found = [str(root)]
    else:
        found = [str(root / name) for name in root.list_objects() if name.endswith(".txt")]
    if not found:
        raise DataError(f"{key}: {pattern} matches no files (give existing objects, prefixes or globs)")
    return sorted(found)


def _match_urls(pattern: str, key: str) -> list[str]:
    """A URL glob's files, sorted; a URL without glob characters that names no file is read as a folder of .txt."""
    try:
        from apache_beam.io.filesystems import FileSystems
    except ImportError as exc:
        raise ConfigError(f"{key}: {pattern}: URL inputs are listed and read through Beam's filesystems "
                          "(corpus.runner=beam with the beam extra)") from exc
    try:
        found: list[str] = []
        if not any(ch in pattern for ch in "*?["):  # a folder (a prefix, on object stores) of .txt files?
            found = sorted(m.path for m in FileSystems.match([f"{pattern.rstrip('/')}/**.txt"])[0].metadata_list)
        found = found or sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except (ValueError, OSError) as exc:  # an unknown scheme, a missing bucket or credentials
        raise DataError(f"{key}: cannot list {pattern}: {str(exc).splitlines()[0]}") from exc
    if not found:
        raise DataError(f"{key}: {pattern} matches no files (give existing files, folders or globs)")
    return found


def open_input(path: str | Path) -> io.BufferedIOBase:
    """An input file's raw bytes: a local path, a URL of a Beam filesystem (gs://, s3://, hdfs://:
    read on the Beam worker that handles the file), or any other URL through fsspec (hf://)."""
    path = str(path)
    if "://" not in path:
        return open(path, "rb")  # noqa: SIM115  (the caller closes it)
    if is_bucket_url(path):
        return location(path).open("rb")  # type: ignore[return-value]  # ranged reads through the storage layer
    try:
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        FileSystems.get_filesystem(path)  # ValueError: not a scheme Beam knows
    except (ImportError, ValueError):
        return _open_url(path)
    # uncompressed: .gz and .zst are decompressed below, the same way for every filesystem
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _decompressed(raw: Any, path: str) -> Any:
    """``raw`` (closed by the caller) decompressed by the file's suffix: .gz, .zst, or as it is."""
    name = path.lower()
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as exc:
            raise DataError(f"{path}: reading .zst needs the zstd extra (pip install 'ru-pretrain[zstd]')") from exc
        return zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)
    return raw


def _read_txt(path: str | Path, numberer: DocumentNumberer) -> Iterator[RawDocument]:
    try:
        with open_input(path) as handle:
            data = handle.read()
    except OSError as exc:
        yield numberer.make(None, str(path), "unreadable")
        log.warning("cannot read %s: %s", path, exc.strerror or exc)
        return
    if not data.strip():
        yield numberer.make(None, str(path), "empty_input", raw_bytes=len(data))
        return
    text, reason = decode_bytes(data)
    if text is None:
        yield numberer.make(None, str(path), reason, raw_bytes=len(data))
        return
    for i, piece in enumerate(split_text(text, numberer.cfg.split_rule, numberer.cfg.chunk_chars)):
        yield numberer.make(piece, f"{path}#{i}")


def _utf8_lines(stream: Any, invalid: list[tuple[int, int]], block: int = 1 << 20) -> Iterator[str]:
    """The lines of a binary ``stream`` (with their ``\\n``), each decoded alone: a line that is no UTF-8 is
    recorded in ``invalid`` as ``(line number, bytes)`` and read as a blank line (which ``iter_jsonl`` skips,
    keeping the numbering), so one bad byte costs its own line, not the rest of the file. The last line
    without a newline is the same, except where its only fault is a character cut at its very end: a copy cut
    short, the torn tail's case (decoded with replacement; ``iter_jsonl`` drops it with a warning)."""
    number, pending = 0, b""
    while chunk := stream.read(block):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            number += 1
            try:
                yield line.decode("utf-8") + "\n"
            except UnicodeDecodeError:
                invalid.append((number, len(line) + 1))
                yield "\n"
    if pending:
        try:
            yield pending.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data":  # cut inside its last character: a torn tail
                yield pending.decode("utf-8", errors="replace")
            else:
                invalid.append((number + 1, len(pending)))


def _read_jsonl(path: str, numberer: DocumentNumberer) -> Iterator[RawDocument]:
    field = numberer.cfg.text_field
    invalid: list[tuple[int, int]] = []  # lines of no UTF-8 not yet handed on as rejections

    def rejected_lines() -> Iterator[RawDocument]:
        while invalid:
            number, size = invalid.pop(0)
            yield numberer.make(None, f"{path}:{number}", "invalid_utf8", raw_bytes=size)

    try:
        with open_input(path) as raw, _decompressed(raw, path) as stream:
            # a user's corpus: a bad line (not JSON, not UTF-8, no text field) is counted as a rejected
            # record, not fatal; a last line cut short (an interrupted download or copy) is logged and dropped
            for line in iter_jsonl(_utf8_lines(stream, invalid), path, torn_tail="warn", malformed="yield"):
                yield from rejected_lines()  # the lines before this one, in file order
                origin = f"{path}:{line.line}"
                text = line.value.get(field) if isinstance(line.value, dict) else None
                if not isinstance(text, str):
                    yield numberer.make(None, origin, "bad_record", raw_bytes=len(line.text) + 1)
                    continue
                yield numberer.make(text, origin)
            yield from rejected_lines()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        log.warning("cannot read %s: %s", path, exc)
        yield numberer.make(None, str(path), "unreadable")


def _open_url(url: str) -> Any:
    import fsspec

    return fsspec.open(url, "rb").open()


def _read_parquet(path: str, numberer: DocumentNumberer) -> Iterator[RawDocument]:
    import pyarrow.parquet as pq

    field = numberer.cfg.text_field
    try:
        # a URL (gs://..., a hub dataset's hf://datasets/...) is opened on the Beam worker that reads it
        parquet = pq.ParquetFile(open_input(path) if "://" in path else path)
    except Exception as exc:  # pyarrow raises its own error types for a corrupt file
        log.warning("cannot read %s: %s", path, exc)
        yield numberer.make(None, str(path), "unreadable")
        return
    if field not in parquet.schema_arrow.names:
        raise DataError(f"{path}: no column '{field}' (columns: {', '.join(parquet.schema_arrow.names)}); "
                        "set the source's text_field")
    row = 0
    for batch in parquet.iter_batches(columns=[field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            origin = f"{path}#row{row}"
            row += 1
            if not isinstance(text, str):
                yield numberer.make(None, origin, "bad_record")
                continue
            yield numberer.make(text, origin)


def iter_file_source(cfg: SourceConfig, numberer: DocumentNumberer, key: str,
                     cache_root: Path | None = None) -> Iterator[RawDocument]:
    """Local files (``cache_root`` is unused: every reader takes the same arguments)."""
    for path in expand_paths(cfg.paths, f"{key}.paths"):
        yield from read_one_file(path, numberer)


def read_one_file(path: Path | str, numberer: DocumentNumberer) -> Iterator[RawDocument]:
    """One input file's documents (a Beam worker reads one file per element through this)."""
    path = str(path)  # a URL stays as it is (Path would fold gs:// to gs:/)
    name = path.lower()
    if name.endswith(JSONL_SUFFIXES):
        return _read_jsonl(path, numberer)
    if name.endswith(PARQUET_SUFFIXES):
        return _read_parquet(path, numberer)
    return _read_txt(path, numberer)  # .txt and anything else: binary files are rejected with a reason


# ---------------------------------------------------------------- Hugging Face datasets

def iter_hub_source(cfg: SourceConfig, numberer: DocumentNumberer, key: str,
                    cache_root: Path | None = None) -> Iterator[RawDocument]:
    """Stream a hub dataset (or a local builder such as ``json`` with ``paths`` as data files).

    ``cache_root`` is unused (the datasets library keeps its own cache): every reader takes the same arguments.
    """
    import datasets

    kwargs: dict[str, Any] = {"split": cfg.split, "streaming": cfg.streaming}
    if cfg.paths:
        kwargs["data_files"] = [str(p) for p in expand_paths(cfg.paths, f"{key}.paths")]
    try:
        dataset = datasets.load_dataset(cfg.dataset, cfg.config_name or None, **kwargs)
    except Exception as exc:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError...)
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        offline = " (HF_DATASETS_OFFLINE=1 is set)" if os.environ.get("HF_DATASETS_OFFLINE") == "1" else ""
        raise DataError(
            f"{key}.dataset: cannot load '{cfg.dataset}'{offline}: {first_line}; on a machine without the hub, "
            "use kind: files with local copies"
        ) from exc
    for row_no, row in enumerate(dataset):
        text = row.get(cfg.text_field)
        if row_no == 0 and cfg.text_field not in row:
            raise DataError(f"{key}.text_field: dataset '{cfg.dataset}' has no field '{cfg.text_field}' "
                            f"(fields: {', '.join(row)})")
        origin = f"{cfg.dataset}#{row_no}"
        yield numberer.make(text, origin) if isinstance(text, str) else numberer.make(None, origin, "bad_record")


def hub_parquet_files(cfg: SourceConfig) -> list[str]:
    """``hf://`` URLs of a hub dataset's parquet files for ``config_name``/``split``, sorted (Beam reads
    one per worker element); empty when the hub cannot be listed or the dataset has none."""
    try:
        from huggingface_hub import HfApi

        names = HfApi().list_repo_files(cfg.dataset, repo_type="dataset")
    except Exception as exc:  # offline, unknown dataset, no huggingface_hub: the whole source is one element
        log.info("hub dataset %s: no parquet file list (%s); one worker reads it whole", cfg.dataset, exc)
        return []
    return [f"hf://datasets/{cfg.dataset}/{name}" for name in select_parquet_files(names, cfg.config_name, cfg.split)]


def select_parquet_files(names: list[str], config_name: str, split: str) -> list[str]:
    """The parquet files of one config and split, as hub datasets lay them out (``data/<config>/<split>/``
    as FineWeb-2 does, or ``<config>/<split>-NNNNN-of-NNNNN.parquet``), in sorted order."""
    chosen = []
    for name in names:
        parts = name.split("/")
        if not name.endswith(".parquet") or (config_name and config_name not in parts[:-1]):
            continue
        if split in parts[:-1] or parts[-1].startswith(f"{split}-") or parts[-1].startswith(f"{split}."):
            chosen.append(name)
    return sorted(chosen)


# ---------------------------------------------------------------- all sources

SourceReader = Callable[[SourceConfig, DocumentNumberer, str, Path], Iterator[RawDocument]]

# one reader per source kind: a new kind is one reader here plus its name in experiment.sections.corpus.SourceKind
SOURCE_READERS: dict[str, SourceReader] = {
    "debian": iter_debian_source,
    "files": iter_file_source,
    "hub": iter_hub_source,
}


def source_reader(cfg: SourceConfig, key: str) -> SourceReader:
    """The reader of ``cfg.kind``; an unknown kind is a ConfigError naming the key and the known kinds."""
    reader = SOURCE_READERS.get(cfg.kind)
    if reader is None:
        raise ConfigError(f"config key '{key}.kind': unknown source kind '{cfg.kind}' "
                          f"(known: {', '.join(sorted(SOURCE_READERS))})")
    return reader


def check_sources(sources: list[SourceConfig], key: str) -> list[SourceReader]:
    """Each source's reader; an unknown kind or a missing path fails now, not after the sources before it."""
    readers = [source_reader(cfg, f"{key}[{index}]") for index, cfg in enumerate(sources)]
    for index, cfg in enumerate(sources):
        if cfg.paths:
            expand_paths(cfg.paths, f"{key}[{index}].paths")
    return readers


def iter_raw_documents(sources: list[SourceConfig], cache_root: Path,
                       sources_key: str = "corpus.sources") -> Iterator[RawDocument]:
    """All sources in config order, numbered with one global order (the dedup order)."""
    readers = check_sources(sources, sources_key)
    order = 0
    for index, (cfg, reader) in enumerate(zip(sources, readers, strict=True)):
        key = f"{sources_key}[{index}]"
        numberer = DocumentNumberer(cfg, order)
        docs = reader(cfg, numberer, key, cache_root)
        log.info("reading source %s (%s)", cfg.label, cfg.kind)
        for doc in docs:
            yield doc
            if numberer.capped:
                log.info("source %s reached its cap after %d documents", cfg.label, numberer.position)
                break
        order = numberer.order


def normalized_texts(sources: list[SourceConfig], cache_root: Path, sources_key: str) -> Callable[[], Iterator[str]]:
    """A re-readable stream of the sources' texts in recipe 01's normalization (inputs it would reject
    skipped, no other filter): text that trains the tokenizer only (``tokenizer.extra_train_sources``).
    The sources are checked now, so a missing path fails before the corpus is read."""
    check_sources(sources, sources_key)

    def texts() -> Iterator[str]:
        for raw in iter_raw_documents(sources, cache_root, sources_key):
            if raw.text:
                text = normalize_text(raw.text)
                if text:
                    yield text

    return texts
