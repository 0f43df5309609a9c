"""Recipe 06: what did each experiment cost, and what did the money buy?

For this experiment (and ``cost.compare_experiments`` under the same run root) it reads the W&B
runs of the group back (the API when online; the local offline runs via ``wandb leet inspect``),
takes the cost from the pretrain run's ``cost/*`` summary (the ledger in ``ledger/`` when W&B has
none), the final loss, and the eval score from the eval run; where W&B has neither (its folder was
deleted, or W&B was disabled) they come from the run folder: the last loss in ``train_log.jsonl``,
the scores of the newest ``eval/step_N.json``. It prints one row per experiment,
writes ``reports/costs.md`` / ``.csv`` and two PNG plots (loss against rubles from the pretrain
history, eval score against rubles), and logs them to the compare run in W&B. An anneal comparison
(``experiment.anneal``) adds its table of bits per byte per data set with intervals (cost/anneal.py).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cost.ledger_format import LEDGER_FILE
from cost.ledger_pricing import summarize_ledger
from cost.report import SIG, Column, log_to_wandb, save_figure, write_table
from cost.summary import COMPARE_COLUMNS, CostSummary
from cost.target import (
    Target,
    TargetCrossing,
    best_so_far,
    cost_to_target,
    eval_points,
    read_train_log,
    target_of,
)
from experiment import appendlog
from experiment.errors import MissingStageError
from experiment.jsontext import parse_json
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import EVAL, PRETRAIN
from experiment.sweep import sweep_name, sweep_variants, variant_experiment_name
from tracking.metrics import RUB_SPENT
from tracking.readback import RunRecord, read_offline_runs, read_online_runs
from tracking.wandb_run import VARIANT_CONFIG_KEY, resolve_mode

log = logging.getLogger("cost.compare")

ACCURACY_NAMES = ("acc", "accuracy", "acc_norm")
_COST = {column.key: column for column in COMPARE_COLUMNS}
BASE_COLUMNS = (
    Column("experiment", "experiment"),
    Column("variant", "variant"),
    Column("run", "run", terminal=False),
    *(_COST[key] for key in ("accelerator", "chips", "tokens", "hours", "rub_total", "rub_per_1b_tokens")),
    Column("final_loss", "final loss", "{:.4f}"),
    Column("eval_score", "eval score", "{:.4f}"),
    Column("rub_per_eval_point", "RUB / eval point", SIG),
)
# the cost summary's columns the table has not shown yet (e.g. rubles lost to restarts), in its order
LATER_COST_COLUMNS = tuple(c for c in COMPARE_COLUMNS if c.key not in {b.key for b in BASE_COLUMNS})
TARGET_COLUMNS = (
    Column("target_status", "target"),
    Column("rub_to_target", "RUB to target", SIG),
    Column("chip_hours_to_target", "chip-hours to target", SIG, terminal=False),
    Column("hours_to_target", "hours to target", SIG),
    Column("tokens_to_target", "tokens to target", "{:,.0f}", terminal=False),
    Column("best_value", "best value", "{:.4f}", terminal=False),
)
SOURCE_COLUMNS = (Column("cost_source", "cost from", terminal=False),)
COLUMNS = (*BASE_COLUMNS, *LATER_COST_COLUMNS, *SOURCE_COLUMNS)


def columns_for(target: Target | None) -> tuple[Column, ...]:
    """The table's columns: with a target, what reaching it cost."""
    return (*BASE_COLUMNS, *LATER_COST_COLUMNS, *(TARGET_COLUMNS if target else ()), *SOURCE_COLUMNS)


def terminal_order(rows: list[dict[str, Any]], columns: tuple[Column, ...]) -> tuple[Column, ...]:
    """The printed table's columns: a sweep's variants are named by what they change (the variant column
    first, repeated in every block a narrow terminal wraps into), other experiments by their name."""
    if not any(row.get("variant") for row in rows):
        return columns
    return (*(c for c in columns if c.key == "variant"), *(c for c in columns if c.key != "variant"))


