"""Exact and near-duplicate detection across the whole corpus.

Per document (in the workers): an exact key (a hash of the normalized text) and a MinHash signature
over word n-gram shingles (datasketch). Across documents (in one place): a document is a duplicate
when an earlier document has the same exact key, or shares an LSH bucket with it (``bands`` x
``rows`` of the signature) and, if ``min_jaccard`` is set, has an estimated Jaccard at least that.

"Earlier" is the global input order, so the rule does not depend on how the work was split: the
local pool checks documents in order against a datasketch ``MinHashLSH``; the Beam pipeline groups
documents by band key and compares each with the lower-ordered members of its buckets. Both mark
the same documents.
"""

from __future__ import annotations

import functools
import hashlib
import re

import numpy as np
from datasketch import MinHash, MinHashLSH

from experiment.sections.corpus import DedupConfig

MINHASH_SCHEME = "affine32"
_TOKEN = re.compile(r"\w+")


def exact_key(text: str) -> str:
    """Hash of the normalized text: equal keys mean byte-identical documents."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def shingles(text: str, n: int) -> list[bytes]:
    """Distinct lowercased word n-grams (the whole text when it has fewer than n words)."""
    tokens = _TOKEN.findall(text.lower())
    if len(tokens) < n:
        return [" ".join(tokens).encode("utf-8")]
    return list({" ".join(tokens[i:i + n]).encode("utf-8") for i in range(len(tokens) - n + 1)})


@functools.lru_cache(maxsize=4)
def _permutations(num_perm: int, seed: int) -> np.ndarray:
    """Drawing the permutations costs more than hashing a short document: draw them once per process."""
    return MinHash(num_perm=num_perm, seed=seed, scheme=MINHASH_SCHEME).permutations


def _minhash(cfg: DedupConfig, hashvalues: np.ndarray | None = None) -> MinHash:
    return MinHash(num_perm=cfg.num_perm, seed=cfg.seed, hashvalues=hashvalues,
                   permutations=_permutations(cfg.num_perm, cfg.seed), scheme=MINHASH_SCHEME)


def minhash_signature(text: str, cfg: DedupConfig) -> np.ndarray:
    """The MinHash signature (uint32 array of bands * rows values) of the text's shingles."""
    minhash = _minhash(cfg)
    minhash.update_batch(shingles(text, cfg.ngram))
    return minhash.hashvalues


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.asarray(a) == np.asarray(b)))


def band_keys(signature: np.ndarray, cfg: DedupConfig) -> list[bytes]:
    """One key per LSH band: the band number and the band's hash values (the Beam grouping keys)."""
    values = np.asarray(signature, dtype=np.uint32)
    return [
        band.to_bytes(2, "big") + values[band * cfg.rows:(band + 1) * cfg.rows].tobytes()
        for band in range(cfg.bands)
    ]


class Deduplicator:
    """Checks documents in input order against everything seen before (kept or not)."""

    def __init__(self, cfg: DedupConfig) -> None:
        self.cfg = cfg
        self.exact_seen: dict[str, str] = {}
        self.lsh = MinHashLSH(num_perm=cfg.num_perm, params=(cfg.bands, cfg.rows)) if cfg.near else None
        self.signatures: dict[str, np.ndarray] = {}

    def check(self, doc_id: str, key: str, signature: np.ndarray | None) -> tuple[str | None, str | None]:
        """Return ``(kind, id of the earlier document)``, kind ``exact``/``near``, or ``(None, None)``.

        The document is remembered either way, so a chain of near-copies is caught link by link.
        """
        if self.cfg.exact:
            earlier = self.exact_seen.setdefault(key, doc_id)
            if earlier != doc_id:
                return "exact", earlier
        if self.lsh is None or signature is None:
            return None, None
        minhash = _minhash(self.cfg, signature)
        candidates = self.lsh.query(minhash)
        matches = sorted(
            c for c in candidates
            if self.cfg.min_jaccard <= 0 or estimated_jaccard(self.signatures[c], signature) >= self.cfg.min_jaccard
        )
        self.lsh.insert(doc_id, minhash, check_duplication=False)
        if self.cfg.min_jaccard > 0:
            self.signatures[doc_id] = signature
        if matches:
            return "near", matches[0]
        return None, None


# FineWeb-2's upsampling by near-duplicate cluster size (its README, "re-hydration"): (smallest cluster size,
# copies), read by the last row whose size the cluster reaches. Clusters of 1,000+ are assumed to be boilerplate.
FINEWEB2_REHYDRATION: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (3, 3), (4, 3), (5, 5), (100, 8), (1000, 1))


def rehydration_copies(cluster_size: int) -> int:
    """How many times a kept document whose cluster (itself and its duplicates) has ``cluster_size``
    documents is written: a pure function, for the local writer and the Beam workers alike."""
    if cluster_size < 1:
        raise ValueError(f"a cluster has at least one document, got {cluster_size}")
    return [copies for size, copies in FINEWEB2_REHYDRATION if cluster_size >= size][-1]


class ClusterSizes:
    """Cluster sizes from the duplicate links the dedup step gives (``duplicate_of`` may itself be a
    duplicate: each document joins the cluster of the kept document its chain ends at)."""

    def __init__(self) -> None:
        self._root: dict[str, str] = {}
        self.sizes: dict[str, int] = {}  # kept document id -> cluster size, for clusters of 2 or more

    def add_duplicate(self, doc_id: str, duplicate_of: str) -> None:
        root = self._root.get(duplicate_of, duplicate_of)
        self._root[doc_id] = root
        self.sizes[root] = self.sizes.get(root, 1) + 1

    def copies(self, doc_id: str) -> int:
        return rehydration_copies(self.sizes.get(doc_id, 1))
