"""Results as rows (for the W&B table) and as a Markdown report: every score beside its interval, the
no-model baselines and the random-init model, and the distribution of the answers it gave."""

from __future__ import annotations

from typing import Any

from eval.harness import headline_metric

BASELINE_NAMES = {"chance": "chance", "majority": "majority", "fewer_tokens": "fewer tokens wins",
                  "fewer_bytes": "fewer bytes wins", "copy_number": "copy the last number",
                  "fewshot_answer": "repeat the last example's answer", "random_init": "random init",
                  "base_model": "base model", "majority_answer": "the most common answer",
                  "text_start": "the text's first three words"}


def results_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (task, metric), per baseline (``baseline:<name>``), random-init score
    (``random_init:<metric>``) and predicted-answer share (``answer_share:<answer>``), per group too
    (RuBLiMP phenomena), and bits per byte; ``note`` flags one answer given throughout or an undefined MCC."""
    rows: list[dict[str, Any]] = []

    def add(task: str, group: str, metric: str, value: float | None, ci: Any, chance: float | None,
            items: int, labels: str, majority: float | None = None, note: str = "") -> None:
        rows.append({"task": task, "group": group, "metric": metric, "value": value,
                     "ci95_low": None if ci is None else ci[0], "ci95_high": None if ci is None else ci[1],
                     "chance": chance, "majority": majority, "items": items, "labels": labels, "note": note})

    if "validation" in results:
        v = results["validation"]
        add("validation", "", "bits_per_byte", v["bits_per_byte"], None, None, v["tokens"], "")
        add("validation", "", "perplexity", v["perplexity"], None, None, v["tokens"], "")
    for name, v in results.get("heldout", {}).items():
        add("heldout", name, "bits_per_byte", v["bits_per_byte"], None, None, v["tokens"], "")
    by_position = results.get("validation_by_position", {})
    for b in by_position.get("buckets", []):  # items: the bucket's tokens
        add("validation_by_position", f"[{b['start']}, {b['end']})", "bits_per_byte", b["bits_per_byte"], None, None,
            b["tokens"], "", note=f"{b['bytes']} bytes in {by_position['documents']} documents")
    for task, r in results.get("tasks", {}).items():
        one_answer = r.get("answers", {}).get("one_answer", False)
        flag = f"one answer ('{r['answers']['top']}') throughout" if one_answer else ""
        for metric, m in r["metrics"].items():
            add(task, "", metric, m["value"], m["ci95"], m["chance"], m["n"], r["labels"], m.get("majority"),
                m.get("undefined", flag))
        for name, b in _baselines(r.get("baselines", {})):
            add(task, "", f"baseline:{name}", b["value"], b["ci95"], None, r["items"], r["labels"],
                note="strongest" if name == r["baselines"]["strongest"] else "")
        for metric, m in r.get("random_init", {}).get("metrics", {}).items():
            add(task, "", f"random_init:{metric}", m["value"], m["ci95"], m["chance"], m["n"], r["labels"],
                note=m.get("undefined", ""))
        for answer, share in r.get("answers", {}).get("predicted", {}).items():
            add(task, "", f"answer_share:{answer}", share, None, None, r["items"], r["labels"], note=flag)
        for group, m in r.get("groups", {}).items():
            add(task, group, "acc", m["value"], m["ci95"], m["chance"], m["n"], r["labels"])
            for name, b in _baselines(m.get("baselines", {})):
                add(task, group, f"baseline:{name}", b["value"], b["ci95"], None, m["n"], r["labels"],
                    note="strongest" if name == m["baselines"]["strongest"] else "")
            random_group = r.get("random_init", {}).get("groups", {}).get(group)
            if random_group:
                add(task, group, "random_init:acc", random_group["value"], random_group["ci95"], m["chance"],
                    m["n"], r["labels"])
    return rows


def _baselines(baselines: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, b) for name, b in baselines.items() if name != "strongest"]


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is not None and 0 < abs(x) < 0.5 * 10 ** -digits:  # a passkey's chance (1e-05) is not 0.000
        return f"{x:.0e}"
    return "" if x is None else f"{x:.{digits}f}"


def _interval(ci: Any, undefined: str | None = None) -> str:
    if ci is None:
        return f"undefined ({undefined})" if undefined else "undefined"
    return f"[{_fmt(ci[0])}, {_fmt(ci[1])}]"


def _with_interval(summary: dict[str, Any] | None) -> str:
    return "" if summary is None else f"{_fmt(summary['value'])} {_interval(summary['ci95'])}"


def _random_init_origin(results: dict[str, Any]) -> str:
    """'seed N' and, for a run that started from another model, that this is not where it started."""
    init = next((r["random_init"] for r in results["tasks"].values() if "random_init" in r), None)
    if init is None:
        return "the run's seed (not run here)"
    return f"seed {init['seed']}" + (f" ({init['note']})" if init.get("note") else "")


def _headline(results: dict[str, Any]) -> list[str]:
    lines = ["## Against the strongest baseline", "",
             "Each task's accuracy (summed log-likelihood) against the strongest of its no-model baselines on "
             "the same items: chance (uniform guessing), majority (always the most common gold answer, where "
             "every item offers the same answers), fewer tokens wins and fewer bytes wins (the shorter answer: "
             "summed log-likelihood favours it). 'above' / 'below': the score's 95% interval excludes the "
             "baseline's score. Random init: the run's step-0 weights, initialised by the trainer's own code "
             f"with {_random_init_origin(results)}; it counts as a baseline too. The score is the task's accuracy, "
             "or the metric named beside the task (generated answers, MERA's scorers).", "",
             "| task | score | 95% interval | strongest baseline | its score | random init | verdict | items "
             "| labels |",
             "|---|---:|---|---|---|---|---|---:|---|"]
    for task, r in results["tasks"].items():
        if "vs_strongest_baseline" not in r:
            continue
        m, versus = r["metrics"][headline_metric(r)], r["vs_strongest_baseline"]
        flag = " (one answer throughout)" if r.get("answers", {}).get("one_answer") else ""
        random_acc = r.get("random_init", {}).get("metrics", {}).get(headline_metric(r))
        named = task if headline_metric(r) == "acc" else f"{task} ({headline_metric(r)})"
        lines.append(f"| {named} | {_fmt(m['value'])} | {_interval(m['ci95'])} | "
                     f"{BASELINE_NAMES.get(versus['baseline'], versus['baseline'])} | "
                     f"{_fmt(versus['baseline_value'])} {_interval(versus['baseline_ci95'])} | "
                     f"{_with_interval(random_acc) or 'not run'} | {versus['verdict']}{flag} | {m['n']} | "
                     f"{r['labels']} |")
    return lines


def _baseline_table(results: dict[str, Any]) -> list[str]:
    # a column per baseline some task has (the base model's: a continued run; copy rules: generative tasks)
    names = [name for name in BASELINE_NAMES if any(name in r.get("baselines", {}) for r in results["tasks"].values())]
    lines = ["", "## Baselines (accuracy, 95% Wilson interval)", "",
             "| task | " + " | ".join(BASELINE_NAMES[name] for name in names) + " |", "|---|" + "---|" * len(names)]
    for task, r in results["tasks"].items():
        if "baselines" in r:
            lines.append(f"| {task} | " + " | ".join(_with_interval(r["baselines"].get(name)) or "n/a"
                                                      for name in names) + " |")
    return lines


def _answers_table(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Answers given", "",
             "Share of each predicted answer (a tie splits its vote) and of each gold answer. A task is flagged "
             "when one answer takes 95% or more of the predictions while the gold labels are not that one-sided.",
             "", "| task | predicted | gold | flag |", "|---|---|---|---|"]
    for task, r in results["tasks"].items():
        a = r.get("answers")
        if not a:
            continue

        def shares(d: dict[str, float]) -> str:
            return ", ".join(f"{name} {share:.2f}" for name, share in d.items())

        flag = f"**one answer ('{a['top']}') throughout**" if a["one_answer"] else ""
        lines.append(f"| {task} | {shares(a['predicted'])} | {shares(a['gold'])} | {flag} |")
    return lines


def _cell(text: str) -> str:
    """A table cell's text: a pipe escaped, line breaks as spaces (a generated answer may hold either)."""
    return " ".join(str(text).split("\n")).replace("|", "\\|")


