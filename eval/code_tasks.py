"""MERA's code tasks, ruHumanEval and ruCodeEval, scored here on their labelled items: ``n`` sampled completions
of each function, run in the sandbox (eval/sandbox.py) against the item's test cases, and pass@k.

    instruction.format(**inputs) --model, sampled n times (temperature 0.6), cut at MERA's stop strings-->
    completions --inputs.function + completion, then each test case's call--> eval/sandbox.run_python
    --> the calls' results as text == outputs, all of them? --> c of n samples pass --> pass@k (Chen et al. 2021)

The items follow MERA's schema (MERA-Evaluation/MERA, ``docs/dataset_cards/en/ruhumaneval.md`` and
``rucodeeval.md``; the scoring is ``benchmark_tasks/ruhumaneval/utils.py``): ``instruction`` (a template over
``{function}``), ``inputs.function`` (the signature and docstring), ``inputs.tests`` (the test cases' keyword
arguments: a list of dicts, or its Python text as MERA's files keep it), ``outputs`` (each case's expected result
as text; MERA's files repeat that list once per sample: a list of equal lists) and ``meta`` (``id``,
``entry_point``, ``canonical_solution``). As MERA's scorer does: the program is ``function + completion``, each
case calls ``entry_point(**case)`` (an exception gives None), and a sample passes when every call's ``str()``
equals the expected text. The prompt and the generation settings are MERA's task configs' (zero-shot, sampled at
temperature 0.6, 10 samples, stop at ``\\nclass``, ``\\ndef``, ``\\n#``, ``\\nif``, ``\\nprint``).

The expected outputs never enter the sandbox: the program prints the calls' results and the runner compares
them, so a program cannot pass by printing "passed" or exiting early with status 0.

Baselines a model must beat: ``stub`` (the prompt's function with ``pass`` as its body: what a model that writes
nothing useful scores; it passes only where every expected output is ``None``) and, as a check of the items and
the sandbox rather than a bar, ``canonical_solution`` (should pass every item).
"""

from __future__ import annotations

import ast
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import comb
from typing import Any

from eval.harness import baselines_summary, metric_summary, versus_baseline
from eval.loaders import Record, read_file
from eval.sandbox import Isolation, Limits, Outcome, namespaces_available, run_python
from experiment.errors import DataError

log = logging.getLogger("eval.code_tasks")

CODE_TASKS = {
    "ruhumaneval": "ruHumanEval (MERA): HumanEval's functions translated to Russian, open test set; pass@k",
    "rucodeeval": "ruCodeEval (MERA): HumanEval-style functions written for MERA; pass@k",
}
STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # MERA's generation_kwargs.until for both tasks
TEMPERATURE, SAMPLES, KS = 0.6, 10, (1, 5, 10)  # MERA's: do_sample at 0.6, repeats 10, pass@1/5/10
MAX_NEW_TOKENS = 256
LIMITS = Limits()  # eval/sandbox.py's defaults: 10 s wall clock, 5 s CPU, 1 GiB address space per sample
# the instruction of the dataset card's example, for a record without one
INSTRUCTION = ("На вход подается функция с описанием в виде строки docstring. В соответствии с описанием вам "
               "необходимо реализовать функцию на основе шаблона:\n{function}")
STUB = "\n    pass\n"
RESULTS_MARKER = "__ru_code_task_results__ "
SCHEMA = "instruction, inputs.function, inputs.tests, outputs, meta.entry_point (meta.id, meta.canonical_solution)"

# (prompts, samples per prompt) -> each prompt's completions
SampleCode = Callable[[list[str], int], list[list[str]]]


@dataclass(frozen=True)
class CodeItem:
    id: str  # "<file>:<row>" (with MERA's meta.id where the record has one)
    prompt: str  # the instruction over the inputs, stripped: what the model continues
    function: str  # the signature and docstring the completion continues
    tests: str  # the test cases' keyword arguments as a Python literal (a list of dicts)
    outputs: tuple[str, ...]  # each case's expected result, as text
    entry_point: str
    canonical_solution: str = ""


