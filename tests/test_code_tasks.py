"""eval/code_tasks.py: MERA's ruHumanEval and ruCodeEval items (files of the dataset cards' schema, built here: the
shared data has no code tasks), completions run in the sandbox against their tests, pass@k (Chen et al. 2021)
checked against counting every draw."""

from __future__ import annotations

import itertools
import json
import tempfile
from fractions import Fraction
from pathlib import Path

import pytest

from eval.code_tasks import (
    STUB,
    CodeItem,
    check_completion,
    evaluate_code_task,
    load_code_items,
    pass_at_k,
    program,
)
from experiment.errors import DataError

GCD_FUNCTION = ('\n\ndef greatest_common_divisor(a: int, b: int) -> int:\n    """Верните наибольший общий делитель '
                'двух целых чисел a и b.\n    Примеры: \n        greatest_common_divisor(3, 5) \n        1 \n'
                '        greatest_common_divisor(25, 15) \n        5\n    """')
# ruCodeEval's card: tests as Python text, outputs one list per sample (equal lists) of texts
GCD = {"instruction": "Необходимо реализовать логику на языке Python для следующей программы\n{function}",
       "inputs": {"function": GCD_FUNCTION, "tests": "[{'a': 100, 'b': 50}, {'a': 98, 'b': 56}, {'a': 7, 'b': 13}]"},
       "outputs": [["50", "14", "1"]] * 3,
       "meta": {"id": 13, "entry_point": "greatest_common_divisor",
                "canonical_solution": "\n\n    def query_gcd(a: int, b: int) -> int:\n        return a if b == 0 else "
                                      "query_gcd(b, a % b)\n    return query_gcd(a, b)    \n\n"}}
# ruHumanEval's card: tests as a list, outputs one flat list (of values)
SORT = {"instruction": "Допишите код на языке Python в соответствии с условием\n{function}",
        "inputs": {"function": 'def sorted_unique(items: list) -> list:\n    """Верните отсортированные уникальные '
                               'элементы списка."""\n',
                   "tests": [{"items": [3, 1, 3]}, {"items": []}, {"items": ["б", "а"]}]},
        "outputs": ["[1, 3]", "[]", "['а', 'б']"],
        "meta": {"id": 1, "entry_point": "sorted_unique", "canonical_solution": "    return sorted(set(items))\n"}}


