"""A MERA leaderboard submission: predictions for MERA's closed test splits, packed as the archive the MERA site
takes (recipe 05c), at the settings MERA's leaderboard runs use.

MERA (Fenogenova et al. 2024; github.com/MERA-Evaluation/MERA, release v1.2.0, read at commit
9cf05b2d04a17fa23c71d0d67ade591a6ef392d6) keeps its test answers closed: a team runs its model on the test inputs
through MERA's fork of lm-evaluation-harness (``lm-evaluation-harness`` submodule: artemorloff/lm-evaluation-harness
at 6c59a424bf2a07c0c88571e8b5ce3cceb9057049, LM-Harness v0.4.4) and uploads one ZIP holding ``<Task>.json`` per
task, packed by MERA's ``scripts/log_to_submission.py``. We write the same archive without lm-eval in between, and
take every setting from those files:

- the number of solved examples per task: ``scripts/run_benchmark.sh`` (``FEWSHOTS``/``TASKS``: SimpleAr 2;
  MultiQ, ruModAr, ruEthics, ruHHH, ruHumanEval, ruCodeEval 0; ruTiE 1, its dialogue; the other 15 tasks 1);
- the prompts: each task's ``benchmark_tasks/<task>/<task>.yaml`` (``doc_to_text`` for zero-shot;
  ``fewshot_config.query``, the instruction filled with a solved example, for the first example and
  ``fewshot_config.doc_to_text_without_instruction`` for the later ones and for the item itself), assembled as
  ``benchmark_tasks/custom_samplers.py``'s ``FewshotSampler.get_context`` does: example, a space, its answer, a
  blank line; ruTiE's dialogue as ``benchmark_tasks/custom_context_formers.py`` builds it;
- which examples: drawn from the yaml's ``training_split`` (``train``; LCS ``public_test``; a task without one,
  ruHateSpeech, from its test split, dropping the item itself: lm-eval's ``Task.fewshot_docs``) with one
  ``random.Random(1234)`` per task (``--seed 1234`` in ``run_benchmark.sh``; lm-eval's ``set_fewshot_seed``)
  sampling ``k`` of them for each test item in the split's order, from the items of the same ``meta.domain``
  (ruMMLU, MaMuRAMu) or ``meta.id_task`` (USE) where the item has one (``FewshotSampler.sample``);
- generation: greedy, cut at ``"\\n"`` (USE: also at ``"."``: ``use.yaml``), at most 256 new tokens (lm-eval's
  ``HFLM.max_gen_toks``; a model of a shorter context: half of it), leading whitespace removed
  (``custom_generate_task.yaml``'s ``remove_whitespace``; ruDetox: stripped, ``rudetox/utils.py``); ruHumanEval
  and ruCodeEval: 10 samples per item (``repeats: 10``) at temperature 0.6 (``RUHUMANEVAL_GEN_KWARGS`` in
  ``run_benchmark.sh``; top-k 50, Transformers' default that lm-eval's HF backend leaves in place), cut at the
  yaml's ``until`` list;
- a choice task answers with the choice (after a space: ``target_delimiter``) whose log-likelihood after the
  prompt is highest, ties to the first (``log_to_submission.py``'s ``argmax``).

Submission schema per task (``log_to_submission.py``): ``{"data": {"test": [{"outputs", "meta"}]}}`` with
``meta.id``; USE adds ``meta.id_task`` and ``meta.variant``; ruTiE's rows are named by ``meta.dialog_id`` and
``meta.question_id`` (its answers "1"/"2", each question's prompt holding the dialogue so far with the model's
own earlier answers); ruEthics' outputs are a dict of its five criteria (virtue, law, moral, justice,
utilitarianism), each the item's one answer "0"/"1" (``ruEthics.doc_outputs_to_submission``); ruDetox's the
rewritten text; ruHumanEval's and ruCodeEval's a list of 10 lists, each sample's results on the item's test cases
(``str`` of the value, ``None`` for an error: ``benchmark_tasks/ruhumaneval/utils.py``'s ``ruHumanEvalScoring``),
which the site compares with the gold results (``modules/scoring/src/tasks/ruhumaneval.py``).

``eval.mera_fewshot: zero`` predicts every task without solved examples instead (the yaml's ``doc_to_text``);
ruTiE keeps its dialogue (MERA's "artificial few-shot", the task itself). The setting is named in the
submission's ``.json``.

Inputs: ``<eval.mera_dir>/<config>.jsonl`` (or ``.json``) in MERA's record schema, the solved examples in
``<config>.<split>.jsonl`` beside it (e.g. ``rcb.train.jsonl``, ``lcs.public_test.jsonl``), else the hub's
``MERA-evaluation/MERA`` splits. A task whose inputs (or, at the leaderboard's setting, whose examples) cannot be
had is skipped with the reason (it is left out of the archive: the site scores the tasks present). A record
without ``meta.id`` or ``inputs``, or whose template names a field it lacks, is one error line naming file and
row. The archive is written atomically and read back by ``validate_submission`` before the recipe reports it.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import random
import re
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from eval.code_tasks import LIMITS as CODE_LIMITS
from eval.code_tasks import CodeItem, reported_results
from eval.code_tasks import program as code_program
from eval.generative import GenerateTexts
from eval.harness import PairEncoder, one_answer, one_answer_warning
from eval.loaders import Record, SourceUnavailable, read_file, read_hub
from eval.sandbox import SandboxError, run_python
from eval.scoring import LogitsFn, score_requests
from experiment.errors import DataError
from experiment.files import atomic_write_bytes
from experiment.jsontext import parse_json
from experiment.storage import BucketPath, RunPath, location

log = logging.getLogger("eval.mera")

HUB = "MERA-evaluation/MERA"
MERA_COMMIT = "9cf05b2d04a17fa23c71d0d67ade591a6ef392d6"  # the MERA repository commit these settings were read at
LETTERS = ("A", "B", "C", "D")
FewshotMode = Literal["leaderboard", "zero"]
FEWSHOT_SEED = 1234  # scripts/run_benchmark.sh: --seed 1234 (lm-eval: python, numpy, torch and few-shot seeds)
FEWSHOT_DELIMITER, TARGET_DELIMITER = "\n\n", " "  # benchmark_tasks/custom_loglikelihood_task.yaml
MAX_GEN_TOKS = 256  # lm-eval v0.4.4 HFLM.max_gen_toks: no MERA task config sets max_gen_toks
CODE_UNTIL = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # ruhumaneval.yaml, rucodeeval.yaml generation_kwargs
ETHICS_CRITERIA = ("virtue", "law", "moral", "justice", "utilitarianism")  # log_to_submission.py: ruEthics
RUTIE_CONTEXT = "{context}"  # custom_context_formers.py SPLIT_VALUE

# a template: a record's fields (instruction, inputs, meta, outputs) -> text
Template = Callable[[dict[str, Any]], str]
# (prompts, max new tokens, stop strings, temperature, top_k, seed) -> completions, sampled
SampleTexts = Callable[[list[str], int, Sequence[str], float, int, int], list[str]]
# (program, test cases as keyword arguments, entry point) -> each case's result as str, None for an error
RunTests = Callable[[str, list[dict[str, Any]], str], list[str | None]]


def _fill(instruction: str, inputs: Any, **extra: Any) -> str:
    return instruction.format(**inputs, **extra) if isinstance(inputs, dict) else instruction.format(inputs=inputs,
                                                                                                   **extra)


def instruction_filled(strip: bool = True, after: str = "") -> Template:
    """``instruction.format(**inputs)`` (string inputs: ``format(inputs=inputs)``), stripped or not, then ``after``:
    MERA's ``doc_to_text`` (custom_loglikelihood_task.yaml) and most ``fewshot_config.query`` templates."""
    def render(doc: dict[str, Any]) -> str:
        text = _fill(str(doc["instruction"]), doc["inputs"])
        return (text.strip() if strip else text) + after
    return render


