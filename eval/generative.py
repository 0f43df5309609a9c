"""Generative tasks: the model writes the answer, scored by exact match (MERA's arithmetic tasks) or by SQuAD's
token F1 and exact match (MERA's MultiQ).

    few-shot examples + the item's query --our KV-cache decoder, greedy, cut at the first newline--> answer
    answer.strip() == gold  -> exact match, with its Wilson interval, beside no-model baselines
    squad: F1 of the answer's and a gold's words after SQuAD's normalization (lower case, ASCII punctuation and
           the English articles removed, spaces collapsed), the best over the golds (MERA's outputs "a;b")

Prompts follow MERA's lm-eval task configs (MERA-Evaluation/MERA, ``benchmark_tasks/<task>/<task>.yaml``): a
fixed number of solved examples (SimpleAr 2, ruMultiAr 1), each its ``inputs``, a space and its answer, separated
by a blank line, then the item's query: its ``instruction`` with ``{inputs}`` filled in. A record without an
instruction (the shared human-benchmark SimpleAr items keep only the formula) gets the task's own.

Sources, as for the log-likelihood tasks: ``eval.task_files.<task>`` in one of the task's schemas, else the
task's local file, else the hub (MERA's labelled train split; the test split's answers are closed). Schemas:
``mera`` (``inputs``, ``outputs``, optional ``instruction``, ``meta.id``) and, for SimpleAr, ``humanbench``
(``formula``): its answer is computed from the formula (integer ``a op b``), which is exact where a crowd vote is
silver, and a formula that is not of that form is one error line.

A MERA record whose ``inputs`` are fields (MultiQ: question, support_text, text) fills the instruction by name,
and reads as the task's ``example`` template where it is a solved example.

Baselines a model must beat: exact tasks: ``copy_number`` (the last number of the item's inputs),
``fewshot_answer`` (the answer of the last example in its prompt: what a model that only repeats the pattern
writes); squad tasks: ``majority_answer`` (the split's most common answer, said for every item) and
``text_start`` (the first three words of the item's passage, e.g. MultiQ's second text); through recipe 05, the
run's step-0 weights and a continued run's base model. Intervals are Wilson's on the mean credit (for an F1 in
[0, 1] that bounds the variance from above: conservative).
"""

from __future__ import annotations

import logging
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eval.harness import baselines_summary, metric_summary, one_answer, versus_baseline
from eval.loaders import Record, read_file, read_hub
from eval.tasks import BENCH, GenerativeTask
from experiment.errors import DataError
from experiment.storage import location

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
    answer: str  # the first gold answer (a solved example's)
    query: str
    golds: tuple[str, ...] = ()  # every gold answer (squad scoring: the best counts); () = (answer,)
    passage: str = ""  # the text the answer is taken from (the task's ``passage`` field of its inputs)

    @property
    def answers(self) -> tuple[str, ...]:
        return self.golds or (self.answer,)


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
        golds: tuple[str, ...] = ()
    else:
        raw = fields.get("inputs")
        golds = gold_answers(fields.get("outputs"))
        if not raw:
            raise DataError(f"{where}: missing field 'inputs'")
        if not golds:
            raise DataError(f"{where}: missing field 'outputs' (the answer; a test split's answers are closed: "
                            "score a labelled split)")
        answer = golds[0]
        instruction = str(fields.get("instruction") or task.instruction)
        if isinstance(raw, dict):
            try:
                query, inputs = instruction.format(**raw).strip(), task.example.format(**raw).strip()
            except (KeyError, IndexError, ValueError) as exc:
                raise DataError(f"{where}: field 'inputs' has no field {exc} the task's prompt names") from exc
            return GenItem(id=f"{record.where}:{record.row}", inputs=inputs, answer=answer, query=query, golds=golds,
                           passage=str(raw.get(task.passage) or ""))
        inputs = str(raw).strip()
    try:
        query = instruction.format(inputs=inputs).strip()
    except (KeyError, IndexError, ValueError) as exc:
        raise DataError(f"{where}: field 'instruction' is not a template over {{inputs}} ({exc!r})") from exc
    return GenItem(id=f"{record.where}:{record.row}", inputs=inputs, answer=answer, query=query, golds=golds)


