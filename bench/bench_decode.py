"""Decode speed: our KV-cache generation (model/generate.py) against Transformers' ``generate`` with a
static cache, same weights, same prompts, greedy, on this CPU.

    python bench/bench_decode.py                     # demo shape, batch 1 and 8, 64 new tokens, 5 rounds
    python bench/bench_decode.py --rounds 7 --torch-python .venvs/hf/bin/python --out results.json
    python bench/bench_decode.py --no-torch-compile  # leave out the torch.compile'd peer

The model: a Llama at the demo's shape (recipes/configs/demo.yaml's ``model:``; vocab 4000) in fp32, built
by our family (``get_family("llama").init``) and exported by its HF adapter to a temporary folder
(model.safetensors + config.json), which the Transformers side loads with
``AutoModelForCausalLM.from_pretrained``: both sides run the same weights.

Sides, each in its own process (``--torch-python`` for the two PyTorch ones), driven in interleaved rounds
(``bench/interleave.py``), one ``generate`` call per side per round and batch size:

- ``ours``: ``model.generate.generate(model, prompts, N)`` (greedy; one jitted prefill, one jitted step).
- ``hf_static``: ``model.generate(input_ids, attention_mask, max_new_tokens=N, do_sample=False,
  cache_implementation="static")``, eager: Transformers 5 compiles a static-cache decode by itself only on
  cuda/xpu/tpu/neuron devices (``_valid_auto_compile_criteria``), so on a CPU this is eager PyTorch.
- ``hf_static_compiled``: the same call with ``compile_config=CompileConfig()`` whose ``_compile_all_devices``
  is set, i.e. Transformers' own auto-compile of the decode forward (``torch.compile``, inductor, its default
  mode) forced on the CPU.

PyTorch runs on one intra-op thread by default (``--torch-threads 1``): on this 2-vCPU VM shared with other
jobs (load average 4-6), Transformers' generate of this tiny model with two threads ran 5-10x slower than
with one (OpenMP workers waiting for a descheduled sibling: batch 8, 64 tokens, static cache, 58 against 670
tokens/s per whole call, measured alone), so one thread is the peer's best setting here. JAX keeps its
defaults.

Decode tokens/s counts the steps after the prefill only: ours from ``Generated.decode_seconds`` (N - 1 steps,
a step that compiled left out); Transformers' from a logits processor that stamps the clock after each forward
(first stamp: after the prefill; last: after the last decode step, N - 1 steps apart). The first call of each
batch size on each side (compiles, warm-up) is not timed. Every call's greedy tokens are compared with ours:
a difference is a failure (exit status 1) unless ``--allow-mismatch``.

The JSON (stdout, and ``--out``, default bench/results/decode_cpu_<date>.json) records the CPU (lscpu's
model name, the vector/matrix flags), load average before and after, the jax/torch/transformers versions and
the command. bench/bench_gpu_step.py reuses ``OursDecoder``/``TheirsDecoder`` for the H200 row.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported as bench.bench_decode (tests)
from interleave import interleaved_rounds, median_ratio  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEMO_SHAPE = dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=704, max_seq_len=128)


def compare_tokens(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Whether two sides' greedy tokens are equal, row for row; the first difference (row, position) if not."""
    for row, (a, b) in enumerate(zip(reference, other, strict=False)):
        if list(a) != list(b):
            position = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return {"equal": False, "rows": len(reference), "first_difference": {"row": row, "position": position}}
    if len(reference) != len(other):
        return {"equal": False, "rows": len(reference), "first_difference": {"row": min(len(reference), len(other)),
                                                                              "position": 0}}
    return {"equal": True, "rows": len(reference), "first_difference": None}


