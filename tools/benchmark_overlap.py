"""How much of each benchmark a corpus holds: the share of its items with at least one n-gram in the corpus.

Meant for a corpus built without decontamination (``corpus.decontamination.enabled: false``): it says what the
decontamination would remove and which scores a team should not publish as they stand. The index is recipe 01's
(the same benchmarks, files, n, ``min_words`` and word normalization: eval/decontam.py and
data_prep/corpus/decontam.py); an item counts as overlapping when any of its grams occurs in any document.

    python -m tools.benchmark_overlap --config recipes/configs/demo.yaml [key=value ...] [--corpus DIR] [--out DIR]

``--corpus``: a recipe-01 corpus folder (docs-NNNNN.jsonl and manifest.json); default, the config's run folder's
corpus/. Writes ``overlap.csv``, ``overlap.md`` and ``overlap.png`` (a bar per benchmark) into ``--out`` (default:
that corpus folder) and prints the Markdown table. Benchmarks that cannot be read are listed with the reason.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.corpus.decontam import BenchmarkIndex, normalized_words
from eval.decontam import benchmark_index
from experiment.config import load_config
from experiment.corpus_format import iter_documents
from experiment.errors import RecipeError
from experiment.files import atomic_write_bytes, atomic_write_text
from experiment.runfolder import RunFolder


@dataclass
class Overlap:
    benchmark: str
    source: str
    items: int
    items_checked: int  # items with at least one gram (the rest are shorter than min_words)
    items_overlapping: int

    @property
    def share(self) -> float:
        return self.items_overlapping / self.items if self.items else 0.0


def measure_overlap(index: BenchmarkIndex, texts: Iterable[str]) -> tuple[list[Overlap], int]:
    """Per benchmark, the items with a gram in any of ``texts``; and how many texts were read."""
    seen = np.zeros(len(index.item_benchmark), dtype=bool)
    documents = 0
    for text in texts:
        documents += 1
        for hit in index.hits(normalized_words(text)):
            seen[list(hit.items)] = True
    rows = []
    for number, name in enumerate(index.benchmarks):
        summary = index.summaries[name]
        mine = index.item_benchmark == number
        rows.append(Overlap(name, summary.source, summary.items, summary.items_indexed, int(seen[mine].sum())))
    return rows, documents


def render_csv(rows: list[Overlap]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["benchmark", "source", "items", "items_checked", "items_overlapping", "share_overlapping"])
    for row in rows:
        writer.writerow([row.benchmark, row.source, row.items, row.items_checked, row.items_overlapping,
                         f"{row.share:.4f}"])
    return out.getvalue()


def render_markdown(rows: list[Overlap], index: BenchmarkIndex, corpus: Path, documents: int) -> str:
    lines = [f"# Benchmark overlap of {corpus}", "",
             f"{documents:,} documents; word {index.ngram}-grams (item text of {index.min_words} to {index.ngram - 1} "
             "words: whole) over lower-cased words, ё as е, punctuation dropped.", "",
             "| benchmark | items | items checked | items overlapping | share |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r.benchmark} | {r.items:,} | {r.items_checked:,} | {r.items_overlapping:,} | {100 * r.share:.2f}% |"
              for r in rows]
    if index.not_indexed:
        lines += ["", "Not measured:", ""] + [f"- {name}: {why}" for name, why in index.not_indexed.items()]
    return "\n".join(lines) + "\n"


def render_plot(rows: list[Overlap], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.5))
    ax.barh([r.benchmark for r in rows], [100 * r.share for r in rows], color="#4c72b0")
    for y, row in enumerate(rows):
        ax.text(100 * row.share, y, f" {row.items_overlapping}/{row.items}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("items with an n-gram in the corpus, %")
    ax.set_title("Benchmark items the corpus overlaps")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--corpus", default="", help="a recipe-01 corpus folder (default: the run folder's)")
    parser.add_argument("--out", default="", help="where overlap.csv/.md/.png go (default: the corpus folder)")
    parser.add_argument("overrides", nargs="*", help="config overrides, key.sub=value")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        cfg.corpus.decontamination.enabled = True  # the index, whatever the corpus was built with
        corpus = Path(args.corpus) if args.corpus else RunFolder.for_config(cfg).corpus
        index = benchmark_index(cfg)
        assert index is not None
        rows, documents = measure_overlap(index, (doc["text"] for doc in iter_documents(corpus)))
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else corpus
    out.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(rows, index, corpus, documents)
    atomic_write_text(out / "overlap.csv", render_csv(rows))
    atomic_write_text(out / "overlap.md", markdown)
    render_plot(rows, out / "overlap.png")
    print(markdown, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
