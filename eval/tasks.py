"""The task registry: every benchmark described as data (source, prompt, choices, gold, metrics).

An item is scored as a choice between continuations: each choice ``i`` is a (context_i,
continuation_i) pair and the model's log-likelihood of continuation_i given context_i decides.
Multiple-choice tasks share one context; RuBLiMP has an empty context and the two sentences as
continuations (the grammatical one must score higher); Winograd-style tasks vary the context and
score the shared rest of the sentence. Every item starts a new document (EOS before it).

Templates are ``str.format`` strings over a record's fields. Answers are scored as text (the
FineTasks way, where small base models rise above chance), never as letters.

A source is a local file or a hub split; each source is also a record schema (the fields its
templates name plus ``gold_field`` with its ``gold_values``). A file given as ``eval.task_files.<task>``
may be in any of its task's schemas: the one named by ``eval.task_schemas.<task>``, else the one its
first record fits (``schema_of``); a record that fits none is named with every schema's fields, and a
later record that does not fit the file's schema with that schema's fields. Labels are ``gold`` or ``silver`` (crowd
majority); silver is reported.
"""

from __future__ import annotations

import difflib
import json
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from eval.loaders import Record
from experiment.errors import ConfigError, DataError
from experiment.jsontext import parse_json
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.eval import MERA_CONFIGS, EvalConfig

BENCH = "{bench}"  # replaced by eval.bench_dir


@dataclass(frozen=True)
class Source:
    """Where the items come from and which field holds the answer there."""

    path: str  # local file (may start with {bench}) or a hub dataset id
    gold_field: str
    gold_values: tuple[str, ...]  # the gold field's value for choice 0, 1, ...
    hub: bool = False
    config: str | None = None
    split: str = "test"
    labels: str = "gold"  # "gold" or "silver" (crowd majority vote)
    schema: str = ""  # the schema's name in errors and docs ("" : "local" or "hub")

    def schema_name(self) -> str:
        return self.schema or ("hub" if self.hub else "local")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    description: str
    sources: tuple[Source, ...]  # tried in order: the first local file that exists, else the hub
    choices: tuple[str, ...] = ()  # continuation template per choice
    context: str = ""  # shared context template
    contexts: tuple[str, ...] = ()  # per-choice context templates (Winograd style) instead of ``context``
    choices_field: str | None = None  # a list field holding the continuations instead of ``choices``
    choice_prefix: str = " "  # put before each continuation from ``choices_field``
    prepare: str | None = None  # name in PREPARERS: derives fields a template needs
    metrics: tuple[str, ...] = ("acc", "acc_norm_chars", "acc_norm_bytes")
    group_field: str | None = None  # report accuracy per value of this field too
    fewshot_ok: bool = True  # minimal pairs have no prompt to put examples in front of
    directory: bool = False  # the source path is a folder of CSV files (RuBLiMP: one per phenomenon)


@dataclass(frozen=True)
class Item:
    task: str
    id: str  # "<file>:<row>", stable across runs
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    group: str | None = None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _prepare_parus(fields: dict[str, Any]) -> dict[str, Any]:
    """COPA style: 'premise потому что choice' for causes, 'premise поэтому choice' for effects."""
    question = str(fields["question"])
    if question not in ("cause", "effect"):
        question = "cause" if "причин" in question.lower() else "effect"
    connector = "потому что" if question == "cause" else "поэтому"
    premise = str(fields["premise"]).rstrip().rstrip(".!?…")
    return {**fields, "stem": f"{premise} {connector}",
            "choice1_text": _lower_first(str(fields["sent1" if "sent1" in fields else "choice1"])),
            "choice2_text": _lower_first(str(fields["sent2" if "sent2" in fields else "choice2"]))}


_EDGE_PUNCTUATION = "\"'«»„“”.,;:!?…()[]-—– "


def _json_field(value: Any) -> Any:
    """A list field as the JSON text a CSV or TSV copy stores it in."""
    if isinstance(value, str) and value.strip()[:1] == "[":
        try:
            return parse_json(value)
        except json.JSONDecodeError as exc:
            raise KeyError(f"{value[:30]!r} (not valid JSON: {exc.msg})") from exc
    return value


