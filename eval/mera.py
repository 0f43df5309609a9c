"""A MERA leaderboard submission: predictions for MERA's closed test splits, packed as the archive the MERA site
takes (recipe 05c).

MERA (Fenogenova et al. 2024; MERA-Evaluation/MERA) keeps its test answers closed: a team runs its model on the
test inputs and uploads one ZIP holding ``<Task>.json`` per task, each ``{"data": {"test": [{"outputs": ...,
"meta": {"id": ...}}, ...]}}`` (the layout of MERA's own ``scripts/log_to_submission.py``; USE also carries
``meta.id_task`` and ``meta.variant``). We write the same without lm-eval in between:

- a choice task (PARus, RCB, ruWorldTree, ...) answers with the choice whose text, after the item's prompt, the
  model finds most likely (recipe 05's scoring: each item starts a document, ties go to the first);
- a text task (SimpleAr, ruModAr, ruMultiAr, MultiQ, CheGeKa, USE) answers with what our KV-cache decoder
  writes, greedy, up to the first newline.

The prompt is the record's ``instruction`` filled with its ``inputs`` (a string, or a dict whose keys the
instruction names), as MERA's lm-eval configs build the query; zero-shot: the test splits carry no solved
examples (MERA's official runs add a fixed number from the train splits, which are on the hub).

Inputs: ``<eval.mera_dir>/<config>.jsonl`` (or ``.json``) in MERA's record schema, else the hub's
``MERA-evaluation/MERA`` test split. A task whose inputs cannot be had is skipped with the reason (it is left out
of the archive: the site scores the tasks present). A record without ``meta.id`` or ``inputs``, or whose
instruction names a field it lacks, is one error line naming file and row. The archive is written atomically and
read back by ``validate_submission`` before the recipe reports it.
"""

from __future__ import annotations

import io
import json
import logging
import time
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.generative import GenerateTexts
from eval.harness import PairEncoder, one_answer, one_answer_warning
from eval.loaders import Record, SourceUnavailable, read_file, read_hub
from eval.scoring import LogitsFn, score_requests
from experiment.errors import DataError
from experiment.files import atomic_write_bytes, atomic_write_json
from experiment.jsontext import parse_json
from experiment.schema import ExperimentConfig
from experiment.stages import MERA
from experiment.storage import BucketPath, RunPath, location

log = logging.getLogger("eval.mera")

HUB = "MERA-evaluation/MERA"
LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class MeraTask:
    name: str  # the submission's file name (MERA's task class name), e.g. "PARus" -> PARus.json
    config: str  # the hub config and our local file's stem, e.g. "parus"
    choices: tuple[str, ...] = ()  # a choice task's answers; () : a text task (generated)
    max_new_tokens: int = 32
    meta_keys: tuple[str, ...] = ("id",)  # what each prediction's meta carries from the record's


MERA_TASKS: dict[str, MeraTask] = {task.config: task for task in (
    MeraTask("PARus", "parus", ("1", "2")),
    MeraTask("RCB", "rcb", ("1", "2", "3")),
    MeraTask("RWSD", "rwsd", ("Да", "Нет")),
    MeraTask("ruWorldTree", "ruworldtree", LETTERS),
    MeraTask("ruOpenBookQA", "ruopenbookqa", LETTERS),
    MeraTask("ruMMLU", "rummlu", LETTERS),
    MeraTask("MaMuRAMu", "mamuramu", LETTERS),
    MeraTask("MathLogicQA", "mathlogicqa", LETTERS),
    MeraTask("ruHHH", "ruhhh", ("1", "2")),
    MeraTask("ruHateSpeech", "ruhatespeech", ("1", "2")),
    MeraTask("BPS", "bps", ("0", "1")),
    MeraTask("LCS", "lcs", tuple(str(i) for i in range(10))),
    MeraTask("SimpleAr", "simplear", max_new_tokens=8),
    MeraTask("ruModAr", "rumodar", max_new_tokens=8),
    MeraTask("ruMultiAr", "rumultiar", max_new_tokens=8),
    MeraTask("MultiQ", "multiq"),
    MeraTask("CheGeKa", "chegeka"),
    MeraTask("USE", "use", max_new_tokens=16, meta_keys=("id", "id_task", "variant")),
)}
BY_NAME = {task.name: task for task in MERA_TASKS.values()}


@dataclass(frozen=True)
class MeraItem:
    meta: dict[str, Any]  # the prediction's meta: the record's id (and USE's id_task, variant)
    prompt: str


