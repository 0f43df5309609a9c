"""Recipe 05: evaluate a checkpoint; also the quick evaluation the trainer runs every N steps.

``evaluate(cfg, run_folder, wandb_run)`` loads a checkpoint (the latest by default) and its
tokenizer, measures bits per byte and perplexity on the validation shards and any held-out text
files, scores the configured tasks, and writes ``eval/step_NNNNNNN.json`` + ``.md`` and the
manifest (last). W&B gets the summary, a results table and the eval files as an artifact.

``evaluate_model(model, cfg, run_folder, step)`` is the trainer's entry: the configured subset,
a flat dict of metrics back, nothing written.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data_prep.shards.loader import mixture_sets
from eval import bpb, harness, passkey
from eval.decontam_status import log_decontamination
from eval.generative import GenerateTexts, GenTaskData, evaluate_generative, load_generative
from eval.harness import PairEncoder, TaskData, headline_metric, one_answer_warning
from eval.loaders import SourceUnavailable
from eval.mera import Predictors, SampleTexts
from eval.mera_scores import MeraLocalData, evaluate_mera_local, load_mera_local
from eval.report import render_markdown, results_rows
from eval.scoring import LogitsFn, model_logits_fn
from eval.tasks import GENERATIVE_TASKS, MERA_PREFIX, PASSKEY, check_task_names, get_task
from experiment.config import redact
from experiment.errors import ConfigError, DataError, RecipeError, WriteError
from experiment.files import atomic_write_json, atomic_write_text, write_errno, write_error
from experiment.links import resolved
from experiment.manifest import invalidate
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.eval import EvalConfig
from experiment.stages import EVAL, EXPORT, SHARDS
from experiment.storage import RunPath, location
from tokenizer.loaded import RunTokenizer, load_run_tokenizer
from tracking.artifacts import add_files

log = logging.getLogger("eval")


_TASK_CACHE: dict[tuple[Any, ...], TaskData | GenTaskData | MeraLocalData] = {}
_SKIPPED_CACHE: dict[tuple[Any, ...], str] = {}
_PASSKEY_CACHE: dict[tuple[Any, ...], tuple[list[passkey.PasskeyItem], str]] = {}


def load_tasks(names: Sequence[str], eval_cfg: EvalConfig, max_items: int | None,
               skipped: dict[str, str] | None = None) -> list[TaskData | GenTaskData | MeraLocalData]:
    """Load (and, for repeated eval during training, remember) the items of each task.

    With ``eval.missing_tasks: skip`` a task whose files are absent is left out with a warning and
    its reason goes into ``skipped``; by default it is an error.
    """
    # ${RU_SHARED_DATA} and other variables were expanded once, by the config loader
    bench_dir, rublimp_dir, task_files = eval_cfg.bench_dir, eval_cfg.rublimp_dir, eval_cfg.task_files
    loaded = []
    for name in names:
        key = (name, bench_dir, rublimp_dir, tuple(sorted(task_files.items())),
               tuple(sorted(eval_cfg.task_schemas.items())), max_items, eval_cfg.seed, eval_cfg.balance_labels,
               eval_cfg.mera_dir, eval_cfg.mera_fewshot)
        if key in _SKIPPED_CACHE and eval_cfg.missing_tasks == "skip" and skipped is not None:
            skipped[name] = _SKIPPED_CACHE[key]  # eval during training: do not retry an unreachable hub every time
            continue
        if key not in _TASK_CACHE:
            try:
                if name.startswith(MERA_PREFIX):
                    _TASK_CACHE[key] = load_mera_local(name.removeprefix(MERA_PREFIX), bench_dir=bench_dir,
                                                       mera_dir=eval_cfg.mera_dir, task_files=task_files,
                                                       mode=eval_cfg.mera_fewshot, max_items=max_items)
                elif name in GENERATIVE_TASKS:
                    _TASK_CACHE[key] = load_generative(GENERATIVE_TASKS[name], bench_dir=bench_dir,
                                                       task_files=task_files, max_items=max_items, seed=eval_cfg.seed)
                else:
                    _TASK_CACHE[key] = harness.load_task(get_task(name), bench_dir=bench_dir, rublimp_dir=rublimp_dir,
                                                         task_files=task_files, task_schemas=eval_cfg.task_schemas,
                                                         max_items=max_items,
                                                         seed=eval_cfg.seed, balance=eval_cfg.balance_labels)
            except SourceUnavailable as exc:
                if eval_cfg.missing_tasks != "skip" or skipped is None:
                    raise
                log.warning("skipping %s", exc)
                skipped[name] = _SKIPPED_CACHE[key] = str(exc)
                continue
        loaded.append(_TASK_CACHE[key])
    return loaded


# an anneal run's (experiment/sweep.py): its shards/ links to its parent's, which a set may name (measured there once)
RUN_SHARDS_NOT_MEASURED = "eval.validate_run_shards is false: the data sets are measured in validation_by_set"


def run_suite(logits_fn: LogitsFn, tok: RunTokenizer, eval_cfg: EvalConfig, run_folder: RunFolder, *, max_len: int,
              tasks: Sequence[str], max_items: int | None, validation_batches: int | None,
              heldout_files: Sequence[str] = (), mixture: Sequence[tuple[str, Path, float]] = (),
              generate: GenerateTexts | None = None, sample: SampleTexts | None = None) -> dict[str, Any]:
    """Bits per byte (the run's validation shards unless ``eval.validate_run_shards`` is false, each ``mixture``
    set's, held-out files) and task scores: the results body."""
    results: dict[str, Any] = {}
    measured: dict[RunPath, bpb.BitsPerByte] = {}  # folder -> its bits per byte: a folder two names give is read once
    shards_manifest = SHARDS.read_manifest_if_present(run_folder.shards) if eval_cfg.validate_run_shards else None
    if not eval_cfg.validate_run_shards:
        log.info("not measuring %s as the run's validation (eval.validate_run_shards is false)", run_folder.shards)
        results["validation_skipped"] = RUN_SHARDS_NOT_MEASURED
    elif shards_manifest is None:
        log.warning("no finished shards in %s: skipping validation bits per byte (run %s)", run_folder.shards,
                    SHARDS.recipe)
    elif not shards_manifest["splits"]["validation"]["records"]:
        log.warning("the validation split in %s is empty: skipping validation bits per byte "
                    "(raise shards.validation_percent or add documents)", run_folder.shards)
        results["validation_skipped"] = "empty validation split"
    else:
        log.info("bits per byte on the validation shards (%s batches)", validation_batches or "all")
        started = time.perf_counter()
        acc = bpb.validation_bpb(logits_fn, run_folder.shards, tok.piece_byte_lengths(), eval_cfg.batch_size,
                                 max_batches=validation_batches, tokenizer_sha256=tok.sha256 or None)
        results["validation"] = {**acc.to_dict(), "seconds": round(time.perf_counter() - started, 2)}
        measured[resolved(run_folder.shards)] = acc
        log.info("validation: %s", bpb.describe(acc))
        if eval_cfg.bpb_position_buckets:
            results["validation_by_position"] = position_buckets(logits_fn, tok, eval_cfg, run_folder.shards,
                                                                 max_len=max_len, validation_batches=validation_batches)
    if mixture:
        by_set = bpb.sets_validation_bpb(logits_fn, mixture, tok.piece_byte_lengths(), eval_cfg.batch_size,
                                         max_batches=validation_batches, tokenizer_sha256=tok.sha256 or None,
                                         measured=measured)
        results["validation_by_set"] = {name: acc.to_dict() for name, acc in by_set.items()}
        for name, acc in by_set.items():
            log.info("validation of mixture set %s: %s", name, bpb.describe(acc))
    if heldout_files:
        results["heldout"] = {}
        for name, text in bpb.read_text_files(list(heldout_files)):
            acc = bpb.text_bpb(logits_fn, tok.encode, [(name, tok.normalize(text))], tok.eos_id, max_len,
                               eval_cfg.batch_size, pad_id=tok.pad_id)
            results["heldout"][name] = acc.to_dict()
            log.info("held-out %s: %s", name, bpb.describe(acc))
    results["tasks"], skipped = score_tasks(logits_fn, tok, eval_cfg, tasks=tasks, max_items=max_items,
                                            max_len=max_len, generate=generate, sample=sample,
                                            shards_dir=run_folder.shards)
    if skipped:
        results["tasks_skipped"] = skipped
    return results


def score_tasks(logits_fn: LogitsFn, tok: RunTokenizer, eval_cfg: EvalConfig, *, tasks: Sequence[str],
                max_items: int | None, max_len: int, generate: GenerateTexts | None = None,
                sample: SampleTexts | None = None,
                shards_dir: Path | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Every task's result (see ``harness.evaluate_task``, ``generative.evaluate_generative``: the generative
    tasks need ``generate``; ``mera_scores.evaluate_mera_local``: MERA's code tasks also need ``sample``;
    ``passkey.evaluate_passkey``: its filler comes from ``shards_dir``'s validation split unless
    ``eval.passkey.filler_file`` is set) and the tasks skipped for missing files."""
    encoder = PairEncoder(tok.encode, tok.eos_id, tok.normalize)
    scored: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    if PASSKEY in tasks:
        if generate is None:
            raise ValueError("task passkey is generative: score_tasks needs generate=")
        started = time.perf_counter()
        items, source = passkey_items(tok, eval_cfg, shards_dir, max_len)
        scored[PASSKEY] = passkey.evaluate_passkey(items, generate, eval_cfg.passkey, seed=eval_cfg.seed,
                                                   source=source, batch_size=eval_cfg.batch_size)
        scored[PASSKEY]["seconds"] = round(time.perf_counter() - started, 2)
    for data in load_tasks([task for task in tasks if task != PASSKEY], eval_cfg, max_items, skipped):
        started = time.perf_counter()
        if isinstance(data, MeraLocalData):
            if generate is None:
                raise ValueError(f"task {MERA_PREFIX}{data.task.config} may generate: score_tasks needs generate=")
            predictors = Predictors(logits_fn, encoder, generate, eval_cfg.batch_size, max_len, tok.pad_id,
                                    sample=sample)
            result = evaluate_mera_local(data, predictors, seed=eval_cfg.seed)
        elif isinstance(data, GenTaskData):
            if generate is None:
                raise ValueError(f"task {data.task.name} is generative: score_tasks needs generate=")
            result = evaluate_generative(data, generate, seed=eval_cfg.seed, batch_size=eval_cfg.batch_size)
        else:
            result = harness.evaluate_task(data, logits_fn, encoder, batch_size=eval_cfg.batch_size, max_len=max_len,
                                           num_fewshot=eval_cfg.num_fewshot, seed=eval_cfg.seed, pad_id=tok.pad_id)
        result["seconds"] = round(time.perf_counter() - started, 2)
        scored[result["task"]] = result
    return scored, skipped


def passkey_items(tok: RunTokenizer, eval_cfg: EvalConfig, shards_dir: Path | None,
                  max_len: int) -> tuple[list[passkey.PasskeyItem], str]:
    """The passkey task's items (made once per tokenizer, context and settings: eval during training repeats
    them) and where their filler came from."""
    from eval.completions import run_codec

    settings = eval_cfg.passkey
    key = (tok.sha256, max_len, eval_cfg.seed, str(shards_dir), tuple(settings.lengths), tuple(settings.depths),
           settings.items_per_depth, settings.digits, settings.filler_file)
    if key not in _PASSKEY_CACHE:
        if shards_dir is None and not settings.filler_file:
            raise DataError("task passkey: no filler (set eval.passkey.filler_file, or run recipe 03 for the "
                            "validation shards)")
        sentences, source = passkey.read_filler(settings, tok.decode, tok.eos_id, shards_dir, eval_cfg.batch_size,
                                                tokenizer_sha256=tok.sha256 or None)
        items = passkey.make_items(sentences, run_codec(tok).encode, settings, max_len=max_len, seed=eval_cfg.seed,
                                   where=source)
        _PASSKEY_CACHE[key] = (items, source)
    return _PASSKEY_CACHE[key]


def position_buckets(logits_fn: LogitsFn, tok: RunTokenizer, eval_cfg: EvalConfig, shards_dir: Path, *,
                     max_len: int, validation_batches: int | None) -> dict[str, Any]:
    """Bits per byte by position bucket (``eval.bpb_position_buckets``) on the validation documents at least as long
    as the context, read from as many batches as the validation bits per byte reads."""
    started = time.perf_counter()
    found = bpb.validation_position_buckets(
        logits_fn, shards_dir, tok.piece_byte_lengths(), starts=eval_cfg.bpb_position_buckets, eos_id=tok.eos_id,
        max_len=max_len, batch_size=eval_cfg.batch_size, max_batches=validation_batches,
        max_documents=eval_cfg.position_bucket_documents, tokenizer_sha256=tok.sha256 or None)
    if not found.documents:
        log.warning("no validation document of %d tokens or more in the batches read (%d shorter): no bits per byte "
                    "by position", max_len, found.shorter)
    for (lo, hi), acc in zip(found.spans, found.buckets, strict=True):
        log.info("validation positions [%d, %d): %s, %d bytes", lo, hi, bpb.describe(acc), acc.bytes)
    return {**found.to_dict(), "max_len": max_len, "seconds": round(time.perf_counter() - started, 2)}


def log_task_results(tasks: dict[str, Any]) -> None:
    """Each task's line, from the results the report renders, once every baseline (the random-init model's, the
    base model's) has joined them: the verdict in the log is the report's."""
    for task, result in tasks.items():
        metric = headline_metric(result)
        acc, versus = result["metrics"][metric], result["vs_strongest_baseline"]
        interval = f"[{acc['ci95'][0]:.3f}, {acc['ci95'][1]:.3f}]" if acc["ci95"] is not None else "[no interval]"
        log.info("%s: %s %.3f %s (strongest baseline %s %.3f: %s; chance %.3f, %d items, %s labels)",
                 task, metric, acc["value"], interval, versus["baseline"], versus["baseline_value"],
                 versus["verdict"], acc["chance"], result["items"], result["labels"])
        if result["answers"]["one_answer"]:
            log.warning(one_answer_warning(task, result["answers"]["top"], result["answers"]["top_share"]))


def random_init_model(cfg: ExperimentConfig, meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The checkpoint's model as the trainer initialises it at step 0 (``trainer.step.initial_params``,
    the code the trainer's own state init runs): the run's seed (recorded in the checkpoint, else
    ``experiment.seed``) and parameter dtype. Returns the model and what it is, for the results: a run
    that started from another model (``model.init_from``) did not start from these weights."""
    import jax
    from flax import nnx

    from model.family import get_family, run_once_compile_options
    from trainer.step import DTYPES, initial_params
    from trainer.trained_model import model_config_from_meta

    model_cfg = model_config_from_meta(meta)
    vocab_size, seed = int(meta["vocab_size"]), int(meta.get("seed", cfg.experiment.seed))
    param_dtype = DTYPES[meta.get("param_dtype", "float32")]
    graphdef = nnx.graphdef(get_family(model_cfg.family).abstract(model_cfg, vocab_size))
    init = jax.jit(lambda: initial_params(model_cfg, vocab_size, seed, param_dtype)).lower()
    params = init.compile(compiler_options=run_once_compile_options(jax.devices()[0].platform))()
    info: dict[str, Any] = {"seed": seed, "seed_from": "checkpoint" if "seed" in meta else "experiment.seed",
                            "param_dtype": str(jax.numpy.dtype(param_dtype)), "init": "trainer.step.initial_params",
                            "run_step0": "init_from" not in meta}
    if "init_from" in meta:
        info["note"] = f"this run started from {meta['init_from'].get('folder')}, not from this initialisation"
    return nnx.merge(graphdef, params), info