def _spec_text(spec: Any) -> str:
    """The raw text of an XWinograd release span: a string, or ``[raw text, token range, tokens, ...]``."""
    return str(spec[0] if isinstance(spec, list) and spec else spec)


def _locate_pronoun(text: str, pronoun: str, candidates: Sequence[str]) -> tuple[int, int]:
    """Where the pronoun stands in the text: its first whole-word occurrence after both candidates were
    first mentioned (the pronoun refers back to them), else its last occurrence."""
    hits = [m.span() for m in re.finditer(rf"(?<!\w){re.escape(pronoun)}(?!\w)", text)]
    if not hits:
        raise KeyError(f"pronoun ({pronoun!r} does not occur in 'text')")
    mentions = [text.find(c) for c in candidates]
    after = max(mentions) if all(m >= 0 for m in mentions) else -1
    return next((span for span in hits if span[0] > after), hits[-1])


def _prepare_winograd_release(fields: dict[str, Any]) -> dict[str, Any]:
    """XWinograd's original release (``text``, ``pronoun``, ``candidates``, ``label``) as the hub's
    sentence with a blank: the pronoun's span becomes ``_``. The pronoun loses the punctuation a span
    may carry ("его."), which stays in the sentence: otherwise nothing after the blank is left to score."""
    candidates = _json_field(fields["candidates"])
    if not isinstance(candidates, list) or len(candidates) != 2:
        raise KeyError("candidates (a list of two answers)")
    options = [_spec_text(c).strip(_EDGE_PUNCTUATION) for c in candidates]
    pronoun = _spec_text(_json_field(fields["pronoun"])).strip(_EDGE_PUNCTUATION)
    if not pronoun or not all(options):
        raise KeyError("pronoun (empty after trimming punctuation)" if not pronoun else "candidates (an empty answer)")
    text = str(fields["text"])
    start, end = _locate_pronoun(text, pronoun, options)
    label = fields.get("label")
    if label in (None, ""):  # the release marks the right candidate inside its spec: [text, range, tokens, true]
        flags = [bool(c[-1]) if isinstance(c, list) and len(c) >= 4 else None for c in candidates]
        if flags.count(True) != 1:
            raise KeyError("label")
        label = flags.index(True)
    return {**fields, "sentence": f"{text[:start]}_{text[end:]}", "option1": options[0], "option2": options[1],
            "label": str(label)}


def _prepare_winograd(fields: dict[str, Any]) -> dict[str, Any]:
    """Split the sentence at '_': each option fills the blank, the rest of the sentence is scored."""
    if "sentence" not in fields and "text" in fields:
        fields = _prepare_winograd_release(fields)
    sentence = str(fields["sentence"])
    if "_" not in sentence:
        raise KeyError("sentence (no '_' blank in it)")
    head, tail = sentence.split("_", 1)
    if not tail.strip():
        raise KeyError("sentence (nothing after the '_' blank to score)")
    return {**fields, "head": head, "tail": tail.strip()}


def _prepare_story(fields: dict[str, Any]) -> dict[str, Any]:
    story = " ".join(str(fields[f"input_sentence_{i}"]) for i in range(1, 5))
    return {**fields, "story": story}


def _prepare_hellaswag(fields: dict[str, Any]) -> dict[str, Any]:
    def clean(text: str) -> str:  # WikiHow artefacts, as lm-evaluation-harness removes them
        return " ".join(text.replace(" [title]", ". ").replace("[header]", "").replace("[step]", "").split())

    ctx = fields["ctx"] if "ctx" in fields else f"{fields['ctx_a']} {str(fields['ctx_b']).capitalize()}"
    endings = fields["endings"]
    if isinstance(endings, str):  # a CSV copy stores the list as JSON text

        endings = parse_json(endings)
    return {**fields, "query": clean(f"{fields.get('activity_label', '')}: {ctx}".lstrip(": ")),
            "endings": [clean(str(e)) for e in endings]}


PREPARERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "parus": _prepare_parus, "winograd": _prepare_winograd, "story": _prepare_story, "hellaswag": _prepare_hellaswag,
}
# the record fields each preparer reads ('a|b': either), for errors that say what a schema expects
PREPARED_FROM: dict[str, tuple[str, ...]] = {
    "parus": ("premise", "question", "sent1|choice1", "sent2|choice2"),
    "winograd": ("sentence (with '_')", "option1", "option2"),
    "story": ("input_sentence_1", "input_sentence_2", "input_sentence_3", "input_sentence_4"),
    "hellaswag": ("ctx|ctx_a+ctx_b",),
}

