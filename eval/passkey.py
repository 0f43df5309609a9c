"""Passkey retrieval in Russian: can the model find a number hidden at a given depth of a long context?

The synthetic test of Mohtashami and Jaggi (2023, "Landmark Attention", arXiv:2305.16300): filler text, a
key of ``digits`` digits said once inside it, and a question at the end. Here in Russian:

    <filler sentences ...> Запомни пароль: 12345. <filler sentences ...>
    Какой пароль? Пароль:

Each item is generated from ``eval.seed``, its length, its depth and its index (``random.Random`` over a string
of the four), so it does not depend on which others run. Lengths are prompt budgets in tokens (the EOS the
prompt follows, the prompt and the ``digits + 2`` tokens of the answer fit in it); a length past the model's
context is capped at that context. The depth is the share of the filler before the key (0: at the start, 1:
just before the question).

Filler: sentences (without digits, so the key is the only number) from ``eval.passkey.filler_file`` or, by
default, from the documents of the run's validation shards (decoded): held-out text of the run's own corpus.

Scoring: the greedy continuation's leading digits (after spaces) must equal the key (``exact_match``, chance
10^-digits: a uniform guess of the key); ``digit_acc`` credits each of the key's positions the continuation
gets right (chance 0.1). Intervals are Wilson's over the items (per-digit credit: the item's mean, which
bounds the variance from above).
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from eval.harness import baselines_summary, metric_summary, one_answer, versus_baseline
from experiment.errors import DataError
from experiment.sections.eval import PasskeyConfig

log = logging.getLogger("eval.passkey")

NEEDLE = "Запомни пароль: {key}."
QUESTION = "\nКакой пароль? Пароль:"
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
LEADING_DIGITS = re.compile(r"\s*(\d+)")
MIN_SENTENCE_CHARS, MAX_SENTENCE_CHARS = 20, 400
# (prompts, max new tokens, stop strings) -> completions: eval.run.text_generator, as for the generative tasks
GenerateTexts = Callable[[list[str], int, Sequence[str]], list[str]]


@dataclass(frozen=True)
class PasskeyItem:
    id: str  # "<length>@<depth>#<index>"
    length: int  # the token budget: EOS, prompt and answer
    depth: float  # the requested share of the filler before the key
    key: str
    prompt: str
    tokens: int  # the prompt's tokens as the model reads it (its EOS included)
    filler_sentences: int
    needle_sentence: int  # filler sentences before the key

    @property
    def group(self) -> str:
        return f"{self.length} tokens, depth {self.depth:.2f}"


def filler_sentences(texts: Iterable[str]) -> list[str]:
    """Sentences of ``texts`` fit for filler: one line each, without digits (the key is the only number), of
    20-400 characters."""
    out = []
    for text in texts:
        for sentence in SENTENCE_END.split(text):
            sentence = " ".join(sentence.split())
            if MIN_SENTENCE_CHARS <= len(sentence) <= MAX_SENTENCE_CHARS and not any(c.isdigit() for c in sentence):
                out.append(sentence)
    return out


def read_filler(cfg: PasskeyConfig, decode: Callable[[Sequence[int]], str], eos_id: int, shards_dir: Any,
                batch_size: int, tokenizer_sha256: str | None = None,
                enough_chars: int = 4_000_000) -> tuple[list[str], str]:
    """The filler sentences and where they came from: ``eval.passkey.filler_file``, else the documents of the run's
    validation shards decoded (read until ``enough_chars`` characters: about the longest prompt, 128k tokens, over
    again; items cycle through the sentences)."""
    from eval.bpb import read_text_files, stream_documents

    if cfg.filler_file:
        return filler_sentences(text for _, text in read_text_files([cfg.filler_file])), cfg.filler_file
    from data_prep.shards.loader import iter_eval_batches

    texts, chars = [], 0
    batches = iter_eval_batches(shards_dir, "validation", batch_size, tokenizer_sha256=tokenizer_sha256)
    for document in stream_documents(batches, eos_id):
        texts.append(decode(document))
        chars += len(texts[-1])
        if chars >= enough_chars:
            break
    if not texts:
        raise DataError(f"{shards_dir}: the validation split has no documents to take passkey filler from (set "
                        "eval.passkey.filler_file to a UTF-8 text, or raise shards.validation_percent and rerun recipe "
                        "03)")
    return filler_sentences(texts), f"{shards_dir} (validation split)"


def answer_tokens(digits: int) -> int:
    """New tokens generated per item: the key's digits, one per token at worst, a space and one to spare."""
    return digits + 2


def context_lengths(lengths: Sequence[int], max_len: int) -> list[int]:
    """The configured lengths capped at the model's context, each once, ascending."""
    return sorted({min(int(length), max_len) for length in lengths})


def prompt_of(filler: Sequence[str], needle_at: int, key: str) -> str:
    return " ".join([*filler[:needle_at], NEEDLE.format(key=key), *filler[needle_at:]]) + QUESTION


