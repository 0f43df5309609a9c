"""The table of an anneal comparison (``experiment.anneal``): what each candidate mixture did against the control.

Recipe 08 runs every mixture (the control and each candidate) from every seed as a decay branch of one parent
checkpoint (experiment/sweep.py's ``anneal_variants``) and recipe 05 measures each run's held-out bits per byte on
every data set the comparison names (``eval.validation_sets``). Recipe 06 then reads them back and writes, into the
sweep's ``reports/``:

- ``anneal_runs.md`` / ``.csv``: one row per run: its mixture, seed, bits per byte per set, its own rubles (the
  anneal: its ledger's total less what it inherited from the parent up to the branch step) and its total;
- ``anneal.md`` / ``.csv``: for each candidate and each set, the control's and the candidate's mean bits per byte
  over seeds with a 95% t-interval, and the candidate - control difference paired by seed with its own 95%
  t-interval (``paired_differences``), and what each mixture's runs cost.

Why paired: a seed fixes the data order of a run (the loader's shuffle of each set, by the seed and the set's place
in the mixture), so the control and a candidate of one seed read a set they share at the same place in the same
order and start from the same checkpoint; the noise
they share cancels in their difference, which is what the comparison asks about. The interval of the mean of the
per-seed differences is Student's t with n - 1 degrees of freedom (n seeds).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost.ledger_format import read_sessions
from cost.ledger_pricing import summarize_ledger
from cost.report import SIG, Column, write_table
from experiment.errors import MissingStageError
from experiment.jsontext import parse_json
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import EVAL
from experiment.sweep import CONTROL, AnnealConfig, anneal_run_name, sweep_name, variant_experiment_name

log = logging.getLogger("cost.anneal")
LEVEL = 0.95  # the intervals' confidence level
RUNS_REPORT = "anneal_runs"
COMPARISON_REPORT = "anneal"


@dataclass(frozen=True)
class Interval:
    """A mean over seeds and its two-sided t-interval (NaN bounds below two values: no spread to measure)."""

    mean: float
    low: float
    high: float
    n: int

    def text(self, digits: int = 4, signed: bool = False) -> str:
        """``mean ± half-width`` (a t-interval is symmetric), or the mean alone without an interval."""
        mean = f"{self.mean:+.{digits}f}" if signed else f"{self.mean:.{digits}f}"
        return mean if math.isnan(self.low) else f"{mean} ± {(self.high - self.low) / 2:.{digits}f}"


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean of ``values`` and its Student-t interval: mean +- t(1 - (1 - level) / 2, n - 1) x s / sqrt(n)."""
    from scipy import stats  # scipy comes with jax; imported here, where an interval is computed

    data = np.asarray(values, dtype=np.float64)
    mean = float(data.mean())
    if len(data) < 2:
        return Interval(mean, math.nan, math.nan, len(data))
    half = float(stats.t.ppf(0.5 + level / 2, len(data) - 1) * data.std(ddof=1) / math.sqrt(len(data)))
    return Interval(mean, mean - half, mean + half, len(data))


def paired_differences(candidate: dict[int, float], control: dict[int, float], level: float = LEVEL) -> Interval:
    """The mean of candidate - control over the seeds both have, with the t-interval of those differences."""
    seeds = sorted(set(candidate) & set(control))
    return t_interval([candidate[seed] - control[seed] for seed in seeds], level)


def verdict(difference: Interval) -> str:
    """What the interval of candidate - control bits per byte says (lower is better)."""
    if math.isnan(difference.low):
        return "one seed: no interval"
    if difference.high < 0:
        return "better"
    if difference.low > 0:
        return "worse"
    return "not different"


@dataclass(frozen=True)
class AnnealRun:
    mixture: str
    seed: int
    experiment: str
    bpb: dict[str, float]  # data set -> held-out bits per byte of the run's last step
    rub_own: float  # the anneal's own rubles: the ledger's total less the parent's up to the branch step
    rub_total: float