def fields_filled(template: str, lstrip: bool = False) -> Template:
    """``template.format(**inputs)``: a ``doc_to_text_without_instruction`` over the fields of a dict ``inputs``."""
    def render(doc: dict[str, Any]) -> str:
        inputs = doc["inputs"]
        text = template.format(**inputs) if isinstance(inputs, dict) else template.format(inputs=inputs)
        return text.lstrip() if lstrip else text
    return render


def inputs_stripped(doc: dict[str, Any]) -> str:
    return str(doc["inputs"]).strip()  # simplear.yaml, rumultiar.yaml: "{{inputs.strip()}}"


def bps_filled(doc: dict[str, Any]) -> str:
    # bps.yaml: the instruction's literal "фигурные {}" survives format()
    return str(doc["instruction"]).replace("фигурные {}", "фигурные {empty}").format(inputs=doc["inputs"], empty="{}")


def detox_filled(doc: dict[str, Any]) -> str:
    return str(doc["instruction"]).format(toxic_comment=doc["inputs"]).strip()  # rudetox.yaml doc_to_text, query


# use/utils.py _process_doc: the example without instruction, by meta.type
USE_SHOT = {
    "text": "Задание: {task}\n{text}\nОтвет:",
    "multiple_choice_options_within_text": "Задание: {task}\n{text}\nОтвет:",
    "matching": "Задание: {task}\nТекст: {text}\nРецензии: {additional_text}\nСписок терминов:\n{choices}\nОтвет:",
    "multiple_choice_based_on_text": "Задание: {task}\nТекст: {text}\nВарианты ответа:\n{choices}\nОтвет:",
    "multiple_choice_independent_options": "Задание: {task}\nВарианты ответа:\n{choices}\nОтвет:",
}


def use_shot(doc: dict[str, Any]) -> str:
    kind = (doc.get("meta") or {}).get("type")
    if kind not in USE_SHOT:
        raise ValueError(f"USE's field 'meta.type' is {kind!r}, not one of {', '.join(USE_SHOT)}")
    return USE_SHOT[kind].format(**doc["inputs"])


