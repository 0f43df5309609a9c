"""Shard writing speed against bare SentencePiece encoding of the same text, one core each.

Both sides get the same documents (Russian classic prose from the shared data folder, cut into
documents of a few KB at paragraph breaks) and the same tokenizer (unigram, trained here on that
text). The peer is ``sp.encode(batch, num_threads=1)`` alone; ours is recipe 3's whole path with
one encoding thread: encode + EOS + split + pack + tf.train.Example + CRC framing + index + sha256.
Goal: ratio >= 0.8. Prints one JSON object.

    python bench/bench_shards.py --text-mb 8
"""

from __future__ import annotations

import argparse
import json
import os
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


def encode_only(sp: Any, texts: list[str], batch: int) -> None:
    for start in range(0, len(texts), batch):
        sp.encode(texts[start:start + batch], out_type=int, num_threads=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-mb", type=float, default=8.0)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--packing", default="concat", choices=["concat", "document"])
    parser.add_argument("--repeats", type=int, default=3, help="best of N for each side")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ru-bench-shards")
    args = parser.parse_args()

    import sentencepiece as spm

    from data_prep.sharding import write_splits
    from experiment.sections.shards import ShardsConfig

    run_folder, docs = prepare_run(args.workdir, args.text_mb, args.vocab_size)
    sp = spm.SentencePieceProcessor(model_file=str(run_folder.tokenizer / "spm.model"))
    texts = [d["text"] for d in docs]
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    cfg = ShardsConfig(seq_len=args.seq_len, packing=args.packing, validation_percent=1.0, records_per_shard=8192,
                       encode_batch_documents=512, num_threads=1)
    tokens = sum(len(ids) + 1 for ids in sp.encode(texts, out_type=int, num_threads=os.cpu_count()))

    encode = [timed(lambda: encode_only(sp, texts, cfg.encode_batch_documents)) for _ in range(args.repeats)]
    out_dir = args.workdir / "shards"
    out_dir.mkdir(parents=True, exist_ok=True)
    shard = [timed(lambda: write_splits(iter(docs), sp, out_dir, cfg, eos_id=sp.eos_id(), pad_id=max(sp.pad_id(), 0),
                                        threads=1))
             for _ in range(args.repeats)]
    (encode_wall, encode_cpu), (shard_wall, shard_cpu) = (min(e[0] for e in encode), min(e[1] for e in encode)), \
        (min(s[0] for s in shard), min(s[1] for s in shard))
    result = {
        "bench": "shard_writing_vs_sentencepiece_encode",
        "documents": len(docs), "text_mb": round(text_bytes / 1e6, 2), "tokens": tokens,
        "vocab_size": sp.get_piece_size(), "seq_len": args.seq_len, "packing": args.packing, "threads": 1,
        "sentencepiece_encode_tokens_per_cpu_s": round(tokens / encode_cpu),
        "shard_writing_tokens_per_cpu_s": round(tokens / shard_cpu),
        "ratio_per_core": round(encode_cpu / shard_cpu, 3),
        "sentencepiece_encode_tokens_per_wall_s": round(tokens / encode_wall),
        "shard_writing_tokens_per_wall_s": round(tokens / shard_wall),
        "ratio_wall": round(encode_wall / shard_wall, 3),
        "shard_writing_mb_per_cpu_s": round(text_bytes / 1e6 / shard_cpu, 2),
        "goal_ratio": 0.8,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
