"""The figures README.md, docs/guide.md and eval/README.md quote, read from where they were measured.

A figure typed by hand into a README drifts as soon as the code changes. Every figure these files give about
``make demo``, ``make demo-sweep`` and ``make test`` is read from the run folder or the test reports it came
from and written between markers, with the figures themselves as one JSON comment. ``tests/test_readme_figures.py``
checks that the text between the markers is what the JSON renders to (no hand edit), that a run the suite makes
gives the same fields, and that the test counts are what pytest collects now. A block whose source is not on
this machine keeps its recorded figures (re-rendered, so a change of wording reaches it).

    python -m tools.readme_figures               # print the blocks from runs/demo, runs/demo-sweep, runs/test-reports
    python -m tools.readme_figures --write       # rewrite the blocks in README.md, docs/guide.md, eval/README.md
    python -m tools.readme_figures --check       # exit 1 when a block differs from its source
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import yaml

from eval.report import BASELINE_NAMES
from experiment.errors import DataError

REPO = Path(__file__).resolve().parents[1]
DEMO, SWEEP, DEMO_EVAL, TESTS = "demo-figures", "sweep-figures", "demo-eval-figures", "test-figures"
# where each block lives
FILES = {DEMO: "README.md", TESTS: "README.md", SWEEP: "docs/guide.md", DEMO_EVAL: "eval/README.md"}
COMMAND = "make readme-figures"
WIDTH = 115  # rendered prose is wrapped to this width, inside the declared line length
STAMP = re.compile(r"^(\d{8}T\d{6}Z)-")  # configs/<stamp>-<stage>.yaml, written when a recipe starts


def _json(path: Path) -> Any:
    if not path.is_file():
        raise DataError(f"{path} is missing: the figures need the stage that writes it")
    return json.loads(path.read_text(encoding="utf-8"))


def _stamps(folder: Path) -> list[dt.datetime]:
    """When each recipe started on this run folder (the config copy it saved first)."""
    found = []
    for path in (folder / "configs").glob("*.yaml"):
        match = STAMP.match(path.name)
        if match:
            found.append(dt.datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC))
    return sorted(found)


def _mtime(path: Path) -> dt.datetime:
    return dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.UTC)


def wall_seconds(started: list[dt.datetime], last_files: list[Path]) -> int | None:
    """From the first recipe's start to the newest of ``last_files`` (None when a copy lost the times)."""
    files = [p for p in last_files if p.is_file()]
    if not started or not files:
        return None
    seconds = (max(_mtime(p) for p in files) - started[0]).total_seconds()
    return round(seconds) if seconds >= 0 else None


def checkpoint_steps(folder: Path) -> list[int]:
    """The finished checkpoints kept in ``checkpoints/`` (Orbax's temporary folders are not)."""
    root = folder / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit()) if root.is_dir() else []


def ledger_cost(folder: Path) -> dict[str, Any]:
    from cost.ledger_pricing import summarize_ledger

    summary = summarize_ledger(folder / "ledger")
    return {"rub": summary.rub_total, "price_row": summary.price.name, "pricing": summary.price.pricing,
            "usd_rub_rate": summary.usd_rub_rate, "rate_date": summary.rate_date}


def task_figures(result: dict[str, Any]) -> dict[str, Any]:
    """A task's accuracy with its interval, its strongest no-model baseline and the step-0 weights' score."""
    acc = result["metrics"]["acc"]
    baselines = result.get("baselines", {})
    strongest = baselines.get("strongest")
    return {"acc": acc["value"], "ci95": list(acc["ci95"]), "items": result["items"], "labels": result["labels"],
            "strongest_baseline": strongest,
            "strongest_value": baselines[strongest]["value"] if strongest else None,
            "random_init": baselines["random_init"]["value"] if "random_init" in baselines else None}


def _scored(entry: dict[str, Any]) -> list[float]:
    return [entry["value"], *entry["ci95"]]


