"""Recipe 05's word per task on the training corpus: decontaminated against it or not, read from the corpus
manifests (recipe 01 records its index there: data_prep/corpus/build.py) of every corpus the run trained on.

A run trains on more than its own folder's corpus when it is a branch or a stage (``train.branch_from``: its
parent's data up to ``train.branch_step``, and the parent's parent's, ...) or mixes shard sets of other runs
(``train.mixture``). Each shard set leads to its corpus by the run-folder layout: the corpus beside the shards
folder it resolves to (a link's target), as recipe 03 packed it; a parent's sets are read from its resolved
config. A task is decontaminated only where every one of those corpora was decontaminated against it. The
check only reads: nothing is written, and each corpus it cannot read is one warning line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import yaml

from data_prep.shards.loader import mixture_sets
from experiment.config import build_config, load_yaml_text
from experiment.errors import ConfigError, RecipeError
from experiment.links import branch_parent, resolved
from experiment.runfolder import RESOLVED_CONFIG, RunFolder, is_linked
from experiment.schema import ExperimentConfig
from experiment.stages import CORPUS, SHARDS
from experiment.storage import RunPath

log = logging.getLogger("eval.decontam")

KEY = "corpus.decontamination"
DECONTAMINATED, NOT_DECONTAMINATED, UNKNOWN = "decontaminated", "NOT decontaminated", "unknown"
OWN_SHARDS = "its shards"  # how a run without train.mixture trained: on its shards folder (a parent's: the parent)


@dataclass(frozen=True)
class TrainedCorpus:
    """One corpus a run trained on: ``via`` says how (its shards, a mixture set, a parent's), ``folder`` is the
    corpus folder, None where it cannot be found (``missing`` says why); ``shards``: the folder trained from."""

    via: str
    folder: RunPath | None
    shards: RunPath | None = None
    missing: str = ""


def trained_corpora(cfg: ExperimentConfig, run_folder: RunFolder) -> list[TrainedCorpus]:
    """Every corpus the run of ``cfg`` in ``run_folder`` trained on, each once: its own shard sets' corpora, then
    its parent's (recursively)."""
    found: dict[str, TrainedCorpus] = {}
    for corpus in _corpora(cfg, run_folder, (resolved(run_folder.root),)):
        found.setdefault(str(resolved(corpus.folder)) if corpus.folder is not None else corpus.missing, corpus)
    return list(found.values())


def _corpora(cfg: ExperimentConfig, run_folder: RunFolder, lineage: tuple[RunPath, ...]) -> list[TrainedCorpus]:
    mixture = mixture_sets(cfg.train.mixture, run_folder.shards)
    sets = [(f"mixture set '{name}'", shards) for name, shards, _ in mixture] or [(OWN_SHARDS, run_folder.shards)]
    corpora = [_shards_corpus(via, shards, run_folder) for via, shards in sets]
    parent = branch_parent(cfg)
    if parent is None:
        return corpora
    via = f"parent {cfg.train.branch_from} to step {cfg.train.branch_step}"
    if resolved(parent.root) in lineage:  # a config edited by hand: no run trains before its own checkpoint
        return [*corpora, TrainedCorpus(via, None, missing=f"train.branch_from leads back to {parent.root} (a cycle "
                                                                "of branches)")]
    try:
        parent_cfg = _resolved_config(parent)
    except (OSError, ConfigError, yaml.YAMLError, ValueError) as exc:
        return [*corpora, TrainedCorpus(via, None, missing=f"the config of {parent.root} cannot be read "
                                                                f"({str(exc).splitlines()[0]})")]
    inherited = _corpora(parent_cfg, parent, (*lineage, resolved(parent.root)))
    return [*corpora, *(TrainedCorpus(via if c.via == OWN_SHARDS else f"{via}: {c.via}", c.folder, c.shards,
                                      c.missing) for c in inherited)]


def _resolved_config(run_folder: RunFolder) -> ExperimentConfig:
    """What the run in ``run_folder`` ran with (its ``config.resolved.yaml``)."""
    path = run_folder.root / RESOLVED_CONFIG
    if not path.is_file():
        raise ConfigError(f"no {RESOLVED_CONFIG} in it")
    tree = load_yaml_text(path.read_text(encoding="utf-8"))
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} holds no mapping")
    return build_config(tree)


def _shards_corpus(via: str, shards: RunPath, run_folder: RunFolder) -> TrainedCorpus:
    """The corpus recipe 03 packed ``shards`` from: this run's corpus for its own shards folder, else the corpus
    of the run folder the shards folder resolves into (the layout: ``<run>/shards`` beside ``<run>/corpus``)."""
    if shards == run_folder.shards and not is_linked(shards):
        return TrainedCorpus(via, run_folder.corpus, shards)
    folder = resolved(shards)
    owner = folder.parent
    if folder.name != SHARDS.folder or not (owner / RESOLVED_CONFIG).is_file():
        return TrainedCorpus(via, None, shards, f"{folder} is no run folder's {SHARDS.folder}/ (no {RESOLVED_CONFIG} "
                                                "beside it): its corpus cannot be found")
    return TrainedCorpus(via, RunFolder(owner).corpus, shards)


