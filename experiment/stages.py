"""The stages of an experiment, in one table: name, run-folder folder, recipe, and what its manifest holds.

Every module that needs a stage's name, where its output lives, which recipe makes it, or its
manifest asks this registry, so an error hint ("run recipes/03_shard.py first") and the folder
names never drift apart. A manifest is read through ``Stage.read_manifest``: missing, unreadable,
written by another stage or schema, or lacking a key its readers rely on, it is one error line
that names the file and the recipe to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from experiment import manifest as manifests
from experiment.errors import DataError, MissingStageError
from experiment.runfolder import RunFolder
from experiment.storage import RunPath


@dataclass(frozen=True)
class Stage:
    name: str  # the W&B job type, the manifest's "stage" field and the resolved-config file suffix
    folder: str  # its output folder inside the run folder
    recipe: str  # the script that runs it, relative to the repository root
    # manifest keys the later stages read, with their types; empty: the stage writes no manifest
    manifest_keys: dict[str, type | tuple[type, ...]] = field(default_factory=dict)
    output: str = manifests.MANIFEST_NAME  # the file in ``folder`` that later stages read
    # the stages whose output it reads while it runs: their lock is held shared (experiment/lock.py),
    # so none of them rewrites it meanwhile
    reads: tuple[str, ...] = ()
    # the checks of a config for this stage, as ``module:function`` names (experiment/check.py): run by the recipe
    # harness before it writes anything, and all of every stage's by ``python -m experiment.check``
    checks: tuple[str, ...] = ()

    @property
    def has_manifest(self) -> bool:
        return bool(self.manifest_keys)

    @property
    def run_first(self) -> str:
        return f"run {self.recipe} first"

    @property
    def run_again(self) -> str:
        return f"run {self.recipe} again"

    def dir(self, run_folder: RunFolder) -> RunPath:
        return run_folder.root / self.folder

    def missing(self, what: str) -> MissingStageError:
        """``<what>: run <recipe> first`` (for outputs other than a manifest, e.g. checkpoints)."""
        return MissingStageError(f"{what}: {self.run_first}")

    def _check_has_manifest(self) -> None:
        if not self.has_manifest:
            raise ValueError(f"stage '{self.name}' writes no manifest")

    def read_manifest(self, stage_dir: RunPath) -> dict[str, Any]:
        """The checked manifest of a finished stage (``stage_dir`` is its folder)."""
        self._check_has_manifest()
        body = manifests.read_manifest(stage_dir, self.name, self.recipe)
        path = manifests.manifest_path(stage_dir)
        for key, kind in self.manifest_keys.items():
            if key not in body:
                raise DataError(f"{path} has no '{key}': {self.run_again}")
            value = body[key]
            if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
                raise DataError(f"{path}: '{key}' is {value!r}, not {_kind_name(kind)}: {self.run_again}")
        return body

    def read_manifest_if_present(self, stage_dir: RunPath) -> dict[str, Any] | None:
        """None when the stage has not run (no manifest file); a present manifest is read checked."""
        self._check_has_manifest()
        if not manifests.manifest_path(stage_dir).is_file():
            return None
        return self.read_manifest(stage_dir)

    def write_manifest(self, stage_dir: RunPath, payload: dict[str, Any]) -> RunPath:
        """Write the manifest last (its presence means the stage finished); its readers' keys must be in it."""
        self._check_has_manifest()
        absent = [key for key in self.manifest_keys if key not in payload]
        if absent:
            raise ValueError(f"stage '{self.name}' manifest lacks {', '.join(absent)}")
        return manifests.write_manifest(stage_dir, self.name, payload)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


# the checks the stages share (experiment/check.py)
EVAL_TASKS = "eval.tasks:check_eval_tasks"
RUN_PRICE = "cost.checks:check_run_price"

CORPUS = Stage("corpus", "corpus", "recipes/01_build_corpus.py", {"documents": int, "shards": list},
               checks=("eval.decontam:check_decontamination",))
TOKENIZER = Stage("tokenizer", "tokenizer", "recipes/02_train_tokenizer.py", {"sha256": str, "vocab_size": int},
                  reads=("corpus",), checks=("tokenizer.adopt:check_adopt_source",))
SHARDS = Stage("shards", "shards", "recipes/03_shard.py",
               {"tokenizer_sha256": str, "seq_len": int, "splits": dict}, reads=("corpus", "tokenizer"))
PRETRAIN = Stage("pretrain", "checkpoints", "recipes/04_pretrain.py", output="", reads=("tokenizer", "shards"),
                 checks=(EVAL_TASKS, RUN_PRICE, "trainer.init_from:check_base_model",
                         "data_prep.shards.loader:check_batch_records"))
FIT_CHECK = Stage("fit_check", "reports", "recipes/04b_tpu_fit_check.py", output="fit_check.json",
                  checks=("trainer.fit_check:check_topology_names",))
NEURON_CHECK = Stage("neuron_check", "reports", "recipes/04c_neuron_check.py", output="neuron_check.json")
# not the checkpoints: recipe 05 evaluates finished ones while recipe 04 goes on training
EVAL = Stage("eval", "eval", "recipes/05_evaluate.py", {"latest": str, "latest_step": int},
             reads=("tokenizer", "shards"), checks=(EVAL_TASKS,))
# a step's Hugging Face folder and nothing else (recipe 05's eval/ is never touched)
EXPORT = Stage("export", "export", "recipes/05b_export_hf.py", output="", reads=("tokenizer",))
# a MERA leaderboard submission of a checkpoint (its test predictions as the ZIP the site takes)
MERA = Stage("mera", "mera", "recipes/05c_mera_submission.py", output="", reads=("tokenizer",))
# completions of prompts by a checkpoint (or a Hugging Face folder), one jsonl per run of recipe 09
GENERATE = Stage("generate", "generate", "recipes/09_generate.py", output="", reads=("tokenizer",),
                 checks=("eval.completions:check_generate",))
COMPARE = Stage("compare", "reports", "recipes/06_compare_costs.py", output="costs.csv")
PLAN = Stage("plan", "reports", "recipes/07_plan_costs.py", output="plan.csv",
             checks=("cost.checks:check_plan",))

STAGES: dict[str, Stage] = {s.name: s for s in (CORPUS, TOKENIZER, SHARDS, PRETRAIN, FIT_CHECK, NEURON_CHECK, EVAL,
                                               EXPORT, MERA, GENERATE, COMPARE, PLAN)}


def stage_named(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise ValueError(f"unknown stage '{name}' (known: {', '.join(STAGES)})") from None