def demo_eval_figures(folder: Path) -> dict[str, Any]:
    """Each task of a demo run's last evaluation against its baselines, and RuBLiMP's verdicts by phenomenon."""
    folder = Path(folder)
    manifest = _json(folder / "eval" / "manifest.json")
    results = _json(folder / "eval" / manifest["latest"])
    tasks = []  # a list, in the results' order (a JSON object's keys are sorted when written)
    for name, task in results.get("tasks", {}).items():
        versus = task.get("vs_strongest_baseline")
        if versus is None:
            continue
        baselines = task["baselines"]
        tasks.append({"task": name, "acc": _scored(task["metrics"]["acc"]), "items": task["items"],
                       "labels": task["labels"],
                       "strongest": versus["baseline"], "strongest_score": _scored(baselines[versus["baseline"]]),
                       "random_init": _scored(baselines["random_init"]) if "random_init" in baselines else None,
                       "verdict": versus["verdict"],
                       "one_answer": task["answers"]["top"] if task["answers"]["one_answer"] else None})
    groups = results.get("tasks", {}).get("rublimp", {}).get("groups", {})
    verdicts: dict[str, int] = {}
    for group in groups.values():
        verdict = group["vs_strongest_baseline"]["verdict"]
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    return {"folder": folder.name, "train_run": results.get("train_wandb_run_id"), "evaluated": manifest["created_at"],
            "step": results["step"], "max_items_per_task": results["config"]["max_items_per_task"],
            "tasks": tasks, "rublimp_groups": dict(sorted(verdicts.items()))}


def demo_figures(folder: Path) -> dict[str, Any]:
    """Everything the README says about a demo run, read from its folder."""
    folder = Path(folder)
    corpus = _json(folder / "corpus" / "manifest.json")
    tokenizer = _json(folder / "tokenizer" / "manifest.json")
    shards = _json(folder / "shards" / "manifest.json")
    eval_manifest = _json(folder / "eval" / "manifest.json")
    results = _json(folder / "eval" / eval_manifest["latest"])
    steps = checkpoint_steps(folder)
    if not steps:
        raise DataError(f"{folder / 'checkpoints'}: no checkpoint: run recipes/04_pretrain.py first")
    meta = _json(folder / "checkpoints" / str(steps[-1]) / "meta" / "metadata")
    from cost.ledger_format import read_sessions
    from cost.target import read_train_log

    log = [r for r in read_train_log(folder) if "train/loss" in r]
    if not log:
        raise DataError(f"{folder / 'train_log.jsonl'}: no logged step")
    opened = [session.meta for session in read_sessions(folder / "ledger")]  # each session's open record
    speeds = [r["train/tokens_per_s"] for r in log if r.get("train/tokens_per_s")]
    return {
        "folder": folder.name,
        "train_run": results.get("train_wandb_run_id") or meta.get("wandb_run_id"),
        "evaluated": eval_manifest["created_at"],
        "devices": opened[0].get("devices") if opened else None,
        "wall_seconds": wall_seconds(_stamps(folder), sorted((folder / "reports").glob("plan.*"))),
        "documents_in": corpus["counts"]["in"], "documents_kept": corpus["counts"]["kept"],
        # the kept documents' UTF-8 text, as recipe 01's log and report quote it (the shard files add ids and JSON)
        "corpus_bytes": corpus["input_bytes"]["kept_text"],
        "vocab_size": tokenizer["vocab_size"], "tokenizer_type": tokenizer.get("model_type"),
        "train_tokens": shards["splits"]["train"]["tokens"],
        "n_params": meta["n_params"], "steps": eval_manifest["latest_step"], "checkpoints_kept": steps,
        "tokens_per_s": [min(speeds), max(speeds)] if speeds else None,
        "loss_first": [log[0]["train/step"], log[0]["train/loss"]],
        "loss_last": [log[-1]["train/step"], log[-1]["train/loss"]],
        "val_bpb": results["validation"]["bits_per_byte"],
        "cost": ledger_cost(folder),
        "rublimp": task_figures(results["tasks"]["rublimp"]) if "rublimp" in results.get("tasks", {}) else None,
    }


def _variant_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.resolved.yaml"
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}