_MC4_CHOICES = (" {option_a}", " {option_b}", " {option_c}", " {option_d}")
_LETTERS = ("A", "B", "C", "D")


def _mera(name: str, config: str, description: str, question: str) -> TaskSpec:
    return TaskSpec(
        name=name, description=description, context=f"Вопрос: {question}\nОтвет:", choices=_MC4_CHOICES,
        sources=(Source("MERA-evaluation/MERA", "outputs", _LETTERS, hub=True, config=config, split="train"),),
    )


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec(
        name="rublimp", description="RuBLiMP minimal pairs: the grammatical sentence must score higher",
        sources=(Source("{rublimp_dir}", "", ("",)),), directory=True,
        # summed log-likelihood favours the shorter sentence; per-token and per-byte means are reported beside it
        choices=("{source_sentence}", "{target_sentence}"), metrics=("acc", "acc_per_token", "acc_norm_bytes"),
        group_field="PID", fewshot_ok=False,
    ),
    TaskSpec(
        name="parus", description="PARus (Russian COPA): the more plausible cause or effect",
        context="{stem}", choices=(" {choice1_text}", " {choice2_text}"), prepare="parus",
        sources=(Source(f"{BENCH}/rsg_humanbench/parus_test_items_human_mv.jsonl", "human_majority", ("0", "1"),
                        labels="silver"),
                 Source("RussianNLP/russian_super_glue", "label", ("0", "1"), hub=True, config="parus",
                        split="validation")),
    ),
    TaskSpec(
        name="terra", description="TERRa textual entailment",
        context="{premise}\nВопрос: {hypothesis} Верно или неверно?\nОтвет:", choices=(" Верно", " Неверно"),
        metrics=("acc", "acc_norm_chars", "acc_norm_bytes", "mcc"),
        sources=(Source(f"{BENCH}/terra/train.jsonl", "label", ("entailment", "not_entailment"), split="train"),
                 Source("RussianNLP/russian_super_glue", "label", ("0", "1"), hub=True, config="terra",
                        split="validation")),
    ),
    TaskSpec(
        name="rcb", description="RCB (Russian CommitmentBank): entailment, contradiction or neutral",
        context="{premise}\nВопрос: {hypothesis} Верно, неверно или неизвестно?\nОтвет:",
        choices=(" Верно", " Неверно", " Неизвестно"),
        # MERA's RCB answers: 1 entailment, 2 contradiction, 3 neutral.
        sources=(Source(f"{BENCH}/mera_humanbench/rcb_items_human_mv.jsonl", "human_majority", ("1", "2", "3"),
                        labels="silver"),
                 Source("RussianNLP/russian_super_glue", "label", ("0", "1", "2"), hub=True, config="rcb",
                        split="validation")),
    ),
    TaskSpec(
        name="rucola", description="RuCoLA linguistic acceptability (MCC)",
        context="{sentence}\nВопрос: Это предложение грамматически правильное?\nОтвет:", choices=(" Нет", " Да"),
        metrics=("acc", "mcc"),
        sources=(Source(f"{BENCH}/rucola/in_domain_dev.csv", "acceptable", ("0", "1"), split="dev"),
                 Source("RussianNLP/rucola", "label", ("0", "1"), hub=True, split="validation")),
    ),
    TaskSpec(
        name="xwinograd_ru", description="XWinograd (ru): the option that makes the rest of the sentence likely",
        contexts=("{head}{option1}", "{head}{option2}"), choices=(" {tail}", " {tail}"), prepare="winograd",
        metrics=("acc",),
        # the original release's records (text, pronoun, candidates, label) are read too: see _prepare_winograd
        sources=(Source(f"{BENCH}/xwinograd/ru.jsonl", "label", ("0", "1"), schema="release"),
                 Source("Muennighoff/xwinograd", "answer", ("1", "2"), hub=True, config="ru", split="test")),
    ),
    TaskSpec(
        name="xstorycloze_ru", description="XStoryCloze (ru): the right ending of a four-sentence story",
        context="{story}", choices=(" {sentence_quiz1}", " {sentence_quiz2}"), prepare="story",
        sources=(Source("juletxara/xstory_cloze", "answer_right_ending", ("1", "2"), hub=True, config="ru",
                        split="eval"),),
    ),
    TaskSpec(
        name="hellaswag_ru", description="HellaSwag (ru, Okapi translation): the most plausible continuation",
        context="{query}", choices_field="endings", prepare="hellaswag",
        sources=(Source("alexandrainst/m_hellaswag", "label", ("0", "1", "2", "3"), hub=True, config="ru",
                        split="val"),),
    ),
    TaskSpec(
        name="belebele_rus_Cyrl", description="Belebele (rus_Cyrl): reading comprehension, four answers",
        context="{flores_passage}\nВопрос: {question}\nОтвет:",
        choices=(" {mc_answer1}", " {mc_answer2}", " {mc_answer3}", " {mc_answer4}"),
        sources=(Source("facebook/belebele", "correct_answer_num", ("1", "2", "3", "4"), hub=True,
                        config="rus_Cyrl", split="test"),),
    ),
    TaskSpec(
        name="xnli_ru", description="XNLI (ru): entailment, neutral or contradiction as 'Да/Также/Нет'",
        contexts=("", "", ""),
        choices=("{premise}, верно? Да, {hypothesis}", "{premise}, верно? Также, {hypothesis}",
                 "{premise}, верно? Нет, {hypothesis}"),
        sources=(Source("facebook/xnli", "label", ("0", "1", "2"), hub=True, config="ru", split="validation"),),
    ),
    TaskSpec(
        name="ruworldtree", description="ruWorldTree (MERA): elementary science questions, four answers",
        context="Вопрос: {question}\nОтвет:", choices=_MC4_CHOICES,
        sources=(Source(f"{BENCH}/mera_humanbench/ruworldtree_items_human_mv.jsonl", "human_majority", _LETTERS,
                        labels="silver"),
                 Source("MERA-evaluation/MERA", "outputs", _LETTERS, hub=True, config="ruworldtree", split="train")),
    ),
    _mera("ruopenbookqa", "ruopenbookqa", "ruOpenBookQA (MERA): science questions, four answers", "{question}"),
    _mera("rummlu", "rummlu", "ruMMLU (MERA): 57 subjects, four answers", "{text}"),
)}


