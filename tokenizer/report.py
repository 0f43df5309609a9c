"""The tokenizer report: compression, fertility, fallback, coverage and round-trip on held-out text.

Every tokenizer is measured through the same ``MeasuredTokenizer`` adapter, so SentencePiece and
the baselines get identical figures side by side in ``report.json``, ``report.md`` and W&B.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from experiment.corpus_format import iter_documents
from experiment.files import atomic_write_json, atomic_write_text
from experiment.progress import progress
from experiment.schema import ExperimentConfig
from experiment.sections.tokenizer import RUSSIAN_REQUIRED_CHARS
from tokenizer.baselines import bytelevel_bpe_under_test, train_bytelevel_bpe
from tokenizer.measured import MeasuredTokenizer
from tokenizer.texts import CorpusSplit, training_texts
from tracking.artifacts import add_folder

log = logging.getLogger("tokenizer")

CYRILLIC_LETTERS = "".join(c for c in RUSSIAN_REQUIRED_CHARS if c.isalpha())
COMMON_PUNCTUATION = ".,:;!?()-–—«»„“”'\"…№%"
_WORD = re.compile(r"\w+")
TOP_PIECES = 20
MAX_FAILURES_LISTED = 5


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 4) if denominator else None


def short_word_share(tok: MeasuredTokenizer, words: Counter[str]) -> float | None:
    """Share of running words (``\\w+``, counted with repeats) that take at most two tokens, each word
    encoded as it stands in text, after a space (the T-pro 2.0 report's measure of fit to a language)."""
    short = sum(n for word, n in words.items() if len(tok.encode(" " + word)) <= 2)
    return _ratio(short, sum(words.values()))


def measure_documents(tok: MeasuredTokenizer, docs: Iterable[dict[str, Any]], counts: Counter[int]) -> dict[str, Any]:
    """Compression, fertility, fallback, unknown, short-word and round-trip figures over ``docs``."""
    documents = chars = n_bytes = words = tokens = fallback = unknown = exact = 0
    failures: list[str] = []
    word_counts: Counter[str] = Counter()
    for doc in docs:
        text = doc["text"]
        ids = tok.encode(text)
        word_counts.update(_WORD.findall(text))
        counts.update(ids)
        documents += 1
        chars += len(text)
        n_bytes += len(text.encode("utf-8"))
        words += len(_WORD.findall(text))
        tokens += len(ids)
        if tok.is_byte_fallback is not None:
            fallback += sum(1 for i in ids if tok.is_byte_fallback(i))
        unknown += sum(1 for i in ids if tok.is_unknown(i))
        if tok.decode(ids) == text:
            exact += 1
        elif len(failures) < MAX_FAILURES_LISTED:
            failures.append(str(doc["id"]))
    return {
        "documents": documents, "chars": chars, "bytes": n_bytes, "words": words, "tokens": tokens,
        "chars_per_token": _ratio(chars, tokens), "bytes_per_token": _ratio(n_bytes, tokens),
        "tokens_per_word": _ratio(tokens, words), "words_within_two_tokens": short_word_share(tok, word_counts),
        "byte_fallback_share": None if tok.is_byte_fallback is None else _ratio(fallback, tokens),
        "unk_rate": _ratio(unknown, tokens), "roundtrip_exact": _ratio(exact, documents),
        "roundtrip_exact_documents": exact, "roundtrip_failures": failures,
    }


def coverage(tok: MeasuredTokenizer, characters: str) -> dict[str, Any]:
    """Share of ``characters`` that encode to one ordinary token (no byte fallback, no unknown)."""
    missing = []
    for char in characters:
        ids = tok.encode(char)
        single = len(ids) == 1 and not tok.is_unknown(ids[0])
        if not single or (tok.is_byte_fallback is not None and tok.is_byte_fallback(ids[0])):
            missing.append(char)
    return {"share": _ratio(len(characters) - len(missing), len(characters)), "missing": "".join(missing),
            "characters": characters}


def piece_lists(tok: MeasuredTokenizer, counts: Counter[int]) -> dict[str, Any]:
    surfaces = {i: tok.surface(i) for i in range(tok.vocab_size)}
    longest = sorted(surfaces, key=lambda i: (-len(surfaces[i]), i))[:TOP_PIECES]
    return {
        "longest": [{"id": i, "piece": surfaces[i], "chars": len(surfaces[i])} for i in longest],
        "most_frequent": [{"id": i, "piece": surfaces[i], "count": n} for i, n in counts.most_common(TOP_PIECES)],
    }


def measure_tokenizer(tok: MeasuredTokenizer, heldout: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """All figures for one tokenizer: overall, per source (domain), coverage and piece lists."""
    counts: Counter[int] = Counter()
    by_source = {
        source: measure_documents(tok, progress(docs, desc=f"measuring {tok.name} on {source or 'corpus'}",
                                             unit="doc", leave=False), counts)
        for source, docs in sorted(heldout.items())
    }
    overall = measure_documents(tok, (d for docs in heldout.values() for d in docs), Counter())
    return {
        "vocab_size": tok.vocab_size,
        "train_seconds": None if tok.train_seconds is None else round(tok.train_seconds, 2),
        "overall": overall,
        "by_source": by_source,
        "coverage": {"cyrillic": coverage(tok, CYRILLIC_LETTERS), "punctuation": coverage(tok, COMMON_PUNCTUATION)},
        "pieces": piece_lists(tok, counts),
    }


def build_report(cfg: ExperimentConfig, run_tokenizer: MeasuredTokenizer, split: CorpusSplit, corpus_dir: Path,
                 extra_texts: Callable[[], Iterable[str]] | None = None,
                 extra_train: dict[str, int] | None = None) -> dict[str, Any]:
    """Measure the run's tokenizer (trained or adopted) and, if configured, the baselines on the same
    held-out documents; the run's tokenizer is the first entry of ``tokenizers``. ``extra_texts`` (text
    that trained the run's tokenizer beside the corpus, counted in ``extra_train``) trains the baseline too."""
    tok_cfg = cfg.tokenizer
    if not split.heldout_docs():
        log.warning("no held-out documents (validation_percent=%s): the report has no held-out figures",
                    cfg.shards.validation_percent)
    tokenizers = [run_tokenizer]
    if tok_cfg.baseline_hf_bpe:
        log.info("training the Hugging Face byte-level BPE baseline at vocabulary %d", tok_cfg.vocab_size)
        started = time.perf_counter()
        # Whole documents, as this baseline is normally trained: its pre-tokenizer splits them itself.
        texts = training_texts(iter_documents(corpus_dir), cfg.shards.validation_percent, tok_cfg.heldout_sources)
        if extra_texts is not None:
            texts = itertools.chain(texts, extra_texts())
        baseline = train_bytelevel_bpe(texts, tok_cfg.vocab_size)
        tokenizers.append(bytelevel_bpe_under_test(baseline, time.perf_counter() - started))
    log.info("measuring %d tokenizer(s) on %d held-out documents", len(tokenizers), len(split.heldout_docs()))
    return {
        "heldout": {
            "documents_measured": len(split.heldout_docs()),
            "documents_total": split.heldout_documents,
            "sources": {source: len(docs) for source, docs in sorted(split.heldout.items())},
            "validation_percent": cfg.shards.validation_percent,
            "unseen_sources": sorted(tok_cfg.heldout_sources),
        },
        "train": {"documents": split.train_documents, "chars": split.train_chars, **(extra_train or {})},
        "tokenizers": {tok.name: measure_tokenizer(tok, split.heldout) for tok in tokenizers},
    }


_TABLE_METRICS = ("chars_per_token", "bytes_per_token", "tokens_per_word", "words_within_two_tokens",
                  "byte_fallback_share", "unk_rate", "roundtrip_exact")
# per source (one table each): what says how a tokenizer fits text it has or has not seen
_SOURCE_METRICS = ("chars_per_token", "bytes_per_token", "byte_fallback_share", "words_within_two_tokens")


def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _md_piece(text: str) -> str:
    return "`" + text.replace("\n", "\\n").replace("`", "'").replace("|", "\\|") + "`"


COVERAGE_SETS = {"cyrillic": "Cyrillic letters of Russian", "punctuation": "punctuation marks"}


def _coverage_definition(results: dict[str, Any]) -> str:
    """What the coverage rows measure, from the characters the report checked (older reports: the current sets),
    and each tokenizer's characters that are not covered."""
    parts = []
    for kind, what in COVERAGE_SETS.items():
        first = next(iter(results.values()))["coverage"][kind]
        characters = first.get("characters", CYRILLIC_LETTERS if kind == "cyrillic" else COMMON_PUNCTUATION)
        missing = "; ".join(f"{name}: {_md_piece(r['coverage'][kind]['missing'])}" for name, r in results.items()
                            if r["coverage"][kind]["missing"])
        parts.append(f"{kind} coverage is the share of the {len(characters)} {what} {_md_piece(characters)} that "
                     f"each encode, alone, as one ordinary token (not unknown, not byte-fallback pieces); "
                     f"not covered: {missing or 'none'}.")
    return " ".join(parts)


def render_markdown(report: dict[str, Any]) -> str:
    names = list(report["tokenizers"])
    results = report["tokenizers"]
    held = report["heldout"]
    lines = [
        "# Tokenizer report", "",
        f"Held-out documents measured: {held['documents_measured']} of {held['documents_total']} "
        f"({held['validation_percent']}% of the corpus by id hash"
        + (f", and sources never trained on: {', '.join(held['unseen_sources'])}" if held.get("unseen_sources") else "")
        + f"); training documents: {report['train']['documents']}"
        + (f", and {report['train']['extra_chars']:,} characters ({report['train']['extra_documents']} documents) of "
           "tokenizer.extra_train_sources" if "extra_chars" in report["train"] else "") + ".",
        "", "## Overall", "",
        "| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
    ]
    rows = [*_TABLE_METRICS, "tokens", "vocab_size", "train_seconds"]
    for metric in rows:
        values = [results[n]["overall"].get(metric, results[n].get(metric)) for n in names]
        lines.append(f"| {metric} | " + " | ".join(_cell(v) for v in values) + " |")
    for kind in ("cyrillic", "punctuation"):
        lines.append(f"| {kind} coverage | " + " | ".join(_cell(results[n]["coverage"][kind]["share"]) for n in names)
                     + " |")
    lines += ["", _coverage_definition(results)]
    unseen = set(held.get("unseen_sources", []))
    for metric in _SOURCE_METRICS:
        lines += ["", f"## {metric} by source", "", "| source | documents | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for source, count in held["sources"].items():
            cells = [_cell(results[n]["by_source"][source].get(metric)) for n in names]
            label = (source or "(none)") + (" (never trained on)" if source in unseen else "")
            lines.append(f"| {label} | {count} | " + " | ".join(cells) + " |")
    for name in names:
        pieces = results[name]["pieces"]
        lines += ["", f"## {name}: pieces", "",
                  "Longest: " + ", ".join(_md_piece(p["piece"]) for p in pieces["longest"]), "",
                  "Most frequent: " + ", ".join(f"{_md_piece(p['piece'])} ({p['count']})"
                                                for p in pieces["most_frequent"])]
        failures = results[name]["overall"]["roundtrip_failures"]
        if failures:
            lines += ["", f"Round-trip failures (first {len(failures)}): " + ", ".join(failures)]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, report: dict[str, Any]) -> None:
    atomic_write_json(out_dir / "report.json", report)
    atomic_write_text(out_dir / "report.md", render_markdown(report))


def log_report(wandb_run: Any, report: dict[str, Any], out_dir: Path, artifact_name: str) -> None:
    """Log the side-by-side table, headline figures and the tokenizer folder as an artifact."""
    import wandb

    columns = ["tokenizer", "source", "documents", *_TABLE_METRICS]
    rows = []
    for name, result in report["tokenizers"].items():
        for source, metrics in [("all", result["overall"]), *result["by_source"].items()]:
            rows.append([name, source, metrics["documents"], *(metrics[m] for m in _TABLE_METRICS)])
    sp_overall = next(iter(report["tokenizers"].values()))["overall"]  # the run's tokenizer comes first
    wandb_run.log({"tokenizer/report": wandb.Table(columns=columns, data=rows)})
    for metric in _TABLE_METRICS:
        wandb_run.summary[f"tokenizer/{metric}"] = sp_overall[metric]
    artifact = wandb.Artifact(artifact_name, type="tokenizer",
                              metadata={m: sp_overall[m] for m in _TABLE_METRICS})
    add_folder(artifact, out_dir)
    wandb_run.log_artifact(artifact)