@dataclass(frozen=True)
class SampleResult:
    passed: bool
    # passed | wrong (ran, some result differs) | no_report (exited 0 before reporting) | error | killed | timeout
    status: str
    got: list[str | None] | None  # the calls' results as the program reported them (None: no report)


def code_item(record: Record, task: str) -> CodeItem:
    """One record as an item; anything missing or malformed is one line naming the file, the row and the field."""
    fields = record.fields
    where = f"{record.at()} (task '{task}', MERA's schema: {SCHEMA})"
    inputs = fields.get("inputs")
    meta = fields.get("meta") if isinstance(fields.get("meta"), dict) else {}
    if not isinstance(inputs, dict):
        raise DataError(f"{where}: field 'inputs' must be an object with 'function' and 'tests'")
    function, tests, entry = inputs.get("function"), inputs.get("tests"), meta.get("entry_point")
    if not isinstance(function, str) or not function.strip():
        raise DataError(f"{where}: missing field 'inputs.function'")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise DataError(f"{where}: field 'meta.entry_point' must be the function's name, got {entry!r}")
    try:
        cases = ast.literal_eval(tests) if isinstance(tests, str) else tests
    except (ValueError, SyntaxError) as exc:
        raise DataError(f"{where}: field 'inputs.tests' is not a Python literal ({exc})") from exc
    if not isinstance(cases, list) or not cases or not all(isinstance(c, dict) for c in cases):
        raise DataError(f"{where}: field 'inputs.tests' must be a non-empty list of keyword-argument objects")
    outputs = expected_outputs(fields.get("outputs"), where)
    if len(outputs) != len(cases):
        raise DataError(f"{where}: {len(cases)} test cases but {len(outputs)} outputs")
    instruction = fields.get("instruction") or INSTRUCTION
    try:
        prompt = str(instruction).format(**inputs).strip()
    except (KeyError, IndexError, ValueError) as exc:
        raise DataError(f"{where}: field 'instruction' names {exc}, which 'inputs' does not have") from exc
    item_id = f"{record.where}:{record.row}" + (f" (id {meta['id']})" if "id" in meta else "")
    return CodeItem(item_id, prompt, function, repr(cases), outputs, entry, str(meta.get("canonical_solution") or ""))


def expected_outputs(outputs: Any, where: str) -> tuple[str, ...]:
    """``outputs`` as text: a list of results, or MERA's list of equal lists (one per sample)."""
    if not isinstance(outputs, list) or not outputs:
        raise DataError(f"{where}: field 'outputs' must be the expected results (a test split's answers are "
                        "closed: score a labelled split)")
    if all(isinstance(row, list) for row in outputs):
        if any(row != outputs[0] for row in outputs):
            raise DataError(f"{where}: field 'outputs' has rows that differ (MERA repeats one list per sample)")
        outputs = outputs[0]
    return tuple(str(value) for value in outputs)


def load_code_items(path: str, task: str, max_items: int | None = None) -> list[CodeItem]:
    """The items of a task file in MERA's schema (.jsonl, or .json: a list or ``{"data": [...]}``); the first
    ``max_items``. Every record is checked before any is run."""
    if task not in CODE_TASKS:
        raise DataError(f"unknown code task '{task}' (known: {', '.join(CODE_TASKS)})")
    items = [code_item(record, task) for record in read_file(path)]
    return items[:max_items] if max_items is not None else items


def program(item: CodeItem, completion: str) -> str:
    """What runs in the sandbox: the function and its completion, then each case's call, the results printed on
    one marked line (a call that raises gives None, as in MERA's scorer)."""
    return (f"{item.function}{unfenced(completion)}\n\n\n"
            f"def __ru_code_task_report():\n"
            f"    import ast, json\n"
            f"    results = []\n"
            f"    for case in ast.literal_eval({item.tests!r}):\n"
            f"        try:\n"
            f"            value = {item.entry_point}(**case)\n"
            f"            results.append(None if value is None else str(value))\n"
            f"        except Exception:\n"
            f"            results.append(None)\n"
            f"    print('\\n{RESULTS_MARKER}' + json.dumps(results))\n\n\n"
            f"__ru_code_task_report()\n")