def run_order(run: RunRecord) -> tuple[str, str]:
    """Oldest first; a resumed run keeps its id and start time, its later folder name breaks the tie."""
    return (run.start_time, run.source)


@dataclass
class ExperimentRuns:
    name: str
    folder: RunFolder
    runs: list[RunRecord] = field(default_factory=list)

    @property
    def cost_runs(self) -> list[RunRecord]:
        """Runs that logged money (the pretrain runs, one per resume), oldest first."""
        found = [r for r in self.runs if CostSummary.logged_in(r.summary) or RUB_SPENT in r.summary]
        return sorted(found, key=run_order)

    @property
    def eval_runs(self) -> list[RunRecord]:
        return sorted((r for r in self.runs if r.job_type == "eval"), key=run_order)

    @functools.cached_property
    def saved_scores(self) -> dict[str, float]:
        """The eval scores the run folder keeps (``eval_results_summary``), for when W&B has none."""
        return eval_results_summary(self.folder.eval)


def eval_results_summary(eval_dir: Path) -> dict[str, float]:
    """The newest ``eval/step_N.json`` as W&B summary keys (eval/val_bpb, eval/<task>/<metric>), the way
    recipe 05 logs them; empty without a readable results file."""
    for path in sorted(eval_dir.glob("step_*.json"), reverse=True):  # zero-padded steps: newest first
        try:
            results = parse_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(results, dict):
            continue
        flat: dict[str, float] = {}
        validation = results.get("validation")
        if isinstance(validation, dict) and isinstance(validation.get("bits_per_byte"), (int, float)):
            flat["eval/val_bpb"] = float(validation["bits_per_byte"])
        for task, result in (results.get("tasks") or {}).items():
            for name, metric in ((result or {}).get("metrics") or {}).items():
                if isinstance(metric, dict) and isinstance(metric.get("value"), (int, float)):
                    flat[f"eval/{task}/{name}"] = float(metric["value"])
        return flat
    return {}


def history_keys(cfg: ExperimentConfig, target: Target | None) -> list[list[str]]:
    """The history series the comparison reads online: the loss, and the target metric's eval points."""
    keys = [[cfg.cost.loss_metric, RUB_SPENT]]
    if target is not None:
        keys.append([target.metric, RUB_SPENT, "cost/hours", "cost/tokens", "train/step"])
    return keys


def known_target(cfg: ExperimentConfig) -> Target | None:
    """The target when it is known before any run is read (an eval metric found in the runs comes later)."""
    named = cfg.cost.target_metric or cfg.cost.eval_metric
    return target_of(cfg.cost, named) if cfg.cost.target_bpb is not None or named else None


def read_runs(cfg: ExperimentConfig, folder: RunFolder, group: str, exclude_id: str | None,
              experiment: str | None = None, target: Target | None = None) -> list[RunRecord]:
    """The group's runs (of ``experiment`` only, when given: a sweep's variants share a group): the W&B
    API when online (falling back on failure), else the offline run folders."""
    runs: list[RunRecord] | None = None
    if resolve_mode(cfg.wandb.mode) == "online":
        try:
            runs = read_online_runs(cfg.wandb.project, cfg.wandb.entity, group, history_keys(cfg, target))
        except Exception as exc:  # network, auth: any API failure falls back to the local runs
            log.warning("W&B API unavailable (%s): reading the local offline runs instead", str(exc).splitlines()[0])
    if runs is None:
        runs = read_offline_runs(folder.wandb, group=group, exclude_ids=(exclude_id,) if exclude_id else ())
    return [r for r in runs
            if r.run_id != exclude_id and (experiment is None or run_experiment(r) in (None, experiment))]


def run_experiment(run: RunRecord) -> str | None:
    """The experiment name a run's W&B config holds (None: not recorded)."""
    section = run.config.get("experiment")
    return section.get("name") if isinstance(section, dict) else None