def add_random_init(results: dict[str, Any], scored: dict[str, Any], init: dict[str, Any]) -> None:
    """Put the random-init model's accuracies (and per group) beside each task's own; its ``acc`` joins
    the baselines, so the headline is against it where it beats every no-model rule."""
    for task, result in scored.items():
        if task not in results["tasks"]:
            continue
        target = results["tasks"][task]
        entry: dict[str, Any] = {**init, "metrics": dict(result["metrics"]), "answers": result["answers"]}
        join_baselines(target, result["metrics"][headline_metric(result)])
        if "groups" in result:
            entry["groups"] = {g: {"value": m["value"], "ci95": m["ci95"], "n": m["n"]}
                               for g, m in result["groups"].items()}
            for g, m in target.get("groups", {}).items():
                if g in result["groups"]:
                    join_baselines(m, result["groups"][g], own=m)
        target["random_init"] = entry


def join_baselines(target: dict[str, Any], model_acc: dict[str, Any], own: dict[str, Any] | None = None,
                   name: str = "random_init") -> None:
    """Add another model's accuracy (the random-init or the base model's) to ``target['baselines']`` as ``name``
    and redo the headline comparison."""
    baselines = target["baselines"]
    baselines[name] = {"value": model_acc["value"], "ci95": model_acc["ci95"]}
    if model_acc["value"] > baselines[baselines["strongest"]]["value"]:
        baselines["strongest"] = name
    target["vs_strongest_baseline"] = harness.versus_baseline(own or target["metrics"][headline_metric(target)],
                                                              baselines)


