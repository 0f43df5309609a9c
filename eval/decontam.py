"""The benchmarks' side of corpus decontamination: their items read by eval's own loaders, as text segments.

Recipe 01 (``corpus.decontamination``) builds its n-gram index (data_prep/corpus/decontam.py) from what this
module reads: recipe 05's tasks through ``harness.load_task`` and ``generative.load_generative`` (the same sources,
``eval.task_files``, ``eval.bench_dir`` and ``eval.task_schemas`` as the evaluation), and recipe 05c's MERA test
inputs through ``mera.read_records`` (``eval.mera_dir``), as ``mera:<config>``. So the index and the evaluation
see the same text.

An item's segments are the text its prompt is made of with the template's own words left out: each template
literal holding a word (``Вопрос:``, ``Верно или неверно?``) breaks the text, so the grams are the benchmark's and
never the prompt's. Every choice counts (the gold answer and the others: all are benchmark text). Recipe 05
reads the corpus manifest back and says, per task, whether the corpus was decontaminated against it
(eval/decontam_status.py).
"""

from __future__ import annotations

import dataclasses
import logging
import string
from collections.abc import Iterator

from data_prep.corpus.decontam import BenchmarkIndex, IndexBuilder
from eval.generative import load_generative
from eval.harness import _expand, load_task
from eval.loaders import Record, SourceUnavailable
from eval.mera import MERA_TASKS, read_records
from eval.mera_scores import labelled_files, labelled_records
from eval.tasks import BENCH, GENERATIVE_TASKS, MERA_LOCAL_TASKS, TASKS, TaskSpec
from eval.tasks import MERA_PREFIX as MERA_LOCAL_PREFIX
from experiment.errors import ConfigError, DataError
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.eval import EvalConfig
from experiment.storage import location

log = logging.getLogger("eval.decontam")

BREAK = "\x00"  # stands for a template literal with words in it: segments are split there
MERA_PREFIX = "mera:"
KEY = "corpus.decontamination"


def known_benchmarks() -> list[str]:
    """Every benchmark recipe 01 can decontaminate against: recipe 05's tasks (the passkey is generated, not read;
    MERA's labelled items as ``mera_<config>``) and recipe 05c's MERA test splits as ``mera:<config>``."""
    return [*sorted({*TASKS, *GENERATIVE_TASKS}), *MERA_LOCAL_TASKS, *(MERA_PREFIX + config for config in MERA_TASKS)]


def chosen_benchmarks(cfg: ExperimentConfig) -> list[str]:
    """``corpus.decontamination.benchmarks`` (all known ones when empty); an unknown name is one ConfigError line."""
    known = known_benchmarks()
    for name in cfg.corpus.decontamination.benchmarks:
        if name not in known:
            raise ConfigError(f"config key '{KEY}.benchmarks': unknown benchmark '{name}' (known: {', '.join(known)})")
    return list(cfg.corpus.decontamination.benchmarks) or known


def check_decontamination(cfg: ExperimentConfig, run_folder: RunFolder) -> str | None:
    """Recipe 01's stage check: the benchmark names are known (their files are read when the recipe starts)."""
    if cfg.corpus.decontamination.enabled:
        chosen_benchmarks(cfg)
    return None


