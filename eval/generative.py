"""Generative tasks: the model writes the answer, scored by exact match (MERA's arithmetic tasks).

    few-shot examples + the item's query --our KV-cache decoder, greedy, cut at the first newline--> answer
    answer.strip() == gold  -> exact match, with its Wilson interval, beside no-model baselines

Prompts follow MERA's lm-eval task configs (MERA-Evaluation/MERA, ``benchmark_tasks/<task>/<task>.yaml``): a
fixed number of solved examples (SimpleAr 2, ruMultiAr 1), each its ``inputs``, a space and its answer, separated
by a blank line, then the item's query: its ``instruction`` with ``{inputs}`` filled in. A record without an
instruction (the shared human-benchmark SimpleAr items keep only the formula) gets the task's own.

Sources, as for the log-likelihood tasks: ``eval.task_files.<task>`` in one of the task's schemas, else the
task's local file, else the hub (MERA's labelled train split; the test split's answers are closed). Schemas:
``mera`` (``inputs``, ``outputs``, optional ``instruction``, ``meta.id``) and, for SimpleAr, ``humanbench``
(``formula``): its answer is computed from the formula (integer ``a op b``), which is exact where a crowd vote is
silver, and a formula that is not of that form is one error line.

Baselines a model must beat: ``copy_number`` (the last number of the item's inputs), ``fewshot_answer`` (the
answer of the last example in its prompt: what a model that only repeats the pattern writes), and, through
recipe 05, the run's step-0 weights and a continued run's base model.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.harness import baselines_summary, metric_summary, versus_baseline
from eval.loaders import Record, read_file, read_hub
from eval.tasks import BENCH, GenerativeTask
from experiment.errors import DataError

log = logging.getLogger("eval.generative")

# (prompts, max new tokens, stop strings) -> completions: eval.run.text_generator over a model
GenerateTexts = Callable[[list[str], int, Sequence[str]], list[str]]
FEWSHOT_SEPARATOR, TARGET_DELIMITER = "\n\n", " "  # lm-eval's defaults, which MERA's generative configs keep
NUMBER = re.compile(r"-?\d+")
FORMULA = re.compile(r"^\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*$")


@dataclass(frozen=True)
class GenItem:
    id: str  # "<file>:<row>"
    inputs: str
    answer: str
    query: str


SCHEMA_FIELDS = {"mera": "inputs, outputs (the answer), instruction (optional)", "humanbench": "formula (a op b)"}


def computed_answer(formula: str) -> str | None:
    """The value of an integer ``a op b`` formula, or None when it is not one."""
    match = FORMULA.match(formula)
    if match is None:
        return None
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def build_gen_item(task: GenerativeTask, schema: str, record: Record) -> GenItem:
    """One record as an item; a field missing or an answer that cannot be had is one line naming file and row."""
    fields = record.fields
    where = f"{record.at()} (task '{task.name}' reads it in schema {schema}: {SCHEMA_FIELDS[schema]})"
    if schema == "humanbench":
        formula = str(fields.get("formula") or "")
        answer = computed_answer(formula)
        if answer is None:
            raise DataError(f"{where}: field 'formula' is {formula!r}, not an integer 'a op b' with op in + - *")
        inputs, instruction = formula.strip(), task.instruction
    else:
        inputs, answer = str(fields.get("inputs") or "").strip(), str(fields.get("outputs") or "").strip()
        if not inputs:
            raise DataError(f"{where}: missing field 'inputs'")
        if not answer:
            raise DataError(f"{where}: missing field 'outputs' (the answer; a test split's answers are closed: "
                            "score a labelled split)")
        instruction = str(fields.get("instruction") or task.instruction)
    try:
        query = instruction.format(inputs=inputs).strip()
    except (KeyError, IndexError, ValueError) as exc:
        raise DataError(f"{where}: field 'instruction' is not a template over {{inputs}} ({exc!r})") from exc
    return GenItem(id=f"{record.where}:{record.row}", inputs=inputs, answer=answer, query=query)


def schema_of(task: GenerativeTask, record: Record) -> str:
    """The schema a record of a task file fits: MERA's where it has ``inputs``, else the human-benchmark one."""
    schemas = [s.schema for s in task.sources]
    if "inputs" in record.fields or "humanbench" not in schemas:
        return "mera"
    return "humanbench"


@dataclass
class GenTaskData:
    task: GenerativeTask
    where: str
    labels: str
    items: list[GenItem]
    pool: list[GenItem]