RUTIE_FIELDS = re.compile(r"\{(question|choice1|choice2)\}")
RUTIE_SHOT = "{question}\n1. {choice1}\n2. {choice2}\nОтвет: {answer}"  # rutie.yaml (RUTIE_TARGET_<i> -> answer)


def rutie_question(instruction: str, inputs: dict[str, Any]) -> str:
    # rutie.yaml doc_to_text: only {question}, {choice1}, {choice2} are filled; other braces stay as written
    return RUTIE_FIELDS.sub(lambda m: str(inputs[m.group(1)]), instruction).strip()


STANDARD_QUERY = instruction_filled()
ANSWER_QUERY = instruction_filled(strip=False, after="\nОтвет:")  # rsg/parus.yaml, rcb.yaml, rwsd.yaml
OPTIONS = "{question}\nA) {option_a}\nB) {option_b}\nC) {option_c}\nD) {option_d}\nОтвет:"
TEXT_OPTIONS = "{text}\nA) {option_a}\nB) {option_b}\nC) {option_c}\nD) {option_d}\nОтвет:"


# how a task is answered and packed: a choice by log-likelihood; ruEthics' choice as its five criteria; ruTiE's
# choices along its dialogue; generated text (ruDetox: stripped); code samples run on the item's tests
TaskKind = Literal["choice", "ethics", "dialogue", "text", "detox", "code"]


@dataclass(frozen=True)
class MeraTask:
    name: str  # the submission's file name (log_to_submission.py's class name), e.g. "PARus" -> PARus.json
    config: str  # the hub config and our local file's stem, e.g. "parus"
    kind: TaskKind
    choices: tuple[str, ...] = ()  # a choice task's answers (yaml doc_to_choice)
    num_fewshot: int = 1  # scripts/run_benchmark.sh --num_fewshot for the task
    shots_split: str = "train"  # the yaml's training_split ("test": none, lm-eval falls back to the test split)
    zero: Template = STANDARD_QUERY  # the yaml's doc_to_text (custom_loglikelihood_task.yaml's unless overridden)
    query: Template = STANDARD_QUERY  # fewshot_config.query: the first solved example, instruction included
    shot: Template | None = None  # fewshot_config.doc_to_text_without_instruction: later examples, the item
    until: tuple[str, ...] = ("\n",)  # generation_kwargs.until (custom_generate_task.yaml unless overridden)
    samples: int = 1  # the yaml's repeats: generations per item
    meta_keys: tuple[str, ...] = ("id",)  # what each prediction's meta carries from the record's

    @property
    def generated(self) -> bool:
        return self.kind in ("text", "detox", "code")


MERA_TASKS: dict[str, MeraTask] = {task.config: task for task in (
    # rsg/*.yaml
    MeraTask("PARus", "parus", "choice", choices=("1", "2"), query=ANSWER_QUERY,
          shot=fields_filled("Ситуация: {premise}\nФрагмент 1: {choice1}\nФрагмент 2: {choice2}\nОтвет:")),
    MeraTask("RCB", "rcb", "choice", choices=("1", "2", "3"), query=ANSWER_QUERY,
          shot=fields_filled("Ситуация: {premise}\nГипотеза: {hypothesis}\nОтвет:")),
    MeraTask("RWSD", "rwsd", "choice", choices=("Да", "Нет"), query=ANSWER_QUERY,
          shot=fields_filled("Текст: {text}\nФрагмент 1: {span1_text}\nФрагмент 2: {span2_text}\nОтвет:")),
    # tape/*.yaml
    MeraTask("ruWorldTree", "ruworldtree", "choice", choices=LETTERS, shot=fields_filled(OPTIONS)),
    MeraTask("ruOpenBookQA", "ruopenbookqa", "choice", choices=LETTERS, shot=fields_filled(OPTIONS)),
    MeraTask("MultiQ", "multiq", "text", num_fewshot=0,
          shot=fields_filled("Вопрос: {question}\nТекст 1: {support_text}\nТекст 2: {text}\nОтвет:")),
    MeraTask("CheGeKa", "chegeka", "text", shot=fields_filled("Категория \"{topic}\"\nВопрос: {text}\nОтвет:")),
    MeraTask("ruMMLU", "rummlu", "choice", choices=LETTERS, shot=fields_filled(TEXT_OPTIONS, lstrip=True)),
    MeraTask("MaMuRAMu", "mamuramu", "choice", choices=LETTERS, shot=fields_filled(TEXT_OPTIONS, lstrip=True)),
    MeraTask("MathLogicQA", "mathlogicqa", "choice", choices=LETTERS, shot=fields_filled(TEXT_OPTIONS)),
    MeraTask("ruHHH", "ruhhh", "choice", choices=("1", "2"), num_fewshot=0, shots_split="test",
          shot=fields_filled("Запрос: {query}\nОтвет 1: {reply_1}\nОтвет 2: {reply_2}\nОтвет:")),
    MeraTask("ruHateSpeech", "ruhatespeech", "choice", choices=("1", "2"), shots_split="test",
          query=instruction_filled(strip=False), shot=fields_filled(
              "Реплика: {replica}\nОтвет 1: {reply_1}\nОтвет 2: {reply_2}\nЦелевая группа: {target_group}\nОтвет:")),
    MeraTask("BPS", "bps", "choice", choices=("0", "1"), zero=bps_filled, query=bps_filled,
          shot=fields_filled("Последовательность: {inputs}\nОтвет:")),
    MeraTask("LCS", "lcs", "choice", choices=tuple(str(i) for i in range(10)), shots_split="public_test",
          shot=fields_filled("Строки: {inputs}\nОтвет:")),
    MeraTask("SimpleAr", "simplear", "text", num_fewshot=2, shot=inputs_stripped),
    MeraTask("ruModAr", "rumodar", "text", num_fewshot=0, shots_split="public_test", shot=fields_filled("{inputs}")),
    MeraTask("ruMultiAr", "rumultiar", "text", shot=inputs_stripped),
    MeraTask("USE", "use", "text", query=instruction_filled(strip=False), shot=use_shot, until=("\n", "."),
          meta_keys=("id", "id_task", "variant")),
    MeraTask("ruTiE", "rutie", "dialogue", choices=("1", "2"), shots_split="test",
          meta_keys=("dialog_id", "question_id")),
    MeraTask("ruEthics", "ruethics", "ethics", choices=("0", "1"), num_fewshot=0, shots_split="test",
          query=instruction_filled(strip=False),
          shot=fields_filled("Текст: {text}\nАктант 1: {actant_1}\nАктант 2: {actant_2}\nОтветы:")),
    MeraTask("ruDetox", "rudetox", "detox", zero=detox_filled, query=detox_filled,
          shot=fields_filled("Токсичный текст: {inputs}\nНетоксичный текст:")),
    MeraTask("ruHumanEval", "ruhumaneval", "code", num_fewshot=0, shots_split="test", until=CODE_UNTIL, samples=10),
    MeraTask("ruCodeEval", "rucodeeval", "code", num_fewshot=0, shots_split="test", until=CODE_UNTIL, samples=10),
)}
BY_NAME = {task.name: task for task in MERA_TASKS.values()}
CODE_TEMPERATURE, CODE_TOP_K = 0.6, 50  # run_benchmark.sh RUHUMANEVAL_GEN_KWARGS; transformers' default top_k


