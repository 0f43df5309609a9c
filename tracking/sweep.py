"""Recipe 08: run every variant of an experiment (``experiment.variants`` / ``experiment.grid``), then compare them.

Each variant is a run of recipes 04 (pretrain) and 05 (evaluate) with ``experiment.variant=<name>``:
its own run folder ``<run_root>/<sweep>-<variant>``, its W&B runs in the sweep's group with the
variant's keys in their config (``experiment.config`` applies the overrides, ``tracking.wandb_run``
names the group). Variants run one after another, each in its own processes as a user would run
them. Rerunning the same command resumes: a variant whose eval of its last step exists is skipped,
an interrupted one continues from its checkpoint (recipe 04 resumes). Then recipe 06 compares the
group from the sweep's folder ``<run_root>/<sweep>``.

The variants share one corpus, tokenizer and shards: those of ``experiment.data_from`` (an
experiment under the same run root, e.g. the demo's), else the sweep's own folder; recipes 01-03 run
there first when its shards are missing, and each variant's folder links to them.

An anneal comparison (``experiment.anneal``) runs the same way, its runs being stages of the parent's
checkpoint (``train.branch_data: own``): they read the parent's finished checkpoint, its tokenizer and the sets'
shards, which must exist (checked before anything is written), so no recipe 01-03 runs, and each run's shards/
links to the parent's; recipe 06 then adds the comparison's table.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from experiment.check import run_stage_checks
from experiment.checkpoint_steps import finished_steps
from experiment.config import load_config
from experiment.errors import RecipeError
from experiment.links import DATA_STAGES, branch_parent, link_stages
from experiment.lock import SWEEP, hold, lock_path
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import COMPARE, EVAL, PRETRAIN, SHARDS, Stage
from experiment.storage import location
from experiment.sweep import Variant, declared_anneal, sweep_name, sweep_variants
from tracking.harness import make_parser, setup_logging

log = logging.getLogger("tracking.sweep")
REPO = Path(__file__).resolve().parents[1]
VARIANT_STAGES = (PRETRAIN, EVAL)


def recipe_exit_code(recipe: str, argv: list[str]) -> int:
    """``recipe`` (a path under the repo) in its own process, as a user runs it; its output goes to ours."""
    return subprocess.run([sys.executable, str(REPO / recipe), *argv], check=False).returncode


def run_stage(stage: Stage, config: str, overrides: list[str]) -> None:
    """One recipe (``recipe_exit_code``); a failure is one error line naming it."""
    log.info("sweep: %s %s", stage.recipe, " ".join(overrides))
    code = recipe_exit_code(stage.recipe, ["--config", config, *overrides])
    if code != 0:
        raise RecipeError(f"{stage.recipe} {' '.join(overrides)} exited {code}; rerun recipes/08_sweep.py with the "
                          "same arguments to resume")


def data_folder(cfg: ExperimentConfig) -> RunFolder:
    """Where the variants' corpus, tokenizer and shards live."""
    return RunFolder(location(cfg.experiment.run_root) / (cfg.experiment.data_from or sweep_name(cfg.experiment)))


def ensure_data(cfg: ExperimentConfig, config: str, overrides: list[str]) -> RunFolder:
    """The shared data folder, made with recipes 01-03 when its shards are missing."""
    folder = data_folder(cfg)
    if SHARDS.read_manifest_if_present(folder.shards) is None:
        name = folder.root.name
        log.info("sweep: no shards in %s yet: running recipes 01-03 for experiment '%s'", folder.root, name)
        for stage in DATA_STAGES:
            run_stage(stage, config, [*overrides, f"experiment.name={name}"])
    return folder


def link_data(variant_folder: RunFolder, data: RunFolder, stages: tuple[Stage, ...] = DATA_STAGES) -> None:
    """The variant's corpus/, tokenizer/ and shards/ (or ``stages``' folders) link to the shared ones (where it has
    none of its own), read-only for the variant (experiment/links.py)."""
    link_stages(variant_folder, data, stages, "sweep")


def finished(cfg: ExperimentConfig) -> bool:
    """Whether the variant trained all its steps and its last step was evaluated."""
    manifest = EVAL.read_manifest_if_present(RunFolder.for_config(cfg).eval)
    return manifest is not None and manifest["latest_step"] == cfg.train.steps