def _generated_examples(results: dict[str, Any]) -> list[str]:
    """The first items of each generative task: the query's last line, what the model wrote, the answer."""
    lines: list[str] = []
    for task, r in results["tasks"].items():
        if not r.get("examples"):
            continue
        generated = r.get("kind") in ("generative", "mera_text", "mera_detox")
        lines += ["", f"## {task}: {'generated answers' if generated else 'answers'} (first items)", "",
                  f"| query | {'generated' if generated else 'chosen'} | answer |", "|---|---|---|"]
        lines += [f"| {_cell((e['query'].splitlines() or [''])[-1])} | {_cell(e['prediction']) or '(empty)'} | "
                  f"{_cell(e['answer'])} |" for e in r["examples"]]
    return lines


def _group_table(task: str, r: dict[str, Any]) -> list[str]:
    extra = [name for name in ("acc_per_token", "acc_norm_bytes") if name in r["metrics"]]
    header = ["group", "acc", "95% interval", *extra, "fewer tokens", "fewer bytes", "strongest baseline",
              "random init", "verdict", "items"]
    lines = ["", f"## {task} by group", "", "| " + " | ".join(header) + " |",
             "|---|---:|---|" + "---:|" * len(extra) + "---|---|---|---|---|---:|"]
    random_groups = r.get("random_init", {}).get("groups", {})
    for group, m in r["groups"].items():
        b = m.get("baselines", {})
        versus = m.get("vs_strongest_baseline", {})
        cells = [group, _fmt(m["value"]), _interval(m["ci95"]), *(_fmt(m.get(name)) for name in extra),
                 _with_interval(b.get("fewer_tokens")), _with_interval(b.get("fewer_bytes")),
                 BASELINE_NAMES.get(b.get("strongest", ""), ""), _with_interval(random_groups.get(group)),
                 versus.get("verdict", ""), str(m["n"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _base_model(results: dict[str, Any]) -> list[str]:
    """A continued run's trained step against the base model it started from, on the same texts and items."""
    base = results.get("base_model")
    if not base:
        skipped = results.get("base_model_skipped")
        return ["## Against the base model", "", f"Not scored: {skipped}", ""] if skipped else []
    lines = ["## Against the base model", "",
             f"This run continued pretraining {base['folder']} ({base.get('family')} family; "
             f"{base['vocab_adaptation']}); the base model, re-imported as the run imported it, scored on the same "
             "texts and items. Bits per byte: lower is better.", "",
             "| measure | trained | base model | change |", "|---|---:|---:|---:|"]
    trained_texts = [("validation shards bits per byte", results.get("validation"), base.get("validation"))]
    trained_texts += [(f"{name} bits per byte", results.get("heldout", {}).get(name), acc)
                      for name, acc in base.get("heldout", {}).items()]
    for name, ours, theirs in trained_texts:
        if ours and theirs:
            lines.append(f"| {name} | {ours['bits_per_byte']:.4f} | {theirs['bits_per_byte']:.4f} | "
                         f"{ours['bits_per_byte'] - theirs['bits_per_byte']:+.4f} |")
    for task, r in base.get("tasks", {}).items():
        metric = headline_metric(r)
        ours, theirs = results["tasks"][task]["metrics"][metric], r["metrics"][metric]
        lines.append(f"| {task} {metric} | {_with_interval(ours)} | {_with_interval(theirs)} | "
                     f"{ours['value'] - theirs['value']:+.3f} |")
    return [*lines, ""]


def _position_table(results: dict[str, Any]) -> list[str]:
    """Validation bits per byte by position in the context window (``eval.bpb_position_buckets``)."""
    found = results.get("validation_by_position")
    if not found:
        return []
    lines = ["## Bits per byte by position", "",
             f"The first {found['max_len']} tokens of each validation document at least that long "
             f"({found['documents']} documents; {found['shorter_documents']} shorter left out), scored as one window "
             "from the document's start: the token at position p is predicted from the p tokens before it and the "
             "EOS. Falling with position: the model uses its context.", "",
             "| positions | bits per byte | perplexity | tokens | bytes |", "|---|---:|---:|---:|---:|"]
    lines += [f"| [{b['start']}, {b['end']}) | {_fmt(b['bits_per_byte'], 4) or 'n/a'} | "
              f"{_fmt(b['perplexity'], 2) or 'n/a'} | {b['tokens']} | {b['bytes']} |" for b in found["buckets"]]
    return [*lines, ""]


def render_markdown(results: dict[str, Any]) -> str:
    lines = [f"# Evaluation of {results.get('experiment', '')} at step {results['step']}", ""]
    if "validation" in results or "heldout" in results:
        lines += ["| text | bits per byte | perplexity | tokens | bytes |", "|---|---:|---:|---:|---:|"]
        texts = ([("validation shards", results["validation"])] if "validation" in results else [])
        texts += list(results.get("heldout", {}).items())
        lines += [f"| {name} | {v['bits_per_byte']:.4f} | {v['perplexity']:.2f} | {v['tokens']} | {v['bytes']} |"
                  for name, v in texts]
        lines.append("")
    lines += _position_table(results)
    lines += _base_model(results)
    if results.get("tasks"):
        lines += _headline(results)
        lines += ["", "## Scores", "",
                  f"Tasks ({results.get('num_fewshot', 0)}-shot where the task has a prompt); 95% intervals: "
                  "Wilson for accuracies, bootstrap for MCC (undefined when one answer is predicted throughout). "
                  "acc sums the answer's log-likelihood; acc_norm_chars / acc_norm_bytes / acc_per_token divide it "
                  "by the answer's characters / UTF-8 bytes / tokens, side by side. Silver labels are crowd "
                  "majority votes, not gold.", "",
                  "| task | metric | score | 95% interval | chance | majority | items | labels |",
                  "|---|---|---:|---|---:|---:|---:|---|"]
        for task, r in results["tasks"].items():
            for metric, m in r["metrics"].items():
                lines.append(f"| {task} | {metric} | {_fmt(m['value'])} | {_interval(m['ci95'], m.get('undefined'))} | "
                             f"{_fmt(m['chance'])} | {_fmt(m.get('majority'))} | {m['n']} | {r['labels']} |")
        lines += _baseline_table(results)
        lines += _answers_table(results)
        lines += _generated_examples(results)
        for task, r in results["tasks"].items():
            if r.get("groups"):
                lines += _group_table(task, r)
    if results.get("tasks_skipped"):
        lines += ["", "Skipped (eval.missing_tasks: skip):", ""]
        lines += [f"- {task}: {reason}" for task, reason in results["tasks_skipped"].items()]
    return "\n".join(lines) + "\n"
