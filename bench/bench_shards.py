"""Shard writing speed against bare SentencePiece encoding of the same text, one core each.

Both sides get the same documents (Russian classic prose from the shared data folder, cut into
documents of a few KB at paragraph breaks) and the same tokenizer (unigram, trained here on that
text). The peer is bare encoding alone, ``sp.encode(batch, out_type="numpy", num_threads=1)`` (the
fastest way SentencePiece gives ids: no Python int per token; the goal is judged against it), and
for reference the default ``out_type=int`` (Python lists); ours is recipe 3's whole path with one
encoding thread: encode + EOS + split + pack + tf.train.Example + CRC framing + index + sha256.
The sides run interleaved (encode, write, encode, write, ...) so that a slow spell of a shared
machine hits both; ``ratio_per_core`` is the median of the per-round ratios and
``ratio_per_core_best`` the ratio of each side's best round. Goal: >= 0.8.
Prints one JSON object.

    python bench/bench_shards.py --text-mb 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def shared_text_dir() -> Path:
    return Path(os.environ.get("RU_SHARED_DATA", REPO.parent / "shared" / "data")) / "text" / "ruslit" / "prose"


def load_documents(text_mb: float, doc_chars: int = 6000) -> list[dict[str, str]]:
    """Documents of about ``doc_chars`` characters, cut at blank lines, up to ``text_mb`` MB of UTF-8."""
    root = shared_text_dir()
    if not root.is_dir():
        sys.exit(f"shared data not found at {root}: set RU_SHARED_DATA to the shared/data folder")
    budget, docs = int(text_mb * 1e6), []
    for path in sorted(root.rglob("*.txt")):
        paragraphs = [p.strip() for p in path.read_text(encoding="utf-8", errors="replace").split("\n\n") if p.strip()]
        current: list[str] = []
        for paragraph in paragraphs:
            current.append(paragraph)
            if sum(map(len, current)) >= doc_chars:
                docs.append({"id": f"{path.stem}-{len(docs)}", "source": "ruslit", "text": "\n\n".join(current)})
                budget -= len(docs[-1]["text"].encode("utf-8"))
                current = []
                if budget <= 0:
                    return docs
    return docs


def prepare_run(workdir: Path, text_mb: float, vocab_size: int) -> Any:
    """A run folder with a corpus and a tokenizer trained on it (reused if already there)."""
    from experiment.runfolder import RunFolder
    from tests.test_shards_common import write_corpus, write_tokenizer

    run_folder = RunFolder(workdir / "runs" / "bench")
    docs = load_documents(text_mb)
    if not (run_folder.corpus / "manifest.json").is_file():
        write_corpus(run_folder.corpus, docs, per_shard=500)
    if not (run_folder.tokenizer / "manifest.json").is_file():
        write_tokenizer(run_folder.tokenizer, docs[: max(1, len(docs) // 4)], vocab_size=vocab_size)
    return run_folder, docs


def timed(fn: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process): CPU time is what "per core" means, and it is
    steadier than wall time on a machine shared with other jobs."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def encode_only(sp: Any, texts: list[str], batch: int, out_type: Any) -> None:
    for start in range(0, len(texts), batch):
        sp.encode(texts[start:start + batch], out_type=out_type, num_threads=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-mb", type=float, default=8.0)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--packing", default="concat", choices=["concat", "document"])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; medians are reported")
    parser.add_argument("--spm-model", type=Path, default=None,
                        help="an existing SentencePiece model (e.g. recipe 2's 32k spm.model) instead of training one")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ru-bench-shards")
    args = parser.parse_args()

    import sentencepiece as spm

    from data_prep.shards.build import write_splits
    from experiment.sections.shards import ShardsConfig
    from tokenizer.loaded import sentencepiece_run_tokenizer

    run_folder, docs = prepare_run(args.workdir, args.text_mb, args.vocab_size)
    sp = spm.SentencePieceProcessor(model_file=str(args.spm_model or run_folder.tokenizer / "spm.model"))
    run_tokenizer = sentencepiece_run_tokenizer(sp)
    texts = [d["text"] for d in docs]
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    cfg = ShardsConfig(packing=args.packing, validation_percent=1.0, records_per_shard=8192,
                       encode_batch_documents=512, num_threads=1)
    tokens = sum(len(ids) + 1 for ids in sp.encode(texts, out_type=int, num_threads=os.cpu_count()))

    out_dir = args.workdir / "shards"
    out_dir.mkdir(parents=True, exist_ok=True)
    rounds = []
    for _ in range(args.repeats):
        rounds.append({
            "numpy": timed(lambda: encode_only(sp, texts, cfg.encode_batch_documents, "numpy")),
            "list": timed(lambda: encode_only(sp, texts, cfg.encode_batch_documents, int)),
            "shards": timed(lambda: write_splits(iter(docs), run_tokenizer, out_dir, cfg, args.seq_len,
                                                 eos_id=sp.eos_id(), pad_id=max(sp.pad_id(), 0), threads=1)),
        })

    cpu = {side: statistics.median([r[side][1] for r in rounds]) for side in ("numpy", "list", "shards")}
    wall = {side: statistics.median([r[side][0] for r in rounds]) for side in ("numpy", "list", "shards")}
    result = {
        "bench": "shard_writing_vs_sentencepiece_encode",
        "documents": len(docs), "text_mb": round(text_bytes / 1e6, 2), "tokens": tokens,
        "vocab_size": sp.get_piece_size(), "seq_len": args.seq_len, "packing": args.packing, "threads": 1,
        "rounds": args.repeats,
        "encode_numpy_tokens_per_cpu_s": round(tokens / cpu["numpy"]),
        "encode_list_tokens_per_cpu_s": round(tokens / cpu["list"]),
        "shard_writing_tokens_per_cpu_s": round(tokens / cpu["shards"]),
        "ratio_per_core": round(statistics.median([r["numpy"][1] / r["shards"][1] for r in rounds]), 3),
        "ratio_per_core_rounds": [round(r["numpy"][1] / r["shards"][1], 3) for r in rounds],
        # best round of each side: the least disturbed run, the usual estimator of a cost under noise
        "ratio_per_core_best": round(min(r["numpy"][1] for r in rounds) / min(r["shards"][1] for r in rounds), 3),
        "ratio_per_core_vs_list_encode": round(statistics.median([r["list"][1] / r["shards"][1] for r in rounds]), 3),
        "ratio_wall": round(statistics.median([r["numpy"][0] / r["shards"][0] for r in rounds]), 3),
        "shard_writing_tokens_per_wall_s": round(tokens / wall["shards"]),
        "shard_writing_mb_per_cpu_s": round(text_bytes / 1e6 / cpu["shards"], 2),
        "goal_ratio": 0.8,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