def decontamination_status(cfg: ExperimentConfig, run_folder: RunFolder, tasks: dict[str, Any]) -> dict[str, str]:
    """Recipe 05's line per scored task: whether every corpus the run trained on was decontaminated against it,
    read from their corpus manifests (and against the same source as the evaluation read). Where the run trained
    on its own folder's corpus alone, the line is that corpus's; else it names each corpus that was not, or whose
    manifest cannot be read."""
    corpora = trained_corpora(cfg, run_folder)
    readings = [(corpus, _read_corpus(corpus)) for corpus in corpora]
    for corpus, (_, problem) in readings:
        if problem:
            log.warning("cannot tell whether %s was decontaminated against the tasks: %s", _named(corpus), problem)
    only_own = len(corpora) == 1 and corpora[0].folder == run_folder.corpus
    status: dict[str, str] = {}
    for task, result in tasks.items():
        verdicts = [(corpus, *_verdict(manifest, problem, task, result)) for corpus, (manifest, problem) in readings]
        if only_own:
            _, word, why = verdicts[0]
            status[task] = f"{DECONTAMINATED} ({why})" if word == DECONTAMINATED else f"{word}: {why}"
            continue
        for word in (NOT_DECONTAMINATED, UNKNOWN):
            named = [f"{_named(corpus)}: {why}" for corpus, verdict, why in verdicts if verdict == word]
            if named:
                status[task] = f"{word}: {'; '.join(named)}"
                break
        else:
            status[task] = (f"{DECONTAMINATED} in every corpus it trained on: "
                            + "; ".join(f"{_named(corpus)}: {why}" for corpus, _, why in verdicts))
    return status


def _named(corpus: TrainedCorpus) -> str:
    return f"{corpus.via} ({corpus.folder})" if corpus.folder is not None else corpus.via


def _read_corpus(corpus: TrainedCorpus) -> tuple[dict[str, Any] | None, str]:
    """The corpus manifest, or None and why it cannot be read (no folder, not finished, damaged, or not the corpus
    the shards trained on were packed from)."""
    if corpus.folder is None:
        return None, corpus.missing
    try:
        manifest = CORPUS.read_manifest_if_present(corpus.folder)
        if manifest is None:
            return None, f"no finished corpus in {corpus.folder}"
        packed = SHARDS.read_manifest_if_present(corpus.shards) if corpus.shards is not None else None
    except (RecipeError, OSError) as exc:  # damaged, or of another schema: the scores stand, this line says so
        return None, str(exc).splitlines()[0]
    packed_from = ((packed or {}).get("corpus") or {}).get("shards_sha256")
    now = [shard.get("sha256") if isinstance(shard, dict) else None for shard in manifest["shards"]]
    if isinstance(packed_from, list) and None not in now and packed_from != now:
        return None, (f"the corpus in {corpus.folder} is not the one the shards in {corpus.shards} were packed from "
                      f"(recipe 01 ran again since)")
    return manifest, ""


def _verdict(manifest: dict[str, Any] | None, problem: str, task: str, result: dict[str, Any]) -> tuple[str, str]:
    """(DECONTAMINATED / NOT_DECONTAMINATED / UNKNOWN, what the line says after it) for one corpus and task."""
    if manifest is None:
        return UNKNOWN, problem
    record = manifest.get("decontamination")
    if not isinstance(record, dict) or not record.get("enabled"):
        return NOT_DECONTAMINATED, "the corpus was built without decontamination"
    if task in record.get("not_decontaminated", {}):
        return NOT_DECONTAMINATED, str(record["not_decontaminated"][task])
    if task not in record.get("benchmarks", {}):
        return NOT_DECONTAMINATED, f"not among {KEY}.benchmarks"
    entry = record["benchmarks"][task]
    evaluated = result.get("source")
    if evaluated and entry["source"] != evaluated:
        return NOT_DECONTAMINATED, f"indexed from {entry['source']}, not from the file evaluated ({evaluated})"
    return DECONTAMINATED, (f"{record['ngram']}-grams, {record['action']}: {entry.get('documents', 0)} documents "
                            "overlapped")


def log_decontamination(cfg: ExperimentConfig, run_folder: RunFolder, results: dict[str, Any]) -> None:
    """Put recipe 05's per-task decontamination status in the results and print it."""
    status = decontamination_status(cfg, run_folder, results.get("tasks", {}))
    if status:
        results["corpus_decontamination"] = status
    for task, line in status.items():
        log.info("%s: training corpus %s", task, line)
