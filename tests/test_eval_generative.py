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
    squad_exact,
    squad_f1,
)
from eval.loaders import Record
from eval.tasks import GENERATIVE_TASKS
from experiment.errors import DataError

SIMPLEAR = GENERATIVE_TASKS["simplear"]
MULTIQ = GENERATIVE_TASKS["multiq"]


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
    assert (constant["metrics"]["exact_match"]["value"] == 0.0
            and constant["vs_strongest_baseline"]["verdict"] != "above")


def test_rumultiar_reads_a_file_of_meras_schema(tmp_path: Path) -> None:
    rows = [{"instruction": "Вычислите: {inputs}\nОтвет:", "inputs": f"(({i} + 2) * 3) =",
             "outputs": str((i + 2) * 3), "meta": {"id": i}} for i in range(5)]
    path = write_jsonl(tmp_path / "rumultiar.jsonl", rows)
    data = load_generative(GENERATIVE_TASKS["rumultiar"], bench_dir=str(tmp_path), task_files={"rumultiar": str(path)})
    result = evaluate_generative(data, oracle(data))
    assert result["metrics"]["exact_match"]["value"] == 1.0 and result["num_fewshot"] == 1


def multiq_file(tmp_path: Path, n: int = 7) -> Path:
    """MultiQ in MERA's schema: inputs as fields, the golds joined by ";", a per-record instruction."""
    cities = ["Казань", "Самара", "Тверь", "Пермь", "Омск", "Томск"]
    rows = [{"instruction": "Ответьте на вопрос по двум текстам.\nВопрос: {question}\nТекст 1: {support_text}\n"
                            "Текст 2: {text}\nОтвет:",
             "inputs": {"question": f"Где родился автор романа номер {i}?",
                        "support_text": f"Роман номер {i} написал Иван Петров.",
                        "text": f"Иван Петров родился в городе {cities[i % 6]} в 1850 году."},
             "outputs": f"{cities[i % 6]};город {cities[i % 6]}", "meta": {"id": i}} for i in range(n)]
    return write_jsonl(tmp_path / "multiq.jsonl", rows)


def test_squad_scoring_by_hand() -> None:
    # SQuAD's normalization: case, ASCII punctuation and English articles do not count
    assert squad_exact("Москва.", "москва") == 1.0 and squad_exact("the Kremlin", "Kremlin") == 1.0
    assert squad_exact("город Москва", "Москва") == 0.0
    # one shared word of 2 predicted and 1 gold: precision 1/2, recall 1, F1 2/3
    assert squad_f1("город Москва", "Москва") == pytest.approx(2 / 3)
    # 2 shared of 3 predicted and 4 gold: precision 2/3, recall 1/2, F1 4/7
    assert squad_f1("Лев Николаевич Толстой", "граф Лев Толстой писатель") == pytest.approx(4 / 7)
    assert squad_f1("", "") == 1.0 and squad_f1("Москва", "") == 0.0 and squad_f1("Казань", "Москва") == 0.0


def test_multiq_prompts_fill_the_fields_and_score_f1_and_exact_match_over_every_gold(tmp_path: Path) -> None:
    data = load_generative(MULTIQ, bench_dir=str(tmp_path), task_files={"multiq": str(multiq_file(tmp_path))})
    item = data.items[1]
    assert item.query == ("Ответьте на вопрос по двум текстам.\nВопрос: Где родился автор романа номер 1?\n"
                          "Текст 1: Роман номер 1 написал Иван Петров.\n"
                          "Текст 2: Иван Петров родился в городе Самара в 1850 году.\nОтвет:")
    assert item.answers == ("Самара", "город Самара") and item.passage.startswith("Иван Петров")
    assert prompt_of(item, []) == item.query  # MERA's MultiQ is zero-shot

    def second_gold(prompts, max_new_tokens, stop):  # the longer gold, said with a trailing sentence
        return [" город " + p.split("городе ")[1].split(" ")[0] + "\nЕщё текст" for p in prompts]

    result = evaluate_generative(data, second_gold)
    assert list(result["metrics"]) == ["f1", "exact_match"] and result["scoring"] == "squad"
    assert result["metrics"]["f1"]["value"] == 1.0 and result["metrics"]["exact_match"]["value"] == 1.0
    assert result["vs_strongest_baseline"]["verdict"] == "above"

    def with_a_year(prompts, max_new_tokens, stop):  # "Самара 1850" against "Самара": F1 2/3, no exact match
        return [p.split("городе ")[1].split(" ")[0] + " 1850" for p in prompts]

    partial = evaluate_generative(data, with_a_year)
    assert partial["metrics"]["f1"]["value"] == pytest.approx(2 / 3)
    assert partial["metrics"]["exact_match"]["value"] == 0.0

    # what the text_start baseline says: the second text's first three words, no word of any gold
    copier = evaluate_generative(data, lambda prompts, n, stop: ["Иван Петров родился"] * len(prompts))
    assert copier["metrics"]["f1"]["value"] == copier["baselines"]["text_start"]["value"] == 0.0
    # "Казань" is the most common answer (items 0 and 6 of 7): the majority baseline scores those two
    assert result["baselines"]["majority_answer"]["value"] == pytest.approx(2 / 7)


def test_multiq_schemas_of_both_releases_and_a_missing_field_is_one_line(tmp_path: Path) -> None:
    spans = build_gen_item(MULTIQ, "mera", Record("m.jsonl", 1, {
        "inputs": {"question": "Где?", "support_text": "А.", "text": "Б в Омске."},
        "outputs": [{"label": "answer", "length": 5, "offset": 2, "segment": "Омске"},
                    {"label": "answer", "length": 4, "offset": 0, "segment": "Омск"}]}))
    assert spans.answers == ("Омске", "Омск") and spans.query.endswith("Текст 2: Б в Омске.\nОтвет:")
    with pytest.raises(DataError, match=r"m.jsonl: row 2 .*'inputs' has no field 'support_text'"):
        build_gen_item(MULTIQ, "mera", Record("m.jsonl", 2, {"inputs": {"question": "Где?", "text": "Б."},
                                                            "outputs": "Б"}))


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
    multiq = multiq_file(tmp_path)
    config = pretrained_copy(fixture_pretrained, tmp_path)
    run_recipe("05_evaluate.py", config, "eval.tasks=[simplear,rumultiar,multiq]",
               f"eval.task_files={{rumultiar: {path}, multiq: {multiq}}}", "eval.max_items_per_task=6")
    eval_dir = tmp_path / "runs" / "tiny" / "eval"
    results = json.loads(sorted(eval_dir.glob("step_*.json"))[-1].read_text(encoding="utf-8"))
    for task in ("simplear", "rumultiar"):
        r = results["tasks"][task]
        assert r["kind"] == "generative" and r["items"] == 6
        assert {"copy_number", "fewshot_answer", "random_init"} <= set(r["baselines"])
        assert 0.0 <= r["metrics"]["exact_match"]["value"] <= 1.0 and len(r["metrics"]["exact_match"]["ci95"]) == 2
        assert "exact_match" in r["random_init"]["metrics"]
    r = results["tasks"]["multiq"]
    assert r["kind"] == "generative" and r["items"] == 6 and list(r["metrics"]) == ["f1", "exact_match"]
    assert {"majority_answer", "text_start", "random_init"} <= set(r["baselines"])
    assert 0.0 <= r["metrics"]["exact_match"]["value"] <= r["metrics"]["f1"]["value"] <= 1.0
    report = sorted(eval_dir.glob("step_*.md"))[-1].read_text(encoding="utf-8")
    assert "## simplear: generated answers (first items)" in report and "copy the last number" in report