def ledger_rubles(folder: RunFolder) -> tuple[float, float]:
    """``(own, total)`` rubles of a run's ledger: a branch's total holds its parent's up to the branch step, which
    its inherit record gives (cost/ledger_pricing.py)."""
    total = summarize_ledger(folder.ledger).rub_total
    inherited = [session.meta["inherited"] for session in read_sessions(folder.ledger) if "inherited" in session.meta]
    return total - (float(inherited[-1]["rub_total"]) if inherited else 0.0), total


def read_run(folder: RunFolder, mixture: str, seed: int, last_step: int, sets: Sequence[str]) -> AnnealRun:
    """One run's bits per byte per set (its eval of ``last_step``) and rubles; a run not evaluated there is one
    error line saying how to finish it."""
    name = folder.root.name
    manifest = EVAL.read_manifest_if_present(folder.eval)
    if manifest is None or manifest["latest_step"] != last_step:
        raise MissingStageError(f"anneal run '{name}': no evaluation of its last step {last_step} in {folder.eval}: "
                                "rerun recipes/08_sweep.py with the same config to finish it")
    results = parse_json((folder.eval / manifest["latest"]).read_text(encoding="utf-8"))
    by_set = results.get("validation_by_set") or {}
    missing = [s for s in sets if s not in by_set]
    if missing:
        raise MissingStageError(f"anneal run '{name}': its evaluation has no bits per byte of the set {missing[0]!r} "
                                f"(a set with an empty validation split is not measured): {folder.eval}")
    own, total = ledger_rubles(folder)
    return AnnealRun(mixture, seed, name, {s: float(by_set[s]["bits_per_byte"]) for s in sets}, own, total)


def measured_sets(anneal: AnnealConfig) -> list[str]:
    """The sets any mixture draws from, in ``sets`` order: every run is measured on each."""
    return [name for name in anneal.sets if any(name in mixture for mixture in anneal.mixtures().values())]


def read_runs(cfg: ExperimentConfig, sweep_folder: RunFolder) -> list[AnnealRun]:
    anneal = cfg.experiment.anneal
    sweep, sets = sweep_name(cfg.experiment), measured_sets(anneal)
    return [read_run(RunFolder(sweep_folder.root.parent / variant_experiment_name(sweep, anneal_run_name(name, seed))),
                     name, seed, anneal.step + anneal.steps, sets)
            for name in anneal.mixtures() for seed in anneal.seeds]


def comparison_rows(runs: Sequence[AnnealRun], candidates: Sequence[str], sets: Sequence[str]) -> list[dict[str, Any]]:
    """For each candidate and set: control's and candidate's bits per byte over seeds, their paired difference,
    and each mixture's mean rubles per run."""
    def by_seed(mixture: str, data_set: str) -> dict[int, float]:
        return {run.seed: run.bpb[data_set] for run in runs if run.mixture == mixture}

    def mean_rub(mixture: str, key: str) -> float:
        return float(np.mean([getattr(run, key) for run in runs if run.mixture == mixture]))

    rows = []
    for candidate in candidates:
        for data_set in sets:
            control, tried = by_seed(CONTROL, data_set), by_seed(candidate, data_set)
            control_bpb, candidate_bpb = t_interval(list(control.values())), t_interval(list(tried.values()))
            difference = paired_differences(tried, control)
            rows.append({
                "candidate": candidate, "data_set": data_set, "seeds": difference.n,
                "control_bpb": control_bpb.text(), "candidate_bpb": candidate_bpb.text(),
                "difference": difference.text(signed=True), "verdict": verdict(difference),
                "control_mean": control_bpb.mean, "control_low": control_bpb.low, "control_high": control_bpb.high,
                "candidate_mean": candidate_bpb.mean, "candidate_low": candidate_bpb.low,
                "candidate_high": candidate_bpb.high,
                "difference_mean": difference.mean, "difference_low": difference.low,
                "difference_high": difference.high,
                "rub_control": mean_rub(CONTROL, "rub_own"), "rub_candidate": mean_rub(candidate, "rub_own"),
                "rub_candidate_total": mean_rub(candidate, "rub_total"),
            })
    return rows