def sweep_figures(folder: Path) -> dict[str, Any]:
    """What each variant of a sweep cost to reach its target, from ``reports/costs.csv`` (recipe 06)."""
    folder = Path(folder)
    path = folder / "reports" / "costs.csv"
    if not path.is_file():
        raise DataError(f"{path} is missing: run recipes/08_sweep.py first")
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or "target_status" not in rows[0]:
        raise DataError(f"{path}: no target columns (set cost.target_bpb or cost.target_score)")
    variants, starts = [], []
    for row in rows:
        run_folder = folder.parent / row["experiment"]
        config = _variant_config(run_folder)
        steps = int(config["train"]["steps"])
        tokens = float(row["tokens"])
        to_target = float(row["tokens_to_target"]) if row["tokens_to_target"] else None
        variants.append({
            "experiment": row["experiment"], "variant": row["variant"],
            "run": row["cost_source"].removeprefix("W&B run "),
            "steps": steps, "reached": to_target is not None,
            # the crossing is interpolated between eval points: the step it falls at, to the nearest step
            "step_at_target": round(to_target / (tokens / steps)) if to_target is not None else None,
            "rub_to_target": float(row["rub_to_target"]) if row["rub_to_target"] else None,
            "best": float(row["best_value"]) if row["best_value"] else None,
            "rub_total": float(row["rub_total"]),
        })
        starts += _stamps(run_folder)
    config = _variant_config(folder)
    target = (config.get("cost") or {}).get("target_bpb")
    return {"folder": folder.name, "target_bpb": target, "variants": variants,
            "wall_seconds": wall_seconds(sorted(starts), [path])}


def collected_tests(marker: str = "") -> int:
    """How many tests pytest collects in this venv now (``marker``: a ``-m`` expression)."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
    done = subprocess.run(command + (["-m", marker] if marker else []), cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if done.returncode != 0:
        raise DataError(f"pytest --collect-only failed ({done.returncode}): {done.stdout[-500:]}{done.stderr[-500:]}")
    return sum("::" in line for line in done.stdout.splitlines())


def junit_figures(path: Path) -> dict[str, Any]:
    """A pytest JUnit XML report's counts and its session's wall time."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        raise DataError(f"{path}: not a JUnit XML report ({exc})") from exc
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise DataError(f"{path}: no <testsuite> element")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = counts["failures"] + counts["errors"]
    return {"passed": counts["tests"] - failed - counts["skipped"], "skipped": counts["skipped"], "failed": failed,
            "seconds": round(float(suite.get("time", 0.0))), "started": suite.get("timestamp")}


def measured_tests(reports: Path) -> dict[str, Any]:
    """What the last ``make test`` (and ``.ci/run`` around it) recorded in ``reports``: base.xml, unit.xml, one
    extra-<lane>.xml per extras' lane (Makefile) and ci.json (.ci/run)."""
    base = reports / "base.xml"
    if not base.is_file():
        raise DataError(f"{base} is missing: run `make test` (or .ci/run) first")
    unit = reports / "unit.xml"
    ci = _json(reports / "ci.json") if (reports / "ci.json").is_file() else {}
    lanes = {path.stem.removeprefix("extra-"): junit_figures(path) for path in sorted(reports.glob("extra-*.xml"))}
    base_figures = junit_figures(base)
    return {"date": (ci.get("started") or base_figures["started"] or "")[:10], "commit": ci.get("commit"),
            "cpu": ci.get("cpu"), "cores": ci.get("cores"), "ci_seconds": ci.get("seconds"),
            "ci_status": ci.get("status"),
            "base": base_figures, "unit": junit_figures(unit) if unit.is_file() else None, "lanes": lanes}


def test_figures(reports: Path | None, recorded: dict[str, Any] | None) -> dict[str, Any]:
    """The suite's size as collected now, and its times from ``reports`` (else as ``recorded`` before)."""
    base, unit = collected_tests(), collected_tests("not integration")
    if reports is not None and (reports / "base.xml").is_file():
        measured = measured_tests(reports)
    else:  # as recorded (None: never measured)
        measured = recorded.get("measured") if recorded else None
    return {"folder": "test-reports", "collected": {"base": base, "unit": unit, "integration": base - unit},
            "measured": measured}


