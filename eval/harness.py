"""The task harness: load a task's items, add few-shot examples, score every choice, compute metrics.

Metrics per task:
- ``acc``: the gold choice has the highest total log-likelihood (ties share the credit);
- ``acc_norm_chars`` / ``acc_norm_bytes``: the same after dividing by the continuation's length in
  characters / UTF-8 bytes (lm-evaluation-harness's acc_norm is the character one);
- ``acc_per_token``: the same per token of the continuation (minimal pairs: RuBLiMP);
- ``mcc``: Matthews correlation of the argmax prediction with the gold label (binary tasks).
Each comes with its chance level and a 95% interval (Wilson for accuracies, bootstrap for MCC; an
MCC of constant predictions is undefined). Beside them: the no-model baselines (chance, majority,
fewer tokens wins, fewer bytes wins) with intervals, the headline against the strongest of them,
and the distribution of predicted answers (a task answered with one label throughout is flagged).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eval import stats
from eval.loaders import Record, SourceUnavailable, read_file, read_hub
from eval.scoring import LogitsFn, ScoreRequest, score_requests
from eval.tasks import Item, Source, TaskSpec, build_in_schema, named_schema, schema_of
from experiment.errors import DataError
from experiment.storage import RunPath, location

log = logging.getLogger("eval.harness")

Encode = Callable[[str], Sequence[int]]
FEWSHOT_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class TaskData:
    spec: TaskSpec
    source: Source
    where: str  # the file, folder or hub id the items came from
    items: list[Item]  # the items to score (after any cap)
    pool: list[Item]  # every item, for few-shot examples


def _expand(path: str, bench_dir: str, rublimp_dir: str) -> str:
    """A source path with ``{bench}`` and ``{rublimp_dir}`` filled in; RuBLiMP lives under the bench
    folder unless ``rublimp_dir`` names another one, so ``eval.bench_dir`` alone moves every local task."""
    return path.replace("{bench}", bench_dir).replace("{rublimp_dir}", rublimp_dir or f"{bench_dir}/rublimp")


def _directory_records(folder: RunPath) -> list[tuple[str, list[Record]]]:
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise DataError(f"task folder {folder} has no .csv files")
    return [(f.stem, read_file(f)) for f in files]


def cap_items(items: list[Item], max_items: int | None, seed: int, balance: bool = False) -> list[Item]:
    """At most ``max_items`` per group (or in all), drawn with a seed, kept in file order.

    ``balance`` draws the same number of items for every gold answer, so that a model with a fixed
    preference for one answer (a random one) scores exactly the chance level.
    """
    if max_items is None and not balance:
        return items
    groups: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault((item.group, item.gold) if balance else item.group, []).append(i)
    quota = max_items
    if balance:
        classes = len({item.gold for item in items})
        smallest = min(len(m) for m in groups.values())
        quota = smallest if max_items is None else min(smallest, max(1, max_items // classes))
    keep: list[int] = []
    for members in groups.values():
        keep += members if len(members) <= quota else random.Random(seed).sample(members, quota)
    return [items[i] for i in sorted(keep)]


def load_task(spec: TaskSpec, *, bench_dir: str, rublimp_dir: str = "", task_files: dict[str, str] | None = None,
              max_items: int | None = None, seed: int = 0, balance: bool = False,
              task_schemas: dict[str, str] | None = None) -> TaskData:
    """Items of a task from, in order: ``task_files[name]`` (in the schema ``task_schemas[name]`` names,
    else in the one its first record fits: ``eval.tasks.schema_of``), the first local source that
    exists, the hub."""
    override = (task_files or {}).get(spec.name)
    if override:
        candidates = [(spec.sources[0], override, False)]
    else:
        candidates = [(s, _expand(s.path, bench_dir, rublimp_dir), s.hub) for s in spec.sources]
    chosen = next(((s, p, hub) for s, p, hub in candidates if hub or location(p).exists()), None)
    if chosen is None:
        paths = ", ".join(p for _, p, _ in candidates)
        raise SourceUnavailable(f"task '{spec.name}': no source found ({paths}); set eval.task_files.{spec.name} "
                                "or eval.bench_dir")
    source, path, hub = chosen
    if spec.directory:
        grouped = _directory_records(location(path))
        items = [build_in_schema(spec, source, r, "its own source", group=stem)
                 for stem, records in grouped for r in records]
    else:
        records = read_hub(source.path, source.config, source.split) if hub else read_file(path)
        how = "its own source"
        if override:
            named = (task_schemas or {}).get(spec.name)
            source = named_schema(spec, named) if named else schema_of(spec, records[0])
            how = (f"named by eval.task_schemas.{spec.name}" if named
                   else f"detected from {records[0].at()}")
        items = [build_in_schema(spec, source, r, how,
                                 group=str(r.fields.get(spec.group_field)) if spec.group_field else None)
                 for r in records]
    where = f"hub:{source.path}/{source.config}[{source.split}]" if hub else path
    return TaskData(spec=spec, source=source, where=where, items=cap_items(items, max_items, seed, balance), pool=items)


def fewshot_prefix(item: Item, pool: Sequence[Item], k: int, seed: int) -> str:
    """``k`` solved examples from the pool (never the item itself), drawn by a seed and the item's id,
    so the prompt of an item does not depend on which other items are evaluated."""
    if k <= 0:
        return ""
    if len(pool) - 1 < k:
        raise DataError(f"task '{item.task}': {k}-shot needs {k} other items, the split has {len(pool) - 1}")
    # k + 1 draws leave k after dropping the item itself: O(k), not a copy of the pool per item
    drawn = random.Random(f"{seed}:{item.id}").sample(range(len(pool)), k + 1)
    shots = [pool[i] for i in drawn if pool[i].id != item.id][:k]
    return "".join(s.contexts[s.gold] + s.continuations[s.gold] + FEWSHOT_SEPARATOR for s in shots)


class PairEncoder:
    """Token ids of (context, continuation) pairs; the context starts a document (EOS first).

    Trailing spaces of the context move to the continuation, so 'Ответ: Да' splits as 'Ответ:' +
    ' Да' whatever the template did. Contexts repeat across choices: they are encoded once.
    """

    def __init__(self, encode: Encode, start_id: int, normalize: Callable[[str], str] | None = None) -> None:
        self.encode = encode
        self.start_id = start_id
        self.normalize = normalize  # the tokenizer's text normalization (RunTokenizer.normalize), before the split
        self._cache: dict[str, list[int]] = {}

    def _ids(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = list(self.encode(text)) if text else []
        return self._cache[text]

    def __call__(self, context: str, continuation: str) -> ScoreRequest:
        if self.normalize is not None:
            context, continuation = self.normalize(context), self.normalize(continuation)
        stripped = context.rstrip(" ")
        continuation = context[len(stripped):] + continuation
        return ScoreRequest(context=[self.start_id, *self._ids(stripped)], continuation=list(self.encode(continuation)))


# a task where one answer takes at least this share of the predictions (and of no more than this share
# of the gold labels) is flagged: the model answers one label throughout, whatever its accuracy says
ONE_ANSWER_SHARE = 0.95


def one_answer(top_share: float, gold_share: float = 0.0) -> bool:
    """The flag of recipes 05 and 05c: one answer takes ``ONE_ANSWER_SHARE`` or more of the predictions while the
    gold labels are not that one-sided (``gold_share``: 0 where the gold is not known, as in MERA's closed tests)."""
    return top_share >= ONE_ANSWER_SHARE and gold_share < ONE_ANSWER_SHARE


def one_answer_warning(task: str, top: str, top_share: float) -> str:
    """The warning line of a flagged task, the same in recipe 05's log and recipe 05c's."""
    answer = f"one answer ('{top}')" if top else "an empty answer"
    return f"{task}: {answer} takes {100 * top_share:.0f}% of the predictions"


def metric_summary(values: Sequence[float], chance: float, majority: float | None = None) -> dict[str, Any]:
    """Mean of per-item credits with its Wilson interval, the chance level and the majority baseline
    (the score of always giving the most common gold answer; above chance when labels are skewed)."""
    n = len(values)
    total = float(np.sum(values))
    summary = {"value": total / n if n else float("nan"), "ci95": list(stats.wilson_interval(total, n)),
               "chance": chance, "n": n}
    if majority is not None:
        summary["majority"] = majority
    return summary


def same_answers(items: Sequence[Item]) -> bool:
    """Every item offers the same answers (TERRa, RCB, RuCoLA): a scorer can favour one of them."""
    return bool(items) and len({it.continuations for it in items}) == 1


def majority_share(items: Sequence[Item]) -> float | None:
    """Share of the most common gold answer where every item offers the same answers (TERRa, RCB,
    RuCoLA); None where the answers differ per item (a scorer cannot favour a position there)."""
    if not same_answers(items):
        return None
    counts = Counter(it.gold for it in items)
    return max(counts.values()) / len(items)


def answer_names(items: Sequence[Item]) -> list[str]:
    """A name per choice position: the answer text where every item offers the same answers, else
    'choice 1', 'choice 2', ... (Winograd options, PARus alternatives differ per item)."""
    width = max(len(it.continuations) for it in items)
    if same_answers(items):
        return [c.strip() for c in items[0].continuations]
    return [f"choice {i + 1}" for i in range(width)]


def answer_distribution(items: Sequence[Item], loglik: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Share of each predicted answer (a tie splits its vote) beside the gold share of each, and a flag
    when one answer takes almost every prediction although the gold labels are not that one-sided
    (RuBLiMP's gold is always the first sentence: a good model predicts 'choice 1' throughout, unflagged)."""
    names = answer_names(items)
    predicted, gold = np.zeros(len(names)), np.zeros(len(names))
    for item, ll in zip(items, loglik, strict=True):
        best = [i for i, v in enumerate(ll) if v == max(ll)]
        predicted[best] += 1.0 / len(best)
        gold[item.gold] += 1.0
    predicted, gold = predicted / len(items), gold / len(items)
    top = int(np.argmax(predicted))
    return {"predicted": {n: round(float(v), 6) for n, v in zip(names, predicted, strict=True)},
            "gold": {n: round(float(v), 6) for n, v in zip(names, gold, strict=True)},
            "top": names[top], "top_share": float(predicted[top]),
            "one_answer": one_answer(float(predicted[top]), float(gold[top]))}


def baseline_credits(items: Sequence[Item], tokens: Sequence[Sequence[int]] | None) -> dict[str, list[float]]:
    """Per-item credit of each no-model baseline: chance (uniform guessing), majority (always the most
    common gold answer, where every item offers the same answers), and the length rules 'the answer
    with fewer tokens wins' / 'fewer UTF-8 bytes wins' (ties share the credit, as for a model): summed
    log-likelihood favours short answers, so a model must beat these, not just chance."""
    credits: dict[str, list[float]] = {"chance": [1.0 / len(it.continuations) for it in items]}
    if same_answers(items):
        majority = Counter(it.gold for it in items).most_common(1)[0][0]
        credits["majority"] = [float(it.gold == majority) for it in items]
    if tokens is not None:
        credits["fewer_tokens"] = [stats.tie_aware_correct([-float(n) for n in t], it.gold)
                                   for it, t in zip(items, tokens, strict=True)]
    credits["fewer_bytes"] = [stats.tie_aware_correct([-float(len(c.encode("utf-8"))) for c in it.continuations],
                                                      it.gold) for it in items]
    return credits


def baselines_summary(credits: dict[str, list[float]], indices: Sequence[int] | None = None) -> dict[str, Any]:
    """Each baseline's score with its Wilson interval (where a uniform guesser or a length rule lands on
    these items), and ``strongest``: the name of the highest, the one a model's headline is compared to."""
    out: dict[str, Any] = {}
    for name, values in credits.items():
        picked = values if indices is None else [values[i] for i in indices]
        total = float(np.sum(picked))
        out[name] = {"value": total / len(picked), "ci95": list(stats.wilson_interval(total, len(picked)))}
    out["strongest"] = max(credits, key=lambda name: out[name]["value"])  # first listed wins a tie
    return out


def headline_metric(result: dict[str, Any]) -> str:
    """The metric a task's headline compares with its baselines: ``acc`` (log-likelihood tasks), else the first
    (``exact_match`` for a generative task)."""
    return "acc" if "acc" in result["metrics"] else next(iter(result["metrics"]))


def versus_baseline(summary: dict[str, Any], baselines: dict[str, Any]) -> dict[str, Any]:
    """The headline comparison: the score against the strongest baseline. 'above' / 'below' when the
    score's 95% interval excludes the baseline's value, else 'not distinguishable'; 'undefined' without one."""
    name = baselines["strongest"]
    value = baselines[name]["value"]
    if summary["ci95"] is None:  # an MCC of one answer throughout: no interval to compare (mcc_summary says why)
        verdict = f"undefined ({summary.get('undefined', 'no interval')})"
    else:
        lo, hi = summary["ci95"]
        verdict = "above" if lo > value else "below" if hi < value else "not distinguishable"
    return {"baseline": name, "baseline_value": value, "baseline_ci95": baselines[name]["ci95"],
            "margin": summary["value"] - value, "verdict": verdict}


def bootstrap_summary(aggregate: Callable[[list[int]], float], n: int, chance: float, seed: int,
                      undefined: str | None = None) -> dict[str, Any]:
    """A score that is not a mean of per-item credits (MCC, macro F1, USE's grade_norm): ``aggregate`` of the item
    indices, with a seeded percentile bootstrap interval over the items; none (``ci95`` None) where ``undefined`` names
    why, or where the interval collapses to a point (an interval of [0, 0] would look precise)."""
    out: dict[str, Any] = {"value": aggregate(list(range(n))), "ci95": None, "chance": chance, "n": n}
    if undefined:
        out["undefined"] = undefined
        return out
    lo, hi = stats.bootstrap_interval(aggregate, n, seed=seed)
    if lo == hi:
        out["undefined"] = "the bootstrap interval collapses to a point"
    else:
        out["ci95"] = [lo, hi]
    return out


def mcc_undefined(gold: Sequence[int], pred: Sequence[int]) -> str | None:
    """Why an MCC is 0/0 (0 by convention), or None."""
    if len(set(pred)) < 2:
        return "one answer predicted throughout"
    return "one gold answer throughout" if len(set(gold)) < 2 else None


def mcc_of(gold: Sequence[int], pred: Sequence[int], seed: int) -> dict[str, Any]:
    """MCC with its bootstrap interval; undefined (``ci95`` None, with the reason) when the predictions or the labels
    take one value throughout or the interval collapses to a point."""
    g, p = np.asarray(gold, dtype=np.int64), np.asarray(pred, dtype=np.int64)
    return bootstrap_summary(lambda rows: stats.matthews_corrcoef(g[rows], p[rows]), len(g), 0.0, seed,
                             mcc_undefined(gold, pred))


def mcc_summary(items: Sequence[Item], loglik: Sequence[Sequence[float]], seed: int) -> dict[str, Any]:
    """MCC of the argmax prediction (``mcc_of``)."""
    return mcc_of([it.gold for it in items], [int(np.argmax(ll)) for ll in loglik], seed)


def _per_item_credits(items: Sequence[Item], loglik: Sequence[Sequence[float]],
                      tokens: Sequence[Sequence[int]] | None) -> dict[str, list[float]]:
    """Per-item credit of each accuracy: summed log-likelihood, and its means per character, per UTF-8
    byte and (with token counts) per token, reported side by side, never one for another."""
    per_item: dict[str, list[float]] = {"acc": [], "acc_norm_chars": [], "acc_norm_bytes": []}
    if tokens is not None:
        per_item["acc_per_token"] = []
    for i, (item, ll) in enumerate(zip(items, loglik, strict=True)):
        per_item["acc"].append(stats.tie_aware_correct(list(ll), item.gold))
        lengths = {"acc_norm_chars": [max(1, len(c)) for c in item.continuations],
                   "acc_norm_bytes": [max(1, len(c.encode("utf-8"))) for c in item.continuations]}
        if tokens is not None:
            lengths["acc_per_token"] = [max(1, n) for n in tokens[i]]
        for name, length in lengths.items():
            per_item[name].append(stats.tie_aware_correct([s / n for s, n in zip(ll, length, strict=True)], item.gold))
    return per_item


def task_metrics(spec: TaskSpec, items: Sequence[Item], loglik: Sequence[Sequence[float]],
                 seed: int = 0, tokens: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
    """Metrics of a scored task: per metric value, 95% interval, chance level; the no-model baselines
    (``tokens``: each continuation's token count, for the fewer-tokens rule and per-token means) and the
    headline against the strongest; the answer distribution; per group accuracy with its baselines."""
    chance_acc = stats.chance_accuracy([len(it.continuations) for it in items])
    per_item = _per_item_credits(items, loglik, tokens)
    metrics: dict[str, Any] = {}
    for name in spec.metrics:
        if name == "mcc":
            metrics["mcc"] = mcc_summary(items, loglik, seed)
        elif name in per_item:
            metrics[name] = metric_summary(per_item[name], chance_acc, majority_share(items))
        else:
            raise ValueError(f"task {spec.name}: metric {name} needs token counts (pass tokens=)")
    credits = baseline_credits(items, tokens)
    baselines = baselines_summary(credits)
    result: dict[str, Any] = {"metrics": metrics, "baselines": baselines,
                              "vs_strongest_baseline": versus_baseline(metrics["acc"], baselines),
                              "answers": answer_distribution(items, loglik)}
    if any(it.group is not None for it in items):
        groups: dict[str, list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault(str(it.group), []).append(i)
        result["groups"] = {}
        for g, idx in sorted(groups.items()):
            summary = metric_summary([per_item["acc"][i] for i in idx],
                                     stats.chance_accuracy([len(items[i].continuations) for i in idx]))
            summary["baselines"] = baselines_summary(credits, idx)
            summary["vs_strongest_baseline"] = versus_baseline(summary, summary["baselines"])
            for name in spec.metrics:
                if name != "acc" and name in per_item:
                    summary[name] = float(np.mean([per_item[name][i] for i in idx]))
            result["groups"][g] = summary
    return result


def continuation_tokens(items: Sequence[Item], encoder: PairEncoder) -> list[list[int]]:
    """Each choice's continuation length in tokens, as scored (a few-shot prefix does not change it)."""
    return [[len(encoder(ctx, cont).continuation) for ctx, cont in zip(it.contexts, it.continuations, strict=True)]
            for it in items]


def score_items(logits_fn: LogitsFn, items: Sequence[Item], pool: Sequence[Item], encoder: PairEncoder, *,
                batch_size: int, max_len: int, num_fewshot: int = 0, seed: int = 0, pad_id: int = 0,
                desc: str | None = None) -> list[list[float]]:
    """Total log-likelihood of every choice of every item (nats), in item order."""
    requests: list[ScoreRequest] = []
    for item in items:
        prefix = fewshot_prefix(item, pool, num_fewshot, seed)
        requests += [encoder(prefix + ctx, cont) for ctx, cont in zip(item.contexts, item.continuations, strict=True)]
    scores = score_requests(logits_fn, requests, batch_size=batch_size, max_len=max_len, pad_id=pad_id, desc=desc)
    out, pos = [], 0
    for item in items:
        out.append([s.logprob for s in scores[pos:pos + len(item.continuations)]])
        pos += len(item.continuations)
    return out


def evaluate_task(data: TaskData, logits_fn: LogitsFn, encoder: PairEncoder, *, batch_size: int, max_len: int,
                  num_fewshot: int = 0, seed: int = 0, pad_id: int = 0) -> dict[str, Any]:
    """Score one loaded task; returns its JSON-ready result."""
    spec = data.spec
    k = num_fewshot if spec.fewshot_ok else 0
    log.info("task %s: %d items from %s (%s labels, %d-shot)", spec.name, len(data.items), data.where,
             data.source.labels, k)
    loglik = score_items(logits_fn, data.items, data.pool, encoder, batch_size=batch_size, max_len=max_len,
                         num_fewshot=k, seed=seed, pad_id=pad_id, desc=spec.name)
    tokens = continuation_tokens(data.items, encoder)
    return {"task": spec.name, "description": spec.description, "source": data.where, "labels": data.source.labels,
            "items": len(data.items), "num_fewshot": k,
            **task_metrics(spec, data.items, loglik, seed=seed, tokens=tokens)}