# what run_suite measures besides the tasks
BITS_PER_BYTE_PARTS = ("validation", "validation_by_position", "validation_by_set", "heldout")


def add_base_model(results: dict[str, Any], scored: dict[str, Any], info: dict[str, Any]) -> None:
    """Put the base model's bits per byte and accuracies beside the trained step's: ``results['base_model']``
    holds them (with the trained minus base difference in bits per byte), and each task's base accuracy joins its
    baselines as ``base_model`` (the headline is against it where it is the strongest)."""
    entry: dict[str, Any] = {**info, **{part: scored[part] for part in BITS_PER_BYTE_PARTS if part in scored}}
    if "validation" in scored and "validation" in results:
        entry["val_bpb_change"] = results["validation"]["bits_per_byte"] - scored["validation"]["bits_per_byte"]
    entry["tasks"] = {}
    for task, result in scored.get("tasks", {}).items():
        if task not in results["tasks"]:
            continue
        entry["tasks"][task] = {"metrics": dict(result["metrics"]), "answers": result["answers"]}
        join_baselines(results["tasks"][task], result["metrics"][headline_metric(result)], name="base_model")
    results["base_model"] = entry


def flat_metrics(results: dict[str, Any], prefix: str = "eval") -> dict[str, float]:
    """The scalar metrics for W&B summaries and trainer logs: eval/val_bpb, eval/<task>/<metric>, ..."""
    flat: dict[str, float] = {}
    if "validation" in results:
        flat[f"{prefix}/val_bpb"] = results["validation"]["bits_per_byte"]
        flat[f"{prefix}/val_ppl"] = results["validation"]["perplexity"]
    for bucket in results.get("validation_by_position", {}).get("buckets", []):
        if bucket["tokens"]:
            flat[f"{prefix}/val_bpb_position/{bucket['start']}-{bucket['end']}"] = bucket["bits_per_byte"]
    for name, acc in results.get("validation_by_set", {}).items():
        flat[f"{prefix}/mixture/{name}/val_bpb"] = acc["bits_per_byte"]
    for name, acc in results.get("heldout", {}).items():
        flat[f"{prefix}/heldout/{Path(name).stem}/bpb"] = acc["bits_per_byte"]
    for task, result in results.get("tasks", {}).items():
        for metric, summary in result["metrics"].items():
            flat[f"{prefix}/{task}/{metric}"] = summary["value"]
        if "baselines" in result:
            versus = result["vs_strongest_baseline"]
            flat[f"{prefix}/{task}/baseline_strongest"] = versus["baseline_value"]
            flat[f"{prefix}/{task}/acc_minus_strongest_baseline"] = versus["margin"]
            for name, baseline in result["baselines"].items():
                if name != "strongest":
                    flat[f"{prefix}/{task}/baseline_{name}"] = baseline["value"]
            flat[f"{prefix}/{task}/answer_top_share"] = result["answers"]["top_share"]
            flat[f"{prefix}/{task}/one_answer"] = float(result["answers"]["one_answer"])
        if "random_init" in result:
            metric = headline_metric(result)
            flat[f"{prefix}/{task}/random_init_{metric}"] = result["random_init"]["metrics"][metric]["value"]
    base = results.get("base_model", {})
    if "validation" in base:
        flat[f"{prefix}/base_model/val_bpb"] = base["validation"]["bits_per_byte"]
    for name, acc in base.get("heldout", {}).items():
        flat[f"{prefix}/base_model/heldout/{Path(name).stem}/bpb"] = acc["bits_per_byte"]
    for task, result in base.get("tasks", {}).items():
        metric = headline_metric(result)
        flat[f"{prefix}/{task}/base_model_{metric}"] = result["metrics"][metric]["value"]
    return flat