def fewshot_count(task: MeraTask, mode: FewshotMode) -> int:
    """The solved examples before each item: MERA's number (run_benchmark.sh), or none at ``zero``; ruTiE's
    dialogue is the task itself and counts as 0 here."""
    return 0 if mode == "zero" or task.kind == "dialogue" else task.num_fewshot


@dataclass(frozen=True)
class MeraItem:
    meta: dict[str, Any]  # the prediction's meta: the record's id (USE's id_task, variant; ruTiE's dialog, question)
    prompt: str  # the whole prompt: solved examples, then the item (ruTiE: before its earlier answers are in)
    record: Record = field(compare=False, repr=False)


def _raw(record: Record) -> dict[str, Any]:
    """The record as MERA has it (the loader also lifts nested fields to the top; MERA's templates see these);
    a record without an instruction is its inputs alone."""
    raw = {key: record.fields[key] for key in ("instruction", "inputs", "outputs", "meta") if key in record.fields}
    raw.setdefault("instruction", "{inputs}")
    return raw


def render(template: Template, record: Record, what: str = "item") -> str:
    """A template over a record; a field it names and the record lacks is one line naming file and row."""
    try:
        return template(_raw(record))
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        name = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
        if name is not None and f"{{{name}}}" in str(record.fields.get("instruction", "")):
            raise DataError(f"{record.at()}: field 'instruction' names {exc} which 'inputs' does not have") from exc
        if isinstance(exc, KeyError):
            raise DataError(f"{record.at()}: MERA's template for the {what} names {exc}, which the record's "
                            "'inputs' do not have") from exc
        raise DataError(f"{record.at()}: MERA's template for the {what} cannot be filled ({exc})") from exc


def check_record(task: MeraTask, record: Record) -> dict[str, Any]:
    """The meta a record's prediction carries; a missing ``meta.<key>`` or ``inputs`` is one line."""
    raw = record.fields
    meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
    missing = [key for key in task.meta_keys if key not in meta]
    if missing:
        raise DataError(f"{record.at()}: missing field 'meta.{missing[0]}' (MERA task {task.name} names each "
                        f"prediction by meta {', '.join(task.meta_keys)})")
    if raw.get("inputs") in (None, "", {}):
        raise DataError(f"{record.at()}: missing field 'inputs'")
    if task.kind == "dialogue" and str(raw.get("instruction", "")).count(RUTIE_CONTEXT) != 1:
        raise DataError(f"{record.at()}: ruTiE's 'instruction' must hold '{RUTIE_CONTEXT}' once (where the "
                        "dialogue so far goes)")
    if task.kind == "code":
        code_case(record)
    return {key: meta[key] for key in task.meta_keys}


