"""Benchmark: RuBLiMP scoring throughput, our JAX scoring against Transformers on the exported model.

Both sides score the same token requests through the same batching and padding code
(eval.scoring.score_requests); only the forward pass differs: our jitted Flax decoder, or
``LlamaForCausalLM`` (torch, fp32, eager attention) loaded from our Hugging Face export of the very
same weights. One process, same CPU: each side's first pass (compile, warm-up) is timed once and
reported apart, then the sides score every request in turn for ``--rounds`` interleaved rounds
(``bench/interleave.py``); the ratio is the median of the per-round ratios. Prints JSON.

    .venvs/hf/bin/python bench/bench_eval.py --pairs 350 --rounds 3   # needs torch + transformers
    python bench/bench_eval.py --pairs 350                              # ours only, where torch is missing

The model is randomly initialised at the demo's shape (throughput does not depend on the weights);
the tokenizer is a SentencePiece model trained here on a Pushkin novel from the shared data.
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

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from interleave import interleaved_rounds, median_ratio  # noqa: E402

from eval.harness import PairEncoder, load_task  # noqa: E402
from eval.scoring import ScoreRequest, model_logits_fn, score_requests  # noqa: E402
from eval.tasks import TASKS  # noqa: E402
from experiment.sections.tokenizer import TokenizerConfig  # noqa: E402
from model.llama.config import LlamaConfig  # noqa: E402

SHARED = Path(os.environ.get("RU_SHARED_DATA", REPO.parent / "shared" / "data"))


def train_tokenizer(vocab_size: int) -> Any:
    import sentencepiece as spm

    from tokenizer.train import train_sentencepiece, trainer_options

    text = (SHARED / "text" / "ruslit" / "prose" / "Pushkin" / "Капитанская дочка.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    options = trainer_options(TokenizerConfig(vocab_size=vocab_size, model_type="unigram", num_threads=2), seed=0)
    return spm.SentencePieceProcessor(model_proto=train_sentencepiece(iter(lines), options))


def build_requests(sp: Any, pairs: int) -> list[ScoreRequest]:
    data = load_task(TASKS["rublimp"], bench_dir=str(SHARED / "bench"), rublimp_dir=str(SHARED / "bench" / "rublimp"),
                     max_items=max(1, pairs // 35 + 1), seed=0)
    items = data.items[:pairs]
    encoder = PairEncoder(lambda text: sp.encode(text, out_type=int), start_id=sp.eos_id())
    return [encoder(ctx, cont) for it in items for ctx, cont in zip(it.contexts, it.continuations, strict=True)]


class Scorer:
    """One side: scores every request per call and keeps the latest scores (to compare the sides)."""

    def __init__(self, logits_fn: Any, requests: list[ScoreRequest], batch_size: int, max_len: int) -> None:
        self.logits_fn, self.requests, self.batch_size, self.max_len = logits_fn, requests, batch_size, max_len
        self.scores: list = []
        self.first_pass_s = self()  # compile and warm-up, reported apart from the rounds

    def __call__(self) -> float:
        started = time.perf_counter()
        self.scores = score_requests(self.logits_fn, self.requests, batch_size=self.batch_size, max_len=self.max_len)
        return time.perf_counter() - started


def side_result(scorer: Scorer, seconds: list[float], pairs: int, tokens: int) -> dict[str, Any]:
    steady = statistics.median(seconds)
    return {"first_pass_s": round(scorer.first_pass_s, 3), "steady_s": round(steady, 3),
            "steady_s_rounds": [round(s, 3) for s in seconds],
            "examples_per_s": round(pairs / steady, 1), "tokens_per_s": round(tokens / steady, 1)}


def torch_logits_fn(export_dir: Path) -> Any:
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(str(export_dir), dtype=torch.float32,
                                                          attn_implementation="eager").eval()

    def logits_fn(tokens: Any, **_: Any) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(np.asarray(tokens, dtype=np.int64))).logits.numpy()

    return logits_fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=700, help="RuBLiMP pairs to score (2 sequences each)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    args = parser.parse_args()

    import jax
    from flax import nnx

    from eval.hf_export import write_export
    from model.llama.model import Decoder

    sp = train_tokenizer(args.vocab)
    cfg = LlamaConfig(d_model=args.d_model, n_layers=args.layers, n_heads=4, n_kv_heads=2,
                      d_ff=int(args.d_model * 2.75), max_seq_len=128)
    with nnx.use_eager_sharding(False):
        model = nnx.jit(lambda: Decoder(cfg, sp.get_piece_size(), nnx.Rngs(0)))()
    requests = build_requests(sp, args.pairs)
    pairs = len(requests) // 2
    tokens = sum(len(r.context) + len(r.continuation) - 1 for r in requests)

    ours = Scorer(model_logits_fn(model), requests, args.batch_size, cfg.max_seq_len)
    result: dict[str, Any] = {
        "benchmark": "rublimp scoring, examples (minimal pairs) per second", "pairs": pairs, "tokens": tokens,
        "batch_size": args.batch_size, "model": {"d_model": cfg.d_model, "n_layers": cfg.n_layers,
                                                 "vocab": sp.get_piece_size(), "max_len": cfg.max_seq_len},
        "cpu_count": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2), "jax": jax.__version__,
        "rounds": args.rounds,
    }
    try:
        import torch
    except ImportError:
        result["ours"] = side_result(ours, interleaved_rounds({"ours": ours}, args.rounds)["ours"], pairs, tokens)
        result["transformers"] = "not installed: run with the `hf` extra (e.g. .venvs/hf/bin/python)"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            export_dir = write_export(model, cfg, sp.get_piece_size(), Path(tmp) / "hf")
            theirs = Scorer(torch_logits_fn(export_dir), requests, args.batch_size, cfg.max_seq_len)
            seconds = interleaved_rounds({"ours": ours, "transformers": theirs}, args.rounds)
        result["ours"] = side_result(ours, seconds["ours"], pairs, tokens)
        result["transformers"] = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                                  **side_result(theirs, seconds["transformers"], pairs, tokens)}
        # examples/s ours over theirs in each round = their seconds over ours
        result["ratio_ours_over_transformers"] = median_ratio(seconds["transformers"], seconds["ours"])
        result["max_abs_loglik_diff_nats"] = max(abs(a.logprob - b.logprob)
                                                 for a, b in zip(ours.scores, theirs.scores, strict=True))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