def gold_answers(outputs: Any) -> tuple[str, ...]:
    """A record's gold answers: MERA's ``outputs`` as a string (several joined by ";", as its MultiQ has them) or
    as a list of spans (``segment``, an earlier MultiQ release); () when there is none."""
    if isinstance(outputs, list):
        spans = [str(o.get("segment") if isinstance(o, dict) else o) for o in outputs]
    else:
        spans = str(outputs if outputs is not None else "").split(";")
    return tuple(span.strip() for span in spans if span and span.strip())


ARTICLES = re.compile(r"\b(a|an|the)\b")


def squad_words(text: str) -> list[str]:
    """SQuAD's answer normalization (lower case, ASCII punctuation and English articles dropped), as words."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return ARTICLES.sub(" ", text).split()


def squad_exact(prediction: str, gold: str) -> float:
    return float(squad_words(prediction) == squad_words(gold))


def squad_f1(prediction: str, gold: str) -> float:
    """Token F1 of two answers after normalization; two empty answers agree (1), one empty scores 0."""
    predicted, wanted = squad_words(prediction), squad_words(gold)
    if not predicted or not wanted:
        return float(predicted == wanted)
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def best_over(golds: Sequence[str], score: Callable[[str, str], float], prediction: str) -> float:
    return max(score(prediction, gold) for gold in golds)


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
    """Items from ``eval.task_files.<task>``, else the task's local file, else the hub; ``max_items`` drawn by
    ``seed``."""
    from eval.loaders import SourceUnavailable

    override = (task_files or {}).get(task.name)
    if override:
        records = read_file(override)
        schema, where, labels = schema_of(task, records[0]), override, "gold"
    else:
        local = [s for s in task.sources if not s.hub and location(s.path.replace(BENCH, bench_dir)).exists()]
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
    metrics, credits = scores(data, predicted, shots)
    baselines = baselines_summary(credits)
    top = Counter(predicted).most_common(1)[0]
    gold_top = Counter(item.answer for item in data.items).most_common(1)[0][1] / len(data.items)
    answers = {"predicted": answer_shares(predicted), "gold": answer_shares([it.answer for it in data.items]),
               "top": top[0], "top_share": top[1] / len(predicted),
               "one_answer": one_answer(top[1] / len(predicted), gold_top)}
    headline = next(iter(metrics))
    return {"task": task.name, "description": task.description, "source": data.where, "labels": data.labels,
            "items": len(data.items), "num_fewshot": task.num_fewshot, "kind": "generative",
            "scoring": task.scoring, "metrics": metrics, "baselines": baselines,
            "vs_strongest_baseline": versus_baseline(metrics[headline], baselines), "answers": answers,
            "examples": [{"id": item.id, "query": item.query, "prediction": p, "answer": ";".join(item.answers)}
                         for item, p in list(zip(data.items, predicted, strict=True))[:5]]}


def scores(data: GenTaskData, predicted: Sequence[str],
           shots: Sequence[Sequence[GenItem]]) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The metrics of the predictions (headline first) and each baseline's per-item credits, by the task's scoring."""
    items = data.items
    if data.task.scoring == "squad":
        f1 = [best_over(item.answers, squad_f1, p) for p, item in zip(predicted, items, strict=True)]
        exact = [best_over(item.answers, squad_exact, p) for p, item in zip(predicted, items, strict=True)]
        majority = Counter(item.answer for item in data.pool).most_common(1)[0][0]
        starts = [" ".join((item.passage or item.inputs).split()[:3]) for item in items]
        return ({"f1": metric_summary(f1, 0.0), "exact_match": metric_summary(exact, 0.0)},
                {"majority_answer": [best_over(item.answers, squad_f1, majority) for item in items],
                 "text_start": [best_over(item.answers, squad_f1, start) for item, start in
                                zip(items, starts, strict=True)]})
    exact = [float(p == item.answer) for p, item in zip(predicted, items, strict=True)]
    return ({"exact_match": metric_summary(exact, 0.0)},
            {"copy_number": [float((NUMBER.findall(item.inputs) or [""])[-1] == item.answer) for item in items],
             "fewshot_answer": [float(bool(s) and s[-1].answer == item.answer) for item, s in
                                zip(items, shots, strict=True)]})