def _segment_template(template: str) -> str:
    """``template`` with each literal that holds a word replaced by the break mark (fields kept as they are)."""
    parts = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        if any(ch.isalnum() for ch in literal):
            parts.append(BREAK)
        else:
            parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is not None:
            parts.append("{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
    return "".join(parts)


def segment_spec(spec: TaskSpec) -> TaskSpec:
    """The task with its templates rendering the segments (same fields, sources and schemas: the same records)."""
    return dataclasses.replace(spec, context=_segment_template(spec.context),
                               contexts=tuple(_segment_template(t) for t in spec.contexts),
                               choices=tuple(_segment_template(t) for t in spec.choices))


def _segments(*texts: str) -> list[str]:
    found: dict[str, None] = {}
    for text in texts:
        for piece in text.split(BREAK):
            if piece.strip():
                found.setdefault(piece.strip(), None)
    return list(found)


def _local_files(name: str, eval_cfg: EvalConfig) -> list[str]:
    """The local files the loaders would read the benchmark from, in their order (the first that exists wins)."""
    if name.startswith(MERA_PREFIX):
        config = name.removeprefix(MERA_PREFIX)
        return [str(location(eval_cfg.mera_dir) / f"{config}{suffix}") for suffix in (".jsonl", ".json")
                if eval_cfg.mera_dir]
    if name in eval_cfg.task_files:
        return [eval_cfg.task_files[name]]
    if name.startswith(MERA_LOCAL_PREFIX):
        return labelled_files(name.removeprefix(MERA_LOCAL_PREFIX), bench_dir=eval_cfg.bench_dir,
                              mera_dir=eval_cfg.mera_dir)
    if name in GENERATIVE_TASKS:
        return [s.path.replace(BENCH, eval_cfg.bench_dir) for s in GENERATIVE_TASKS[name].sources if not s.hub]
    return [_expand(s.path, eval_cfg.bench_dir, eval_cfg.rublimp_dir) for s in TASKS[name].sources if not s.hub]


def _mera_segments(records: list[Record]) -> Iterator[list[str]]:
    """Each MERA record's text: its inputs' strings and a text answer."""
    for record in records:
        inputs, outputs = record.fields.get("inputs"), record.fields.get("outputs")
        texts = list(inputs.values()) if isinstance(inputs, dict) else [inputs]
        yield _segments(*(str(t) for t in [*texts, outputs] if isinstance(t, str)))


def benchmark_items(name: str, eval_cfg: EvalConfig) -> tuple[str, Iterator[list[str]]]:
    """(where eval reads the benchmark, each item's segments); SourceUnavailable when it cannot be read."""
    if name.startswith(MERA_PREFIX):
        records, where = read_records(MERA_TASKS[name.removeprefix(MERA_PREFIX)], eval_cfg.mera_dir)
        return where, _mera_segments(records)
    if name.startswith(MERA_LOCAL_PREFIX):
        records, source = labelled_records(name.removeprefix(MERA_LOCAL_PREFIX), bench_dir=eval_cfg.bench_dir,
                                           mera_dir=eval_cfg.mera_dir, task_files=eval_cfg.task_files)
        return source["source"], _mera_segments(records)
    if name in GENERATIVE_TASKS:
        data = load_generative(GENERATIVE_TASKS[name], bench_dir=eval_cfg.bench_dir, task_files=eval_cfg.task_files)
        return data.where, (_segments(item.inputs, item.passage, *item.answers) for item in data.pool)
    task = load_task(segment_spec(TASKS[name]), bench_dir=eval_cfg.bench_dir, rublimp_dir=eval_cfg.rublimp_dir,
                     task_files=eval_cfg.task_files, task_schemas=eval_cfg.task_schemas)
    return task.where, (_segments(*(c + x for c, x in zip(item.contexts, item.continuations, strict=True)))
                        for item in task.pool)


def benchmark_index(cfg: ExperimentConfig) -> BenchmarkIndex | None:
    """Recipe 01's index of ``corpus.decontamination.benchmarks`` (None when decontamination is off). A benchmark
    that cannot be read stops the recipe (``missing: error``) or is recorded as not decontaminated against."""
    settings = cfg.corpus.decontamination
    if not settings.enabled:
        return None
    builder = IndexBuilder(settings.ngram, settings.min_words)
    offline: list[str] = []  # benchmarks with no local file: one warning line for all of them
    for name in chosen_benchmarks(cfg):
        try:
            local = _local_files(name, cfg.eval)
            if not settings.read_hub and not any(location(path).exists() for path in local):
                looked = f"{', '.join(local)} missing; " if local else ""
                raise SourceUnavailable(f"no local file ({looked}otherwise its items are on the Hugging Face hub and "
                                        f"{KEY}.read_hub is off; eval.task_files or eval.mera_dir may name a copy)")
            where, items = benchmark_items(name, cfg.eval)
            builder.add_benchmark(name, where, items)
        except SourceUnavailable as exc:
            if settings.missing == "error":
                raise DataError(f"benchmark '{name}' cannot be read for decontamination: {exc} "
                                f"({KEY}.missing=error; 'record' builds the corpus and records it)") from exc
            if str(exc).startswith("no local file"):
                offline.append(name)
            else:
                log.warning("not decontaminating against %s: %s", name, exc)
            builder.skip(name, str(exc))  # the manifest and report keep each one's reason
    if offline:
        log.warning("not decontaminating against %d benchmarks with no local file (their items are on the Hugging "
                    "Face hub and %s.read_hub is off; eval.task_files or eval.mera_dir may name copies; the corpus "
                    "report lists each): %s", len(offline), KEY, ", ".join(offline))
    index = builder.build()
    log.info("decontamination index: %s", ", ".join(
        f"{name} {s.items_indexed}/{s.items} items" for name, s in index.summaries.items()) or "no benchmark")
    return index
