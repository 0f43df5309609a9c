"""Benchmark: SentencePiece vs Hugging Face byte-level BPE on the same Russian text, in one run.

Each trainer runs in its own fresh process (so peak memory is its own), on the same training lines
and at the same vocabulary size; encoding throughput is one core (a plain loop over held-out
documents). The two sides alternate over ``--rounds`` interleaved rounds (``bench/interleave.py``), a
fresh process each time; each side's figures are medians over the rounds, and each SentencePiece / HF
ratio is the median of the per-round ratios. Prints one JSON object.

    python bench/bench_tokenizer.py --vocab-size 32000 --max-mb 20 --rounds 3

``--stage-report DIR`` instead builds a corpus folder from ruslit under DIR and runs the real
recipe-02 stage on it (report.json with the baseline beside SentencePiece, round-trip on every
held-out document), printing the headline figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import resource
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from interleave import interleaved_rounds, median_ratio, medians  # noqa: E402

from experiment.split import is_validation  # noqa: E402

VALIDATION_PERCENT = 5.0
DOC_CHARS = 20_000  # works are cut into documents of about this many characters, at paragraph breaks


def ruslit_dir() -> Path:
    shared = Path(os.environ.get("RU_SHARED_DATA", REPO.parent / "shared" / "data"))
    path = shared / "text" / "ruslit"
    if not path.is_dir():
        sys.exit(f"error: ruslit not found at {path} (set RU_SHARED_DATA to the shared/data folder)")
    return path


def ruslit_documents(max_mb: float | None = None) -> list[dict[str, Any]]:
    """Every work cut into ~20k-character documents; source = prose / poems / publicism."""
    docs: list[dict[str, Any]] = []
    budget = None if max_mb is None else int(max_mb * 1e6)
    total = 0
    files = sorted(ruslit_dir().glob("*/*/*.txt"))
    # Interleave works so that a size cap still samples every genre and author.
    files.sort(key=lambda p: hashlib.sha256(str(p.relative_to(ruslit_dir())).encode()).hexdigest())
    for path in files:
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # one ruslit file is not UTF-8; recipe 01 would reject it too
            print(f"skipping {path}: not UTF-8", file=sys.stderr)
            continue
        text = unicodedata.normalize("NFC", raw.replace("\r\n", "\n"))
        paragraphs = [p.strip() for p in text.split("\n") if p.strip()]
        chunk: list[str] = []
        size = 0
        part = 0
        for para in [*paragraphs, None]:
            if para is None or (chunk and size + len(para) > DOC_CHARS):
                if chunk:
                    category, author = path.parts[-3], path.parts[-2]
                    doc_text = "\n\n".join(chunk)
                    docs.append({"id": f"ruslit/{category}/{author}/{path.stem}#{part}", "source": category,
                                 "text": doc_text})
                    total += len(doc_text.encode("utf-8"))
                    part += 1
                    chunk, size = [], 0
                if para is None:
                    break
            chunk.append(para)
            size += len(para) + 2
        if budget is not None and total >= budget:
            break
    return docs


def split_docs(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train = [d for d in docs if not is_validation(d["id"], VALIDATION_PERCENT)]
    heldout = [d for d in docs if is_validation(d["id"], VALIDATION_PERCENT)]
    return train, heldout


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _train_and_measure(kind: str, train: list[dict[str, Any]], heldout: list[str], vocab_size: int, model_type: str,
                       queue: Any) -> None:
    """Child process: train one tokenizer as the stage does, then time single-core encoding of held-out texts."""
    from experiment.sections.tokenizer import TokenizerConfig
    from tokenizer.baselines import train_bytelevel_bpe
    from tokenizer.texts import training_lines, training_texts
    from tokenizer.train import train_sentencepiece, trainer_options

    rss_before = peak_rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    if kind == "sentencepiece":
        import sentencepiece as spm

        tok = TokenizerConfig(vocab_size=vocab_size, model_type=model_type, num_threads=os.cpu_count() or 1)
        lines = training_lines(train, 0.0, tok.max_sentence_length)
        sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(lines, trainer_options(tok, seed=0)))
        encode = sp.encode
        decode = sp.decode
    else:
        hf = train_bytelevel_bpe(training_texts(train, 0.0), vocab_size)
        encode = lambda text: hf.encode(text, add_special_tokens=False).ids  # noqa: E731
        decode = lambda ids: hf.decode(ids, skip_special_tokens=False)  # noqa: E731
    train_seconds, train_cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    train_peak = peak_rss_mb()
    n_bytes = sum(len(t.encode("utf-8")) for t in heldout)
    # CPU time of this single-threaded loop: per-core speed, unaffected by other jobs on the machine.
    cpu_started = time.process_time()
    encoded = [encode(t) for t in heldout]
    encode_cpu_seconds = time.process_time() - cpu_started
    tokens = sum(len(ids) for ids in encoded)
    queue.put({
        "train_seconds": round(train_seconds, 2),
        "train_cpu_seconds": round(train_cpu_seconds, 2),
        "train_peak_rss_mb": round(train_peak, 1),
        "train_rss_growth_mb": round(train_peak - rss_before, 1),
        "encode_mb_per_s_per_core": round(n_bytes / 1e6 / encode_cpu_seconds, 2),
        "chars_per_token": round(sum(len(t) for t in heldout) / tokens, 3),
        "roundtrip_exact": sum(decode(ids) == t for ids, t in zip(encoded, heldout, strict=True)) / len(heldout),
    })


def run_isolated(kind: str, train: list[dict[str, Any]], heldout: list[str], vocab_size: int,
                 model_type: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # a fresh interpreter: peak RSS is this trainer's alone
    queue = ctx.Queue()
    proc = ctx.Process(target=_train_and_measure, args=(kind, train, heldout, vocab_size, model_type, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def compare(args: argparse.Namespace) -> dict[str, Any]:
    train, heldout = split_docs(ruslit_documents(args.max_mb))
    texts = [d["text"] for d in heldout]
    rounds = interleaved_rounds({kind: lambda kind=kind: run_isolated(kind, train, texts, args.vocab_size,
                                                                       args.model_type)
                                 for kind in ("sentencepiece", "hf_bytelevel_bpe")}, args.rounds)
    sides = {kind: medians({key: [r[key] for r in results] for key in results[0]}, digits=3)
             for kind, results in rounds.items()}
    for kind, results in rounds.items():
        sides[kind]["rounds"] = results
    ratios = {key: median_ratio([r[key] for r in rounds["sentencepiece"]], [r[key] for r in rounds["hf_bytelevel_bpe"]],
                                digits=2)
              for key in ("train_seconds", "train_cpu_seconds", "train_peak_rss_mb", "encode_mb_per_s_per_core",
                          "chars_per_token")}
    return {
        "bench": "tokenizer",
        "corpus": {"train_documents": len(train), "heldout_documents": len(heldout),
                   "train_mb": round(sum(len(d["text"].encode()) for d in train) / 1e6, 1),
                   "heldout_mb": round(sum(len(t.encode()) for t in texts) / 1e6, 2)},
        "vocab_size": args.vocab_size,
        "model_type": args.model_type,
        "rounds": args.rounds,
        "sentencepiece": sides["sentencepiece"],
        "hf_bytelevel_bpe": sides["hf_bytelevel_bpe"],
        "ratio_sentencepiece_over_hf": ratios,
    }


def stage_report(args: argparse.Namespace) -> dict[str, Any]:
    """Run the real recipe-02 stage on ruslit and return its headline figures."""
    from experiment.config import build_dataclass
    from experiment.files import atomic_write_bytes
    from experiment.manifest import write_manifest
    from experiment.runfolder import RunFolder
    from experiment.schema import ExperimentConfig
    from tokenizer.train import train_tokenizer

    cfg = build_dataclass(ExperimentConfig, {
        "experiment": {"name": "ruslit-tokenizer", "run_root": str(args.stage_report), "seed": 0},
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": args.model_type, "report_max_docs": 100_000,
                      "max_piece_length": args.max_piece_length},
        "shards": {"validation_percent": VALIDATION_PERCENT},
    })
    folder = RunFolder.for_config(cfg)
    docs = ruslit_documents(args.max_mb)
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    atomic_write_bytes(folder.corpus / "docs-00000.jsonl", data)
    write_manifest(folder.corpus, "corpus", {
        "shards": [{"file": "docs-00000.jsonl", "documents": len(docs), "bytes": len(data), "sha256": ""}],
        "documents": len(docs), "bytes": len(data), "sources": ["ruslit"], "counts": {}, "config": {},
    })

    class NoRun:  # the benchmark keeps its numbers in report.json, not W&B
        summary: dict[str, Any] = {}

        def log(self, _data: dict[str, Any]) -> None: ...

        def log_artifact(self, _artifact: Any) -> None: ...

    started = time.perf_counter()
    train_tokenizer(cfg, folder, NoRun())
    report = json.loads((folder.tokenizer / "report.json").read_text(encoding="utf-8"))
    headline = {}
    for name, result in report["tokenizers"].items():
        headline[name] = {
            "overall": {k: result["overall"][k] for k in ("documents", "chars_per_token", "tokens_per_word",
                                                          "byte_fallback_share", "roundtrip_exact")},
            "chars_per_token_by_source": {s: m["chars_per_token"] for s, m in result["by_source"].items()},
            "train_seconds": result["train_seconds"],
        }
    return {"bench": "tokenizer-stage", "vocab_size": args.vocab_size, "model_type": args.model_type,
            "max_piece_length": args.max_piece_length,
            "stage_seconds": round(time.perf_counter() - started, 1), "report": str(folder.tokenizer / "report.md"),
            **headline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    parser.add_argument("--max-piece-length", type=int, default=16, help="SentencePiece max_piece_length")
    parser.add_argument("--max-mb", type=float, default=None, help="cap the ruslit text used (MB of UTF-8)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (a fresh process per side each)")
    parser.add_argument("--stage-report", type=Path, default=None,
                        help="run the recipe-02 stage on ruslit with its run root here instead")
    args = parser.parse_args()
    result = stage_report(args) if args.stage_report else compare(args)
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