def compared_experiments(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """(experiment name, its W&B group) of every experiment compared: a sweep's variants (the config
    declares experiment.variants or .grid), else this experiment; then ``cost.compare_experiments``."""
    variants = [] if cfg.experiment.variant else sweep_variants(cfg.experiment)
    sweep = sweep_name(cfg.experiment)
    found = [(variant_experiment_name(sweep, v.name), sweep) for v in variants] or [(cfg.experiment.name, sweep)]
    for name in cfg.cost.compare_experiments:
        if name not in {f[0] for f in found}:
            found.append((name, name))
    return found


def folder_group(folder: RunFolder, default: str) -> str:
    """The W&B group an experiment's stages logged under (its resolved config's; a sweep variant's is
    the sweep's), else ``default``."""
    path = folder.root / "config.resolved.yaml"
    if path.is_file():
        import yaml

        try:
            experiment = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("experiment") or {}
        except yaml.YAMLError:
            return default
        return str(experiment.get("group") or experiment.get("name") or default)
    return default


def pick_eval_metric(cfg: ExperimentConfig, summaries: list[dict[str, Any]]) -> str | None:
    """The configured metric, else eval/<task>/acc (or accuracy) of the first eval task that has one,
    else the first eval/*/acc key seen."""
    if cfg.cost.eval_metric:
        return cfg.cost.eval_metric
    keys = {k for s in summaries for k, v in s.items() if isinstance(v, (int, float))}
    preferred = [f"eval/{task}/{name}" for task in cfg.eval.tasks for name in ACCURACY_NAMES]
    for key in preferred:
        if key in keys:
            return key
    accuracy = sorted(k for k in keys if k.startswith("eval/") and k.rsplit("/", 1)[-1] in ACCURACY_NAMES)
    return accuracy[0] if accuracy else None


def eval_score(exp: ExperimentRuns, metric: str | None) -> float | None:
    if metric is None:
        return None
    for run in reversed([*exp.cost_runs, *exp.eval_runs]):  # the latest eval run wins
        value = run.summary.get(metric)
        if isinstance(value, (int, float)):
            return float(value)
    return exp.saved_scores.get(metric)


def final_loss(exp: ExperimentRuns, loss_metric: str) -> float | None:
    """The latest pretrain run's final loss in W&B, else the last one its history or the run folder's
    ``train_log.jsonl`` holds."""
    latest = exp.cost_runs[-1] if exp.cost_runs else None
    loss = latest.summary.get(loss_metric) if latest else None
    if loss is None:
        losses = [h[loss_metric] for r in exp.cost_runs for h in r.history if loss_metric in h]
        losses = losses or [h[loss_metric] for h in read_train_log(exp.folder.root) if loss_metric in h]
        loss = losses[-1] if losses else None
    return loss


def rub_per_eval_point(rub: float | None, score: float | None) -> float | None:
    """Rubles per percentage point of an accuracy in [0, 1] (per unit for any other score)."""
    if rub is None or score is None or score <= 0:
        return None
    return rub / (score * 100 if score <= 1 else score)


def variant_text(exp: ExperimentRuns) -> str | None:
    """What this sweep variant changes, e.g. ``model.d_model=128`` (None: not a variant)."""
    for run in reversed(exp.runs):
        variant = run.config.get(VARIANT_CONFIG_KEY)
        if isinstance(variant, dict):
            return ", ".join(f"{k}={v}" for k, v in variant.items() if k != "name") or str(variant.get("name"))
    return None


def target_history(exp: ExperimentRuns, metric: str) -> list[dict[str, Any]]:
    """The pretrain runs' logged rows, or the run folder's ``train_log.jsonl`` when W&B has no eval point."""
    history = [h for r in exp.cost_runs for h in r.history]
    if eval_points(history, metric):
        return history
    return read_train_log(exp.folder.root)


def target_cells(exp: ExperimentRuns, target: Target, cost: CostSummary) -> dict[str, Any]:
    """The run's rubles, chip-hours, hours and tokens when it first reached the target (else its best)."""
    points = eval_points(target_history(exp, target.metric), target.metric)
    crossing: TargetCrossing = cost_to_target(points, target)
    chips_per_hour = cost.chip_hours / cost.hours if cost.hours else float(cost.chips)
    return {"target_status": crossing.status(target), "rub_to_target": crossing.rub,
            "hours_to_target": crossing.hours,
            "chip_hours_to_target": None if crossing.hours is None else crossing.hours * chips_per_hour,
            "tokens_to_target": crossing.tokens, "best_value": crossing.best, "_points": points}


def cost_row(cfg: ExperimentConfig, exp: ExperimentRuns, metric: str | None,
             target: Target | None = None) -> dict[str, Any]:
    """One table row: cost from the latest pretrain run's summary, else from the ledger."""
    ledger_dir = exp.folder.ledger
    row: dict[str, Any] = {"experiment": exp.name, "variant": variant_text(exp)}
    cost_runs = exp.cost_runs
    latest = cost_runs[-1] if cost_runs else None
    if latest is not None and CostSummary.logged_in(latest.summary):
        cost = CostSummary.from_wandb(latest.summary, latest.config, latest.run_id)
        row.update(run=latest.name or latest.run_id, cost_source=f"W&B run {latest.run_id}", **cost.compare_row())
    elif appendlog.exists(ledger_dir / LEDGER_FILE):
        cost = summarize_ledger(ledger_dir)
        row.update(run=(latest.name if latest else None) or cost.run_id, cost_source=f"ledger {ledger_dir}",
                   **cost.compare_row())
    else:
        raise MissingStageError(f"experiment '{exp.name}': no cost found (no W&B pretrain run with cost/* and no "
                                f"{ledger_dir / LEDGER_FILE}): {PRETRAIN.run_first}")
    row["final_loss"] = final_loss(exp, cfg.cost.loss_metric)
    row["eval_score"] = eval_score(exp, metric)
    row["rub_per_eval_point"] = rub_per_eval_point(row.get("rub_total"), row["eval_score"])
    if row["eval_score"] is not None:  # for the plot only (no table column): the score's interval
        row["_eval_interval"] = score_interval(exp.folder.eval, metric, row["eval_score"])
    if target is not None:
        row.update(target_cells(exp, target, cost))
    return row


def loss_curve(exp: ExperimentRuns, loss_key: str) -> list[tuple[float, float]]:
    """(rubles, loss) points from every pretrain run's history (resumed runs continue the ledger's rubles)."""
    points = [(float(h[RUB_SPENT]), float(h[loss_key])) for r in exp.cost_runs for h in r.history
              if isinstance(h.get(RUB_SPENT), (int, float)) and isinstance(h.get(loss_key), (int, float))]
    return sorted(p for p in points if math.isfinite(p[1]))


def plot_loss_vs_rubles(experiments: list[ExperimentRuns], loss_key: str, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {exp.name: loss_curve(exp, loss_key) for exp in experiments}
    curves = {name: pts for name, pts in curves.items() if pts}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
    ax.set_xlabel("rubles spent")
    ax.set_ylabel(loss_key)
    ax.set_title("Loss against rubles")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


@dataclass(frozen=True)
class ScorePoint:
    """One run on the eval-score plot: its rubles, its score and the score's 95% interval."""

    name: str
    rub: float
    score: float
    low: float | None = None  # None: the run's eval results (eval/step_N.json) are not on this machine
    high: float | None = None
    chance: float | None = None

    @property
    def error_bar(self) -> tuple[float, float] | None:
        """(below, above) the score, as matplotlib's ``yerr`` takes them."""
        if self.low is None or self.high is None:
            return None
        return (self.score - self.low, self.high - self.score)


def score_interval(eval_dir: Path, metric: str | None, score: float) -> tuple[float, float, float | None] | None:
    """The 95% interval and chance level of ``score`` (W&B summary key ``eval/<task>/<name>``) from the run's
    eval results: W&B summaries carry the score alone, ``eval/step_N.json`` its interval too. The newest
    step whose value is the score wins; None when no results file holds it."""
    parts = (metric or "").split("/")
    if len(parts) != 3 or parts[0] != "eval":
        return None
    _, task, name = parts
    for path in sorted(eval_dir.glob("step_*.json"), reverse=True):
        try:
            entry = parse_json(path.read_text(encoding="utf-8"))["tasks"][task]["metrics"][name]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if math.isclose(entry.get("value", math.nan), score, rel_tol=1e-9) and entry.get("ci95"):
            low, high = entry["ci95"]
            return float(low), float(high), entry.get("chance")
    return None


def score_points(rows: list[dict[str, Any]]) -> list[ScorePoint]:
    """The eval plot's points: each row with rubles and a score, its interval where its results are on disk."""
    points = []
    for row in rows:
        if row.get("rub_total") is None or row.get("eval_score") is None:
            continue
        low, high, chance = row.get("_eval_interval") or (None, None, None)
        points.append(ScorePoint(str(row.get("variant") or row["experiment"]), float(row["rub_total"]),
                                 float(row["eval_score"]), low, high, chance))
    return points


def score_axis(points: list[ScorePoint]) -> tuple[float, float]:
    """The y-range: all of [0, 1] for accuracies, so that runs whose intervals overlap are not spread over the
    whole height as if they were ranked; otherwise every interval and the chance level, padded, and never
    narrower than the widest interval."""
    values = [v for p in points for v in (p.score, p.low, p.high, p.chance) if v is not None]
    if all(0.0 <= v <= 1.0 for v in values):
        return (0.0, 1.0)
    low, high = min(values), max(values)
    widest = max([p.high - p.low for p in points if p.low is not None and p.high is not None] or [0.0])
    pad = max(0.1 * (high - low), widest, 1e-6)
    return (low - pad, high + pad)


def plot_eval_vs_rubles(rows: list[dict[str, Any]], metric: str | None, path: Path) -> Path | None:
    """Each run's eval score with its 95% interval against the rubles it cost, chance level dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = score_points(rows)
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for point in points:
        bar = point.error_bar
        # named in the legend, not beside the point: a sweep's points sit close together and their labels overlap
        ax.errorbar([point.rub], [point.score], yerr=None if bar is None else [[bar[0]], [bar[1]]], fmt="o",
                    capsize=4, markersize=5, label=point.name)
    chances = {p.chance for p in points if p.chance is not None}
    for chance in chances:
        ax.axhline(chance, color="grey", linestyle="--", linewidth=1, label=f"chance {chance:g}")
    ax.set_ylim(*score_axis(points))
    ax.set_xlabel("rubles spent (pretraining)")
    ax.set_ylabel(metric or "eval score")
    missing = sum(p.error_bar is None for p in points)
    note = "bars: 95% intervals (Wilson for accuracies)" + (f"; {missing} run(s) without recorded interval"
                                                           if missing else "")
    ax.set_title(f"Eval score against rubles\n{note}", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1)
    return save_figure(fig, path)


def plot_frontier(rows: list[dict[str, Any]], target: Target, path: Path) -> Path | None:
    """Best quality reached against rubles: each run's best-so-far curve, the group's frontier (the best any
    run had reached for that money) and the target line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {r["experiment"]: best_so_far(r.get("_points") or [], target.lower_is_better) for r in rows}
    curves = {name: curve for name, curve in curves.items() if curve}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        ax.step([c[0] for c in curve], [c[1] for c in curve], where="post", marker=".", alpha=0.7, label=name)
    pick = min if target.lower_is_better else max
    frontier: list[tuple[float, float]] = []
    for rub, value in sorted(point for curve in curves.values() for point in curve):
        frontier.append((rub, value if not frontier else pick(frontier[-1][1], value)))
    ax.step([f[0] for f in frontier], [f[1] for f in frontier], where="post", color="black", linewidth=2,
            label="frontier (best of the group)")
    ax.axhline(target.value, color="tab:red", linestyle="--", label=f"target {target.label}")
    for row in rows:
        if row.get("rub_to_target") is not None:
            ax.plot([row["rub_to_target"]], [target.value], marker="x", color="tab:red")
    ax.set_xlabel("rubles spent")
    ax.set_ylabel(f"best {target.metric} so far")
    ax.set_title("Best quality reached against rubles")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, path)


def compare_costs(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any) -> list[dict[str, Any]]:
    """Recipe 06: the cost table and plots of this experiment and ``cost.compare_experiments``."""
    exclude = getattr(wandb_run, "id", None)
    experiments = []
    for name, group in compared_experiments(cfg):
        folder = RunFolder(run_folder.root.parent / name)
        if not folder.root.is_dir():
            key = "cost.compare_experiments" if name in cfg.cost.compare_experiments else "experiment.variants"
            raise MissingStageError(f"config key '{key}': no run folder {folder.root} for experiment '{name}'"
                                    + ("" if key == "cost.compare_experiments" else ": run recipes/08_sweep.py"))
        runs = read_runs(cfg, folder, folder_group(folder, group), exclude, experiment=name,
                         target=known_target(cfg))
        experiments.append(ExperimentRuns(name, folder, runs))
    for exp in experiments:
        if not exp.runs:
            log.warning("experiment '%s': no W&B run found under %s; its loss and eval scores come from the run "
                        "folder (train_log.jsonl, eval/step_*.json)", exp.name, exp.folder.wandb)
    metric = pick_eval_metric(cfg, [r.summary for e in experiments for r in [*e.cost_runs, *e.eval_runs]]
                              + [e.saved_scores for e in experiments])
    target = target_of(cfg.cost, metric)
    rows = [cost_row(cfg, exp, metric, target) for exp in experiments]

    reports = run_folder.reports
    reports.mkdir(parents=True, exist_ok=True)
    images = {}
    notes = [f"eval score: {metric or f'none found (run {EVAL.recipe})'}; RUB / eval point = rubles / "
             "(score x 100) for an accuracy in [0, 1]"]
    loss_png = plot_loss_vs_rubles(experiments, cfg.cost.loss_metric, reports / "loss_vs_rubles.png")
    if loss_png:
        images["loss_vs_rubles"] = loss_png
    else:
        notes.append(f"no loss-against-rubles plot: no pretrain history has both '{cfg.cost.loss_metric}' and "
                     f"'{RUB_SPENT}'")
    eval_png = plot_eval_vs_rubles(rows, metric, reports / "eval_vs_rubles.png")
    if eval_png:
        images["eval_vs_rubles"] = eval_png
    if target is not None:
        notes.append(f"target: {target.label}; rubles, chip-hours, hours and tokens when the run first reached it, "
                     "interpolated linearly between the eval points around the crossing (train.eval_every)")
        frontier_png = plot_frontier(rows, target, reports / "frontier.png")
        if frontier_png:
            images["frontier"] = frontier_png
        else:
            notes.append(f"no frontier plot: no run logged '{target.metric}' during training (train.eval_every)")
    log.info("compared %d experiment(s): %s", len(rows),
             ", ".join(f"{r['experiment']} ({r['cost_source']})" for r in rows))
    columns = columns_for(target)
    files = write_table(rows, columns, reports / "costs", "Experiment costs in rubles", notes=notes,
                        terminal_columns=terminal_order(rows, columns))
    log_to_wandb(wandb_run, "costs", rows, columns, images, files, artifact_type="cost-report")
    if cfg.experiment.anneal.declared() and not cfg.experiment.variant:
        from cost.anneal import anneal_report  # an anneal comparison's table of bits per byte per data set

        anneal_report(cfg, run_folder)
    return rows
