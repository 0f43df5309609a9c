"""A miniature of the RuAdapt experiment through the recipes: adapt a foreign (English) base model to Russian.

1. The foreign base, "the checkpoint the user brings": recipes 01-04 pretrain a small decoder on English text
   (Debian's English documentation) with an English tokenizer, and recipe 05 exports it in Hugging Face format.
2. Four arms continue on Russian (the shared ruslit corpus) for the same number of train steps:
   ``keep`` (the base tokenizer, ``tokenizer.adopt_from``, ``model.vocab_adaptation=none``), ``mean`` and
   ``random`` (a Russian tokenizer with that ``model.vocab_adaptation``) and ``scratch`` (the Russian
   tokenizer, the same shape, no base). Each arm runs in segments and the arms take turns in rotating order
   (``interleave.interleaved_rounds``; recipe 04 resumes from its checkpoint when ``train.steps`` is raised),
   so a slow spell of the shared machine hits every arm.
3. Per arm: held-out Russian bits per byte (the eval code's validation-split bpb, logged by recipe 04's
   ``train.eval_every`` against the ledger's rubles; recipe 05 confirms the final one), chars per token and the
   share of Russian word occurrences of at most two tokens on the validation documents, and the rubles at which
   the arm first reaches the from-scratch arm's final bits per byte (linear interpolation between eval points).

Every recipe runs as a subprocess, as a user would run it; the configs are written by this script into the work
folder. Progress lines go to stderr, the JSON result to stdout (and ``--json``), a markdown table to ``--table``
and the plot to ``--plot``. A stage whose manifest is already in its folder is not rerun (a second call of the
same command continues an interrupted bench).

    python bench/bench_vocab_adaptation.py --work /tmp/ruadapt --base-steps 300 --arm-steps 280
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from interleave import interleaved_rounds

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARMS = ("keep", "mean", "random", "scratch")
ARM_LABELS = {"keep": "base tokenizer kept (none)", "mean": "Russian tokenizer, mean init",
              "random": "Russian tokenizer, random init", "scratch": "from scratch, Russian tokenizer"}
ENGLISH_PACKAGES = ["debian-reference-en", "manpages", "debian-faq"]
RUSLIT_AUTHORS = ["Tolstoy", "Dostoevsky", "Gogol", "Pushkin", "Lermontov", "Gorky", "Herzen", "Blok", "Bryusov"]
CYRILLIC_WORD = re.compile(r"[А-Яа-яЁё]+")
STARTED = time.monotonic()


def progress(message: str) -> None:
    print(f"[vocab-bench {time.strftime('%H:%M:%S')} +{time.monotonic() - STARTED:5.0f}s] {message}",
          file=sys.stderr, flush=True)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------- configs and recipes

def shape_section(args: argparse.Namespace) -> dict[str, Any]:
    return {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
            "n_kv_heads": args.n_kv_heads, "d_ff": args.d_ff, "max_seq_len": args.seq_len}


def common_sections(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """What every run shares: run root, shards, training hyperparameters, eval, prices, W&B offline."""
    return {
        "experiment": {"name": name, "run_root": str(args.work / "runs"), "seed": args.seed},
        "shards": {"packing": "concat", "validation_percent": args.validation_percent, "records_per_shard": 4096},
        "train": {"batch_size": args.batch_size, "learning_rate": args.learning_rate, "warmup_steps": args.warmup,
                  # constant after warmup: a run cut into segments follows the same schedule as one run
                  "schedule": "constant", "checkpoint_every": 1000, "keep_checkpoints": 2,
                  "log_every": 10, "eval_every": args.eval_every},
        "eval": {"tasks": [], "train_tasks": [], "missing_tasks": "skip",
                 # the whole validation split, the same documents for every tokenizer
                 "train_validation_batches": 100_000, "max_validation_batches": None},
        "cost": {"accelerator": "cpu-e2-standard-2", "pricing": "on-demand", "chips": 1,
                 "usd_rub_rate": 101.6797, "usd_rub_date": "2025-01-01", "max_rate_age_days": 100_000},
        "wandb": {"project": "ru-pretrain-vocab-bench", "mode": "offline"},
    }


def write_config(args: argparse.Namespace, name: str, sections: dict[str, Any]) -> Path:
    cfg = common_sections(args, name)
    for key, values in sections.items():
        cfg.setdefault(key, {}).update(values)
    path = args.work / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def recipe_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("WANDB_API_KEY", None)
    return env


class RecipeFailed(RuntimeError):
    pass


def run_recipe(args: argparse.Namespace, script: str, config: Path, *overrides: str) -> float:
    """Run one recipe as a subprocess (its output to the work folder's logs); its wall seconds."""
    cmd = [sys.executable, str(REPO / "recipes" / script), "--config", str(config), *overrides]
    log_path = args.work / "logs" / f"{config.stem}.{script.split('_')[0]}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("a", encoding="utf-8") as log_file:
        log_file.write(f"\n$ {' '.join(cmd)}\n")
        log_file.flush()
        proc = subprocess.run(cmd, cwd=REPO, env=recipe_env(), stdout=log_file, stderr=subprocess.STDOUT,
                              check=False)
    if proc.returncode != 0:
        lines = [x for x in log_path.read_text(encoding="utf-8").splitlines() if x.strip()]
        raise RecipeFailed(f"{' '.join(cmd)} exited {proc.returncode}: {lines[-1] if lines else ''} "
                           f"(log: {log_path})")
    return time.monotonic() - started


def run_folder(args: argparse.Namespace, name: str) -> Path:
    return args.work / "runs" / name


def run_stage(args: argparse.Namespace, script: str, config: Path, folder: str, *overrides: str) -> None:
    """Run the recipe unless its stage folder already has a manifest (written last, so it is finished)."""
    if (run_folder(args, config.stem) / folder / "manifest.json").is_file():
        progress(f"{config.stem}: {folder}/ already done, kept")
        return
    seconds = run_recipe(args, script, config, *overrides)
    progress(f"{config.stem}: {script} done in {seconds:.0f} s")


def copy_stage(args: argparse.Namespace, source: str, target: str, folder: str) -> None:
    """Give an arm the same stage output as another (same corpus, tokenizer or shards: built once)."""
    dst = run_folder(args, target) / folder
    if (dst / "manifest.json").is_file():
        return
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(run_folder(args, source) / folder, dst)


# ---------------------------------------------------------------- the foreign base

def build_base(args: argparse.Namespace) -> Path:
    """The English base model exported as a Hugging Face folder; its path."""
    config = write_config(args, "en-base", {
        "corpus": {"sources": [{"kind": "debian", "name": "debian-en", "packages": ENGLISH_PACKAGES,
                                "cache_dir": str(args.work / "debian-cache")}],
                   "min_cyrillic_share": 0.0, "langid": {"target": "en"},
                   "quality": {"min_stop_words": 0}},  # the stop-word list is Russian
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": "bpe", "baseline_hf_bpe": False},
        "model": shape_section(args),
        "train": {"steps": args.base_steps, "eval_every": 0, "checkpoint_every": args.base_steps},
        "eval": {"max_validation_batches": 20, "export_hf": True},
    })
    run_stage(args, "01_build_corpus.py", config, "corpus")
    run_stage(args, "02_train_tokenizer.py", config, "tokenizer")
    run_stage(args, "03_shard.py", config, "shards")
    base = run_folder(args, "en-base")
    latest = base / "eval" / f"step_{args.base_steps:07d}.json"
    if not latest.is_file():
        progress(f"en-base: pretraining {args.base_steps} steps on English")
        seconds = run_recipe(args, "04_pretrain.py", config)
        progress(f"en-base: 04_pretrain.py done in {seconds:.0f} s")
        run_recipe(args, "05_evaluate.py", config)
    results = json.loads(latest.read_text(encoding="utf-8"))
    progress(f"en-base: English validation {results['validation']['bits_per_byte']:.3f} bits/byte, "
             f"exported to {results['hf_export']}")
    return Path(results["hf_export"])


# ---------------------------------------------------------------- the Russian arms

def arm_sections(args: argparse.Namespace, arm: str, base_hf: Path) -> dict[str, Any]:
    authors = args.authors.split(",")
    paths = [f"{args.shared}/text/ruslit/prose/{author}/*.txt" for author in authors]
    sections: dict[str, Any] = {
        "corpus": {"sources": [{"kind": "files", "name": "ruslit", "paths": paths, "split_rule": "chunk",
                                "chunk_chars": 3000, "weight": args.ru_share}]},
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": "bpe", "baseline_hf_bpe": False},
        "train": {"embeddings_only_steps": args.embeddings_only_steps if arm != "scratch" else 0},
    }
    if arm == "keep":
        sections["tokenizer"]["adopt_from"] = str(base_hf)
    if arm == "scratch":
        sections["model"] = shape_section(args)
    else:
        sections["model"] = {"init_from": str(base_hf), "vocab_adaptation": "none" if arm == "keep" else arm,
                             "max_seq_len": args.seq_len}
    return sections


def prepare_arms(args: argparse.Namespace, base_hf: Path) -> dict[str, Path]:
    """Configs per arm; corpus built once, the Russian tokenizer and its shards once (the keep arm shards with
    the base's tokenizer)."""
    configs = {arm: write_config(args, f"ru-{arm}", arm_sections(args, arm, base_hf)) for arm in ARMS}
    run_stage(args, "01_build_corpus.py", configs["mean"], "corpus")
    for arm in ARMS:
        if arm != "mean":
            copy_stage(args, "ru-mean", f"ru-{arm}", "corpus")
    run_stage(args, "02_train_tokenizer.py", configs["mean"], "tokenizer")
    run_stage(args, "02_train_tokenizer.py", configs["keep"], "tokenizer")
    run_stage(args, "03_shard.py", configs["mean"], "shards")
    run_stage(args, "03_shard.py", configs["keep"], "shards")
    for arm in ("random", "scratch"):
        copy_stage(args, "ru-mean", f"ru-{arm}", "tokenizer")
        copy_stage(args, "ru-mean", f"ru-{arm}", "shards")
    return configs


def segment_runner(args: argparse.Namespace, arm: str, config: Path, bounds: Sequence[int]) -> Callable[[], float]:
    """A callable running the arm's next segment (recipe 04 with train.steps raised to the next bound)."""
    done = {"segments": 0}

    def run_next() -> float:
        index = done["segments"]
        steps = bounds[index]
        progress(f"{arm}: segment {index + 1}/{len(bounds)}, training to step {steps}")
        seconds = run_recipe(args, "04_pretrain.py", config, f"train.steps={steps}")
        done["segments"] += 1
        points = eval_points(args, arm)
        last = points[-1] if points else None
        progress(f"{arm}: step {steps} in {seconds:.0f} s" + (
            f", val {last['bpb']:.4f} bits/byte at {last['rub']:.4f} RUB" if last else ""))
        return seconds

    return run_next


def eval_points(args: argparse.Namespace, arm: str) -> list[dict[str, float]]:
    """(step, bits per byte, rubles) at each eval of recipe 04, from train_log.jsonl (last record per step).

    ``rub`` is the ledger's total so far, the evals included (booked before the record is logged);
    ``rub_excl_eval`` takes out the evals' own seconds at the run's rubles per hour, because an arm whose
    tokenizer cuts Russian into more tokens also pays more for every eval of the same text.
    """
    log_path = run_folder(args, f"ru-{arm}") / "train_log.jsonl"
    by_step: dict[int, dict[str, float]] = {}
    eval_seconds: dict[int, float] = {}
    if log_path.is_file():
        for line in log_path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if "eval/val_bpb" in record:
                step = int(record["train/step"])
                eval_seconds[step] = float(record["eval/seconds"])
                rub, hours = float(record["cost/rub_spent"]), float(record["cost/hours"])
                spent_on_evals = sum(eval_seconds.values()) / 3600 * (rub / hours)
                by_step[step] = {"step": step, "bpb": float(record["eval/val_bpb"]), "rub": rub,
                                 "rub_excl_eval": rub - spent_on_evals}
    return [by_step[s] for s in sorted(by_step)]


def ledger_rubles(args: argparse.Namespace, arm: str) -> dict[str, Any]:
    """The arm's ledger total, read back through the cost package."""
    from cost.ledger_pricing import summarize_ledger

    summary = summarize_ledger(run_folder(args, f"ru-{arm}") / "ledger")
    return {"rub": summary.rub_total, "hours": summary.hours, "sessions": summary.sessions,
            "rub_by_phase": dict(summary.rub_by_phase)}


# ---------------------------------------------------------------- tokenizer measures

def validation_texts(args: argparse.Namespace) -> list[str]:
    from data_prep.shards.layout import split_of
    from experiment.corpus_format import iter_documents

    corpus = run_folder(args, "ru-mean") / "corpus"
    return [doc["text"] for doc in iter_documents(corpus)
            if split_of(doc["id"], args.validation_percent) == "validation"]


def tokenizer_measures(args: argparse.Namespace, arm: str, texts: list[str]) -> dict[str, float]:
    """Chars per token on the validation documents; share of Cyrillic word occurrences of <= 2 tokens.

    A word's tokens: len(encode("а " + word)) - len(encode("а")), so it carries its leading space (or
    SentencePiece's ▁) as it does inside running text, for SentencePiece and byte-level BPE alike.
    """
    from tokenizer.loaded import load_run_tokenizer

    tok = load_run_tokenizer(run_folder(args, f"ru-{arm}") / "tokenizer")
    chars = sum(len(t) for t in texts)
    tokens = sum(len(ids) for ids in tok.encode_batch(texts))
    words = collections.Counter(w for t in texts for w in CYRILLIC_WORD.findall(t))
    prefix = len(tok.encode("а"))
    short = sum(count for word, count in words.items() if len(tok.encode("а " + word)) - prefix <= 2)
    return {"chars_per_token": chars / tokens, "words_le2_tokens": short / sum(words.values()),
            "validation_chars": chars, "validation_words": sum(words.values())}


# ---------------------------------------------------------------- results

def rubles_to_reach(points: Sequence[dict[str, float]], target: float) -> dict[str, Any]:
    """Rubles (and steps) at which bpb first reaches ``target``, interpolated linearly between eval points."""
    keys = ("rub", "rub_excl_eval", "step")
    previous = None
    for point in points:
        if point["bpb"] <= target:
            if previous is None:
                return {**{k: point[k] for k in keys}, "bound": "at or before the first eval"}
            share = (previous["bpb"] - target) / (previous["bpb"] - point["bpb"])
            return {**{k: previous[k] + share * (point[k] - previous[k]) for k in keys}, "bound": "interpolated"}
        previous = point
    return {**dict.fromkeys(keys), "bound": "not reached"}


def plot(points: dict[str, list[dict[str, float]]], target: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, xlabel in ((axes[0], "rub", "rubles spent (ledger, evals included)"),
                            (axes[1], "rub_excl_eval", "rubles spent, evals excluded")):
        for arm in ARMS:
            ax.plot([p[key] for p in points[arm]], [p["bpb"] for p in points[arm]], marker="o", ms=3,
                    label=ARM_LABELS[arm])
        ax.axhline(target, color="grey", ls=":", lw=1, label="from-scratch final")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out Russian bits per byte")
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def reach_cell(reach: dict[str, Any], key: str, scratch_rub: float) -> str:
    if reach[key] is None:
        return "not reached"
    at_most = "<= " if reach["bound"] != "interpolated" else ""  # reached by the first eval already
    return f"{at_most}{reach[key]:.3f} = {at_most}{reach[key] / scratch_rub:.2f}x"


def markdown_table(result: dict[str, Any]) -> str:
    arms = result["arms"]
    scratch_last = arms["scratch"]["points"][-1]
    lines = ["| arm | chars/token (ru) | ru words <= 2 tokens | bpb, first eval | bpb, final (recipe 05) | "
             "RUB at the end (excl. evals) | RUB to scratch's final bpb, x scratch's (ledger) | "
             "same, excl. evals |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in ARMS:
        a = arms[arm]
        last, reach = a["points"][-1], a["reach_scratch_final"]
        lines.append(f"| {ARM_LABELS[arm]} | {a['tokenizer']['chars_per_token']:.2f} | "
                     f"{a['tokenizer']['words_le2_tokens']:.1%} | {fmt(a['points'][0]['bpb'], 3)} | "
                     f"{fmt(a['final_bpb'], 3)} | {last['rub']:.3f} ({last['rub_excl_eval']:.3f}) | "
                     f"{reach_cell(reach, 'rub', scratch_last['rub'])} | "
                     f"{reach_cell(reach, 'rub_excl_eval', scratch_last['rub_excl_eval'])} |")
    steps = sorted({p["step"] for a in arms.values() for p in a["points"]})
    lines += ["", "| step | " + " | ".join(ARM_LABELS[arm] for arm in ARMS) + " |", "|---:|" + "---:|" * len(ARMS)]
    for step in steps:
        row = []
        for arm in ARMS:
            match = [p for p in arms[arm]["points"] if p["step"] == step]
            row.append(f"{match[0]['bpb']:.3f} @ {match[0]['rub']:.3f}" if match else "-")
        lines.append(f"| {step} | " + " | ".join(row) + " |")
    lines += ["", "(held-out bits per byte @ ledger rubles at that eval)"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/ru-vocab-bench"), help="run root, configs and logs")
    p.add_argument("--shared", default=os.environ.get("RU_SHARED_DATA", str(REPO.parent / "shared" / "data")))
    p.add_argument("--json", type=Path, default=None, help="also write the JSON result here")
    p.add_argument("--table", type=Path, default=None, help="write the markdown table here")
    p.add_argument("--plot", type=Path, default=REPO / "bench" / "results" / "vocab_adaptation.png")
    p.add_argument("--base-steps", type=int, default=300)
    p.add_argument("--arm-steps", type=int, default=280)
    p.add_argument("--segments", type=int, default=4, help="segments per arm, run in rotating order")
    p.add_argument("--eval-every", type=int, default=35)
    p.add_argument("--embeddings-only-steps", type=int, default=0, help="for the arms that start from the base")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=6)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-kv-heads", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=704)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-only", action="store_true", help="run nothing: report on the work folder's runs")
    p.add_argument("--validation-percent", type=float, default=2.0)
    p.add_argument("--ru-share", type=float, default=0.15,
                   help="share of the ruslit prose documents kept (a stable hash of each document)")
    p.add_argument("--authors", default=",".join(RUSLIT_AUTHORS), help="ruslit prose authors, comma-separated")
    args = p.parse_args(argv)
    if args.arm_steps % args.segments or (args.arm_steps // args.segments) % args.eval_every:
        p.error("--arm-steps must split into --segments equal segments, each a multiple of --eval-every")
    args.work = args.work.resolve()
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    try:
        if not args.report_only:
            base_hf = build_base(args)
            configs = prepare_arms(args, base_hf)
            segment = args.arm_steps // args.segments
            bounds = [segment * (i + 1) for i in range(args.segments)]
            seconds = interleaved_rounds({arm: segment_runner(args, arm, configs[arm], bounds) for arm in ARMS},
                                         args.segments)
            for arm in ARMS:  # the eval stage itself on each arm's last checkpoint
                run_recipe(args, "05_evaluate.py", configs[arm])
    except RecipeFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finals = {}
    for arm in ARMS:
        final = run_folder(args, f"ru-{arm}") / "eval" / f"step_{args.arm_steps:07d}.json"
        finals[arm] = json.loads(final.read_text(encoding="utf-8"))["validation"]["bits_per_byte"]
    base_hf = Path(json.loads((run_folder(args, "en-base") / "eval" / f"step_{args.base_steps:07d}.json")
                              .read_text(encoding="utf-8"))["hf_export"])
    texts = validation_texts(args)
    points = {arm: eval_points(args, arm) for arm in ARMS}
    target = finals["scratch"]
    arms: dict[str, Any] = {}
    for arm in ARMS:
        arms[arm] = {"label": ARM_LABELS[arm], "points": points[arm], "final_bpb": finals[arm],
                     "segment_seconds": seconds[arm], "ledger": ledger_rubles(args, arm),
                     "tokenizer": tokenizer_measures(args, arm, texts),
                     "reach_scratch_final": rubles_to_reach(points[arm], target)}
    mean_reach = arms["mean"]["reach_scratch_final"]["rub"]
    mean_reach_excl = arms["mean"]["reach_scratch_final"]["rub_excl_eval"]
    common = sorted({p["step"] for p in points["mean"]} & {p["step"] for p in points["random"]})
    by_step = {arm: {p["step"]: p["bpb"] for p in points[arm]} for arm in ("mean", "random")}
    result = {
        "bench": "vocab_adaptation", "cpu": cpu_model(), "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "base_hf": str(base_hf), "scratch_final_bpb": target, "arms": arms,
        "goals": {
            "mean_reaches_scratch_final_with_half_the_rubles": (
                mean_reach is not None and mean_reach <= 0.5 * arms["scratch"]["points"][-1]["rub"]),
            "mean_reaches_scratch_final_with_half_the_rubles_excl_evals": (
                mean_reach_excl is not None
                and mean_reach_excl <= 0.5 * arms["scratch"]["points"][-1]["rub_excl_eval"]),
            "mean_beats_random_at_every_logged_step": all(by_step["mean"][s] < by_step["random"][s] for s in common),
            "steps_compared": common,
        },
        "wall_seconds": round(time.monotonic() - STARTED, 1),
    }
    plot(points, target, args.plot, f"English base -> Russian, {args.arm_steps} steps per arm, "
                                     f"{cpu_model()}, one seed")
    table = markdown_table(result)
    if args.table:
        args.table.write_text(table + "\n", encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2, ensure_ascii=False))
    progress("done\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