# generative tasks (scored by eval/generative.py): the model writes the answer, exact match decides


@dataclass(frozen=True)
class GenSource:
    path: str  # a local file (may start with {bench}) or a hub dataset id
    schema: str  # "mera" or "humanbench"
    hub: bool = False
    config: str | None = None
    split: str = "train"
    labels: str = "gold"


@dataclass(frozen=True)
class GenerativeTask:
    name: str
    description: str
    sources: tuple[GenSource, ...]
    instruction: str  # the query for a record without its own instruction; {inputs} is the item's
    num_fewshot: int  # MERA's
    max_new_tokens: int = 16
    stop: tuple[str, ...] = ("\n",)
    # "exact": the answer equals the gold; "squad": SQuAD's token F1 and exact match after its normalization, the
    # best over the gold answers (MERA's MultiQ scorer)
    scoring: Literal["exact", "squad"] = "exact"
    # a record whose inputs are fields (a dict): how they read as a solved example's text (MERA's
    # doc_to_text_without_instruction); the instruction fills them by name
    example: str = ""
    passage: str = ""  # the inputs field holding the text an answer is taken from (squad: the text_start baseline)


GENERATIVE_TASKS: dict[str, GenerativeTask] = {task.name: task for task in (
    GenerativeTask(
        name="simplear", description="SimpleAr (MERA): add two numbers, the answer written out",
        sources=(GenSource(f"{BENCH}/mera_humanbench/simplear_items_human_mv.jsonl", "humanbench",
                           labels="gold (computed from the formula)"),
                 GenSource("MERA-evaluation/MERA", "mera", hub=True, config="simplear")),
        instruction="Вычислите значение выражения.\n{inputs} =", num_fewshot=2),
    GenerativeTask(
        name="rumultiar",
        description="ruMultiArithmetic (MERA): a nested arithmetic expression, the answer written out",
        sources=(GenSource("MERA-evaluation/MERA", "mera", hub=True, config="rumultiar"),),
        instruction="Вычислите значение выражения.\n{inputs}", num_fewshot=1),
    GenerativeTask(
        name="multiq", description="MultiQ (MERA): a question answered by a span of two linked texts (multi-hop), "
                                   "scored by token F1 and exact match",
        sources=(GenSource("MERA-evaluation/MERA", "mera", hub=True, config="multiq"),),
        instruction="Прочитайте два текста и ответьте на вопрос одним словом или словосочетанием из текста.\n"
                    "Вопрос: {question}\nТекст 1: {support_text}\nТекст 2: {text}\nОтвет:",
        example="Вопрос: {question}\nТекст 1: {support_text}\nТекст 2: {text}\nОтвет:",
        num_fewshot=0, max_new_tokens=32, scoring="squad", passage="text"),
)}


