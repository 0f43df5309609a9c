"""Generative tasks (eval/generative.py): MERA's arithmetic tasks answered by generation and scored by exact match,
with their schemas, prompts, baselines and one-line errors; recipe 05 scores them beside the log-likelihood tasks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eval.generative import (
    build_gen_item,
    computed_answer,
    evaluate_generative,
    load_generative,
    prompt_of,
)
from eval.loaders import Record
from eval.tasks import GENERATIVE_TASKS
from experiment.errors import DataError

SIMPLEAR = GENERATIVE_TASKS["simplear"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def humanbench_file(tmp_path: Path, n: int = 12) -> Path:
    rows = [{"formula": f"{100 + 7 * i} + {200 + 11 * i}", "human_majority": str(300 + 18 * i)} for i in range(n)]
    return write_jsonl(tmp_path / "simplear.jsonl", rows)


def oracle(data):
    answers = {item.query: item.answer for item in data.items}

    def generate(prompts, max_new_tokens, stop):
        return [" " + answers[p.split("\n\n")[-1]] + "\nмусор" for p in prompts]  # cut at the newline

    return generate


def test_the_answer_of_a_formula_is_computed_and_a_formula_that_is_none_is_one_line() -> None:
    assert (computed_answer("8920 + 2043"), computed_answer(" 12 - 30 "), computed_answer("7 * -3")) == \
        ("10963", "-18", "-21")
    assert computed_answer("2 + 2 + 2") is None
    with pytest.raises(DataError, match=r"f.jsonl: row 3 .*'formula' is 'два плюс два'"):
        build_gen_item(SIMPLEAR, "humanbench", Record("f.jsonl", 3, {"formula": "два плюс два"}))
    with pytest.raises(DataError, match=r"row 2 .*missing field 'outputs' .*closed"):
        build_gen_item(SIMPLEAR, "mera", Record("t.jsonl", 2, {"inputs": "1 + 1", "outputs": ""}))
    with pytest.raises(DataError, match=r"'instruction' is not a template"):
        build_gen_item(SIMPLEAR, "mera", Record("t.jsonl", 2, {"inputs": "1 + 1", "outputs": "2",
                                                             "instruction": "Сложите {a}"}))


def test_prompts_are_meras_few_shot_examples_then_the_query(tmp_path: Path) -> None:
    data = load_generative(SIMPLEAR, bench_dir=str(tmp_path), task_files={"simplear": str(humanbench_file(tmp_path))})
    item = data.items[0]
    shots = [data.pool[3], data.pool[5]]
    prompt = prompt_of(item, shots)
    assert prompt == (f"{shots[0].inputs} {shots[0].answer}\n\n{shots[1].inputs} {shots[1].answer}\n\n"
                      f"Вычислите значение выражения.\n{item.inputs} =")
    mera = build_gen_item(SIMPLEAR, "mera", Record("t.jsonl", 1, {"inputs": "5 + 6", "outputs": "11",
                                                                "instruction": "Решите: {inputs}\nОтвет:"}))
    assert mera.query == "Решите: 5 + 6\nОтвет:"  # a record's own instruction wins


def test_exact_match_baselines_and_flags_from_known_generators(tmp_path: Path) -> None:
    data = load_generative(SIMPLEAR, bench_dir=str(tmp_path), task_files={"simplear": str(humanbench_file(tmp_path))})
    right = evaluate_generative(data, oracle(data), batch_size=5)
    assert right["metrics"]["exact_match"]["value"] == 1.0 and right["vs_strongest_baseline"]["verdict"] == "above"
    assert right["num_fewshot"] == 2 and right["labels"] == "gold" and right["items"] == 12

    def copy_last_number(prompts, max_new_tokens, stop):
        return [re.findall(r"-?\d+", p.split("\n\n")[-1])[-1] for p in prompts]

    copier = evaluate_generative(data, copy_last_number)
    assert copier["metrics"]["exact_match"]["value"] == copier["baselines"]["copy_number"]["value"] == 0.0

    def repeat_last_example(prompts, max_new_tokens, stop):
        return [p.split("\n\n")[-2].split(" ")[-1] for p in prompts]

    repeater = evaluate_generative(data, repeat_last_example)
    assert repeater["metrics"]["exact_match"]["value"] == repeater["baselines"]["fewshot_answer"]["value"]

    constant = evaluate_generative(data, lambda prompts, n, stop: ["42"] * len(prompts))
    assert constant["answers"]["one_answer"] and constant["answers"]["top"] == "42"
    assert constant["metrics"]["exact_match"]["value"] == 0.0 and constant["vs_strongest_baseline"]["verdict"] != "above"


def test_rumultiar_reads_a_file_of_meras_schema(tmp_path: Path) -> None:
    rows = [{"instruction": "Вычислите: {inputs}\nОтвет:", "inputs": f"(({i} + 2) * 3) =",
             "outputs": str((i + 2) * 3), "meta": {"id": i}} for i in range(5)]
    path = write_jsonl(tmp_path / "rumultiar.jsonl", rows)
    data = load_generative(GENERATIVE_TASKS["rumultiar"], bench_dir=str(tmp_path), task_files={"rumultiar": str(path)})
    result = evaluate_generative(data, oracle(data))
    assert result["metrics"]["exact_match"]["value"] == 1.0 and result["num_fewshot"] == 1


def test_the_shared_simplear_items_computed_answers_are_the_crowds(shared_data: Path) -> None:
    path = shared_data / "bench" / "mera_humanbench" / "simplear_items_human_mv.jsonl"
    data = load_generative(SIMPLEAR, bench_dir=str(shared_data / "bench"))
    assert data.where == str(path) and len(data.items) == 230
    crowd = [json.loads(line)["human_majority"] for line in path.read_text(encoding="utf-8").splitlines()]
    assert [item.answer for item in data.items] == crowd


def test_recipe_05_scores_generative_tasks_with_baselines(fixture_pretrained: Path, tmp_path: Path) -> None:
    from tests.fixture_run import pretrained_copy
    from tests.recipe_runner import run_recipe

    rows = [{"inputs": f"{i} + {i}", "outputs": str(2 * i), "meta": {"id": i}} for i in range(8)]
    path = write_jsonl(tmp_path / "rumultiar.jsonl", rows)
    config = pretrained_copy(fixture_pretrained, tmp_path)
    run_recipe("05_evaluate.py", config, "eval.tasks=[simplear,rumultiar]", f"eval.task_files={{rumultiar: {path}}}",
               "eval.max_items_per_task=6")
    eval_dir = tmp_path / "runs" / "tiny" / "eval"
    results = json.loads(sorted(eval_dir.glob("step_*.json"))[-1].read_text(encoding="utf-8"))
    for task in ("simplear", "rumultiar"):
        r = results["tasks"][task]
        assert r["kind"] == "generative" and r["items"] == 6
        assert {"copy_number", "fewshot_answer", "random_init"} <= set(r["baselines"])
        assert 0.0 <= r["metrics"]["exact_match"]["value"] <= 1.0 and len(r["metrics"]["exact_match"]["ci95"]) == 2
        assert "exact_match" in r["random_init"]["metrics"]
    report = sorted(eval_dir.glob("step_*.md"))[-1].read_text(encoding="utf-8")
    assert "## simplear: generated answers (first items)" in report and "copy the last number" in report