def measured_sets(cfg: ExperimentConfig, run_folder: RunFolder) -> list[tuple[str, Path, float]]:
    """The shard sets whose validation splits are measured apart: train.mixture's, then eval.validation_sets' that
    the mixture does not name (weight 0: none is trained on); a name both give must be the same folder."""
    sets = mixture_sets(cfg.train.mixture, run_folder.shards)
    folders = {name: folder for name, folder, _ in sets}
    for name, shards in cfg.eval.validation_sets.items():
        folder = location(shards, "eval.validation_sets") if shards else location(run_folder.shards)
        if name not in folders:
            sets.append((name, folder, 0.0))
        elif resolved(folders[name]) != resolved(folder):
            raise ConfigError(f"config key 'eval.validation_sets.{name}': {folder} is not the shards folder "
                              f"train.mixture names for the set {name!r} ({folders[name]})")
    return sets


def max_len_of(cfg: ExperimentConfig, meta: dict[str, Any] | None = None) -> int:
    """The length the model was trained on (its checkpoint's), not what the config says now."""
    meta = meta or {}
    return int(meta.get("seq_len") or (meta.get("model") or {}).get("max_seq_len") or cfg.model.max_seq_len)


def evaluate_model(model: Any, cfg: ExperimentConfig, run_folder: RunFolder, step: int | None = None,
                   subset: bool = True) -> dict[str, float]:
    """Eval during training: the quick subset (``eval.train_*``) or the full suite, as flat metrics.

    The trainer logs the dict against its step and the rubles spent; nothing is written to disk.
    """
    eval_cfg = cfg.eval
    check_task_names(eval_cfg)
    tok = load_run_tokenizer(run_folder.tokenizer)
    started = time.perf_counter()
    results = run_suite(
        model_logits_fn(model), tok, eval_cfg, run_folder, max_len=max_len_of(cfg),
        generate=text_generator(model, tok, max_len_of(cfg)), sample=text_sampler(model, tok, max_len_of(cfg)),
        tasks=eval_cfg.train_tasks if subset else eval_cfg.tasks,
        max_items=eval_cfg.train_max_items_per_task if subset else eval_cfg.max_items_per_task,
        validation_batches=eval_cfg.train_validation_batches if subset else eval_cfg.max_validation_batches,
        # held-out texts whole at every eval: bits per byte on text no split of the corpus holds, against rubles
        heldout_files=eval_cfg.heldout_text_files,
        mixture=measured_sets(cfg, run_folder),
    )
    log_task_results(results["tasks"])
    flat = flat_metrics(results)
    flat["eval/seconds"] = time.perf_counter() - started
    log.info("eval at step %s: %s", step, ", ".join(f"{k}={v:.4f}" for k, v in flat.items()))
    return flat