PASSKEY = "passkey"  # generated, not read: eval/passkey.py (settings: eval.passkey)
# MERA's tasks on labelled items, at its prompts and settings, scored by its scorer: mera_<config> (eval/mera_scores.py)
MERA_PREFIX = "mera_"
MERA_LOCAL_TASKS = tuple(MERA_PREFIX + config for config in MERA_CONFIGS)


def known_task_names() -> list[str]:
    """Every task recipe 05 can score: the log-likelihood ones, the generative ones (eval/generative.py), the
    passkey retrieval (eval/passkey.py) and MERA's tasks as its scorer scores them (eval/mera_scores.py)."""
    return sorted({*TASKS, *GENERATIVE_TASKS, PASSKEY, *MERA_LOCAL_TASKS})


def check_task_names(eval_cfg: EvalConfig) -> None:
    """The configured task names (``eval.tasks``, ``eval.train_tasks``, ``eval.task_files``) are known;
    checked where recipe 05 starts and, before the first step, where recipe 04 starts."""
    known = known_task_names()
    for name in ("tasks", "train_tasks"):
        for task in getattr(eval_cfg, name):
            if task not in known:
                raise ConfigError(f"config key 'eval.{name}': unknown task '{task}'{_known_tasks(task)}")
    for task in eval_cfg.task_files:
        if task not in known:
            raise ConfigError(f"config key 'eval.task_files.{task}': unknown task{_known_tasks(task)}")
        if task == PASSKEY:
            raise ConfigError(f"config key 'eval.task_files.{task}': the passkey items are generated, not read "
                              "(its filler text: eval.passkey.filler_file)")
    for task in eval_cfg.task_schemas:
        if task not in TASKS:  # a generative task's schema is read from its records
            raise ConfigError(f"config key 'eval.task_schemas.{task}': unknown task{_known_tasks(task)}")
    for task, schema in eval_cfg.task_schemas.items():
        named_schema(TASKS[task], schema)


def check_eval_tasks(cfg: ExperimentConfig, run_folder: RunFolder) -> None:
    """The stage check of recipes 04 and 05 (experiment/check.py): ``check_task_names`` of ``cfg.eval``, before
    the run folder, its lock or a W&B run is written."""
    check_task_names(cfg.eval)


