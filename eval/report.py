"""Results as rows (for the W&B table) and as a Markdown report, chance and interval beside each score."""

from __future__ import annotations

from typing import Any


def results_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (task, metric), plus per-group accuracy rows (RuBLiMP phenomena) and bits per byte."""
    rows: list[dict[str, Any]] = []

    def add(task: str, group: str, metric: str, value: float, ci: tuple[float, float] | None, chance: float | None,
            items: int, labels: str, majority: float | None = None) -> None:
        rows.append({"task": task, "group": group, "metric": metric, "value": value,
                     "ci95_low": None if ci is None else ci[0], "ci95_high": None if ci is None else ci[1],
                     "chance": chance, "majority": majority, "items": items, "labels": labels})

    if "validation" in results:
        v = results["validation"]
        add("validation", "", "bits_per_byte", v["bits_per_byte"], None, None, v["tokens"], "")
        add("validation", "", "perplexity", v["perplexity"], None, None, v["tokens"], "")
    for name, v in results.get("heldout", {}).items():
        add("heldout", name, "bits_per_byte", v["bits_per_byte"], None, None, v["tokens"], "")
    for task, r in results.get("tasks", {}).items():
        for metric, m in r["metrics"].items():
            add(task, "", metric, m["value"], tuple(m["ci95"]), m["chance"], m["n"], r["labels"], m.get("majority"))
        for group, m in r.get("groups", {}).items():
            add(task, group, "acc", m["value"], tuple(m["ci95"]), m["chance"], m["n"], r["labels"])
    return rows


def _fmt(x: float | None, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def render_markdown(results: dict[str, Any]) -> str:
    lines = [f"# Evaluation of {results.get('experiment', '')} at step {results['step']}", ""]
    if "validation" in results or "heldout" in results:
        lines += ["| text | bits per byte | perplexity | tokens | bytes |", "|---|---:|---:|---:|---:|"]
        texts = ([("validation shards", results["validation"])] if "validation" in results else [])
        texts += list(results.get("heldout", {}).items())
        lines += [f"| {name} | {v['bits_per_byte']:.4f} | {v['perplexity']:.2f} | {v['tokens']} | {v['bytes']} |"
                  for name, v in texts]
        lines.append("")
    if results.get("tasks"):
        lines += [f"Tasks ({results.get('num_fewshot', 0)}-shot where the task has a prompt); 95% intervals: "
                  "Wilson for accuracies, bootstrap for MCC. Chance: uniform guessing; majority: always giving "
                  "the most common answer (tasks with the same answers on every item). Silver labels are crowd "
                  "majority votes, not gold.", "",
                  "| task | metric | score | 95% interval | chance | majority | items | labels |",
                  "|---|---|---:|---|---:|---:|---:|---|"]
        for task, r in results["tasks"].items():
            for metric, m in r["metrics"].items():
                lo, hi = m["ci95"]
                lines.append(f"| {task} | {metric} | {_fmt(m['value'])} | [{_fmt(lo)}, {_fmt(hi)}] | "
                             f"{_fmt(m['chance'])} | {_fmt(m.get('majority'))} | {m['n']} | {r['labels']} |")
        for task, r in results["tasks"].items():
            if not r.get("groups"):
                continue
            lines += ["", f"## {task} by group", "", "| group | acc | 95% interval | chance | items |",
                      "|---|---:|---|---:|---:|"]
            for group, m in r["groups"].items():
                lo, hi = m["ci95"]
                lines.append(f"| {group} | {_fmt(m['value'])} | [{_fmt(lo)}, {_fmt(hi)}] | {_fmt(m['chance'])} | "
                             f"{m['n']} |")
    if results.get("tasks_skipped"):
        lines += ["", "Skipped (eval.missing_tasks: skip):", ""]
        lines += [f"- {task}: {reason}" for task, reason in results["tasks_skipped"].items()]
    return "\n".join(lines) + "\n"
