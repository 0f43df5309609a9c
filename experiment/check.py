"""Every stage's checks of a config, with nothing written: ``python -m experiment.check --config X [overrides]``.

Each stage names the functions that check a config for it (``Stage.checks`` in experiment/stages.py: eval task
names, the planner's model, prices and slices, the base model of continued pretraining, recipe 09's prompts and
model ...). The recipe harness runs its stage's before it makes the run folder, takes a lock, writes
``config.resolved.yaml`` or opens W&B (``run_stage_checks``); this command runs every stage's at once, so a typo
that recipe 07 or recipe 05 would meet hours into a pipeline is one line now.

A check is ``fn(cfg, run_folder) -> str | None``: it reads (the config, the catalog, a base model's config.json, the
run's finished manifests where there are some) and never writes; it raises a RecipeError (one line naming the key)
for a problem, and may return a note of what it could not check here (a base model in a bucket, a tokenizer recipe
02 has not trained yet). The checks live with the code they check (layered above this package) and are imported
by their dotted names, as model families are (experiment/families.py). A run folder in a bucket is read where its
manifests are (the bucket must answer); inputs outside the run in a bucket (a base model, a tokenizer to adopt) are
left to the recipe, since a shipped config names placeholders there.

Exit codes: 0 with a short summary when every check passes, 1 with one ``error:`` line per problem otherwise.
"""

from __future__ import annotations

import argparse
import contextvars
import importlib
import sys
from collections.abc import Callable, Iterable

from experiment.errors import RecipeError
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import STAGES, Stage

Check = Callable[[ExperimentConfig, RunFolder], "str | None"]
# whether a check may read a bucket (a base model's config.json, a tokenizer to adopt): a recipe does, since it reads
# them anyway; ``python -m experiment.check`` does not (it may run offline), and a check says what it left unread
_READ_BUCKETS: contextvars.ContextVar[bool] = contextvars.ContextVar("read_buckets", default=True)


def reads_buckets() -> bool:
    return _READ_BUCKETS.get()


def check_function(name: str) -> Check:
    """The check a ``module:function`` name in ``Stage.checks`` stands for."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def stage_check_names(stages: Iterable[Stage]) -> list[str]:
    """The checks of ``stages``, each once, in stage order (a check two stages share runs once)."""
    names: list[str] = []
    for stage in stages:
        names += [name for name in stage.checks if name not in names]
    return names


def run_stage_checks(stage: Stage, cfg: ExperimentConfig, run_folder: RunFolder) -> list[str]:
    """The recipe harness's call before anything is written: the stage's checks in order, the first problem
    raised as its RecipeError; returns the checks' notes."""
    notes = [check_function(name)(cfg, run_folder) for name in stage_check_names([stage])]
    return [note for note in notes if note]


def check_config(cfg: ExperimentConfig, stages: Iterable[Stage] | None = None,
                 read_buckets: bool = False) -> tuple[list[str], list[str], int]:
    """Every check of ``stages`` (default: all) on ``cfg``: (problems, notes, checks run); a problem is the
    one line of the RecipeError a check raised (the same line from two checks is listed once)."""
    run_folder = RunFolder.for_config(cfg)
    names = stage_check_names(STAGES.values() if stages is None else stages)
    problems: list[str] = []
    notes: list[str] = []
    token = _READ_BUCKETS.set(read_buckets)
    try:
        for name in names:
            try:
                note = check_function(name)(cfg, run_folder)
            except RecipeError as exc:
                if str(exc) not in problems:
                    problems.append(str(exc))
                continue
            if note:
                notes.append(note)
    finally:
        _READ_BUCKETS.reset(token)
    return problems, notes, len(names)


def main(argv: list[str] | None = None) -> int:
    from experiment.config import load_config
    from experiment.plugins import load_plugins
    from experiment.sweep import sweep_variants

    parser = argparse.ArgumentParser(description="Run every recipe's checks of a config, writing nothing")
    parser.add_argument("--config", required=True, help="experiment YAML, e.g. recipes/configs/demo.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.tasks=[rublimp]")
    args = parser.parse_args(argv)
    try:
        load_plugins()
        cfg = load_config(args.config, args.overrides)
        problems, notes, count = check_config(cfg)
        if not cfg.experiment.variant:  # a sweep's variants are runs of their own (recipe 08 runs each)
            for variant in sweep_variants(cfg.experiment):
                try:
                    found, _, _ = check_config(load_config(args.config, [*args.overrides,
                                                                         f"experiment.variant={variant.name}"]))
                except RecipeError as exc:  # the variant's overrides do not load
                    found = [str(exc)]
                problems += [f"variant '{variant.name}': {problem}" for problem in found if problem not in problems]
    except RecipeError as exc:  # the config itself does not load: that one line is the answer
        problems, notes, count = [str(exc)], [], 0
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"ok: {args.config}: the {count} checks of the {len(STAGES)} stages pass; nothing was written")
    for note in notes:
        print(f"  not checked here: {note}")
    return 0


if __name__ == "__main__":
    # the checks import experiment.check (reads_buckets): run the main of that module, not of this __main__ copy
    sys.exit(importlib.import_module("experiment.check").main())