def _known_tasks(task: str) -> str:
    """The tail of an unknown task's error: the nearest known name, as for a misspelled config key, and all of them."""
    known = known_task_names()
    near = difflib.get_close_matches(task, known, n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return f"{hint} (known: {', '.join(known)})"


def named_schema(spec: TaskSpec, name: str) -> Source:
    """The task's source whose schema is called ``name`` (``eval.task_schemas.<task>``)."""
    for source in spec.sources:
        if source.schema_name() == name:
            return source
    raise ConfigError(f"config key 'eval.task_schemas.{spec.name}': task '{spec.name}' has no schema '{name}' "
                      f"(its schemas: {', '.join(s.schema_name() for s in spec.sources)})")


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise DataError(f"unknown eval task '{name}'{_known_tasks(name)}")
    return TASKS[name]


def template_fields(spec: TaskSpec) -> list[str]:
    """The record fields the prompt templates name (before ``prepare`` derives its own)."""
    names: list[str] = []
    for template in (spec.context, *spec.contexts, *spec.choices):
        names += [name for _, name, _, _ in string.Formatter().parse(template) if name and name not in names]
    return names


def _render(template: str, fields: dict[str, Any], record: Record) -> str:
    try:
        return template.format_map(fields)
    except KeyError as exc:
        raise DataError(f"{record.at()}: missing field '{exc.args[0]}'") from exc


def build_item(spec: TaskSpec, source: Source, record: Record, group: str | None = None) -> Item:
    """Turn one record into an item; a missing field or a gold value outside the choices is named."""
    fields = {k: ("" if v is None else v) for k, v in record.fields.items()}
    if spec.prepare:
        try:
            fields = PREPARERS[spec.prepare](fields)
        except KeyError as exc:
            raise DataError(f"{record.at()}: missing field '{exc.args[0]}'") from exc
    if spec.choices_field:
        options = fields.get(spec.choices_field)
        if not isinstance(options, list) or not options:
            raise DataError(f"{record.at()}: field '{spec.choices_field}' must be a non-empty list")
        continuations = tuple(spec.choice_prefix + str(o) for o in options)
    else:
        continuations = tuple(_render(t, fields, record) for t in spec.choices)
    contexts = (tuple(_render(t, fields, record) for t in spec.contexts) if spec.contexts
                else (_render(spec.context, fields, record),) * len(continuations))
    if not source.gold_field:  # minimal pairs: the first choice is the right one by construction
        gold = 0
    else:
        if source.gold_field not in fields or fields[source.gold_field] in (None, ""):  # a preparer may derive it
            raise DataError(f"{record.at()}: missing field '{source.gold_field}' (the gold answer)")
        value = str(fields[source.gold_field])
        if value not in source.gold_values[:len(continuations)]:
            raise DataError(f"{record.at()}: field '{source.gold_field}' has {value!r}, not one of "
                            f"{list(source.gold_values[:len(continuations)])}")
        gold = source.gold_values.index(value)
    for i, text in enumerate(continuations):
        if not text.strip():
            raise DataError(f"{record.at()}: choice {i} is empty")
    return Item(task=spec.name, id=f"{record.where}:{record.row}", contexts=contexts, continuations=continuations,
                gold=gold, group=group)


def expected_fields(spec: TaskSpec, source: Source) -> str:
    """What a record of this schema holds, in words: its fields and where the answer is."""
    derived = {"stem", "choice1_text", "choice2_text", "head", "tail", "story", "query"}
    names = [n for n in template_fields(spec) if n not in derived]
    if spec.prepare:
        names = [*PREPARED_FROM[spec.prepare], *(n for n in names if n not in PREPARED_FROM[spec.prepare])]
        if source.schema == "release":
            names = ["text", "pronoun", "candidates"]
    if spec.choices_field:
        names.append(f"{spec.choices_field} (list)")
    gold = f"; gold '{source.gold_field}' in {list(source.gold_values)}" if source.gold_field else ""
    return f"{source.schema_name()}: {', '.join(names)}{gold}"


def build_in_schema(spec: TaskSpec, source: Source, record: Record, how: str, group: str | None = None) -> Item:
    """``build_item`` for a record of a file read in one schema (``how``: why that schema); a record that
    does not fit it is one line naming the file, the row, what failed and the fields that schema expects."""
    try:
        return build_item(spec, source, record, group)
    except DataError as exc:
        raise DataError(f"{exc} (task '{spec.name}' reads this file in schema {expected_fields(spec, source)}, "
                        f"{how})") from exc


def schema_of(spec: TaskSpec, record: Record) -> Source:
    """The task's schema (one of its sources) a record fits: the first whose fields and gold values it
    has. A record that fits none is one error line naming what every schema expects and why it failed."""
    reasons = []
    for source in spec.sources:
        try:
            build_item(spec, source, record)
        except DataError as exc:
            reasons.append(f"{expected_fields(spec, source)} ({str(exc).removeprefix(record.at() + ': ')})")
            continue
        return source
    raise DataError(f"{record.at()}: fits no schema of task '{spec.name}': {' | '.join(reasons)}")


__all__ = ["TASKS", "Item", "Source", "TaskSpec", "build_in_schema", "build_item", "expected_fields", "get_task",
           "named_schema", "schema_of", "template_fields"]
