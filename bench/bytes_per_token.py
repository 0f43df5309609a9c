"""Benchmark: UTF-8 bytes per character and bytes per token of Russian text, for sizing a corpus in bytes.

A corpus cap (``corpus.sources[].max_bytes``) and recipe 01's report ("MB of text") count UTF-8 bytes; a run
trains ``train.steps x train.batch_size x model.max_seq_len`` tokens. The bridge between the two is bytes per
token, which is not characters per token: a Cyrillic letter is two bytes in UTF-8. This measures both on the
shared ruslit text (public-domain Russian literature, not web text: FineWeb-2's pages carry more Latin, digits
and markup, so their figure differs) with the tokenizers recipe 02 builds:

- SentencePiece BPE at 32,000 pieces (``tokenizer.model_type: bpe``, the default), trained by the real recipe-02
  stage (``tokenizer.train.train_tokenizer``) on the seen authors, every document through recipe 01's
  ``normalize_text`` first, as the corpus is;
- the Hugging Face byte-level BPE the stage trains beside it for its report (``tokenizer.baseline_hf_bpe``).

Both are measured on whole authors they never saw (``--heldout-authors``, held out through
``tokenizer.heldout_sources``) and on the stage's usual 5% of the seen authors' documents. Prints one JSON object
(with the CPU model and the load average); ``--out`` also writes it.

    python bench/bytes_per_token.py --max-mb 12 --heldout-mb 3 --out bench/results/bytes_per_token_ruslit.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_tokenizer import VALIDATION_PERCENT, run_stage_on, ruslit_documents  # noqa: E402


def cpu_model() -> str:
    """``lscpu``'s model name (what bench/README.md records of a machine)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")


def text_figures(texts: list[str]) -> dict[str, Any]:
    """Characters, UTF-8 bytes, their ratio and the share of Cyrillic letters among the characters."""
    chars = sum(len(t) for t in texts)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    cyrillic = sum(1 for t in texts for c in t if "\u0400" <= c <= "\u04ff")
    return {"documents": len(texts), "chars": chars, "bytes": n_bytes,
            "bytes_per_char": round(n_bytes / max(chars, 1), 4), "cyrillic_share": round(cyrillic / max(chars, 1), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--model-type", choices=["unigram", "bpe"], default="bpe")
    parser.add_argument("--max-mb", type=float, default=12.0,
                        help="the seen authors' text (MB of UTF-8, whole documents): training and the 5%% held out")
    parser.add_argument("--heldout-mb", type=float, default=3.0, help="the held-out authors' text (MB of UTF-8)")
    parser.add_argument("--heldout-authors", nargs="+", default=["Herzen", "Lermontov"],
                        help="ruslit authors held out whole (never trained on)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()

    from data_prep.corpus.normalize import normalize_text
    from experiment.config import build_dataclass
    from experiment.runfolder import RunFolder
    from experiment.schema import ExperimentConfig

    load_before = os.getloadavg()
    started = time.perf_counter()
    docs = []
    budget = {"seen": args.max_mb * 1e6, "unseen": args.heldout_mb * 1e6}
    # every work is read (in bench_tokenizer's hash order, mixing genres and authors); each side keeps whole
    # documents until its budget is spent, so the held-out authors are measured on more than a few documents
    for doc in ruslit_documents():
        author = doc["id"].split("/")[2]
        side = "unseen" if author in args.heldout_authors else "seen"
        if budget[side] <= 0:
            continue
        text = normalize_text(doc["text"])
        budget[side] -= len(text.encode("utf-8"))
        docs.append({**doc, "source": f"unseen-{doc['source']}" if side == "unseen" else doc["source"], "text": text})
    unseen = sorted({d["source"] for d in docs if d["source"].startswith("unseen-")})
    with tempfile.TemporaryDirectory(prefix="bytes-per-token-") as root:
        cfg = build_dataclass(ExperimentConfig, {
            "experiment": {"name": "bytes-per-token", "run_root": root, "seed": 0},
            "tokenizer": {"vocab_size": args.vocab_size, "model_type": args.model_type, "report_max_docs": 100_000,
                          "heldout_sources": unseen, "hf_export": False, "num_threads": os.cpu_count() or 1,
                          "baseline_hf_bpe": True},
            "shards": {"validation_percent": VALIDATION_PERCENT},
        })
        report = run_stage_on(cfg, RunFolder.for_config(cfg), docs)
    keys = ("documents", "chars", "bytes", "tokens", "chars_per_token", "bytes_per_token")
    tokenizers = {}
    for name, result in report["tokenizers"].items():
        by_source = {source: {k: m[k] for k in keys} for source, m in result["by_source"].items()}
        unseen_total = {k: sum(by_source[s][k] for s in unseen if s in by_source)
                        for k in ("documents", "chars", "bytes", "tokens")}
        unseen_total["chars_per_token"] = round(unseen_total["chars"] / max(unseen_total["tokens"], 1), 3)
        unseen_total["bytes_per_token"] = round(unseen_total["bytes"] / max(unseen_total["tokens"], 1), 3)
        tokenizers[name] = {"vocab_size": result["vocab_size"], "heldout_authors": unseen_total,
                            "heldout_all": {k: result["overall"][k] for k in keys}, "by_source": by_source}
    by_source_texts: dict[str, list[str]] = {}
    for doc in docs:
        by_source_texts.setdefault(doc["source"], []).append(doc["text"])
    result = {
        "bench": "bytes-per-token",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python bench/bytes_per_token.py " + " ".join(sys.argv[1:]),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_average_before": list(load_before),
                    "load_average_after": list(os.getloadavg())},
        "text": "ruslit (public-domain Russian literature, /shared/data/text/ruslit): not web text",
        "vocab_size": args.vocab_size, "model_type": args.model_type, "heldout_authors": args.heldout_authors,
        "train": report["train"],
        "utf8": {"all": text_figures([d["text"] for d in docs]),
                 "by_source": {s: text_figures(t) for s, t in sorted(by_source_texts.items())}},
        "tokenizers": tokenizers,
        "seconds": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(result, ensure_ascii=False, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