def text_generator(model: Any, tok: RunTokenizer, max_len: int) -> GenerateTexts:
    """(prompts, max new tokens, stop strings) -> completions of ``model`` with the run's tokenizer: greedy,
    recipe 09's code (eval/completions.py), a prompt too long for ``max_len`` cut to its end; what the generative
    tasks call."""
    from eval.completions import complete, keeping_the_end, run_codec

    codec = run_codec(tok)

    def generate(prompts: list[str], max_new_tokens: int, stop: Sequence[str]) -> list[str]:
        # a few-shot prompt longer than the model's context keeps its end, the query (as lm-eval does)
        records = complete(model, keeping_the_end(codec, max_len, max_new_tokens), prompts,
                           max_new_tokens=max_new_tokens, stop=stop, max_len=max_len, batch_size=len(prompts))
        return [record["completion"] for record in records]

    return generate


def text_sampler(model: Any, tok: RunTokenizer, max_len: int) -> SampleTexts:
    """(prompts, max new tokens, stop strings, temperature, top-k, seed) -> sampled completions of ``model``, a prompt
    too long for ``max_len`` cut to its end: what MERA's code tasks call (eval/mera.py)."""
    from eval.completions import complete, keeping_the_end, run_codec

    codec = run_codec(tok)

    def sample(prompts: list[str], max_new_tokens: int, stop: Sequence[str], temperature: float, top_k: int,
               seed: int) -> list[str]:
        records = complete(model, keeping_the_end(codec, max_len, max_new_tokens), prompts,
                           max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed, stop=stop,
                           max_len=max_len, batch_size=len(prompts))
        return [record["completion"] for record in records]

    return sample


