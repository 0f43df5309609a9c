"""Recipe 05's word per task on the training corpus: decontaminated against it or not, read from the corpus
manifest of the run folder (recipe 01 records its index there: data_prep/corpus/build.py)."""

from __future__ import annotations

import logging
from typing import Any

from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import CORPUS

log = logging.getLogger("eval.decontam")

KEY = "corpus.decontamination"


def other_data(cfg: ExperimentConfig) -> str:
    """What the run trained on besides its own folder's corpus, which the status below does not check: a branch's
    parent's steps, a mixture's sets in other folders ("" for none)."""
    parts = [f"its parent {cfg.train.branch_from}'s data up to step {cfg.train.branch_step}"
             if cfg.train.branch_from else "", *(f"mixture set '{m.name}'" for m in cfg.train.mixture if m.shards)]
    return ", ".join(part for part in parts if part)


def decontamination_status(run_folder: RunFolder, tasks: dict[str, Any], other: str = "") -> dict[str, str]:
    """Recipe 05's line per scored task: whether the corpus of this run folder was decontaminated against it,
    read from the corpus manifest (and against the same source as the evaluation read); ``other``: what else the
    run trained on (``other_data``), named as not checked."""
    status = _own_corpus_status(run_folder, tasks)
    if other:
        status = {task: f"{line} (its own corpus; not checked here: {other})" for task, line in status.items()}
    return status


def _own_corpus_status(run_folder: RunFolder, tasks: dict[str, Any]) -> dict[str, str]:
    manifest = CORPUS.read_manifest_if_present(run_folder.corpus)
    record = (manifest or {}).get("decontamination") or {}
    status: dict[str, str] = {}
    for task, result in tasks.items():
        if manifest is None:
            status[task] = f"unknown: no finished corpus in {run_folder.corpus}"
        elif not record.get("enabled"):
            status[task] = "NOT decontaminated: the corpus was built without decontamination"
        elif task in record.get("not_decontaminated", {}):
            status[task] = f"NOT decontaminated: {record['not_decontaminated'][task]}"
        elif task not in record.get("benchmarks", {}):
            status[task] = f"NOT decontaminated: not among {KEY}.benchmarks"
        else:
            entry = record["benchmarks"][task]
            evaluated = result.get("source")
            if evaluated and entry["source"] != evaluated:
                status[task] = f"NOT decontaminated against what was evaluated: the corpus against {entry['source']}"
            else:
                status[task] = (f"decontaminated ({record['ngram']}-grams, {record['action']}: "
                                f"{entry.get('documents', 0)} documents overlapped)")
    return status


def log_decontamination(run_folder: RunFolder, results: dict[str, Any], other: str = "") -> None:
    """Put recipe 05's per-task decontamination status in the results and print it."""
    status = decontamination_status(run_folder, results.get("tasks", {}), other)
    if status:
        results["corpus_decontamination"] = status
    for task, line in status.items():
        log.info("%s: training corpus %s", task, line)