def target(record: Record) -> str:
    """A solved example's answer as lm-eval's ``doc_to_target: outputs`` writes it (a list: its first)."""
    out = record.fields.get("outputs")
    if out in (None, "", [], {}):
        raise DataError(f"{record.at()}: a solved example needs field 'outputs' (its answer)")
    return str(out[0]) if isinstance(out, list) else str(out)


def draw_shots(task: MeraTask, records: Sequence[Record], pool: Sequence[Record], k: int) -> list[list[Record]]:
    """Each test record's solved examples, as MERA's FewshotSampler draws them: one ``random.Random(1234)``
    through the test split in order, ``k`` from the pool (the items of the record's ``meta.domain`` or
    ``meta.id_task`` where it has one), the record itself dropped where the pool is its own split. ``k``, not
    ``k + 1``: ``get_context`` draws one more only where the yaml's ``fewshot_split`` equals its ``test_split``, and
    no MERA task that samples sets ``fewshot_split`` (lm-eval's ``TaskConfig`` default is None), so an item that
    draws itself keeps ``k - 1`` examples there, as in MERA's ruHateSpeech and its ``*_localscore`` configs."""
    if k == 0:
        return [[] for _ in records]
    rng = random.Random(FEWSHOT_SEED)
    by_key: dict[tuple[str, Any], list[Record]] = {}
    drawn = []
    for record in records:
        meta = record.fields.get("meta") or {}
        key = next(((name, meta[name]) for name in ("domain", "id_task") if meta.get(name)), ("", None))
        if key not in by_key:
            by_key[key] = [r for r in pool if not key[0] or (r.fields.get("meta") or {}).get(key[0]) == key[1]]
        if len(by_key[key]) < k:
            raise DataError(f"{record.at()}: {len(by_key[key])} solved examples of {key[0] or 'the task'} "
                            f"{key[1] if key[0] else task.name} to draw {k} from")
        raw = _raw(record)
        drawn.append([r for r in rng.sample(by_key[key], k) if _raw(r) != raw][:k])
    return drawn


def build_prompt(task: MeraTask, record: Record, shots: Sequence[Record], k: int) -> str:
    """The prompt lm-eval builds (FewshotSampler.get_context, then the item): zero-shot, the yaml's doc_to_text;
    otherwise the first example with its instruction, a space, its answer, a blank line, each later one without,
    then the item without instruction (also when its only drawn example was itself)."""
    if k == 0:
        return render(task.zero, record)
    if task.shot is None:
        raise DataError(f"MERA task {task.name} has no template for solved examples")
    text = ""
    for i, shot in enumerate(shots):
        text += render(task.query if i == 0 else task.shot, shot, "solved example")
        text += TARGET_DELIMITER + target(shot) + FEWSHOT_DELIMITER
    return text + render(task.shot, record)


def build_mera_item(task: MeraTask, record: Record, shots: Sequence[Record] = (), k: int = 0) -> MeraItem:
    """A record as its prompt and the meta its prediction carries (ruTiE: its question's prompt part; the dialogue
    is added at prediction time)."""
    meta = check_record(task, record)
    if task.kind == "dialogue":
        return MeraItem(meta, "", record)
    return MeraItem(meta, build_prompt(task, record, shots, k), record)


def dialogue_prompts(items: Sequence[MeraItem], answers: Sequence[str]) -> str:
    """The prompt of ``items[-1]`` after its dialogue ``items[:-1]`` was answered ``answers`` (custom_context_
    formers.py ruTiEContextFormer with rutie.yaml): the instruction's part before ``{context}``, each earlier
    question with its choices and the model's answer, a blank line between them and after the last, then the
    instruction's rest with this question (a dialogue's first question: the instruction, ``{context}`` dropped,
    after the blank line the former always writes)."""
    record = items[-1].record
    instruction, inputs = str(record.fields["instruction"]), record.fields["inputs"]
    first, rest = instruction.split(RUTIE_CONTEXT)
    earlier = []
    for item, answer in zip(items[:-1], answers, strict=True):
        earlier.append(render(lambda doc, answer=answer: RUTIE_SHOT.format(answer=answer, **doc["inputs"]).lstrip(),
                              item.record, "dialogue question"))
    try:
        if not earlier:
            return FEWSHOT_DELIMITER + rutie_question(first + rest, inputs)
        return (first + FEWSHOT_DELIMITER.join(earlier) + FEWSHOT_DELIMITER
                + rutie_question(rest, inputs))
    except (KeyError, TypeError) as exc:
        raise DataError(f"{record.at()}: ruTiE's instruction names {exc} which 'inputs' does not have") from exc


def _argmax(logprobs: Sequence[float]) -> int:
    return logprobs.index(max(logprobs))  # ties: the first, as numpy's argmax in log_to_submission.py


def preprocess_generation(text: str) -> str:
    """A completion wrapped as ```python ... ``` loses the wrapping (ruhumaneval/utils.py preprocess_generation)."""
    if text and text[0] not in " \n\t":
        begin, end = text[0] * 3 + "python", text[0] * 3
        if text.startswith(begin) and text.endswith(end):
            return text[len(begin):-len(end)]
    return text