def unfenced(completion: str) -> str:
    """A completion without a Markdown fence around it (```python ... ```), as MERA's scorer strips one."""
    stripped = completion.strip()
    if stripped.startswith("```python") and stripped.endswith("```") and len(stripped) >= 12:
        return "\n" + stripped[len("```python"):-3].strip("\n") + "\n"
    return completion


def reported_results(outcome: Outcome) -> list[str | None] | None:
    """The results the program printed last on its marked line; None when it printed none (it failed first)."""
    lines = [line for line in outcome.stdout.splitlines() if line.startswith(RESULTS_MARKER)]
    if not lines:
        return None
    try:
        got = json.loads(lines[-1][len(RESULTS_MARKER):])
    except json.JSONDecodeError:
        return None
    return got if isinstance(got, list) else None


def check_completion(item: CodeItem, completion: str, limits: Limits = LIMITS,
                     isolation: Isolation = "auto") -> SampleResult:
    """Run one completion against the item's tests in the sandbox."""
    outcome = run_python(program(item, completion), limits, isolation=isolation)
    got = reported_results(outcome)
    passed = got is not None and len(got) == len(item.outputs) and all(
        str(g) == want for g, want in zip(got, item.outputs, strict=True))
    status = ("passed" if passed else "wrong" if got is not None else
              "no_report" if outcome.ok else outcome.status)  # no_report: it exited 0 before the calls ended
    return SampleResult(passed, status, got)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models Trained on Code", eq. 1):
    1 - C(n-c, k) / C(n, k), the chance that k of the n samples drawn without replacement include a passing
    one. Exact integers (no float product to drift)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate_code_task(task: str, items: Sequence[CodeItem], sample: SampleCode, *, source: str, n: int = SAMPLES,
                       ks: Sequence[int] = KS, limits: Limits = LIMITS, isolation: Isolation = "auto",
                       workers: int = 4) -> dict[str, Any]:
    """Sample ``n`` completions per item, run each against the item's tests (``workers`` sandboxes at a time),
    and score pass@k for each k <= n beside the stub baseline and the canonical solutions; the JSON-ready result."""
    if isolation == "auto":
        isolation = "namespaces" if namespaces_available() else "guards"
    ks = [k for k in ks if k <= n]
    log.info("task %s: %d items from %s, %d samples each, sandbox %s", task, len(items), source, n, isolation)
    completions = sample([item.prompt for item in items], n)
    if [len(c) for c in completions] != [n] * len(items):
        raise ValueError(f"the sampler gave {[len(c) for c in completions]} completions, not {n} for each item")
    with_solution = [item for item in items if item.canonical_solution]
    # every run: (item, completion) -- the samples, then the stubs, then the canonical solutions
    runs = [(item, c) for item, samples in zip(items, completions, strict=True) for c in samples]
    runs += [(item, STUB) for item in items] + [(item, item.canonical_solution) for item in with_solution]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # each thread waits on its child process
        results = list(pool.map(lambda run: check_completion(run[0], run[1], limits, isolation), runs))
    sampled, stub = results[:len(items) * n], results[len(items) * n:len(items) * (n + 1)]
    canonical = results[len(items) * (n + 1):]
    per_item = []
    for i, (item, samples) in enumerate(zip(items, completions, strict=True)):
        mine = sampled[i * n:(i + 1) * n]
        per_item.append({"id": item.id, "passed": sum(r.passed for r in mine), "samples": len(mine),
                         "statuses": [r.status for r in mine], "first_completion": samples[0] if samples else ""})
    metrics = {f"pass@{k}": metric_summary([pass_at_k(r["samples"], r["passed"], k) for r in per_item], 0.0)
               for k in ks}
    baselines = baselines_summary({"stub": [float(r.passed) for r in stub]})
    return {"task": task, "description": CODE_TASKS[task], "source": source, "items": len(items),
            "kind": "code", "samples_per_item": n, "sandbox": isolation, "metrics": metrics, "baselines": baselines,
            "vs_strongest_baseline": versus_baseline(metrics["pass@1"], baselines),
            "canonical_solution": {"passed": sum(r.passed for r in canonical), "of": len(with_solution)},
            "statuses": dict(Counter(r.status for r in sampled)), "per_item": per_item}


