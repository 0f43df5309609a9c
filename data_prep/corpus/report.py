"""Counting what happened to every input document, and the corpus report (Markdown and W&B).

Every input document ends in exactly one bucket: kept, rejected with a reason, or removed as an
exact or near duplicate. ``CorpusCounts.check`` proves the buckets add up before the manifest is
written.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from data_prep.corpus.cleaning import CleanDocument

DUPLICATE_KINDS = ("exact", "near")


@dataclass
class SourceCounts:
    documents_in: int = 0
    bytes_in: int = 0
    kept: int = 0
    bytes_kept: int = 0
    rejected: int = 0
    duplicates: int = 0


@dataclass
class CorpusCounts:
    documents_in: int = 0
    bytes_in: int = 0
    kept: int = 0
    bytes_kept: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    rejected_bytes: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    duplicate_bytes: Counter[str] = field(default_factory=Counter)
    per_source: dict[str, SourceCounts] = field(default_factory=lambda: defaultdict(SourceCounts))
    examples: dict[str, list[dict[str, str]]] = field(default_factory=lambda: defaultdict(list))
    max_examples: int = 3
    # decontamination: documents that overlapped each benchmark (removed or cut), and the words cut
    benchmark_documents: Counter[str] = field(default_factory=Counter)
    words_cut: int = 0

    def _example(self, bucket: str, doc: CleanDocument, note: str = "") -> None:
        if len(self.examples[bucket]) < self.max_examples:
            self.examples[bucket].append({"id": doc.id, "origin": doc.origin, "preview": doc.preview, "note": note})

    def _count_in(self, doc: CleanDocument) -> None:
        self.benchmark_documents.update(doc.benchmarks)
        self.words_cut += doc.words_cut
        self.documents_in += 1
        self.bytes_in += doc.bytes_in
        source = self.per_source[doc.source]
        source.documents_in += 1
        source.bytes_in += doc.bytes_in

    def add_rejected(self, doc: CleanDocument) -> None:
        self._count_in(doc)
        reason = doc.reject or "unknown"
        self.rejected[reason] += 1
        self.rejected_bytes[reason] += doc.bytes_in
        self.per_source[doc.source].rejected += 1
        self._example(reason, doc, note=f"overlaps {', '.join(doc.benchmarks)}" if doc.benchmarks else "")

    def add_duplicate(self, doc: CleanDocument, kind: str, duplicate_of: str) -> None:
        self._count_in(doc)
        self.duplicates[kind] += 1
        self.duplicate_bytes[kind] += doc.bytes_in
        self.per_source[doc.source].duplicates += 1
        self._example(f"duplicate_{kind}", doc, note=f"duplicate of {duplicate_of}")

    def add_kept(self, doc: CleanDocument) -> None:
        self._count_in(doc)
        self.kept += 1
        self.bytes_kept += doc.bytes_out
        source = self.per_source[doc.source]
        source.kept += 1
        source.bytes_kept += doc.bytes_out

    def check(self) -> None:
        """Every input document is in exactly one bucket (a failure here is a bug, not bad input)."""
        total = self.kept + sum(self.rejected.values()) + sum(self.duplicates.values())
        if total != self.documents_in:
            raise AssertionError(f"corpus accounting is off: {self.documents_in} in, {total} accounted for")

    def manifest_counts(self) -> dict[str, Any]:
        return {
            "in": self.documents_in,
            "kept": self.kept,
            "rejected": dict(sorted(self.rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
            "duplicates": {kind: self.duplicates.get(kind, 0) for kind in DUPLICATE_KINDS},
        }

    def manifest_bytes(self) -> dict[str, Any]:
        """Input bytes per outcome (the text bytes the source gave, before cleaning)."""
        return {
            "in": self.bytes_in,
            "kept_text": self.bytes_kept,
            "rejected": dict(sorted(self.rejected_bytes.items(), key=lambda kv: (-kv[1], kv[0]))),
            "duplicates": {kind: self.duplicate_bytes.get(kind, 0) for kind in DUPLICATE_KINDS},
        }

    def outcome_rows(self) -> list[tuple[str, int, int]]:
        """(outcome, documents, input bytes), largest first, for the report and the W&B table."""
        rows = [(f"rejected: {r}", n, self.rejected_bytes[r]) for r, n in self.rejected.items()]
        rows += [(f"duplicate: {k}", n, self.duplicate_bytes[k]) for k, n in self.duplicates.items()]
        # ties by name: the order outcomes were met in is the runner's (Beam's workers meet them in any order)
        return [("kept", self.kept, self.bytes_kept)] + sorted(rows, key=lambda row: (-row[1], row[0]))


def _share(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _quote(text: str) -> str:
    return " ".join(text.split())[:200].replace("|", "\\|")


def decontamination_lines(record: dict[str, Any]) -> list[str]:
    """The report's decontamination section, from the manifest's record (build.decontamination_record)."""
    lines = ["", "## Decontamination", ""]
    if not record.get("enabled"):
        return [*lines, f"Not decontaminated: {record.get('reason', 'off')}."]
    lines += [f"Word {record['ngram']}-grams (an item text of {record['min_words']} to {record['ngram'] - 1} words: "
              f"whole) over normalized words ({record['normalization']}); overlapping documents: "
              f"{'removed' if record['action'] == 'remove' else 'the overlapping spans cut'}"
              + (f" ({record['words_cut']:,} words cut)." if record["action"] == "cut" else "."), "",
              "| benchmark | source | items | items checked | n-grams | documents overlapping | documents removed |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for name, entry in record["benchmarks"].items():
        lines.append(f"| {name} | `{entry['source']}` | {entry['items']:,} | {entry['items_indexed']:,} "
                     f"| {entry['ngrams']:,} | {entry['documents']:,} | {entry['documents_removed']:,} |")
    if record["not_decontaminated"]:
        lines += ["", "Not decontaminated against:", ""]
        lines += [f"- {name}: {_quote(reason)}" for name, reason in record["not_decontaminated"].items()]
    return lines


def render_report(counts: CorpusCounts, shards: list[dict[str, Any]], seconds: float,
                  decontamination: dict[str, Any] | None = None) -> str:
    mb_in = counts.bytes_in / 1e6
    lines = [
        "# Corpus report",
        "",
        f"{counts.documents_in:,} input documents ({mb_in:.1f} MB) -> {counts.kept:,} kept "
        f"({counts.bytes_kept / 1e6:.1f} MB of text) in {len(shards)} shard(s), {seconds:.0f} s "
        f"({mb_in / max(seconds, 1e-9):.2f} MB/s).",
        "",
        "## Outcomes",
        "",
        "| outcome | documents | share | input MB |",
        "|---|---:|---:|---:|",
    ]
    for outcome, documents, size in counts.outcome_rows():
        lines.append(f"| {outcome} | {documents:,} | {_share(documents, counts.documents_in)} | {size / 1e6:.2f} |")
    lines += ["", "## Sources", "", "| source | documents in | MB in | kept | MB kept | rejected | duplicates |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, source in counts.per_source.items():
        lines.append(f"| {name} | {source.documents_in:,} | {source.bytes_in / 1e6:.2f} | {source.kept:,} "
                     f"| {source.bytes_kept / 1e6:.2f} | {source.rejected:,} | {source.duplicates:,} |")
    if decontamination is not None:
        lines += decontamination_lines(decontamination)
    lines += ["", "## Examples of removed documents", ""]
    for bucket, examples in sorted(counts.examples.items()):
        lines += [f"### {bucket}", ""]
        for example in examples:
            note = f" ({example['note']})" if example["note"] else ""
            lines.append(f"- `{example['id']}` from `{example['origin']}`{note}: "
                         f"{_quote(example['preview']) or '(no text)'}")
        lines.append("")
    return "\n".join(lines) + "\n"


def log_to_wandb(wandb_run: Any, counts: CorpusCounts) -> None:
    """A table of outcomes, a table of examples, and the headline counts in the run summary."""
    import wandb

    outcomes = wandb.Table(columns=["outcome", "documents", "input_bytes"],
                           data=[list(row) for row in counts.outcome_rows()])
    examples = wandb.Table(columns=["bucket", "id", "origin", "preview"], data=[
        [bucket, ex["id"], ex["origin"], ex["preview"]]
        for bucket, items in sorted(counts.examples.items()) for ex in items
    ])
    wandb_run.log({"corpus/outcomes": outcomes, "corpus/examples": examples}, step=0)
    wandb_run.summary.update({
        "corpus/documents_in": counts.documents_in,
        "corpus/documents_kept": counts.kept,
        "corpus/bytes_in": counts.bytes_in,
        "corpus/bytes_kept": counts.bytes_kept,
        **{f"corpus/rejected/{r}": n for r, n in counts.rejected.items()},
        **{f"corpus/duplicates/{k}": n for k, n in counts.duplicates.items()},
    })