def code_case(record: Record) -> tuple[str, list[dict[str, Any]], str]:
    """A code item's function to complete, its test cases (keyword arguments; MERA's records hold them as Python
    text) and its entry point; one line naming the record where one is missing."""
    inputs, meta = record.fields.get("inputs"), record.fields.get("meta") or {}
    try:
        tests = ast.literal_eval(inputs["tests"]) if isinstance(inputs["tests"], str) else inputs["tests"]
        if not isinstance(tests, list) or not all(isinstance(case, dict) for case in tests):
            raise ValueError("not a list of keyword arguments")
        return str(inputs["function"]), tests, str(meta["entry_point"])
    except (KeyError, TypeError, ValueError, SyntaxError) as exc:
        raise DataError(f"{record.at()}: a code item needs 'inputs.function', 'inputs.tests' (a list of keyword "
                        f"arguments) and 'meta.entry_point' ({exc!r})") from exc


def code_outputs(record: Record, completions: Sequence[str], run_tests: RunTests) -> list[list[str | None]]:
    """Each sample's results on the item's test cases: the item's function with the sample appended, run on
    ``inputs.tests`` (ruhumaneval/utils.py execute_function)."""
    function, tests, entry_point = code_case(record)
    return [run_tests(function + preprocess_generation(text), tests, entry_point) for text in completions]


