"""The train/validation split: by a hash of the document id, so it is stable when the corpus grows."""

from __future__ import annotations

import hashlib


def is_validation(doc_id: str, validation_percent: float) -> bool:
    """True for about ``validation_percent`` % of ids; the same id always lands on the same side."""
    bucket = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") % 1_000_000
    return bucket < validation_percent * 10_000