def task_file(tmp_path: Path, *records: dict) -> Path:
    path = tmp_path / "rucodeeval.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def items(tmp_path: Path) -> list[CodeItem]:
    return load_code_items(str(task_file(tmp_path, GCD, SORT)), "rucodeeval")


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The share of all k-sample draws (without replacement) from n samples, c of them passing, with a pass."""
    samples = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in draw) for draw in draws), len(draws))


def test_pass_at_k_is_the_share_of_draws_with_a_passing_sample() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the passing share
    assert pass_at_k(200, 0, 100) == 0.0 and pass_at_k(200, 101, 100) == 1.0


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_items_read_in_both_cards_shapes(tmp_path: Path) -> None:
    gcd, sort = items(tmp_path)
    assert gcd.prompt == ("Необходимо реализовать логику на языке Python для следующей программы\n"
                          + GCD_FUNCTION.rstrip())  # MERA strips the whole prompt, not the function
    assert gcd.outputs == ("50", "14", "1") and gcd.entry_point == "greatest_common_divisor"
    assert gcd.id.endswith(":1 (id 13)")
    assert sort.outputs == ("[1, 3]", "[]", "['а', 'б']")
    assert load_code_items(str(task_file(tmp_path, GCD, SORT)), "rucodeeval", max_items=1) == [gcd]


@pytest.mark.parametrize("change, message", [
    (lambda r: r["meta"].pop("entry_point"), "meta.entry_point"),
    (lambda r: r["inputs"].update(tests="[{'a': 1"), "inputs.tests' is not a Python literal"),
    (lambda r: r.update(outputs=["50"]), "3 test cases but 1 outputs"),
    (lambda r: r.update(outputs=[]), "answers are closed"),
    (lambda r: r.update(outputs=[["1", "2", "3"], ["1", "2", "4"]]), "rows that differ"),
    (lambda r: r.update(instruction="{function} {code}"), "names 'code'"),
])
def test_a_bad_record_is_one_line_naming_file_row_and_field(tmp_path: Path, change, message: str) -> None:
    broken = json.loads(json.dumps(SORT))
    change(broken)
    path = task_file(tmp_path, GCD, broken)
    with pytest.raises(DataError, match=message) as error:
        load_code_items(str(path), "rucodeeval")
    assert f"{path}: row 2" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.integration  # runs the sandbox's child interpreters
def test_the_canonical_solution_passes_and_wrong_ones_do_not(tmp_path: Path) -> None:
    gcd, sort = items(tmp_path)
    assert check_completion(gcd, GCD["meta"]["canonical_solution"]).status == "passed"
    assert check_completion(sort, "```python\n    return sorted(set(items))\n```").passed  # a fenced answer
    wrong = check_completion(sort, "    return sorted(items)\n")
    assert wrong.status == "wrong" and wrong.got == ["[1, 3, 3]", "[]", "['а', 'б']"]
    assert check_completion(gcd, STUB).got == [None, None, None]
    assert check_completion(gcd, "\n    return a +\n").status == "error"  # does not compile


@pytest.mark.integration
@pytest.mark.parametrize("completion", [
    "\n    import sys\n    sys.exit(0)\n",  # ends "successfully" at the first call
    "\n    import os\n    os._exit(0)\n",
    # a forged report of the right length, then an exit before the real calls
    "\n    print('\\n__ru_code_task_results__ [\"1\", \"1\", \"1\"]')\n    import os\n    os._exit(0)\n",
])
def test_a_completion_cannot_pass_by_ending_early_or_forging_its_report(tmp_path: Path, completion: str) -> None:
    gcd = items(tmp_path)[0]
    result = check_completion(gcd, completion)
    assert not result.passed and result.status in ("no_report", "wrong")


@pytest.mark.integration
@pytest.mark.parametrize("hostile, status", [
    ("\n    open(SENTINEL, 'w').write('escaped')\n    return 1\n", "wrong"),  # each call raises: None
    ("\n    import socket\n    socket.create_connection(('192.0.2.1', 80), timeout=2)\n    return 1\n", "wrong"),
    ("\n    while True:\n        pass\n", "killed|timeout"),  # CPU limit, or the wall clock on a busy machine
    ("\n    import time\n    time.sleep(60)\n", "timeout"),
    ("\n    import os\n    while True:\n        os.fork()\n", "wrong"),
    ("\n    return len(bytearray(4 << 30))\n", "wrong"),
])
def test_a_hostile_completion_scores_as_failing_and_nothing_escapes(tmp_path: Path, hostile: str, status: str) -> None:
    from eval.sandbox import Limits

    sentinel = tmp_path / "escaped.txt"
    gcd = items(tmp_path)[0]
    result = check_completion(gcd, hostile.replace("SENTINEL", repr(str(sentinel))), Limits(wall_s=4, cpu_s=2))
    assert not result.passed and result.status in status.split("|")
    assert result.got in (None, [None, None, None])
    assert not sentinel.exists()


@pytest.mark.integration
def test_pass_at_k_of_a_task_from_scripted_samples(tmp_path: Path) -> None:
    gcd, sort = items(tmp_path)
    right = {gcd.prompt: GCD["meta"]["canonical_solution"], sort.prompt: SORT["meta"]["canonical_solution"]}
    # the gcd item: 1 of 4 samples right; the sort item: 4 of 4
    scripted = {gcd.prompt: [right[gcd.prompt], STUB, "\n    return 0\n", "\n    return a\n"],
                sort.prompt: [right[sort.prompt]] * 4}

    def sample(prompts: list[str], n: int) -> list[list[str]]:
        assert n == 4
        return [scripted[p] for p in prompts]

    result = evaluate_code_task("rucodeeval", [gcd, sort], sample, source="scripted", n=4, ks=(1, 2, 10))
    assert list(result["metrics"]) == ["pass@1", "pass@2"]  # k above n has no estimate
    assert result["metrics"]["pass@1"]["value"] == pytest.approx((0.25 + 1.0) / 2)
    assert result["metrics"]["pass@2"]["value"] == pytest.approx((0.5 + 1.0) / 2)
    assert [r["passed"] for r in result["per_item"]] == [1, 4]
    assert result["baselines"]["stub"]["value"] == 0.0
    assert result["canonical_solution"] == {"passed": 2, "of": 2}
    assert result["statuses"] == {"passed": 5, "wrong": 3}
    assert result["vs_strongest_baseline"]["baseline"] == "stub"


def test_the_program_calls_each_case_and_keeps_the_expected_outputs_out(tmp_path: Path) -> None:
    gcd = items(tmp_path)[0]
    text = program(gcd, "    return 1\n")
    assert text.startswith(GCD_FUNCTION + "    return 1\n")
    assert "greatest_common_divisor(**case)" in text and "'b': 56" in text
    assert "'14'" not in text and '"14"' not in text  # the answers never reach the sandbox


def test_the_fixture_model_is_scored_on_two_items(fixture_pretrained: Path, tmp_path: Path) -> None:
    """The plumbing end to end, through ``python -m eval.code_tasks``: the tiny fixture model sampled twice per
    item by recipe 09's code, its completions run in the sandbox. A 6-step model writes no working Python: pass@1
    is 0, as is the stub's, while the canonical solutions pass in the same sandbox."""
    from eval.code_tasks import main

    before = set(Path(tempfile.gettempdir()).glob("ru-sandbox-*"))
    out = tmp_path / "result.json"
    assert main(["--run", str(fixture_pretrained.parent / "runs" / "tiny"), "--task", "rucodeeval",
                 "--file", str(task_file(tmp_path, GCD, SORT)), "--samples", "2", "--max-new-tokens", "24",
                 "--seed", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["items"] == 2 and [r["samples"] for r in result["per_item"]] == [2, 2] and result["step"] == 6
    assert list(result["metrics"]) == ["pass@1"]  # pass@5 and pass@10 need 5 and 10 samples
    assert result["metrics"]["pass@1"]["value"] == 0.0 and result["baselines"]["stub"]["value"] == 0.0
    assert sum(result["statuses"].values()) == 4 and "passed" not in result["statuses"]
    assert result["canonical_solution"] == {"passed": 2, "of": 2}
    assert all(r["first_completion"] for r in result["per_item"])  # the model wrote something, run and failed
    assert set(Path(tempfile.gettempdir()).glob("ru-sandbox-*")) <= before  # every run's folder removed


def test_a_bad_task_file_is_one_error_line_before_any_model_loads(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from eval.code_tasks import main

    broken = json.loads(json.dumps(SORT))
    broken["meta"].pop("entry_point")
    path = task_file(tmp_path, broken)
    assert main(["--run", str(tmp_path / "no-such-run"), "--task", "ruhumaneval", "--file", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {path}: row 1") and "\n" not in error