def read_records(task: MeraTask, mera_dir: str) -> tuple[list[Record], str]:
    """The test records of a task: ``<mera_dir>/<config>.jsonl|.json`` when ``mera_dir`` is set (a task without a
    file there is unavailable: the hub is not asked, each unreachable ask costs ~20 s), else the hub's test split."""
    if mera_dir:
        for suffix in (".jsonl", ".json"):
            path = location(mera_dir) / f"{task.config}{suffix}"
            if path.is_file():
                return read_file(path), str(path)
        raise SourceUnavailable(f"no {task.config}.jsonl or {task.config}.json in eval.mera_dir ({mera_dir})")
    try:
        return read_hub(HUB, task.config, "test"), f"hub:{HUB}/{task.config}[test]"
    except SourceUnavailable as exc:
        raise SourceUnavailable(f"{str(exc).split('; put')[0]}; put its test split in eval.mera_dir as "
                                f"{task.config}.jsonl") from exc


def build_mera_item(task: MeraTask, record: Record) -> MeraItem:
    """A record as a prompt and the meta its prediction carries; a missing field is one line naming file and row.
    (The loader lifts nested fields to the top level too, but keeps ``meta`` and a dict ``inputs`` as they are.)"""
    raw = record.fields
    meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
    missing = [key for key in task.meta_keys if key not in meta]
    if missing:
        raise DataError(f"{record.at()}: missing field 'meta.{missing[0]}' (MERA task {task.name} names each "
                        f"prediction by meta {', '.join(task.meta_keys)})")
    inputs = raw.get("inputs")
    if inputs in (None, "", {}):
        raise DataError(f"{record.at()}: missing field 'inputs'")
    instruction = str(raw.get("instruction") or "{inputs}")
    try:
        prompt = (instruction.format(**inputs) if isinstance(inputs, dict)
                  else instruction.format(inputs=inputs)).strip()
    except (KeyError, IndexError, ValueError) as exc:
        raise DataError(f"{record.at()}: field 'instruction' names {exc} which 'inputs' does not have") from exc
    return MeraItem({key: meta[key] for key in task.meta_keys}, prompt)


def predict_task(task: MeraTask, items: Sequence[MeraItem], *, logits_fn: LogitsFn, encoder: PairEncoder,
                 generate: GenerateTexts, batch_size: int, max_len: int, pad_id: int = 0) -> list[Any]:
    """Each item's answer: the most likely choice, or the generated text up to its first newline."""
    if not task.choices:
        outputs: list[str] = []
        prompts = [item.prompt for item in items]
        for first in range(0, len(prompts), batch_size):
            outputs += generate(prompts[first:first + batch_size], task.max_new_tokens, ("\n",))
        return [out.split("\n", 1)[0].strip() for out in outputs]
    requests = [encoder(item.prompt, " " + choice) for item in items for choice in task.choices]
    scores = score_requests(logits_fn, requests, batch_size=batch_size, max_len=max_len, pad_id=pad_id,
                            desc=f"MERA {task.name}")
    k = len(task.choices)
    answers = []
    for i in range(len(items)):
        logprobs = [s.logprob for s in scores[i * k:(i + 1) * k]]
        answers.append(task.choices[logprobs.index(max(logprobs))])
    return answers


def build_submission(tasks: Sequence[str], mera_dir: str, *, logits_fn: LogitsFn, encoder: PairEncoder,
                     generate: GenerateTexts, batch_size: int, max_len: int, pad_id: int = 0,
                     max_items: int | None = None) -> tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, Any]]:
    """(file name -> its JSON, skipped task -> why, per-task summary) for the MERA ``tasks`` (configs)."""
    files: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    summary: dict[str, Any] = {}
    for config in tasks:
        task = MERA_TASKS[config]
        try:
            records, where = read_records(task, mera_dir)
        except SourceUnavailable as exc:
            skipped[task.name] = str(exc)
            log.warning("MERA %s skipped: %s", task.name, exc)
            continue
        items = [build_mera_item(task, record) for record in records]
        items = items[:max_items] if max_items else items
        ids = [json.dumps(item.meta, sort_keys=True) for item in items]
        if len(set(ids)) != len(ids):
            raise DataError(f"{where}: two records share meta {next(i for i in ids if ids.count(i) > 1)}")
        started = time.perf_counter()
        answers = predict_task(task, items, logits_fn=logits_fn, encoder=encoder, generate=generate,
                               batch_size=batch_size, max_len=max_len, pad_id=pad_id)
        files[f"{task.name}.json"] = {"data": {"test": [{"outputs": answer, "meta": item.meta}
                                                        for item, answer in zip(items, answers, strict=True)]}}
        summary[task.name] = {"source": where, "items": len(items), "kind": "choice" if task.choices else "text",
                              "seconds": round(time.perf_counter() - started, 2)}
        log.info("MERA %s: %d predictions from %s", task.name, len(items), where)
        if answers:
            # recipe 05's check of its answers: the test split's gold is closed, so any one answer throughout
            top, count = Counter(answers).most_common(1)[0]
            summary[task.name].update(top_answer=top, top_share=count / len(answers),
                                      one_answer=one_answer(count / len(answers)))
            if summary[task.name]["one_answer"]:
                log.warning("MERA %s: the site will score that, not the model", one_answer_warning(
                    task.name, top, count / len(answers)))
    return files, skipped, summary