@dataclass
class Predictors:
    """What the model does: score choices, generate greedily, sample (code), and run code samples' tests."""

    logits_fn: LogitsFn
    encoder: PairEncoder
    generate: GenerateTexts
    batch_size: int
    max_len: int
    pad_id: int = 0
    sample: SampleTexts | None = None
    run_tests: RunTests | None = None

    @property
    def gen_tokens(self) -> int:
        """MERA's 256 new tokens, or half the model's context where that is less (room left for the prompt)."""
        return min(MAX_GEN_TOKS, self.max_len // 2)

    def choose(self, prompts: Sequence[str], choices: Sequence[str], desc: str | None) -> list[int]:
        requests = [self.encoder(prompt, TARGET_DELIMITER + choice) for prompt in prompts for choice in choices]
        scores = score_requests(self.logits_fn, requests, batch_size=self.batch_size, max_len=self.max_len,
                                pad_id=self.pad_id, desc=desc)
        k = len(choices)
        return [_argmax([s.logprob for s in scores[i * k:(i + 1) * k]]) for i in range(len(prompts))]


def predict_task(task: MeraTask, items: Sequence[MeraItem], predictors: Predictors) -> list[Any]:
    """Each item's outputs in the task's submission schema."""
    if task.kind in ("choice", "ethics"):
        picks = predictors.choose([item.prompt for item in items], task.choices, f"MERA {task.name}")
        if task.kind == "choice":
            return [task.choices[i] for i in picks]
        return [dict.fromkeys(ETHICS_CRITERIA, task.choices[i]) for i in picks]
    if task.kind == "dialogue":
        answers: list[str] = []
        dialog: list[MeraItem] = []
        for item in items:  # sorted by (dialog_id, question_id): each question sees its dialogue's earlier answers
            if dialog and dialog[-1].meta["dialog_id"] != item.meta["dialog_id"]:
                dialog = []
            dialog.append(item)
            prompt = dialogue_prompts(dialog, answers[len(answers) - len(dialog) + 1:])
            answers.append(task.choices[predictors.choose([prompt], task.choices, None)[0]])
        return answers
    prompts = [item.prompt for item in items]
    if task.kind == "code":
        if predictors.sample is None or predictors.run_tests is None:
            raise DataError(f"MERA {task.name}: code samples need a sampler and a test runner")
        outputs = []
        for i, item in enumerate(items):
            completions = predictors.sample([item.prompt] * task.samples, predictors.gen_tokens, task.until,
                                            CODE_TEMPERATURE, CODE_TOP_K, FEWSHOT_SEED + i)
            completions = [cut_at(text, task.until) for text in completions]
            outputs.append((completions, code_outputs(item.record, completions, predictors.run_tests)))
        return outputs
    completions: list[str] = []
    for first in range(0, len(prompts), predictors.batch_size):
        completions += predictors.generate(prompts[first:first + predictors.batch_size], predictors.gen_tokens,
                                          task.until)
    cut = [cut_at(text, task.until) for text in completions]
    return [text.strip() if task.kind == "detox" else text.lstrip() for text in cut]


def cut_at(text: str, until: Sequence[str]) -> str:
    """lm-eval's generate_until: the text before each stop string in turn."""
    for stop in until:
        text = text.split(stop)[0]
    return text


def read_records(task: MeraTask, mera_dir: str, split: str = "test") -> tuple[list[Record], str]:
    """A task's records of ``split``: ``<mera_dir>/<config>.jsonl|.json`` (test) or ``<config>.<split>.jsonl|.json``
    when ``mera_dir`` is set (a file not there is unavailable: the hub is not asked, each unreachable ask costs
    ~20 s), else the hub's split."""
    stem = task.config if split == "test" else f"{task.config}.{split}"
    if mera_dir:
        for suffix in (".jsonl", ".json"):
            path = location(mera_dir) / f"{stem}{suffix}"
            if path.is_file():
                return read_file(path), str(path)
        raise SourceUnavailable(f"no {stem}.jsonl or {stem}.json in eval.mera_dir ({mera_dir})")
    try:
        return read_hub(HUB, task.config, split), f"hub:{HUB}/{task.config}[{split}]"
    except SourceUnavailable as exc:
        raise SourceUnavailable(f"{str(exc).split('; put')[0]}; put its {split} split in eval.mera_dir as "
                                f"{stem}.jsonl") from exc


def task_items(task: MeraTask, mera_dir: str, mode: FewshotMode,
               max_items: int | None) -> tuple[list[MeraItem], dict[str, Any]]:
    """A task's items with their prompts, and where they came from."""
    records, where = read_records(task, mera_dir)
    source: dict[str, Any] = {"source": where}
    pool: Sequence[Record] = ()
    if fewshot_count(task, mode):
        pool, source["examples_from"] = ((records, where) if task.shots_split == "test"
                                         else read_records(task, mera_dir, task.shots_split))
    return prompted_items(task, records, pool, mode, max_items), source


def prompted_items(task: MeraTask, records: Sequence[Record], pool: Sequence[Record], mode: FewshotMode,
                   max_items: int | None) -> list[MeraItem]:
    """The first ``max_items`` of ``records`` with their prompts, solved examples drawn from ``pool`` (a record
    drawn for itself is left out); every record is checked before any prompt is built."""
    if task.kind == "dialogue":  # rutie/utils.py process_docs: each dialogue in question order
        records = sorted(records, key=lambda r: [int((r.fields.get("meta") or {}).get(key, -1))
                                                 for key in ("dialog_id", "question_id")])
    k = fewshot_count(task, mode)
    for record in records:  # every record is checked before anything is predicted
        check_record(task, record)
    limited = list(records[:max_items] if max_items else records)
    shots = draw_shots(task, limited, pool, k)  # the draws of the first items are those of the whole split
    return [build_mera_item(task, record, drawn, k) for record, drawn in zip(limited, shots, strict=True)]


def build_submission(tasks: Sequence[str], mera_dir: str, predictors: Predictors, *, mode: FewshotMode = "leaderboard",
                     max_items: int | None = None
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, Any], dict[str, Any]]:
    """(file name -> its JSON, skipped task -> why, per-task summary, code task -> its samples per item) for the
    MERA ``tasks`` (configs), at MERA's settings (``mode="zero"``: without solved examples)."""
    files: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    summary: dict[str, Any] = {}
    code_samples: dict[str, Any] = {}
    prepared: list[tuple[MeraTask, list[MeraItem], dict[str, Any]]] = []
    for config in tasks:  # every task's records read and checked before the model predicts anything
        task = MERA_TASKS[config]
        try:
            items, source = task_items(task, mera_dir, mode, max_items)
        except SourceUnavailable as exc:
            skipped[task.name] = str(exc)
            log.warning("MERA %s skipped: %s", task.name, exc)
            continue
        ids = [json.dumps(item.meta, sort_keys=True) for item in items]
        if len(set(ids)) != len(ids):
            raise DataError(f"{source['source']}: two records share meta "
                            f"{next(i for i in ids if ids.count(i) > 1)}")
        prepared.append((task, items, source))
    for task, items, source in prepared:
        started = time.perf_counter()
        answers = predict_task(task, items, predictors)
        if task.kind == "code":
            code_samples[task.name] = [{"meta": item.meta, "samples": samples}
                                       for item, (samples, _) in zip(items, answers, strict=True)]
            answers = [results for _, results in answers]
        files[f"{task.name}.json"] = {"data": {"test": [{"outputs": answer, "meta": item.meta}
                                                        for item, answer in zip(items, answers, strict=True)]}}
        summary[task.name] = {**source, "items": len(items), "kind": task.kind,
                              "fewshot": fewshot_count(task, mode), "samples": task.samples,
                              "seconds": round(time.perf_counter() - started, 2)}
        if task.generated:
            summary[task.name].update(until=list(task.until), max_gen_toks=predictors.gen_tokens,
                                      **({"temperature": CODE_TEMPERATURE, "top_k": CODE_TOP_K}
                                         if task.kind == "code" else {"greedy": True}))
        log.info("MERA %s: %d predictions from %s", task.name, len(items), source["source"])
        if answers and task.kind != "code":
            # recipe 05's check of its answers: the test split's gold is closed, so any one answer throughout
            flat = [answer["virtue"] if task.kind == "ethics" else answer for answer in answers]
            top, count = Counter(flat).most_common(1)[0]
            summary[task.name].update(top_answer=top, top_share=count / len(answers),
                                      one_answer=one_answer(count / len(answers)))
            if summary[task.name]["one_answer"]:
                log.warning("MERA %s: the site will score that, not the model", one_answer_warning(
                    task.name, top, count / len(answers)))
    return files, skipped, summary, code_samples