def model_sampler(model: Any, tokenizer: Any, max_len: int, *, max_new_tokens: int = MAX_NEW_TOKENS,
                  temperature: float = TEMPERATURE, seed: int = 0, batch_size: int = 16) -> SampleCode:
    """``n`` completions per prompt from a model with the run's tokenizer, by recipe 09's code
    (eval/completions.py): each prompt repeated ``n`` times in a batch, sampled at ``temperature`` (each row
    its own draw), cut at MERA's stop strings; a prompt too long for ``max_len`` keeps its end."""
    from eval.completions import complete, keeping_the_end, run_codec

    codec = keeping_the_end(run_codec(tokenizer), max_len, max_new_tokens)

    def sample(prompts: list[str], n: int) -> list[list[str]]:
        repeated = [prompt for prompt in prompts for _ in range(n)]
        records = complete(model, codec, repeated, max_new_tokens=max_new_tokens, temperature=temperature,
                           seed=seed, stop=STOP, max_len=max_len, batch_size=batch_size)
        texts = [record["completion"] for record in records]
        return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]

    return sample


def score_run(run: str, task: str, task_file: str, *, step: int | None = None, n: int = SAMPLES,
              max_items: int | None = None, max_new_tokens: int = MAX_NEW_TOKENS, temperature: float = TEMPERATURE,
              seed: int = 0, limits: Limits = LIMITS) -> dict[str, Any]:
    """A run's checkpoint (``step``, else the latest) scored on a code task file: the items are read and checked
    before the model is loaded."""
    from experiment.runfolder import RunFolder
    from experiment.storage import location
    from tokenizer.loaded import load_run_tokenizer
    from trainer.trained_model import load_trained_model

    items = load_code_items(task_file, task, max_items)
    run_folder = RunFolder(location(run, "--run"))
    model, loaded_step, meta = load_trained_model(run_folder, step=step)
    max_len = int(meta.get("seq_len") or meta["model"]["max_seq_len"])
    sampler = model_sampler(model, load_run_tokenizer(run_folder.tokenizer), max_len,
                            max_new_tokens=min(max_new_tokens, max_len // 2), temperature=temperature, seed=seed)
    result = evaluate_code_task(task, items, sampler, source=task_file, n=n, limits=limits)
    return {**result, "run": run, "step": int(loaded_step), "temperature": temperature, "seed": seed}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eval.code_tasks --run runs/demo --task ruhumaneval --file ruhumaneval.jsonl [--out r.json]``"""
    import argparse

    from experiment.errors import RecipeError
    from experiment.files import atomic_write_text

    parser = argparse.ArgumentParser(prog="python -m eval.code_tasks", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the run folder (runs/<experiment>)")
    parser.add_argument("--task", required=True, choices=sorted(CODE_TASKS))
    parser.add_argument("--file", required=True, help="the task's labelled items in MERA's schema (.jsonl, .json)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="completions per item (n of pass@k)")
    parser.add_argument("--max-items", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--temperature", type=float, default=TEMPERATURE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the JSON result here (default: print it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = score_run(args.run, args.task, args.file, step=args.step, n=args.samples,
                           max_items=args.max_items, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=args.seed)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, ensure_ascii=False, indent=1) + "\n"
    if args.out:
        atomic_write_text(args.out, text)
    else:
        print(text, end="")
    for k, summary in result["metrics"].items():
        low, high = summary["ci95"]
        print(f"{args.task} {k}: {summary['value']:.4f} [{low:.4f}, {high:.4f}] over {result['items']} items; "
              f"stub {result['baselines']['stub']['value']:.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