def write_submission(path: RunPath, files: dict[str, dict[str, Any]]) -> RunPath:
    """The ZIP the MERA site takes, written atomically (a crash never leaves a half archive under the name)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, body in sorted(files.items()):
            archive.writestr(name, json.dumps(body, ensure_ascii=False, indent=1))
    atomic_write_bytes(path, buffer.getvalue())
    return path


def validate_submission(path: RunPath, expected: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, int]:
    """Read an archive back against the schema the site takes: every member a known task's ``<Task>.json`` at the
    top level, ``{"data": {"test": [...]}}`` of ``{"outputs", "meta"}`` with the task's meta keys and unique ids,
    a choice task's outputs among its answers, a text task's a string; with ``expected`` (file name -> the metas of
    its inputs), exactly those. Returns predictions per member; a violation is one DataError line."""
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
                out = row["outputs"]
                if not isinstance(out, str) or (task.choices and out not in task.choices):
                    allowed = f"one of {list(task.choices)}" if task.choices else "a string"
                    raise DataError(f"{where}: outputs {out!r} is not {allowed}")
            if expected is not None:
                want = {json.dumps(m, sort_keys=True) for m in expected.get(name, [])}
                if want != seen:
                    raise DataError(f"{path}: {name} predicts {len(seen)} items, its inputs have {len(want)} "
                                    f"({len(want - seen)} missing, {len(seen - want)} not among them)")
            counts[name] = len(rows)
    return counts


def mera_submission(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any) -> Path:
    """Recipe 05c: the predictions of one checkpoint (``eval.checkpoint_step``, else the latest) for the MERA tasks
    ``eval.mera_tasks``, as ``mera/submission_step_NNNNNNN.zip`` (validated by reading it back) beside a
    ``.json`` saying what each task's inputs were and which tasks were skipped, and why."""
    from eval.run import max_len_of, step_name, text_generator
    from eval.scoring import model_logits_fn
    from tokenizer.loaded import load_run_tokenizer
    from trainer.trained_model import load_trained_model

    eval_cfg = cfg.eval  # its mera_tasks were checked against experiment.sections.eval.MERA_CONFIGS at load
    tok = load_run_tokenizer(run_folder.tokenizer)
    model, step, meta = load_trained_model(run_folder, step=eval_cfg.checkpoint_step)
    max_len = max_len_of(cfg, meta)
    files, skipped, summary = build_submission(
        eval_cfg.mera_tasks, eval_cfg.mera_dir, logits_fn=model_logits_fn(model),
        encoder=PairEncoder(tok.encode, tok.eos_id, tok.normalize), generate=text_generator(model, tok, max_len),
        batch_size=eval_cfg.batch_size, max_len=max_len, pad_id=tok.pad_id, max_items=eval_cfg.mera_max_items)
    if not files:
        raise DataError(f"no MERA task's test inputs could be read ({'; '.join(skipped.values())}): set "
                        "eval.mera_dir to a folder of <task>.jsonl files in MERA's schema")
    out = MERA.dir(run_folder) / f"submission_{step_name(int(step))}.zip"
    write_submission(out, files)
    counts = validate_submission(out, {name: [row["meta"] for row in body["data"]["test"]]
                                       for name, body in files.items()})
    atomic_write_json(out.with_suffix(".json"), {"step": int(step), "archive": out.name, "tasks": summary,
                                                 "predictions": counts, "skipped": skipped})
    flagged = [name for name, task in summary.items() if task.get("one_answer")]
    log.info("MERA submission of step %d: %s (%d tasks, %d predictions; skipped: %s; one answer throughout: %s)",
             step, out, len(counts), sum(counts.values()), ", ".join(skipped) or "none", ", ".join(flagged) or "none")
    print(out)
    if wandb_run is not None:
        wandb_run.summary.update({"mera/archive": str(out), "mera/tasks": len(counts), "mera/step": int(step),
                                  "mera/one_answer_tasks": len(flagged)})
    return out
