"""The one reader of JSON-lines files (one JSON value a line), with an explicit torn-tail policy.

Every JSONL file of a run is read here: the cost ledger, ``train_log.jsonl``, corpus shards, staged
Beam summaries, eval datasets, user corpora, ``wandb leet inspect`` output. They differ in one thing
only, what a *torn tail* means, and each caller says which:

- a line that ends with a newline and does not parse is damage (a record cut and overwritten, a
  foreign file): always a ``DataError`` naming the file and the line (or, with ``malformed="yield"``,
  handed to the caller, for user data whose bad records are counted rather than fatal);
- the last line without a newline that does not parse is a record *being written* (an appending
  writer was killed, or is still writing): ``torn_tail="ignore"`` drops it (a live log read while its
  writer runs), ``"warn"`` drops it with a warning (a crash left it), ``"error"`` raises (a file that
  is written atomically, so a torn end is damage);
- a last line without a newline that parses is a complete record (a JSON object cannot be cut into
  a shorter valid one), kept;
- blank lines are skipped; an empty file has no records.

Lines are split on ``\\n`` alone: ``ensure_ascii=False`` JSON may hold U+2028 and other characters
that ``str.splitlines`` would split on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from experiment import appendlog
from experiment.errors import DataError
from experiment.jsontext import JSONTooDeep, parse_json
from experiment.storage import BucketPath, location

log = logging.getLogger("experiment.jsonl")

TornTail = Literal["ignore", "warn", "error"]
Malformed = Literal["error", "yield"]
TORN_TAILS: tuple[str, ...] = ("ignore", "warn", "error")


@dataclasses.dataclass(frozen=True)
class JsonlRecord:
    """One non-blank line: its 1-based number, its text (no newline) and its value; ``error`` (and
    ``value`` None) for a malformed line read with ``malformed="yield"``."""

    line: int
    text: str
    value: Any = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class JsonlContents:
    """A whole file read: its records, and the torn last line that was dropped (None when there was none)."""

    name: str
    records: list[JsonlRecord]
    torn_tail: str | None = None

    @property
    def values(self) -> list[Any]:
        return [record.value for record in self.records]


def split_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` with their ``\\n`` (the last one may lack it), split on ``\\n`` alone."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end + 1]
        start = end + 1


def iter_jsonl(lines: Iterable[str], name: str, *, torn_tail: TornTail,
               malformed: Malformed = "error") -> Iterator[JsonlRecord]:
    """The records of ``lines`` (a text file opened with its newlines, or ``split_lines``); ``name`` (a
    path or URI) is what errors and warnings name. The policy is the module docstring's."""
    if torn_tail not in TORN_TAILS:
        raise ValueError(f"torn_tail must be one of {TORN_TAILS}, got {torn_tail!r}")
    for number, line in enumerate(lines, start=1):
        text = line[:-1] if line.endswith("\n") else line
        if not text.strip():
            continue
        try:
            value = parse_json(text)
        except json.JSONDecodeError as exc:
            if not line.endswith("\n") and not isinstance(exc, JSONTooDeep):  # the last line, cut short: being written
                message = (f"{name} line {number}: a last line without a newline that is not JSON "
                           f"({len(text.encode('utf-8'))} bytes; a writer was killed or is still writing)")
                if torn_tail == "error":
                    raise DataError(message) from None
                if torn_tail == "warn":
                    log.warning("%s: dropped", message)
                return
            if malformed == "yield":
                yield JsonlRecord(number, text, error=f"not valid JSON ({exc.msg})")
                continue
            raise DataError(f"{name} line {number}: not valid JSON ({exc.msg})") from None
        yield JsonlRecord(number, text, value)


def parse_jsonl(text: str, name: str, *, torn_tail: TornTail, malformed: Malformed = "error") -> JsonlContents:
    """Every record of ``text`` (a whole file, or a command's output); ``torn_tail`` holds the dropped
    last line, for a caller that cuts it off the file."""
    records = list(iter_jsonl(split_lines(text), name, torn_tail=torn_tail, malformed=malformed))
    last_line = text.rsplit("\n", 1)[-1]  # "" when the text ends with its newline
    parsed_last = bool(records) and records[-1].line == text.count("\n") + 1 and records[-1].error is None
    torn = last_line if last_line.strip() and not parsed_last else None
    return JsonlContents(name, records, torn)


def read_jsonl(path: str | os.PathLike[str] | BucketPath, *, torn_tail: TornTail, malformed: Malformed = "error",
               missing_ok: bool = False) -> JsonlContents:
    """Every record of the file at ``path`` (UTF-8; in a bucket also an append-only log's segments,
    ``experiment.appendlog``); with ``missing_ok``, a missing file has none."""
    path = location(path)
    try:
        data = appendlog.read_bytes(path)
    except FileNotFoundError:
        if missing_ok:
            return JsonlContents(str(path), [])
        raise DataError(f"{path} is missing") from None
    head_end = data.rfind(b"\n") + 1
    try:
        text = data[:head_end].decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not UTF-8 ({exc.reason})") from None
    # a kill can cut the last line inside a multi-byte character: that line is torn, not the file
    text += data[head_end:].decode("utf-8", errors="replace")
    return parse_jsonl(text, str(path), torn_tail=torn_tail, malformed=malformed)
