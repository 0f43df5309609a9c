"""Vocabulary adaptation as teams meet it, through the recipes: a base that knows Russian through a tokenizer poor
at it, adapted to a Russian tokenizer, measured on authors no run trained on, over several seeds.

1. The base, "the checkpoint the user brings": recipes 01-04 pretrain a small decoder on English and Russian text
   (Debian's English documentation plus a share of the ruslit prose of the training authors) with a tokenizer
   trained on that mixture, English-centric as Llama's and Qwen's are (English is most of its text, so Russian
   gets few pieces); recipe 05 exports it in Hugging Face format.
2. Five arms continue on Russian prose of the training authors for the same number of train steps, once per seed:
   ``keep`` (the base tokenizer, ``tokenizer.adopt_from``, ``model.vocab_adaptation=none``), ``mean`` and
   ``random`` (a Russian tokenizer trained by recipe 02 on the arms' corpus, with that
   ``model.vocab_adaptation``), ``mean_warmup`` (``mean`` with ``train.embeddings_only_steps``) and ``scratch``
   (the Russian tokenizer, the same shape, no base). Each seed runs the arms in a rotated order, so a slow spell
   of the shared machine does not always hit the same arm.
3. Measured at every eval of recipe 04 (``train.eval_every``; ``eval.heldout_text_files`` are scored whole at
   each): bits per byte on two authors whose text no stage of any run saw (the held-out authors), pooled by
   their texts' bytes, against the ledger's rubles. Across seeds: each arm's mean with a 95% t-interval, and the
   paired differences between arms of the same seed with theirs; chars per token and the share of Russian word
   occurrences of at most two tokens on the held-out text; the steps and rubles at which an arm first reaches
   the from-scratch arm's final held-out bits per byte (its own seed's, interpolated between evals).

Every recipe runs as a subprocess, as a user would run it; the configs are written by this script into the work
folder. Progress lines go to stderr, the JSON result to stdout (and ``--json``), markdown tables to ``--table``
and the plot to ``--plot``. A stage whose manifest is in its folder, or an arm that logged its last eval, is not
rerun (a second call of the same command continues an interrupted bench).

    python bench/bench_vocab_adaptation.py --work /tmp/ruadapt
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from interleave import cpu_model  # noqa: E402  (this script's own folder is on sys.path)

ARMS = ("keep", "mean", "random", "mean_warmup", "scratch")
ARM_LABELS = {"keep": "base tokenizer kept (none)", "mean": "Russian tokenizer, mean init",
              "random": "Russian tokenizer, random init",
              "mean_warmup": "Russian tokenizer, mean init, embeddings-only warm-up",
              "scratch": "from scratch, Russian tokenizer"}
# (arm, reference): the paired differences reported, arm minus reference on the same seed
COMPARISONS = (("mean", "random"), ("mean", "scratch"), ("random", "scratch"), ("mean_warmup", "mean"),
               ("keep", "scratch"))
ENGLISH_PACKAGES = ["debian-reference-en", "manpages", "debian-faq"]
TRAIN_AUTHORS = ["Tolstoy", "Dostoevsky", "Gogol", "Pushkin", "Lermontov", "Gorky", "Blok"]
HELDOUT_AUTHORS = ["Herzen", "Bryusov"]
CYRILLIC_WORD = re.compile(r"[А-Яа-яЁё]+")
# Student's t, two-sided 95%, by degrees of freedom (any statistics table); beyond 10 the normal's 1.96 is close
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
STARTED = time.monotonic()


def progress(message: str) -> None:
    print(f"[vocab-bench {time.strftime('%H:%M:%S')} +{time.monotonic() - STARTED:5.0f}s] {message}",
          file=sys.stderr, flush=True)



# ---------------------------------------------------------------- configs and recipes

def shape_section(args: argparse.Namespace) -> dict[str, Any]:
    return {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
            "n_kv_heads": args.n_kv_heads, "d_ff": args.d_ff, "max_seq_len": args.seq_len}


def common_sections(args: argparse.Namespace, name: str, seed: int) -> dict[str, Any]:
    """What every run shares: run root, shards, training hyperparameters, eval, prices, W&B offline."""
    return {
        "experiment": {"name": name, "run_root": str(args.work / "runs"), "seed": seed},
        "shards": {"packing": "concat", "validation_percent": args.validation_percent, "records_per_shard": 4096},
        "train": {"batch_size": args.batch_size, "learning_rate": args.learning_rate, "warmup_steps": args.warmup,
                  "schedule": "constant", "checkpoint_every": 1000, "keep_checkpoints": 1,
                  "log_every": 10, "eval_every": args.eval_every},
        "eval": {"tasks": [], "train_tasks": [], "missing_tasks": "skip", "sample_max_new_tokens": 0,
                 "train_validation_batches": args.validation_batches,
                 "max_validation_batches": args.validation_batches},
        "cost": {"accelerator": "cpu-e2-standard-2", "pricing": "on-demand", "chips": 1,
                 "usd_rub_rate": 101.6797, "usd_rub_date": "2025-01-01", "max_rate_age_days": 100_000},
        "wandb": {"project": "ru-pretrain-vocab-bench", "mode": "offline"},
    }


def write_config(args: argparse.Namespace, name: str, sections: dict[str, Any], seed: int = 0) -> Path:
    cfg = common_sections(args, name, seed)
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
    """Give a run the same stage output as another (same corpus, tokenizer or shards: built once)."""
    dst = run_folder(args, target) / folder
    if (dst / "manifest.json").is_file():
        return
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(run_folder(args, source) / folder, dst)


def ruslit_source(args: argparse.Namespace, name: str, authors: Sequence[str], share: float) -> dict[str, Any]:
    paths = [f"{args.shared}/text/ruslit/prose/{author}/*.txt" for author in authors]
    return {"kind": "files", "name": name, "paths": paths, "split_rule": "chunk", "chunk_chars": 3000,
            "weight": share}


# ---------------------------------------------------------------- held-out authors

def write_heldout(args: argparse.Namespace) -> list[Path]:
    """One text per held-out author: ``--heldout-chunk`` characters from the middle of each of the author's works
    (by file name), until ``--heldout-chars``; cut at whitespace. No stage of any run reads these authors."""
    folder = args.work / "heldout"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for author in HELDOUT_AUTHORS:
        pieces, total = [], 0
        for work in sorted((Path(args.shared) / "text" / "ruslit" / "prose" / author).glob("*.txt")):
            text = " ".join(work.read_text(encoding="utf-8").split())
            if len(text) < 2 * args.heldout_chunk:
                continue
            middle = len(text) // 2
            start = text.find(" ", middle - args.heldout_chunk // 2) + 1
            end = text.rfind(" ", start, start + args.heldout_chunk)
            pieces.append(text[start:end])
            total += end - start
            if total >= args.heldout_chars:
                break
        if total < args.heldout_chars // 2:
            raise SystemExit(f"error: {author}'s works under {args.shared}/text/ruslit/prose give only {total} "
                             f"characters of held-out text (--heldout-chars {args.heldout_chars})")
        path = folder / f"{author}.txt"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n\n".join(pieces) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        paths.append(path)
    return paths


# ---------------------------------------------------------------- the base

def build_base(args: argparse.Namespace) -> Path:
    """The base model (English and Russian, an English-centric tokenizer) exported as a Hugging Face folder."""
    config = write_config(args, "base", {
        "corpus": {"sources": [{"kind": "debian", "name": "debian-en", "packages": ENGLISH_PACKAGES,
                                "cache_dir": str(args.work / "debian-cache")},
                               ruslit_source(args, "ruslit-base", TRAIN_AUTHORS, args.base_ru_share)],
                   # two languages: no language filter, and the stop-word check is Russian
                   "min_cyrillic_share": 0.0, "langid": {"enabled": False}, "quality": {"min_stop_words": 0}},
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": "bpe", "baseline_hf_bpe": False},
        "model": shape_section(args),
        "train": {"steps": args.base_steps, "eval_every": 0, "checkpoint_every": args.base_steps},
        "eval": {"export_hf": True},
    }, seed=args.seeds[0])
    run_stage(args, "01_build_corpus.py", config, "corpus")
    run_stage(args, "02_train_tokenizer.py", config, "tokenizer")
    run_stage(args, "03_shard.py", config, "shards")
    base = run_folder(args, "base")
    latest = base / "eval" / f"step_{args.base_steps:07d}.json"
    if not latest.is_file():
        progress(f"base: pretraining {args.base_steps} steps on English and Russian")
        seconds = run_recipe(args, "04_pretrain.py", config)
        progress(f"base: 04_pretrain.py done in {seconds:.0f} s")
        run_recipe(args, "05_evaluate.py", config)
    results = json.loads(latest.read_text(encoding="utf-8"))
    progress(f"base: validation (English and Russian) {results['validation']['bits_per_byte']:.3f} bits/byte, "
             f"exported to {results['hf_export']}")
    return Path(results["hf_export"])


# ---------------------------------------------------------------- the Russian arms

def run_name(arm: str, seed: int) -> str:
    return f"ru-{arm}-s{seed}"


def arm_sections(args: argparse.Namespace, arm: str, base_hf: Path, heldout: list[Path]) -> dict[str, Any]:
    sections: dict[str, Any] = {
        "corpus": {"sources": [ruslit_source(args, "ruslit", TRAIN_AUTHORS, args.ru_share)]},
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": "bpe", "baseline_hf_bpe": False},
        "train": {"embeddings_only_steps": args.embeddings_only_steps if arm == "mean_warmup" else 0},
        "eval": {"heldout_text_files": [str(p) for p in heldout]},
    }
    if arm == "keep":
        sections["tokenizer"]["adopt_from"] = str(base_hf)
    if arm == "scratch":
        sections["model"] = shape_section(args)
    else:
        adaptation = {"keep": "none", "mean_warmup": "mean"}.get(arm, arm)
        sections["model"] = {"init_from": str(base_hf), "vocab_adaptation": adaptation, "max_seq_len": args.seq_len}
    return sections


def prepare_arms(args: argparse.Namespace, base_hf: Path, heldout: list[Path]) -> dict[tuple[str, int], Path]:
    """Configs per arm and seed; the corpus built once, the Russian tokenizer and its shards once (the keep arm
    shards with the base's tokenizer), copied to the other runs."""
    configs = {(arm, seed): write_config(args, run_name(arm, seed), arm_sections(args, arm, base_hf, heldout), seed)
               for arm in ARMS for seed in args.seeds}
    first = args.seeds[0]
    russian, kept = run_name("mean", first), run_name("keep", first)
    run_stage(args, "01_build_corpus.py", configs["mean", first], "corpus")
    copy_stage(args, russian, kept, "corpus")
    run_stage(args, "02_train_tokenizer.py", configs["mean", first], "tokenizer")
    run_stage(args, "02_train_tokenizer.py", configs["keep", first], "tokenizer")
    run_stage(args, "03_shard.py", configs["mean", first], "shards")
    run_stage(args, "03_shard.py", configs["keep", first], "shards")
    for arm, seed in configs:
        source = kept if arm == "keep" else russian
        if run_name(arm, seed) != source:
            for folder in ("corpus", "tokenizer", "shards"):
                copy_stage(args, source, run_name(arm, seed), folder)
    return configs


def heldout_bpb(record: dict[str, Any], weights: dict[str, int]) -> float:
    """The held-out authors' bits per byte pooled: each text's bits per byte weighted by its bytes."""
    return sum(float(record[f"eval/heldout/{stem}/bpb"]) * n for stem, n in weights.items()) / sum(weights.values())


def eval_points(args: argparse.Namespace, name: str, weights: dict[str, int]) -> list[dict[str, float]]:
    """(step, held-out bpb, validation bpb, rubles) at each eval of recipe 04, from train_log.jsonl (the last
    record per step, read with the project's torn-tail policy).

    ``rub`` is the ledger's total so far, the evals included (booked before the record is logged);
    ``rub_excl_eval`` takes out the evals' own seconds at the run's rubles per hour, because an arm whose
    tokenizer cuts Russian into more tokens also pays more for every eval of the same text.
    """
    from experiment.jsonl import read_jsonl

    log_path = run_folder(args, name) / "train_log.jsonl"
    by_step: dict[int, dict[str, float]] = {}
    eval_seconds: dict[int, float] = {}
    for record in read_jsonl(log_path, torn_tail="ignore", missing_ok=True).values:
        if "eval/val_bpb" in record:
            step = int(record["train/step"])
            eval_seconds[step] = float(record["eval/seconds"])
            rub, hours = float(record["cost/rub_spent"]), float(record["cost/hours"])
            spent_on_evals = sum(eval_seconds.values()) / 3600 * (rub / hours)
            by_step[step] = {"step": step, "bpb": heldout_bpb(record, weights),
                             "val_bpb": float(record["eval/val_bpb"]),
                             **{stem: float(record[f"eval/heldout/{stem}/bpb"]) for stem in weights},
                             "rub": rub, "rub_excl_eval": rub - spent_on_evals}
    return [by_step[s] for s in sorted(by_step)]


def run_arms(args: argparse.Namespace, configs: dict[tuple[str, int], Path], weights: dict[str, int]) -> dict[str, Any]:
    """Each seed's arms in an order rotated by the seed's index; an arm that logged its last eval is kept."""
    seconds: dict[str, float] = {}
    for index, seed in enumerate(args.seeds):
        order = ARMS[index % len(ARMS):] + ARMS[:index % len(ARMS)]
        for arm in order:
            name = run_name(arm, seed)
            points = eval_points(args, name, weights)
            if points and points[-1]["step"] >= args.arm_steps:
                progress(f"{name}: already trained to step {args.arm_steps}, kept")
                continue
            progress(f"{name}: training {args.arm_steps} steps")
            seconds[name] = run_recipe(args, "04_pretrain.py", configs[arm, seed], f"train.steps={args.arm_steps}")
            last = eval_points(args, name, weights)[-1]
            progress(f"{name}: {seconds[name]:.0f} s, held-out {last['bpb']:.4f} bits/byte at {last['rub']:.4f} RUB")
    return seconds


def ledger_rubles(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """The run's ledger total, read back through the cost package."""
    from cost.ledger_pricing import summarize_ledger

    summary = summarize_ledger(run_folder(args, name) / "ledger")
    return {"rub": summary.rub_total, "hours": summary.hours, "sessions": summary.sessions,
            "rub_by_phase": dict(summary.rub_by_phase)}


# ---------------------------------------------------------------- tokenizer measures

def tokenizer_measures(args: argparse.Namespace, name: str, texts: list[str]) -> dict[str, float]:
    """Chars per token on the held-out texts; share of Cyrillic word occurrences of <= 2 tokens.

    A word's tokens: len(encode("а " + word)) - len(encode("а")), so it carries its leading space (or
    SentencePiece's ▁) as it does inside running text, for SentencePiece and byte-level BPE alike.
    """
    from tokenizer.loaded import load_run_tokenizer

    tok = load_run_tokenizer(run_folder(args, name) / "tokenizer")
    chars = sum(len(t) for t in texts)
    tokens = sum(len(ids) for ids in tok.encode_batch(texts))
    words = collections.Counter(w for t in texts for w in CYRILLIC_WORD.findall(t))
    prefix = len(tok.encode("а"))
    short = sum(count for word, count in words.items() if len(tok.encode("а " + word)) - prefix <= 2)
    return {"chars_per_token": chars / tokens, "words_le2_tokens": short / sum(words.values()),
            "heldout_chars": chars, "heldout_words": sum(words.values())}


# ---------------------------------------------------------------- statistics

def interval(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95% t-interval over seeds (a single value has no interval)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": None, "n": len(values), "values": list(values)}
    half = T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": len(values), "values": list(values)}


def reach(points: Sequence[dict[str, float]], target: float) -> dict[str, Any]:
    """Steps and rubles at which bpb first reaches ``target``, interpolated linearly between eval points."""
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


def summarize(points: dict[tuple[str, int], list[dict[str, float]]], seeds: Sequence[int]) -> dict[str, Any]:
    """Per arm and eval step: the mean over seeds with its interval; per comparison and step: the paired
    difference (arm minus reference on the same seed) with its interval and how many seeds it is below zero;
    per arm: steps and rubles to the scratch arm's final held-out bpb of the same seed, as a share of scratch's."""
    steps = sorted({p["step"] for run in points.values() for p in run})
    at = {key: {p["step"]: p for p in run} for key, run in points.items()}
    by_arm = {arm: {str(step): interval([at[arm, s][step]["bpb"] for s in seeds]) for step in steps
                    if all(step in at[arm, s] for s in seeds)} for arm in ARMS}
    paired = {}
    for arm, ref in COMPARISONS:
        rows = {}
        for step in steps:
            if all(step in at[arm, s] and step in at[ref, s] for s in seeds):
                diffs = [at[arm, s][step]["bpb"] - at[ref, s][step]["bpb"] for s in seeds]
                rows[str(step)] = {**interval(diffs), "seeds_below_zero": sum(d < 0 for d in diffs)}
        paired[f"{arm} - {ref}"] = rows
    to_scratch_final = {}
    for arm in ARMS:
        shares: dict[str, list[float | None]] = {"step": [], "rub": [], "rub_excl_eval": []}
        for s in seeds:
            scratch = points["scratch", s][-1]
            hit = reach(points[arm, s], scratch["bpb"])
            for key in shares:
                shares[key].append(None if hit[key] is None else hit[key] / scratch[key])
        to_scratch_final[arm] = shares
    return {"steps": steps, "heldout_bpb": by_arm, "paired": paired, "to_scratch_final": to_scratch_final}


# ---------------------------------------------------------------- report

def fmt_interval(summary: dict[str, Any], digits: int = 3, signed: bool = False) -> str:
    sign = "+" if signed else ""
    text = f"{summary['mean']:{sign}.{digits}f}"
    if summary["ci95"]:
        low, high = summary["ci95"]
        text += f" [{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"
    return text


def fmt_shares(shares: Sequence[float | None]) -> str:
    if any(x is None for x in shares):
        reached = sum(x is not None for x in shares)
        return f"not reached ({reached} of {len(shares)} seeds did)"
    return f"{statistics.fmean(shares):.2f}x ({min(shares):.2f}-{max(shares):.2f})"


def markdown_tables(result: dict[str, Any]) -> str:
    summary, arms = result["summary"], result["arms"]
    first, last = str(summary["steps"][0]), str(summary["steps"][-1])
    n = len(result["settings"]["seeds"])
    lines = [f"| arm | chars/token (held-out) | ru words <= 2 tokens | held-out bpb, step {first} | "
             f"held-out bpb, step {last} | steps to scratch's final bpb (x scratch's) | same, rubles excl. evals | "
             "RUB at the end (excl. evals) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in ARMS:
        a = arms[arm]
        rub = statistics.fmean(a["rub_end"])
        rub_excl = statistics.fmean(a["rub_end_excl_eval"])
        lines.append(f"| {ARM_LABELS[arm]} | {a['tokenizer']['chars_per_token']:.2f} | "
                     f"{a['tokenizer']['words_le2_tokens']:.1%} | {fmt_interval(summary['heldout_bpb'][arm][first])} | "
                     f"{fmt_interval(summary['heldout_bpb'][arm][last])} | "
                     f"{fmt_shares(summary['to_scratch_final'][arm]['step'])} | "
                     f"{fmt_shares(summary['to_scratch_final'][arm]['rub_excl_eval'])} | {rub:.3f} ({rub_excl:.3f}) |")
    lines += ["", f"(mean over {n} seeds [95% t-interval]; held-out: {', '.join(HELDOUT_AUTHORS)}, "
                  "pooled by bytes)", "",
              "| step | " + " | ".join(f"{arm} - {ref}" for arm, ref in COMPARISONS) + " |",
              "|---:|" + "---:|" * len(COMPARISONS)]
    for step in summary["steps"]:
        cells = []
        for arm, ref in COMPARISONS:
            row = summary["paired"][f"{arm} - {ref}"].get(str(step))
            cells.append(f"{fmt_interval(row, signed=True)} ({row['seeds_below_zero']}/{row['n']})" if row else "-")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += ["", "(held-out bits per byte, arm minus reference on the same seed: mean [95% t-interval] "
              "(seeds where the arm is lower / seeds))"]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for arm in ARMS:
        rows = summary["heldout_bpb"][arm]
        steps = [int(s) for s in rows]
        means = [rows[s]["mean"] for s in rows]
        line, = axes[0].plot(steps, means, marker="o", ms=3, label=ARM_LABELS[arm])
        if all(rows[s]["ci95"] for s in rows):
            axes[0].fill_between(steps, [rows[s]["ci95"][0] for s in rows], [rows[s]["ci95"][1] for s in rows],
                                 color=line.get_color(), alpha=0.15)
        runs = result["arms"][arm]["points"]
        rub = [statistics.fmean(run[i]["rub_excl_eval"] for run in runs.values()) for i in range(len(steps))]
        axes[1].plot(rub, means, marker="o", ms=3, color=line.get_color())
    axes[0].set_xlabel("train step (band: 95% t-interval over seeds)")
    axes[1].set_xlabel("rubles spent, evals excluded (mean over seeds)")
    axes[0].set_ylabel("held-out authors' bits per byte")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/ru-vocab-bench"), help="run root, configs and logs")
    p.add_argument("--shared", default=os.environ.get("RU_SHARED_DATA", str(REPO.parent / "shared" / "data")))
    p.add_argument("--json", type=Path, default=None, help="also write the JSON result here")
    p.add_argument("--table", type=Path, default=None, help="write the markdown tables here")
    p.add_argument("--plot", type=Path, default=REPO / "bench" / "results" / "vocab_adaptation.png")
    p.add_argument("--seeds", default="0,1,2", help="experiment.seed of each arm's runs, comma-separated")
    p.add_argument("--base-steps", type=int, default=400)
    p.add_argument("--base-ru-share", type=float, default=0.03,
                   help="share of the training authors' documents in the base's corpus (beside the English)")
    p.add_argument("--arm-steps", type=int, default=210)
    p.add_argument("--eval-every", type=int, default=35)
    p.add_argument("--embeddings-only-steps", type=int, default=35, help="the mean_warmup arm's warm-up")
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
    p.add_argument("--validation-percent", type=float, default=2.0)
    p.add_argument("--validation-batches", type=int, default=10,
                   help="batches of the training authors' validation split scored at each eval")
    p.add_argument("--ru-share", type=float, default=0.15,
                   help="share of the training authors' documents in the arms' corpus (a stable hash of each)")
    p.add_argument("--heldout-chars", type=int, default=40_000, help="characters of held-out text per author")
    p.add_argument("--heldout-chunk", type=int, default=2_000, help="characters taken from each held-out work")
    p.add_argument("--report-only", action="store_true", help="run nothing: report on the work folder's runs")
    args = p.parse_args(argv)
    args.seeds = [int(x) for x in args.seeds.split(",")]
    if args.arm_steps % args.eval_every:
        p.error("--arm-steps must be a multiple of --eval-every")
    if args.embeddings_only_steps >= args.arm_steps:
        p.error("--embeddings-only-steps must be below --arm-steps")
    args.work = args.work.resolve()
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    heldout = write_heldout(args)
    weights = {p.stem: len(p.read_bytes()) for p in heldout}
    seconds: dict[str, float] = {}
    try:
        base_hf = build_base(args)
        configs = prepare_arms(args, base_hf, heldout)
        if not args.report_only:
            seconds = run_arms(args, configs, weights)
    except RecipeFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    texts = [p.read_text(encoding="utf-8") for p in heldout]
    points = {(arm, s): eval_points(args, run_name(arm, s), weights) for arm in ARMS for s in args.seeds}
    unfinished = [run_name(*key) for key, run in points.items() if not run or run[-1]["step"] < args.arm_steps]
    if unfinished:
        print(f"error: not trained to step {args.arm_steps}: {', '.join(unfinished)} (run without --report-only)",
              file=sys.stderr)
        return 1
    arms: dict[str, Any] = {}
    for arm in ARMS:
        names = {s: run_name(arm, s) for s in args.seeds}
        arms[arm] = {"label": ARM_LABELS[arm],
                     "points": {str(s): points[arm, s] for s in args.seeds},
                     "rub_end": [points[arm, s][-1]["rub"] for s in args.seeds],
                     "rub_end_excl_eval": [points[arm, s][-1]["rub_excl_eval"] for s in args.seeds],
                     "train_seconds": {str(s): seconds.get(names[s]) for s in args.seeds},
                     "ledger": {str(s): ledger_rubles(args, names[s]) for s in args.seeds},
                     "tokenizer": tokenizer_measures(args, names[args.seeds[0]], texts)}
    base_tokenizer = tokenizer_measures(args, "base", texts)
    result = {
        "bench": "vocab_adaptation", "cpu": cpu_model(), "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "base_hf": str(base_hf), "base_tokenizer_on_heldout": base_tokenizer,
        "heldout": {"authors": HELDOUT_AUTHORS, "bytes": weights},
        "train_authors": TRAIN_AUTHORS, "arms": arms, "summary": summarize(points, args.seeds),
        "wall_seconds": round(time.monotonic() - STARTED, 1),
    }
    plot(result, args.plot, f"bilingual base (English-centric tokenizer) -> Russian tokenizer, {args.arm_steps} "
                            f"steps per arm, {len(args.seeds)} seeds, held-out {' and '.join(HELDOUT_AUTHORS)}")
    tables = markdown_tables(result)
    if args.table:
        args.table.write_text(tables + "\n", encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2, ensure_ascii=False))
    progress("done\n" + tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