# ------------------------------------------------------------------------------------------------ rendering
def minutes(seconds: int | None) -> str:
    if seconds is None:
        return "time not recorded"
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def wrapped(text: str) -> str:
    """A list item's text, wrapped to WIDTH with the list's indent."""
    return textwrap.fill(text, width=WIDTH, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


def render_demo(f: dict[str, Any]) -> str:
    speed = f["tokens_per_s"]
    text = (
        f"- **Demo** (`make demo` on {f['devices'] or 'devices not recorded'}, run `{f['train_run']}` evaluated "
        f"{f['evaluated'][:10]}): {minutes(f['wall_seconds'])} from recipe 01 to recipe 07. "
        f"{f['documents_in']:,} Debian documents in, {f['documents_kept']:,} kept "
        f"({f['corpus_bytes'] / 1e6:.1f} MB of text); "
        f"a {f['vocab_size']:,}-piece {(f['tokenizer_type'] or '').upper()} tokenizer; a "
        f"{f['n_params'] / 1e6:.2f}M-parameter decoder trained {f['steps']} steps on {f['train_tokens']:,} tokens"
        + (f" at {speed[0]:,.0f}-{speed[1]:,.0f} tokens/s" if speed else "")
        + f", loss {f['loss_first'][1]:.2f} (step {f['loss_first'][0]}) -> {f['loss_last'][1]:.2f} "
        f"(step {f['loss_last'][0]}); {len(f['checkpoints_kept'])} checkpoints kept (steps "
        f"{', '.join(str(s) for s in f['checkpoints_kept'])}); validation {f['val_bpb']:.3f} bits per byte; "
        f"{f['cost']['rub']:.2f} RUB "
        f"({f['cost']['price_row']}, {f['cost']['pricing']}, {f['cost']['usd_rub_rate']} RUB/USD of "
        f"{f['cost']['rate_date']})."
    )
    task = f["rublimp"]
    if task is None:
        return wrapped(text + " RuBLiMP skipped (its files were absent).")
    low, high = task["ci95"]
    strongest = BASELINE_NAMES.get(task["strongest_baseline"], task["strongest_baseline"])
    text += (f" RuBLiMP {task['acc']:.3f} [{low:.3f}, {high:.3f}] on {task['items']:,} pairs against its strongest "
             f"baseline ({strongest}: {task['strongest_value']:.3f})")
    if task["random_init"] is not None:
        text += f" and the run's step-0 weights ({task['random_init']:.3f})"
    return wrapped(text + "; eval/README.md has the other tasks.")


def render_tests(f: dict[str, Any]) -> str:
    n, m = f["collected"], f["measured"]
    size = (f"- **Tests**: {n['base']:,} in the base suite, {n['unit']:,} unit (`make test-unit`) and "
            f"{n['integration']:,} integration.")
    if m is None:
        return wrapped(size + " No `make test` run recorded yet.")

    def outcome(lane: dict[str, Any]) -> str:
        parts = [f"{lane['passed']:,} passed"] + [f"{lane[k]:,} {k}" for k in ("failed", "skipped") if lane[k]]
        return f"{', '.join(parts)} in {minutes(lane['seconds'])}"

    machine = ", ".join(str(x) for x in (m["cpu"], f"{m['cores']} cores" if m["cores"] else None) if x)
    text = (f"{size} Last `make test` ({m['date']}"
            + (f", commit {m['commit'][:7]}" if m["commit"] else "") + (f", {machine}" if machine else "") + "): "
            + (f"`.ci/run` in a fresh clone {minutes(m['ci_seconds'])}"
               + (f" (it failed: exit status {m['ci_status']})" if m.get("ci_status") else "") + "; "
               if m["ci_seconds"] else "")
            + f"base suite {outcome(m['base'])} (the skips run in the extras' venvs)"
            + (f"; the unit loop {outcome(m['unit'])}" if m["unit"] else "")
            + ("; lanes " + "; ".join(f"{name} {outcome(lane)}" for name, lane in m["lanes"].items())
               if m["lanes"] else "") + ".")
    return wrapped(text)


def render_sweep(f: dict[str, Any]) -> str:
    parts = []
    for v in f["variants"]:
        if v["reached"]:
            parts.append(f"{v['variant']}: reached at step {v['step_at_target']} for {v['rub_to_target']:.3f} RUB")
        else:
            parts.append(f"{v['variant']}: not reached in {v['steps']} steps (best {v['best']:.3f})")
    runs = ", ".join(v["run"] for v in f["variants"])
    return textwrap.fill(f"Target {f['target_bpb']} validation bits per byte; {'; '.join(parts)}. The whole sweep "
                         f"took {minutes(f['wall_seconds'])} (W&B runs {runs}).", width=WIDTH,
                         break_on_hyphens=False, break_long_words=False)


def render_demo_eval(f: dict[str, Any]) -> str:
    def scored(values: list[float] | None) -> str:
        return "not run" if values is None else f"{values[0]:.3f} [{values[1]:.3f}, {values[2]:.3f}]"

    lines = [f"Run `{f['train_run']}`, checkpoint step {f['step']}, evaluated {f['evaluated'][:10]}, "
             f"{f['max_items_per_task']} items per task and per RuBLiMP phenomenon:", "",
             "| task | acc [95%] | strongest baseline [95%] | random init (step 0) [95%] | verdict |",
             "|---|---|---|---|---|"]
    for t in f["tasks"]:
        flag = f"; '{t['one_answer']}' throughout (flagged)" if t["one_answer"] else ""
        strongest = BASELINE_NAMES.get(t["strongest"], t["strongest"])
        lines.append(f"| {t['task']} | {scored(t['acc'])} | {strongest} {scored(t['strongest_score'])} | "
                     f"{scored(t['random_init'])} | {t['verdict']}{flag} |")
    if f["rublimp_groups"]:
        counts = ", ".join(f"{verdict} on {n}" for verdict, n in f["rublimp_groups"].items())
        lines += ["", f"By RuBLiMP phenomenon ({sum(f['rublimp_groups'].values())}): {counts}."]
    return "\n".join(lines)


RENDERERS = {DEMO: render_demo, SWEEP: render_sweep, DEMO_EVAL: render_demo_eval, TESTS: render_tests}
SOURCES = {DEMO: "runs/demo", DEMO_EVAL: "runs/demo", SWEEP: "runs/demo-sweep",
           TESTS: "runs/test-reports and pytest's collection"}


def block(name: str, figures: dict[str, Any]) -> str:
    """The marked block: the opening marker naming the command, the figures as JSON, the text."""
    return (f"<!-- {name}: written by `{COMMAND}` from {SOURCES[name]}; do not edit by hand -->\n"
            f"<!-- {json.dumps(figures, sort_keys=True, ensure_ascii=False)} -->\n"
            f"{RENDERERS[name](figures)}\n<!-- /{name} -->")


def _block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- {re.escape(name)}:.*?<!-- /{re.escape(name)} -->", re.S)


def find_block(text: str, name: str) -> tuple[dict[str, Any], str] | None:
    """(the figures recorded in the block, the whole block as written), or None when the text has none."""
    match = _block_pattern(name).search(text)
    if match is None:
        return None
    lines = match.group(0).splitlines()
    data = lines[1].removeprefix("<!-- ").removesuffix(" -->")
    return json.loads(data), match.group(0)


def replace_block(text: str, name: str, figures: dict[str, Any]) -> str:
    if find_block(text, name) is None:
        raise DataError(f"no <!-- {name}: ... --> block to rewrite")
    return _block_pattern(name).sub(lambda _: block(name, figures), text, count=1)


def recorded_figures(root: Path = REPO) -> dict[str, dict[str, Any]]:
    """The figures each file's block records now."""
    found = {}
    for name, file in FILES.items():
        held = find_block((root / file).read_text(encoding="utf-8"), name)
        if held is None:
            raise DataError(f"{file} has no <!-- {name}: ... --> block")
        found[name] = held[0]
    return found


def collect(demo: Path, sweep: Path, reports: Path, recorded: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Fresh figures where their source is on this machine, the recorded ones elsewhere."""
    found = dict(recorded)
    if (demo / "eval" / "manifest.json").is_file():
        found[DEMO], found[DEMO_EVAL] = demo_figures(demo), demo_eval_figures(demo)
    if (sweep / "reports" / "costs.csv").is_file():
        found[SWEEP] = sweep_figures(sweep)
    found[TESTS] = test_figures(reports, recorded.get(TESTS))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, default=REPO / "runs" / "demo", help="the demo's run folder")
    parser.add_argument("--sweep", type=Path, default=REPO / "runs" / "demo-sweep", help="the demo sweep's folder")
    parser.add_argument("--reports", type=Path, default=REPO / "runs" / "test-reports",
                        help="the test reports `make test` wrote (a fresh clone's, for .ci/run's figures)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the blocks in place")
    action.add_argument("--check", action="store_true", help="exit 1 when a block differs from its source")
    args = parser.parse_args(argv)
    try:
        figures = collect(args.demo, args.sweep, args.reports, recorded_figures())
    except (DataError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for file in sorted(set(FILES.values())):
        path = REPO / file
        text = path.read_text(encoding="utf-8")
        for name in (name for name, held in FILES.items() if held == file):
            if find_block(text, name)[1] != block(name, figures[name]):  # type: ignore[index]
                stale.append(f"{file}: block '{name}'")
                text = replace_block(text, name, figures[name])
        if args.write:
            path.write_text(text, encoding="utf-8")
    if args.check:
        for where in stale:
            print(f"{where} differs from its source: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    if not args.write:
        for name, values in figures.items():
            print(block(name, values), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