def sample_completions(model: Any, cfg: ExperimentConfig, run_folder: RunFolder, step: int) -> list[dict[str, Any]]:
    """Samples during training: ``eval.sample_prompts`` continued greedily by ``model`` (``eval.sample_max_new_tokens``
    new tokens each, the run's tokenizer, recipe 09's code: eval/completions.py). Greedy, so the completions at a
    step depend on the weights alone and two evals of the same weights read the same."""
    from eval.completions import complete, run_codec

    if not cfg.eval.sample_max_new_tokens or not cfg.eval.sample_prompts:
        return []
    started = time.perf_counter()
    records = complete(model, run_codec(load_run_tokenizer(run_folder.tokenizer)), cfg.eval.sample_prompts,
                       max_new_tokens=cfg.eval.sample_max_new_tokens, max_len=max_len_of(cfg))
    log.info("samples at step %s (%.1f s): %s", step, time.perf_counter() - started,
             " | ".join(one_line(f"{r['prompt']}{r['completion']}") for r in records))
    return records


# every character str.splitlines() breaks a line at, and the backslash that escapes them, as Python writes them
_LINE_ESCAPES = str.maketrans({char: ascii(char)[1:-1] for char in "\\\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def one_line(text: str) -> str:
    """``text`` on one log line: its line breaks written as escapes (a completion's newlines would each start a line
    of the log that no longer says what it is)."""
    return text.translate(_LINE_ESCAPES)


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def write_results(eval_dir: Path, results: dict[str, Any]) -> tuple[Path, Path]:
    """step_NNNNNNN.json and .md, then the manifest naming the latest and listing every evaluated step."""
    invalidate(eval_dir)
    name = step_name(results["step"])
    json_path, md_path = eval_dir / f"{name}.json", eval_dir / f"{name}.md"
    atomic_write_json(json_path, results)
    atomic_write_text(md_path, render_markdown(results))
    steps = sorted(int(p.stem.split("_")[1]) for p in eval_dir.glob("step_*.json"))
    EVAL.write_manifest(eval_dir, {"latest": json_path.name, "latest_step": results["step"],
                                     "steps": steps, "files": [json_path.name, md_path.name]})
    return json_path, md_path


def link_inputs(wandb_run: Any, names: Sequence[str]) -> None:
    """Mark the artifacts this evaluation used (checkpoint, tokenizer) as its inputs: W&B lineage."""
    for name in names:
        try:
            wandb_run.use_artifact(name)
        except Exception as exc:  # offline runs cannot resolve artifacts by name; lineage is optional
            log.info("W&B lineage to %s kept in metadata only (%s)", name, str(exc).splitlines()[0])


def log_to_wandb(wandb_run: Any, cfg: ExperimentConfig, results: dict[str, Any], files: Sequence[Path],
                 inputs: Sequence[str]) -> None:
    """Summary metrics, the results table (logged at the checkpoint's step) and an ``eval`` artifact."""
    import wandb

    flat = flat_metrics(results)
    wandb_run.summary.update({**flat, "eval/step": results["step"]})
    rows = results_rows(results)
    record: dict[str, Any] = dict(flat)
    if rows:
        record["eval/results"] = wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
    wandb_run.log(record, step=results["step"])
    link_inputs(wandb_run, inputs)
    artifact = wandb.Artifact(f"{cfg.experiment.name}-eval", type="eval",
                              metadata={"step": results["step"],
                                        "train_wandb_run_id": results.get("train_wandb_run_id"),
                                        "tokenizer_sha256": results.get("tokenizer_sha256"), "inputs": list(inputs),
                                        **flat})
    add_files(artifact, files)
    wandb_run.log_artifact(artifact, aliases=["latest", step_name(results["step"])])


def evaluate(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any) -> dict[str, Any]:
    """Recipe 05: evaluate one checkpoint, write the results and log them."""
    from trainer.trained_model import load_trained_model

    eval_cfg = cfg.eval
    check_task_names(eval_cfg)
    tok = load_run_tokenizer(run_folder.tokenizer)
    model, step, meta = load_trained_model(run_folder, step=eval_cfg.checkpoint_step)
    if meta.get("tokenizer_sha256") and tok.sha256 and meta["tokenizer_sha256"] != tok.sha256:
        raise DataError(f"checkpoint step {step} was trained with tokenizer {meta['tokenizer_sha256'][:12]}..., "
                        f"{run_folder.tokenizer} holds {tok.sha256[:12]}...: evaluate with the tokenizer it was "
                        "trained with")
    log.info("evaluating checkpoint step %d of %s", step, run_folder.root)
    started = time.perf_counter()
    max_len = max_len_of(cfg, meta)
    results: dict[str, Any] = {"experiment": cfg.experiment.name, "step": int(step),
                               "checkpoint": str(run_folder.checkpoints), "tokenizer_sha256": tok.sha256,
                               "train_wandb_run_id": meta.get("wandb_run_id"),
                               "max_len": max_len, "num_fewshot": eval_cfg.num_fewshot, "seed": eval_cfg.seed,
                               "config": redact(dataclasses.asdict(eval_cfg))}
    results.update(run_suite(model_logits_fn(model), tok, eval_cfg, run_folder, max_len=max_len,
                             generate=text_generator(model, tok, max_len), sample=text_sampler(model, tok, max_len),
                             tasks=eval_cfg.tasks, max_items=eval_cfg.max_items_per_task,
                             validation_batches=eval_cfg.max_validation_batches,
                             heldout_files=eval_cfg.heldout_text_files,
                             mixture=measured_sets(cfg, run_folder)))
    if eval_cfg.random_init_baseline and results["tasks"]:
        # the run's step 0: the same items scored by the untrained model (tasks only, no bits per byte)
        random_started = time.perf_counter()
        random_model, init = random_init_model(cfg, meta)
        log.info("scoring the same items with the step-0 model (seed %d from %s)", init["seed"], init["seed_from"])
        scored, _ = score_tasks(model_logits_fn(random_model), tok, eval_cfg,
                                tasks=list(results["tasks"]), max_items=eval_cfg.max_items_per_task,
                                max_len=max_len, generate=text_generator(random_model, tok, max_len),
                                sample=text_sampler(random_model, tok, max_len), shards_dir=run_folder.shards)
        add_random_init(results, scored, init)
        results["random_init_seconds"] = round(time.perf_counter() - random_started, 2)
    if eval_cfg.base_model_baseline and meta.get("init_from"):
        # a continued run: the model it started from, on the same shards, texts and items
        base_started = time.perf_counter()
        from trainer.init_from import reimport_base

        try:
            base, info = reimport_base(run_folder, meta)
        except (DataError, OSError) as exc:  # the base moved or changed: the trained step's results still stand
            results["base_model_skipped"] = str(exc)
            log.warning("not scoring the base model: %s", exc)
        else:
            log.info("scoring the same shards, texts and items with the base model %s", info["folder"])
            scored = run_suite(model_logits_fn(base), tok, eval_cfg, run_folder, max_len=max_len,
                               generate=text_generator(base, tok, max_len),
                               sample=text_sampler(base, tok, max_len), tasks=list(results["tasks"]),
                               max_items=eval_cfg.max_items_per_task,
                               validation_batches=eval_cfg.max_validation_batches,
                               heldout_files=eval_cfg.heldout_text_files,
                               mixture=measured_sets(cfg, run_folder))
            del base
            add_base_model(results, scored, info)
            if "val_bpb_change" in results["base_model"]:
                log.info("validation bits per byte: %.4f trained against %.4f for the base model (%+.4f)",
                         results["validation"]["bits_per_byte"], scored["validation"]["bits_per_byte"],
                         results["base_model"]["val_bpb_change"])
            results["base_model_seconds"] = round(time.perf_counter() - base_started, 2)
    results["seconds"] = round(time.perf_counter() - started, 2)
    log_task_results(results["tasks"])
    log_decontamination(cfg, run_folder, results)  # per task: was every corpus it trained on decontaminated
    # the results first: an export that fails (a full disk) must not take a finished evaluation with it
    json_path, md_path = write_results(run_folder.eval, results)
    log.info("wrote %s and %s", json_path, md_path)
    export_failure: str | None = None
    if eval_cfg.export_hf:
        export_failure = export_beside_results(model, int(step), meta, run_folder, cfg, tok, results)
        if "hf_export" in results:
            write_results(run_folder.eval, results)  # the same files, naming the export
    if wandb_run is not None:  # None: library use without tracking
        inputs = [name for name in (meta.get("wandb_artifact"), f"{cfg.experiment.name}-tokenizer:latest") if name]
        log_to_wandb(wandb_run, cfg, results, [json_path, md_path], inputs)
    if export_failure is not None:
        raise WriteError(f"{export_failure}; the evaluation of step {step} is saved in {json_path}")
    return results


def export_beside_results(model: Any, step: int, meta: dict[str, Any], run_folder: RunFolder, cfg: ExperimentConfig,
                          tok: RunTokenizer, results: dict[str, Any]) -> str | None:
    """``eval.export_hf``: the Hugging Face folder of the evaluated step, its path put in ``results['hf_export']``;
    the reason it could not be written (a full disk, a tokenizer that is not the checkpoint's), or None."""
    from eval.hf_export import export_checkpoint

    try:
        exported = export_checkpoint(model, step, meta, run_folder, cfg, tok)
    except RecipeError as exc:
        return str(exc)
    except OSError as exc:
        if write_errno(exc) is None:
            raise
        return str(write_error(exc, run_folder.eval / "hf", advice=f"free some space, then {EXPORT.recipe} "
                               f"eval.checkpoint_step={step} exports the step without evaluating it again"))
    if exported is not None:  # None: the model family has no Hugging Face adapter
        results["hf_export"] = str(exported)
    return None
