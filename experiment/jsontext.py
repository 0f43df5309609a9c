"""JSON text from files the project reads back (manifests, ledgers, logs, records, eval data), parsed with a
nesting bound: ``json.loads`` of ``[[[[...`` a few thousand levels deep is a ``RecursionError``, which no
caller's ``except ValueError`` catches, and a value nested a few hundred levels deep stays a hazard for every
recursive walk after it (copies, checks, records). Every such reader parses with ``parse_json``; a value beyond
the bound is a ``JSONDecodeError`` like any other malformed text, so each reader's one-line error (naming the
file and the line or record) covers it."""

from __future__ import annotations

import json
from typing import Any

# deeper than any file this project writes or reads (a manifest or a Hugging Face tokenizer.json: under 10)
MAX_JSON_DEPTH = 100


class JSONTooDeep(json.JSONDecodeError):
    """JSON text nested beyond MAX_JSON_DEPTH (its message is the problem alone: the position is unknown)."""

    def __init__(self, doc: str) -> None:
        super().__init__(f"nested more than {MAX_JSON_DEPTH} levels deep", doc, 0)

    def __str__(self) -> str:
        return self.msg


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``, or ``JSONTooDeep`` (a ``ValueError``) for text nested beyond MAX_JSON_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeep(text if isinstance(text, str) else "") from None
    stack = [(value, 1)]
    while stack:  # iterative: the check itself must not recurse
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_JSON_DEPTH:
                    raise JSONTooDeep(text if isinstance(text, str) else "")
                stack.append((child, depth + 1))
    return value
