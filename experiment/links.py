"""Stage folders linked from another run: how a run reads another's corpus, tokenizer and shards, read-only.

Three things link a run's stage folders to another run's: a decay branch (``train.branch_from``:
the parent's tokenizer and shards), a sweep's variants (the corpus, tokenizer and shards they
share) and ``experiment.data_from`` (any run of recipes 04/05 on another experiment's data, e.g. a
continued pretraining on the demo's shards). A link is made only where the run has no folder of
its own, and the data behind it belongs to the other run: a stage recipe (01-03) whose output
folder is such a link refuses to run (``check_own_output``), and ``experiment.manifest.invalidate``
never clears a folder through one. No stage writes its output through a link of any other kind either (a
folder kept elsewhere): it deletes and replaces files there, and a planted link would point that at another
folder's files (``experiment.files.check_removable`` guards each deletion below the stage folder too).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path

from experiment.errors import ConfigError, RecipeError
from experiment.manifest import linked_run
from experiment.runfolder import RunFolder, is_linked, link_target, make_link
from experiment.schema import ExperimentConfig
from experiment.stages import CORPUS, EVAL, EXPORT, FIT_CHECK, NEURON_CHECK, PRETRAIN, SHARDS, TOKENIZER, Stage
from experiment.storage import BucketPath, RunPath, location

log = logging.getLogger("experiment.links")
DATA_STAGES = (CORPUS, TOKENIZER, SHARDS)  # the stages whose outputs other runs read through links
# the stages that read experiment.data_from's data (recipes 04b and 04c: the tokenizer's and shards' manifests;
# 05b: the tokenizer)
DATA_READERS = (PRETRAIN, FIT_CHECK, NEURON_CHECK, EVAL, EXPORT)
# of those, the checks that size the model from the config when there is no data yet
CONFIG_SIZED = (FIT_CHECK, NEURON_CHECK)
BRANCH_DATA = (TOKENIZER, SHARDS)  # the stages a decay branch reads from its parent


def branch_links(cfg: ExperimentConfig, stage: Stage) -> tuple[Stage, ...]:
    """The parent's folders a branch links in before ``stage`` runs: a decay branch's readers read its tokenizer
    and shards; a stage (``train.branch_data: own``) packs shards of its own (recipe 03: with the parent's
    tokenizer, from the parent's corpus where it has none of its own) and reads them with that tokenizer."""
    if getattr(cfg.train, "branch_data", "parent") != "own":
        return BRANCH_DATA if stage in DATA_READERS else ()
    if stage == SHARDS:
        return (CORPUS, TOKENIZER)
    # recipe 02 too: the link makes it refuse in one line (a stage trains on with its parent's embeddings)
    return (TOKENIZER,) if stage in (*DATA_READERS, TOKENIZER) else ()


class LinkedOutputError(RecipeError):
    """A stage's output folder is a link to another run's: its data is read-only here."""


def resolved(folder: RunPath) -> RunPath:
    """Where a stage folder's data is: the folder a link stands for, else the folder itself."""
    target = link_target(folder)
    if target is not None:
        return resolved(target) if target != folder else target
    return folder if isinstance(folder, BucketPath) else folder.resolve()


def link_stages(run_folder: RunFolder, source: RunFolder, stages: Iterable[Stage], why: str) -> None:
    """Link each of ``stages``' folders of ``run_folder`` to ``source``'s where it has none of its own
    (and ``source`` has one); ``why`` says who asked, for the log."""
    run_folder.root.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        mine, theirs = stage.dir(run_folder), resolved(stage.dir(source))
        if not mine.exists() and not is_linked(mine) and theirs.is_dir():
            with contextlib.suppress(FileExistsError):  # another process of this run made it first
                make_link(mine, theirs)
                log.info("%s: %s links to %s", why, mine, theirs)


def _link_reason(cfg: ExperimentConfig) -> str:
    """The config key that linked a run's data folders, as the user wrote it."""
    train = getattr(cfg, "train", None)
    if getattr(train, "branch_from", ""):
        return f"train.branch_from={train.branch_from}"
    if cfg.experiment.data_from:
        return f"experiment.data_from={cfg.experiment.data_from}"
    if cfg.experiment.variant:
        return f"the data sweep '{cfg.experiment.group}' shares with its variants"
    return "another run's data"


def check_own_output(cfg: ExperimentConfig, run_folder: RunFolder, stage: Stage) -> None:
    """Refuse to run ``stage`` where its output folder is a link: into another run folder (that run's data), or
    anywhere else (a stage deletes and replaces files in its output folder, and never does so through a link:
    a planted one would make it delete another folder's files)."""
    folder = stage.dir(run_folder)
    if not is_linked(folder):
        return
    owner = linked_run(folder)
    if owner is not None:
        raise LinkedOutputError(f"{folder} is a link to {link_target(folder)} ({_link_reason(cfg)}): its data is "
                                "read-only here; remove the link to build this run's own")
    raise LinkedOutputError(f"{folder} is a link to {link_target(folder)}, out of the run folder {run_folder.root}: "
                            f"{stage.recipe} deletes and replaces files in its output folder and never does so "
                            "through a link; remove the link and rerun (to keep runs on another disk, point "
                            "experiment.run_root there)")


def link_data_from(cfg: ExperimentConfig, run_folder: RunFolder, stage: Stage) -> None:
    """``experiment.data_from``: recipes 04, 04b, 04c and 05 read that experiment's corpus, tokenizer and shards
    through links; recipes 01-03 build them only in that experiment's own folder; 06 and 07 read none."""
    name = cfg.experiment.data_from
    if not name:
        return
    source = RunFolder(location(cfg.experiment.run_root) / name)
    if resolved(source.root) == resolved(run_folder.root):
        return  # the data's own folder (a sweep builds its shared data there)
    key = "config key 'experiment.data_from'"
    if stage in DATA_STAGES:
        raise ConfigError(f"{key}: this run reads the {stage.name} of experiment '{name}': run {stage.recipe} with "
                          f"experiment.name={name} to build it, or leave experiment.data_from unset")
    if stage not in DATA_READERS:
        return
    if getattr(getattr(cfg, "train", None), "branch_from", ""):
        raise ConfigError(f"{key}: a branch reads its parent's tokenizer and shards (train.branch_from="
                          f"{cfg.train.branch_from}): leave experiment.data_from unset")
    if not resolved(SHARDS.dir(source)).is_dir():
        if stage in CONFIG_SIZED:
            log.info("experiment.data_from=%s: %s has no shards yet; the %s reads the vocabulary and "
                     "sequence length from the config", name, source.root, stage.name.replace("_", " "))
            return
        raise ConfigError(f"{key}: {source.root} holds no shards/ folder: run recipes 01-03 with "
                          f"experiment.name={name} first")
    for data in DATA_STAGES:
        mine, theirs = data.dir(run_folder), resolved(data.dir(source))
        if (mine.exists() or is_linked(mine)) and theirs.is_dir() and resolved(mine) != theirs:
            raise ConfigError(f"{key}: {mine} is this run's own {data.name}, not {name}'s: remove it to read "
                              f"{theirs}, or leave experiment.data_from unset")
    link_stages(run_folder, source, DATA_STAGES, f"experiment.data_from={name}")


def branch_parent(cfg: ExperimentConfig) -> RunFolder | None:
    """The run folder ``train.branch_from`` names (an experiment under the run root, a path or a bucket URL);
    None: no branch."""
    parent = getattr(getattr(cfg, "train", None), "branch_from", "")
    if not parent:
        return None
    named = location(parent, "train.branch_from")
    if isinstance(named, Path) and not named.is_absolute():
        named = location(cfg.experiment.run_root) / parent
    return RunFolder(resolved(named))


def prepare_links(cfg: ExperimentConfig, run_folder: RunFolder, stage: Stage) -> None:
    """What the harness checks and links before a stage runs: its output is its own, data_from's data and a
    branch's parent data are linked (before the stage locks what it reads: through the links)."""
    link_data_from(cfg, run_folder, stage)
    parent = branch_parent(cfg)
    if parent is not None and parent.root != resolved(run_folder.root):
        link_stages(run_folder, parent, branch_links(cfg, stage), "branch")
    check_own_output(cfg, run_folder, stage)