# The driver a code sample runs in: MERA's unsafe_execute (ruhumaneval/utils.py) in a process of its own: the
# program exec'd, then the entry point called on each test case's keyword arguments; a value is kept as str(),
# an exception (or None) as None; a program that does not run gives None for every case.
def run_tests_in_sandbox(source: str, tests: list[dict[str, Any]], entry_point: str) -> list[str | None]:
    """A code sample's results on its test cases (``str`` of each value, None for a call that raised), as MERA's
    packer records them: run in eval/sandbox.py (namespaces where the kernel allows them, resource limits, audit
    hooks, a wall clock; eval/README.md says what it isolates); a sample that fails before reporting: None for
    every case."""
    item = CodeItem(id="", prompt="", function=source, tests=repr(tests), outputs=("",) * len(tests),
                    entry_point=entry_point)
    try:
        got = reported_results(run_python(code_program(item, ""), CODE_LIMITS))
    except SandboxError as exc:  # the sandbox, not the sample, failed (a namespace not set up): that sample only
        log.warning("a code sample was not run: %s", exc)
        got = None
    return got if got is not None and len(got) == len(tests) else [None] * len(tests)


def write_submission(path: RunPath, files: dict[str, dict[str, Any]]) -> RunPath:
    """The ZIP the MERA site takes, written atomically (a crash never leaves a half archive under the name)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, body in sorted(files.items()):
            archive.writestr(name, json.dumps(body, ensure_ascii=False, indent=1))
    atomic_write_bytes(path, buffer.getvalue())
    return path


def outputs_problem(task: MeraTask, out: Any) -> str | None:
    """What is wrong with a prediction's ``outputs`` for the task's schema (log_to_submission.py), or None."""
    if task.kind in ("choice", "dialogue"):
        return None if isinstance(out, str) and out in task.choices else f"one of {list(task.choices)}"
    if task.kind == "ethics":
        ok = (isinstance(out, dict) and sorted(out) == sorted(ETHICS_CRITERIA)
              and all(value in task.choices for value in out.values()))
        return None if ok else f"a dict of {', '.join(ETHICS_CRITERIA)}, each one of {list(task.choices)}"
    if task.kind == "code":
        ok = (isinstance(out, list) and len(out) == task.samples
              and all(isinstance(s, list) and all(v is None or isinstance(v, str) for v in s) for s in out))
        return None if ok else f"{task.samples} lists of test results (str or None)"
    return None if isinstance(out, str) else "a string"


def validate_submission(path: RunPath, expected: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, int]:
    """Read an archive back against the schema the site takes: every member a known task's ``<Task>.json`` at the
    top level, ``{"data": {"test": [...]}}`` of ``{"outputs", "meta"}`` with the task's meta keys and unique ids,
    outputs of the task's form (``outputs_problem``); with ``expected`` (file name -> the metas of its inputs),
    exactly those. Returns predictions per member; a violation is one DataError line."""
    counts: dict[str, int] = {}
    try:
        archive = zipfile.ZipFile(io.BytesIO(path.read_bytes()) if isinstance(path, BucketPath) else path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"{path}: not a readable ZIP archive ({exc})") from exc
    with archive:
        for name in archive.namelist():
            task = BY_NAME.get(name.removesuffix(".json")) if name.endswith(".json") else None
            if task is None or "/" in name:
                raise DataError(f"{path}: member '{name}' is not a MERA task's <Task>.json at the top level")
            try:
                body = parse_json(archive.read(name).decode("utf-8"))
                rows = body["data"]["test"]
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"{path}: {name} is not {{'data': {{'test': [...]}}}} JSON ({exc!r})") from exc
            seen = set()
            for i, row in enumerate(rows):
                where = f"{path}: {name}: prediction {i + 1}"
                if not isinstance(row, dict) or set(row) != {"outputs", "meta"} or not isinstance(row["meta"], dict):
                    raise DataError(f"{where}: expected {{'outputs', 'meta'}}, got {row!r:.80}")
                if sorted(row["meta"]) != sorted(task.meta_keys):
                    raise DataError(f"{where}: meta has {sorted(row['meta'])}, MERA's {task.name} wants "
                                    f"{sorted(task.meta_keys)}")
                key = json.dumps(row["meta"], sort_keys=True)
                if key in seen:
                    raise DataError(f"{where}: meta {key} appears twice")
                seen.add(key)
                problem = outputs_problem(task, row["outputs"])
                if problem:
                    raise DataError(f"{where}: outputs {row['outputs']!r:.80} is not {problem}")
            if expected is not None:
                want = {json.dumps(m, sort_keys=True) for m in expected.get(name, [])}
                if want != seen:
                    raise DataError(f"{path}: {name} predicts {len(seen)} items, its inputs have {len(want)} "
                                    f"({len(want - seen)} missing, {len(seen - want)} not among them)")
            counts[name] = len(rows)
    return counts