def load_generative(task: GenerativeTask, *, bench_dir: str, task_files: dict[str, str] | None = None,
                    max_items: int | None = None, seed: int = 0) -> GenTaskData:
    """Items from ``eval.task_files.<task>``, else the task's local file, else the hub; ``max_items`` drawn by ``seed``."""
    from eval.loaders import SourceUnavailable

    override = (task_files or {}).get(task.name)
    if override:
        records = read_file(override)
        schema, where, labels = schema_of(task, records[0]), override, "gold"
    else:
        local = [s for s in task.sources if not s.hub and Path(s.path.replace(BENCH, bench_dir)).exists()]
        hub = [s for s in task.sources if s.hub]
        if local:
            source = local[0]
            where = source.path.replace(BENCH, bench_dir)
            records = read_file(where)
        elif hub:
            source = hub[0]
            records = read_hub(source.path, source.config, source.split)
            where = f"hub:{source.path}/{source.config}[{source.split}]"
        else:
            raise SourceUnavailable(f"task '{task.name}': no source found; set eval.task_files.{task.name}")
        schema, labels = source.schema, source.labels
    items = [build_gen_item(task, schema, record) for record in records]
    chosen = items
    if max_items is not None and len(items) > max_items:
        chosen = [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), max_items))]
    return GenTaskData(task, where, labels, chosen, items)


def fewshot_examples(item: GenItem, pool: Sequence[GenItem], k: int, seed: int) -> list[GenItem]:
    """``k`` solved examples from the pool (never the item), drawn by the seed and the item's id."""
    if k <= 0:
        return []
    if len(pool) - 1 < k:
        raise DataError(f"{k}-shot needs {k} other items, the split has {len(pool) - 1}")
    drawn = random.Random(f"{seed}:{item.id}").sample(range(len(pool)), k + 1)
    return [pool[i] for i in drawn if pool[i].id != item.id][:k]


def prompt_of(item: GenItem, shots: Sequence[GenItem]) -> str:
    return "".join(s.inputs + TARGET_DELIMITER + s.answer + FEWSHOT_SEPARATOR for s in shots) + item.query


def prediction(completion: str, stop: Sequence[str]) -> str:
    """The answer a completion gives: up to the first stop string, stripped."""
    for s in stop:
        if s in completion:
            completion = completion[:completion.index(s)]
    return completion.strip()


def answer_shares(values: Sequence[str], top: int = 5) -> dict[str, float]:
    return {v: round(n / len(values), 6) for v, n in Counter(values).most_common(top)}


def evaluate_generative(data: GenTaskData, generate: GenerateTexts, *, seed: int = 0,
                        batch_size: int = 16) -> dict[str, Any]:
    """Generate every item's answer and score it (see the module docstring); the JSON-ready result."""
    task = data.task
    shots = [fewshot_examples(item, data.pool, task.num_fewshot, seed) for item in data.items]
    prompts = [prompt_of(item, s) for item, s in zip(data.items, shots, strict=True)]
    log.info("task %s: %d items from %s (%s labels, %d-shot, generated)", task.name, len(data.items), data.where,
             data.labels, task.num_fewshot)
    completions: list[str] = []
    for first in range(0, len(prompts), batch_size):
        completions += generate(prompts[first:first + batch_size], task.max_new_tokens, task.stop)
    predicted = [prediction(c, task.stop) for c in completions]
    exact = [float(p == item.answer) for p, item in zip(predicted, data.items, strict=True)]
    metrics = {"exact_match": metric_summary(exact, 0.0)}
    credits = {
        "copy_number": [float((NUMBER.findall(item.inputs) or [""])[-1] == item.answer) for item in data.items],
        "fewshot_answer": [float(bool(s) and s[-1].answer == item.answer) for item, s in
                           zip(data.items, shots, strict=True)],
    }
    baselines = baselines_summary(credits)
    top = Counter(predicted).most_common(1)[0]
    gold_top = Counter(item.answer for item in data.items).most_common(1)[0][1] / len(data.items)
    answers = {"predicted": answer_shares(predicted), "gold": answer_shares([it.answer for it in data.items]),
               "top": top[0], "top_share": top[1] / len(predicted),
               "one_answer": bool(top[1] / len(predicted) >= 0.95 and gold_top < 0.95)}
    return {"task": task.name, "description": task.description, "source": data.where, "labels": data.labels,
            "items": len(data.items), "num_fewshot": task.num_fewshot, "kind": "generative",
            "metrics": metrics, "baselines": baselines,
            "vs_strongest_baseline": versus_baseline(metrics["exact_match"], baselines), "answers": answers,
            "examples": [{"id": item.id, "query": item.query, "prediction": p, "answer": item.answer}
                         for item, p in list(zip(data.items, predicted, strict=True))[:5]]}