def make_items(sentences: Sequence[str], encode: Callable[[str], Sequence[int]], cfg: PasskeyConfig, *,
               max_len: int, seed: int, where: str = "filler") -> list[PasskeyItem]:
    """Every (length, depth, index) item: filler sentences from a seeded start in ``sentences`` (cycling), as
    many as fit the length's budget with the key and the question (counted with ``encode``, the prompt's token
    ids as the model reads them), the key after ``round(depth * sentences)`` of them."""
    if not sentences:
        raise DataError(f"{where}: no filler sentences (one line of 20-400 characters without digits) to hide a "
                        "passkey in")
    counts: dict[int, int] = {}

    def count(index: int) -> int:  # a sentence's tokens alone: the running estimate the full prompt then checks
        if index not in counts:
            counts[index] = len(encode(sentences[index])) - 1  # less the EOS the codec puts first
        return counts[index]

    items = []
    for length in context_lengths(cfg.lengths, max_len):
        budget = length - answer_tokens(cfg.digits)
        for depth in cfg.depths:
            for index in range(cfg.items_per_depth):
                rng = random.Random(f"{seed}:{length}:{depth}:{index}")
                key = str(rng.randrange(10 ** cfg.digits)).zfill(cfg.digits)
                fixed = len(encode(prompt_of([], 0, key)))
                if fixed > budget:
                    raise DataError(f"eval.passkey: the key and the question take {fixed} tokens, a {length}-token "
                                    f"item leaves {budget} for the prompt (raise eval.passkey.lengths or the model's "
                                    "context)")
                chosen, total, at = [], fixed, rng.randrange(len(sentences))
                while total + count(at) <= budget and len(chosen) < budget:
                    chosen.append(sentences[at])
                    total += count(at)
                    at = (at + 1) % len(sentences)
                while True:  # joined, the sentences may take a few tokens more than apart
                    needle_at = round(depth * len(chosen))
                    prompt = prompt_of(chosen, needle_at, key)
                    tokens = len(encode(prompt))
                    if tokens <= budget or not chosen:
                        break
                    chosen.pop()
                items.append(PasskeyItem(id=f"{length}@{depth:g}#{index}", length=length, depth=float(depth), key=key,
                                         prompt=prompt, tokens=tokens, filler_sentences=len(chosen),
                                         needle_sentence=needle_at))
    return items


def predicted_key(completion: str) -> str:
    """The digits a continuation starts with (after spaces); "" when it starts otherwise."""
    match = LEADING_DIGITS.match(completion)
    return match.group(1) if match else ""


def key_credit(key: str, completion: str) -> tuple[float, float]:
    """(exact match, share of the key's digit positions right) of one continuation."""
    predicted = predicted_key(completion)
    right = sum(1 for i, digit in enumerate(key) if i < len(predicted) and predicted[i] == digit)
    return float(predicted == key), right / len(key)


def evaluate_passkey(items: Sequence[PasskeyItem], generate: GenerateTexts, cfg: PasskeyConfig, *, seed: int,
                     source: str, batch_size: int = 16) -> dict[str, Any]:
    """Generate every item's answer greedily and score it against chance, overall and per (length, depth)."""
    log.info("task passkey: %d items (lengths %s, depths %s, %d digits) in filler from %s", len(items),
             sorted({it.length for it in items}), list(cfg.depths), cfg.digits, source)
    prompts = [item.prompt for item in items]
    completions: list[str] = []
    for first in range(0, len(prompts), batch_size):
        completions += generate(prompts[first:first + batch_size], answer_tokens(cfg.digits), ("\n",))
    credits = [key_credit(item.key, c) for item, c in zip(items, completions, strict=True)]
    exact, per_digit = [c[0] for c in credits], [c[1] for c in credits]
    chance = 10.0 ** -cfg.digits
    metrics = {"exact_match": metric_summary(exact, chance), "digit_acc": metric_summary(per_digit, 0.1)}
    baselines = baselines_summary({"chance": [chance] * len(items)})
    groups: dict[str, Any] = {}
    for group in dict.fromkeys(item.group for item in items):
        picked = [i for i, item in enumerate(items) if item.group == group]
        summary = metric_summary([exact[i] for i in picked], chance)
        summary["digit_acc"] = sum(per_digit[i] for i in picked) / len(picked)
        summary["baselines"] = baselines_summary({"chance": [chance] * len(picked)})
        summary["vs_strongest_baseline"] = versus_baseline(summary, summary["baselines"])
        groups[group] = summary
    predicted = [predicted_key(c) for c in completions]
    top, top_count = Counter(predicted).most_common(1)[0]
    gold_top = Counter(item.key for item in items).most_common(1)[0][1] / len(items)
    shares = {k: round(n / len(items), 6) for k, n in Counter(predicted).most_common(5)}
    return {"task": "passkey", "description": "passkey retrieval (Russian filler): the key hidden at a depth of a "
                                              "long context, exact match of the greedy answer's digits",
            "source": source, "labels": "gold (generated)", "items": len(items), "kind": "generative",
            "scoring": "exact", "metrics": metrics, "baselines": baselines,
            "vs_strongest_baseline": versus_baseline(metrics["exact_match"], baselines),
            "answers": {"predicted": shares, "gold": {}, "top": top, "top_share": top_count / len(items),
                        "one_answer": one_answer(top_count / len(items), gold_top)},
            "groups": groups, "seed": seed, "digits": cfg.digits, "lengths": sorted({it.length for it in items}),
            "depths": list(cfg.depths), "items_per_depth": cfg.items_per_depth,
            "prompt_tokens": {"min": min(it.tokens for it in items), "max": max(it.tokens for it in items)},
            "examples": [{"id": item.id, "query": item.prompt[-200:], "prediction": p, "answer": item.key}
                         for item, p in list(zip(items, predicted, strict=True))[:5]]}


__all__ = ["NEEDLE", "QUESTION", "PasskeyItem", "context_lengths", "evaluate_passkey", "filler_sentences",
           "key_credit", "make_items", "predicted_key", "read_filler"]