def check_anneal_inputs(cfg: ExperimentConfig, first_run: ExperimentConfig) -> None:
    """What an anneal comparison reads, before the sweep writes anything: the parent's checkpoint of the step
    (``first_run``: a run's config, whose ``train.branch_from`` names the parent's folder) and each set's
    finished shards; one error line naming the key."""
    anneal = cfg.experiment.anneal
    parent = branch_parent(first_run)
    where = parent.checkpoints if parent is not None else anneal.parent
    # finished as the trainer's branch will judge it (Orbax committed it and its checksums were written): a step
    # folder a crash left mid-save would otherwise pass here and fail every run of the comparison in turn
    steps = finished_steps(parent.checkpoints) if parent is not None else []
    if anneal.step not in steps:
        finished = f"its finished steps: {', '.join(map(str, steps)) or 'none'}"
        if parent is not None and (parent.checkpoints / str(anneal.step)).is_dir():
            raise RecipeError(f"config key 'experiment.anneal.step': the checkpoint of step {anneal.step} in {where} "
                              f"did not finish (its save was interrupted: no commit marker or checksums); {finished} "
                              f"(resume the parent with {PRETRAIN.recipe}, or name a finished step)")
        raise RecipeError(f"config key 'experiment.anneal.step': no checkpoint of step {anneal.step} in {where}; "
                          f"{finished} (run {PRETRAIN.recipe} for the parent first, or name a finished step)")
    for name, folder in first_run.eval.validation_sets.items():
        if SHARDS.read_manifest_if_present(location(folder)) is None:
            raise RecipeError(f"config key 'experiment.anneal.sets.{name}': no finished shards in {folder} (run "
                              f"recipes 01-03 for that data with the parent's tokenizer first)")


def run_variant(variant: Variant, index: int, total: int, config: str, overrides: list[str], data: RunFolder,
                stages: tuple[Stage, ...] = DATA_STAGES) -> str:
    """Recipes 04 and 05 for one variant unless it is done; returns what happened."""
    variant_overrides = [*overrides, f"experiment.variant={variant.name}"]
    cfg = load_config(config, variant_overrides)
    what = ", ".join(f"{k}={v}" for k, v in variant.overrides.items())
    if finished(cfg):
        log.info("sweep: variant %d/%d '%s' (%s) is done: skipped", index, total, variant.name, what)
        return "skipped"
    log.info("sweep: variant %d/%d '%s' (%s) in %s", index, total, variant.name, what, RunFolder.for_config(cfg).root)
    link_data(RunFolder.for_config(cfg), data, stages)
    started = time.monotonic()
    for stage in VARIANT_STAGES:
        run_stage(stage, config, variant_overrides)
    log.info("sweep: variant %d/%d '%s' done in %.0f s", index, total, variant.name, time.monotonic() - started)
    return "ran"


def run_sweep(config: str, overrides: list[str], compare: bool = True) -> dict[str, str]:
    """Every variant in order (resumable), then recipe 06 on the group; returns variant name -> ran/skipped."""
    cfg = load_config(config, overrides)
    if cfg.experiment.variant:
        raise RecipeError(f"config key 'experiment.variant': {cfg.experiment.variant!r} selects one variant; "
                          "recipe 08 runs them all: leave it unset")
    variants = sweep_variants(cfg.experiment)
    if not variants:
        raise RecipeError(f"{config}: declares no variants: add experiment.variants (a list of overrides), "
                          "experiment.grid (key: [values]) or experiment.anneal")
    anneal = declared_anneal(cfg.experiment.anneal)
    # every variant's checks of its stages before the sweep writes its lock or its data (experiment/check.py)
    variant_cfgs = [load_config(config, [*overrides, f"experiment.variant={v.name}"]) for v in variants]
    for variant_cfg in variant_cfgs:
        for stage in ((*DATA_STAGES,) if anneal is None else ()) + (*VARIANT_STAGES, COMPARE):
            run_stage_checks(stage, variant_cfg, RunFolder.for_config(variant_cfg))
    if anneal is not None:
        check_anneal_inputs(cfg, variant_cfgs[0])
    # one sweep at a time in its folder (a double submit); no deadlock with its stages: they run in processes
    # of their own and each locks its own stage, never this lock
    with hold(lock_path(RunFolder.for_config(cfg), SWEEP), SWEEP):
        if anneal is None:
            data, stages = ensure_data(cfg, config, overrides), DATA_STAGES
        else:
            # an anneal's runs are stages (train.branch_data: own) that link their parent's tokenizer themselves and
            # read train.mixture; recipe 04 also reads the run's own shards/ manifest (its tokenizer and length),
            # which the parent's shards give: the same tokenizer, and an anneal keeps the parent's length
            data, stages = branch_parent(variant_cfgs[0]), (SHARDS,)
        done = {v.name: run_variant(v, i, len(variants), config, overrides, data, stages)
                for i, v in enumerate(variants, 1)}
        if compare:
            run_stage(COMPARE, config, overrides)
    return done


def sweep_main(argv: list[str] | None = None) -> None:
    """The recipe's command line; problems the user can fix end in one ``error:`` line and exit code 2."""
    parser = make_parser("Run every variant of an experiment (recipes 04-05 each), then compare them (recipe 06)")
    parser.add_argument("--no-compare", action="store_true", help="train and evaluate only")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        run_sweep(args.config, args.overrides, compare=not args.no_compare)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: sweep interrupted (rerun the same command to resume)", file=sys.stderr)
        sys.exit(130)