COMPARISON_COLUMNS = (
    Column("candidate", "candidate"),
    Column("data_set", "data set"),
    Column("control_bpb", "control ± 95%"),
    Column("candidate_bpb", "candidate ± 95%"),
    Column("difference", "difference ± 95%"),
    Column("verdict", "candidate is"),
    Column("seeds", "seeds", terminal=False),
    *(Column(key, key, "{:.6f}", terminal=False) for key in (
        "control_mean", "control_low", "control_high", "candidate_mean", "candidate_low", "candidate_high",
        "difference_mean", "difference_low", "difference_high")),
    Column("rub_control", "RUB / control run", SIG),
    Column("rub_candidate", "RUB / candidate run", SIG),
    Column("rub_candidate_total", "RUB / candidate run with parent", SIG, terminal=False),
)


def run_columns(sets: Sequence[str]) -> tuple[Column, ...]:
    return (Column("experiment", "run"), Column("mixture", "mixture"), Column("seed", "seed"),
            *(Column(f"bpb_{name}", f"bpb {name}", "{:.4f}") for name in sets),
            Column("rub_own", "RUB (anneal)", SIG), Column("rub_total", "RUB (with parent)", SIG))


def anneal_report(cfg: ExperimentConfig, sweep_folder: RunFolder) -> list[dict[str, Any]]:
    """Recipe 06 on an anneal comparison: both tables printed and written to the sweep's reports/; returns the
    comparison's rows."""
    anneal = cfg.experiment.anneal
    sets = measured_sets(anneal)
    runs = read_runs(cfg, sweep_folder)
    reports = sweep_folder.reports
    reports.mkdir(parents=True, exist_ok=True)
    run_rows = [{"experiment": r.experiment, "mixture": r.mixture, "seed": r.seed, "rub_own": r.rub_own,
                 "rub_total": r.rub_total, **{f"bpb_{name}": r.bpb[name] for name in sets}} for r in runs]
    write_table(run_rows, run_columns(sets), reports / RUNS_REPORT, "Anneal runs: held-out bits per byte and rubles",
                notes=[f"each run: steps {anneal.step + 1}-{anneal.step + anneal.steps} from {anneal.parent}'s "
                       f"checkpoint {anneal.step}; RUB (anneal): its own, RUB (with parent): with the parent's up to "
                       "that step"])
    rows = comparison_rows(runs, list(anneal.candidates), sets)
    mixtures = "; ".join(f"{name}: " + ", ".join(f"{s} {w:g}" for s, w in mixture.items())
                         for name, mixture in anneal.mixtures().items())
    write_table(rows, COMPARISON_COLUMNS, reports / COMPARISON_REPORT,
                f"Anneal comparison: {len(anneal.seeds)} seeds, {anneal.steps} steps from {anneal.parent} step "
                f"{anneal.step}", preamble=f"Mixtures (set weight): {mixtures}.",
                notes=["control, candidate: held-out (validation split) bits per byte of the data set at the last "
                       "step, lower is better: the mean over seeds ± the half-width of its 95% Student-t interval",
                       "difference: candidate - control bits per byte paired by seed (a seed reads a set both "
                       "mixtures have at the same place in the same order), their mean ± its 95% t-interval "
                       "(n - 1 degrees of freedom); the candidate is better or worse when the interval excludes 0",
                       "RUB / run: each mixture's mean own rubles per run (the anneal alone, not the parent's)"])
    log.info("anneal comparison: %d runs, %d candidate(s) x %d set(s)", len(runs), len(anneal.candidates), len(sets))
    return rows