def make_prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` random ids in [1, vocab) (id 0 is our pad id), the same on every side."""
    import numpy as np

    return np.random.default_rng(seed).integers(1, vocab, (batch, length)).tolist()


class OursDecoder:
    """``model.generate.generate`` on one model: ``run(prompts)`` -> decode figures and the tokens."""

    def __init__(self, model: Any, new_tokens: int) -> None:
        self.model, self.new_tokens = model, new_tokens

    def run(self, prompts: list[list[int]]) -> dict[str, Any]:
        from model.generate import generate

        started = time.perf_counter()
        out = generate(self.model, prompts, self.new_tokens)
        return {"decode_tokens_per_s": out.decode_tokens_per_second, "decode_s": out.decode_seconds,
                "decode_steps": out.decode_steps, "prefill_s": out.prefill_seconds, "compiled": out.compiled,
                "call_s": time.perf_counter() - started, "tokens": out.tokens}


class TheirsDecoder:
    """Transformers' ``generate`` with a static cache, eager or with its own auto-compile forced on."""

    def __init__(self, model: Any, new_tokens: int, compiled: bool) -> None:
        from transformers import CompileConfig

        self.model, self.new_tokens, self.compiled = model, new_tokens, compiled
        self.device = next(model.parameters()).device
        if compiled:
            self.compile_config = CompileConfig()
            self.compile_config._compile_all_devices = True  # CPU included (off by default: cuda/xpu/tpu/neuron only)
        else:
            self.compile_config = None

    def run(self, prompts: list[list[int]]) -> dict[str, Any]:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        cuda = self.device.type == "cuda"

        class Clock(LogitsProcessor):
            """Stamps the time after each forward (the processor runs on its logits)."""

            def __init__(self) -> None:
                self.marks: list[Any] = []

            def __call__(self, input_ids: Any, scores: Any) -> Any:
                if cuda:
                    event = torch.cuda.Event(enable_timing=True)
                    event.record()
                    self.marks.append(event)
                else:
                    self.marks.append(time.perf_counter())
                return scores

        clock = Clock()
        ids = torch.tensor(prompts, dtype=torch.int64, device=self.device)
        extra = ({"compile_config": self.compile_config} if self.compiled
                 else {"disable_compile": True})  # eager also where Transformers would compile by itself (cuda)
        started = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.new_tokens,
                                      min_new_tokens=self.new_tokens, do_sample=False,
                                      cache_implementation="static", logits_processor=LogitsProcessorList([clock]),
                                      pad_token_id=0, return_dict_in_generate=True, **extra)
        if cuda:
            torch.cuda.synchronize()
            decode_s = clock.marks[0].elapsed_time(clock.marks[-1]) / 1000
        else:
            decode_s = clock.marks[-1] - clock.marks[0]
        steps = len(clock.marks) - 1
        cache = getattr(out, "cache", None)  # Transformers 5 (``past_key_values`` is its deprecated name)
        return {"decode_tokens_per_s": steps * len(prompts) / decode_s if decode_s > 0 else 0.0,
                "decode_s": decode_s, "decode_steps": steps, "call_s": time.perf_counter() - started,
                "cache": type(cache).__name__, "tokens": out.sequences[:, ids.shape[1]:].tolist()}


def cpu_record() -> dict[str, Any]:
    """lscpu's model name and the vector/matrix flags (bench_train_step.cpu_facts), logical CPUs."""
    from bench_train_step import cpu_facts

    facts = cpu_facts()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        facts["lscpu_model_name"] = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                                          if line.startswith("Model name")), None)
    except (OSError, subprocess.SubprocessError):
        facts["lscpu_model_name"] = None
    return facts


def ours_worker(args: argparse.Namespace) -> tuple[dict[str, Any], OursDecoder]:
    """Builds the model (our family, fp32), exports it to ``args.folder`` for the peers, returns the decoder."""
    import jax
    from safetensors.numpy import save_file

    from model.llama.config import LlamaConfig
    from model.registry import get_family

    cfg = LlamaConfig(**DEMO_SHAPE)
    llama = get_family("llama")
    model = llama.init(cfg, args.vocab, seed=args.seed)
    state_dict, config = llama.hf_adapter.export(model, cfg, args.vocab)
    folder = Path(args.folder)
    save_file(state_dict, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    facts = {"framework": f"jax {jax.__version__}", "backend": jax.default_backend(),
             "scan_layers": cfg.scan_layers, "n_params": int(sum(v.size for v in state_dict.values()))}
    return facts, OursDecoder(model, args.new_tokens)


def theirs_worker(args: argparse.Namespace, compiled: bool) -> tuple[dict[str, Any], TheirsDecoder]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.torch_threads or os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32).eval()
    facts = {"framework": f"torch {torch.__version__}, transformers {transformers.__version__}",
             "torch_threads": torch.get_num_threads(), "attn_implementation": model.config._attn_implementation,
             "compile": "CompileConfig() with _compile_all_devices (inductor)" if compiled else "eager"}
    return facts, TheirsDecoder(model, args.new_tokens, compiled)


def serve(args: argparse.Namespace) -> None:
    """Worker loop: build, one untimed call per batch size (compile, warm-up), then ``RUN b`` until ``DONE``."""
    facts, decoder = (ours_worker(args) if args.worker == "ours"
                      else theirs_worker(args, args.worker == "hf_static_compiled"))
    batches = [int(b) for b in args.batches.split(",")]
    prompts = make_prompts(args.vocab, max(batches), args.prompt_len, args.seed)
    facts["first_call_s"] = {}
    for batch in batches:
        first = decoder.run(prompts[:batch])
        facts["first_call_s"][str(batch)] = round(first["call_s"], 3)
        facts.setdefault("cache", first.get("cache"))
    print("READY " + json.dumps(facts), flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "RUN":
            print(json.dumps(decoder.run(prompts[:int(command[1])])), flush=True)
        else:
            return


class Worker:
    """A side in its own process, driven over stdin/stdout (as bench_train_step.py's workers are)."""

    def __init__(self, python: str, kind: str, argv: list[str]) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.kind = kind
        self.proc = subprocess.Popen([python, __file__, "--worker", kind, *argv], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.facts = json.loads(self._line().removeprefix("READY "))

    def _line(self) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(("READY ", "{")):
                return line
        raise SystemExit(f"{self.kind} worker failed:\n{self.proc.stderr.read()[-3000:] if self.proc.stderr else ''}")

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("DONE\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def summarize(batch: int, runs: dict[str, list[dict[str, Any]]], reference: str = "ours") -> dict[str, Any]:
    """One batch size's row: each side's median/range of decode tokens/s, ratios ours/peer, token equality."""
    row: dict[str, Any] = {"batch": batch, "sides": {}, "tokens_equal": {}}
    for name, calls in runs.items():
        rates = [c["decode_tokens_per_s"] for c in calls]
        row["sides"][name] = {"decode_tokens_per_s_median": round(statistics.median(rates), 1),
                              "min": round(min(rates), 1), "max": round(max(rates), 1),
                              "rounds": [round(r, 1) for r in rates], "decode_steps": calls[0]["decode_steps"]}
    for name, calls in runs.items():
        if name == reference:
            continue
        row[f"ratio_{reference}_over_{name}"] = median_ratio([c["decode_tokens_per_s"] for c in runs[reference]],
                                                             [c["decode_tokens_per_s"] for c in calls])
        checks = [compare_tokens(mine["tokens"], theirs["tokens"]) for mine, theirs in zip(runs[reference], calls,
                                                                                            strict=True)]
        row["tokens_equal"][name] = next((c for c in checks if not c["equal"]), checks[0])
    return row


def mismatches(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The (batch, peer) pairs whose greedy tokens differed from ours in any round: the bench then fails."""
    return [f"batch {row['batch']}: {name}" for row in rows for name, check in row["tokens_equal"].items()
            if not check["equal"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["ours", "hf_static", "hf_static_compiled"])
    parser.add_argument("--folder", help="worker: the exported model folder")
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the sides alternate, medians are reported")
    parser.add_argument("--seed", type=int, default=0, help="the model's init and the prompts")
    parser.add_argument("--torch-python", default=os.environ.get("RU_TORCH_PYTHON", ".venvs/hf/bin/python"))
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="PyTorch intra-op threads (0: all CPUs); see the module docstring for why 1")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="leave out the compiled static-cache peer")
    parser.add_argument("--allow-mismatch", action="store_true", help="record differing tokens without failing")
    parser.add_argument("--out", type=Path, help="default: bench/results/decode_cpu_<date>.json")
    args = parser.parse_args()
    if args.worker:
        serve(args)
        return

    date = time.strftime("%Y-%m-%d", time.gmtime())
    load_before = os.getloadavg()
    batches = [int(b) for b in args.batches.split(",")]
    shared = ["--vocab", str(args.vocab), "--prompt-len", str(args.prompt_len), "--batches", args.batches,
              "--new-tokens", str(args.new_tokens), "--seed", str(args.seed),
              "--torch-threads", str(args.torch_threads)]
    with tempfile.TemporaryDirectory(prefix="decode-bench-") as folder:
        argv = [*shared, "--folder", folder]
        workers = {"ours": Worker(sys.executable, "ours", argv)}  # writes the folder the peers load
        workers["hf_static"] = Worker(args.torch_python, "hf_static", argv)
        if args.torch_compile:
            workers["hf_static_compiled"] = Worker(args.torch_python, "hf_static_compiled", argv)
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        rows = []
        for batch in batches:
            runs = interleaved_rounds({name: (lambda w=worker, b=batch: w.ask(f"RUN {b}"))
                                       for name, worker in workers.items()}, args.rounds)
            rows.append(summarize(batch, runs))
        for worker in workers.values():
            worker.close()
    record = {
        "date": date, "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "cpu": cpu_record(), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "model": {**DEMO_SHAPE, "vocab": args.vocab, "dtype": "float32", "family": "llama",
                  "tie_word_embeddings": config.get("tie_word_embeddings")},
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "rounds": args.rounds,
        "sides": {name: worker.facts for name, worker in workers.items()}, "results": rows,
    }
    text = json.dumps(record, indent=2)
    print(text)
    out = args.out or REPO / "bench" / "results" / f"decode_cpu_{date}.json"
    out.write_text(text + "\n", encoding="utf-8")
    mismatched = mismatches(rows)
    if mismatched and not args.allow_mismatch:
        raise SystemExit(f"greedy tokens differ from ours: {', '.join(mismatched)}")


if __name__ == "__main__":
    main()
