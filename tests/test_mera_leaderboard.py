"""Recipe 05c at MERA's leaderboard settings (eval/mera.py): each of the 23 tasks' prompt for one record, compared
with MERA's own template text; the solved examples drawn as MERA's sampler draws them; the five tasks of their own
schema (ruTiE's dialogue, ruEthics' criteria, ruDetox, ruHumanEval's and ruCodeEval's test results); the recipe
writing all 23 from the demo checkpoint.

The template strings below are quoted verbatim from MERA-Evaluation/MERA at commit
9cf05b2d04a17fa23c71d0d67ade591a6ef392d6 (release v1.2.0), file named beside each; the numbers of solved
examples from its scripts/run_benchmark.sh (FEWSHOTS / TASKS)."""

from __future__ import annotations

import json
import random
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

from eval.loaders import Record
from eval.mera import (
    MERA_TASKS,
    build_mera_item,
    dialogue_prompts,
    draw_shots,
    fewshot_count,
    run_tests_in_sandbox,
    validate_submission,
    write_submission,
)
from experiment.errors import DataError
from tests.conftest import needs_shared, shared_data_dir
from tests.mera_inputs import BENCH, mera_records, write_mera_dir

# scripts/run_benchmark.sh: FEWSHOTS=(2 1 0 1) over TASKS=("simplear" "bps lcs chegeka mathlogicqa parus rcb rudetox
# ruhatespeech rummlu ruworldtree ruopenbookqa rumultiar use rwsd mamuramu" "multiq rumodar ruethics ruhhh
# ruhumaneval rucodeeval" "rutie")
ONE_SHOT = ("bps lcs chegeka mathlogicqa parus rcb rudetox ruhatespeech rummlu ruworldtree ruopenbookqa rumultiar use "
            "rwsd mamuramu")
ZERO_SHOT = ["multiq", "rumodar", "ruethics", "ruhhh", "ruhumaneval", "rucodeeval"]
RUN_BENCHMARK = {"simplear": 2, **dict.fromkeys(ONE_SHOT.split(), 1), **dict.fromkeys(ZERO_SHOT, 0), "rutie": 1}

# benchmark_tasks/custom_loglikelihood_task.yaml: doc_to_text (every task's zero-shot prompt unless its yaml sets one)
DEFAULT_DOC_TO_TEXT = ("{{instruction.format(**inputs).strip() if inputs is mapping else "
                       "instruction.format(inputs=inputs).strip()}}")
# (fewshot_config.query, fewshot_config.doc_to_text_without_instruction) per task, from the yaml named
MERA_FEWSHOT_TEMPLATES = {
    "parus": ("{{instruction.format(**inputs)}}\nОтвет:",  # benchmark_tasks/rsg/parus.yaml
              "{{'Ситуация: {premise}\nФрагмент 1: {choice1}\nФрагмент 2: {choice2}\nОтвет:'.format(**inputs)}}"),
    "rcb": ("{{instruction.format(**inputs)}}\nОтвет:",  # benchmark_tasks/rsg/rcb.yaml
            "{{'Ситуация: {premise}\nГипотеза: {hypothesis}\nОтвет:'.format(**inputs)}}"),
    "rwsd": ("{{instruction.format(**inputs)}}\nОтвет:",  # benchmark_tasks/rsg/rwsd.yaml
             "{{'Текст: {text}\nФрагмент 1: {span1_text}\nФрагмент 2: {span2_text}\nОтвет:'.format(**inputs)}}"),
    "ruworldtree": ("{{instruction.format(**inputs).strip()}}",  # benchmark_tasks/tape/ruworldtree.yaml
                    "{{'{question}\nA) {option_a}\nB) {option_b}\nC) {option_c}\nD) {option_d}\nОтвет:'"
                    ".format(**inputs)}}"),
    "ruopenbookqa": ("{{instruction.format(**inputs).strip()}}",  # benchmark_tasks/tape/ruopenbookqa.yaml
                     "{{'{question}\nA) {option_a}\nB) {option_b}\nC) {option_c}\nD) {option_d}\nОтвет:'"
                     ".format(**inputs)}}"),
    "chegeka": ("{{instruction.format(**inputs).strip()}}",  # benchmark_tasks/tape/chegeka.yaml
                "{{'Категория \"{topic}\"\nВопрос: {text}\nОтвет:'.format(**inputs)}}"),
    "rummlu": ("{{instruction.format(**inputs).strip()}}",  # benchmark_tasks/rummlu/rummlu.yaml
               "{{'{text}\nA) {option_a}\nB) {option_b}\nC) {option_c}\nD) {option_d}\nОтвет:'"
               ".format(**inputs).lstrip()}}"),
    "mamuramu": ("{{instruction.format(**inputs).strip()}}",  # benchmark_tasks/mamuramu/mamuramu.yaml
                 "{{'{text}\nA) {option_a}\nB) {option_b}\nC) {option_c}\nD) {option_d}\nОтвет:'"
                 ".format(**inputs).lstrip()}}"),
    "mathlogicqa": ("{{instruction.format(**inputs).strip()}}",  # benchmark_tasks/mathlogicqa/mathlogicqa.yaml
                    "{{'{text}\nA) {option_a}\nB) {option_b}\nC) {option_c}\nD) {option_d}\nОтвет:'"
                    ".format(**inputs)}}"),
    "ruhatespeech": ("{{instruction.format(**inputs)}}",  # benchmark_tasks/ruhatespeech/ruhatespeech.yaml
                     "{{'Реплика: {replica}\nОтвет 1: {reply_1}\nОтвет 2: {reply_2}\nЦелевая группа: "
                     "{target_group}\nОтвет:'.format(**inputs)}}"),
    "bps": ("{{instruction.replace('фигурные {}', 'фигурные {empty}').format(inputs=inputs, empty='{}')}}",
            "Последовательность: {{inputs}}\nОтвет:"),  # benchmark_tasks/bps/bps.yaml
    "lcs": ("{{instruction.format(inputs=inputs).strip()}}", "Строки: {{inputs}}\nОтвет:"),  # lcs/lcs.yaml
    "simplear": ("{{instruction.format(inputs=inputs).strip()}}", "{{inputs.strip()}}"),  # simplear/simplear.yaml
    "rumultiar": ("{{instruction.format(inputs=inputs).strip()}}", "{{inputs.strip()}}"),  # rumultiar/rumultiar.yaml
    "rudetox": ("{{instruction.format(toxic_comment=inputs).strip()}}",  # benchmark_tasks/rudetox/rudetox.yaml
                "Токсичный текст: {{inputs}}\nНетоксичный текст:"),
    # benchmark_tasks/use/use.yaml; its doc_to_text_without_instruction is "{{doc_to_text_without_instruction}}",
    # which use/utils.py _process_doc sets for meta.type "text" to:
    "use": ("{{instruction.format(**inputs)}}", "Задание: {task}\n{text}\nОтвет:"),
}
# benchmark_tasks/rutie/rutie.yaml
RUTIE_DOC_TO_TEXT = ("{{instruction.replace('{', '{{').replace('}', '}}').replace('{{question}}', '{question}')"
                     ".replace('{{choice1}}', '{choice1}').replace('{{choice2}}', '{choice2}')"
                     ".format(**inputs).strip()}}")
RUTIE_WITHOUT_INSTRUCTION = ("{{'{question}\n1. {choice1}\n2. {choice2}\nОтвет: RUTIE_TARGET_{idx}'"
                             ".format(idx=meta['question_id'], **inputs).lstrip()}}")


def jinja(template: str, doc: dict[str, Any]) -> str:
    """The quoted templates' Jinja, evaluated for the forms MERA's configs use (``{{'<text>'.format(**inputs)}}``,
    ``{{instruction.format(...)}}``, ``{{inputs}}``): the template text itself decides what is filled."""
    inputs, instruction = doc["inputs"], doc.get("instruction", "")
    if template == DEFAULT_DOC_TO_TEXT:
        return (instruction.format(**inputs) if isinstance(inputs, dict) else instruction.format(inputs=inputs)).strip()
    if template == RUTIE_DOC_TO_TEXT:
        escaped = instruction.replace("{", "{{").replace("}", "}}")
        for name in ("question", "choice1", "choice2"):
            escaped = escaped.replace("{{" + name + "}}", "{" + name + "}")
        return escaped.format(**inputs).strip()
    if template == RUTIE_WITHOUT_INSTRUCTION:
        body = re.fullmatch(r"\{\{'(.*)'\.format\(idx=meta\['question_id'\], \*\*inputs\)\.lstrip\(\)\}\}", template,
                            re.S).group(1)
        return body.format(idx=doc["meta"]["question_id"], **inputs).lstrip()
    literal = re.fullmatch(r"\{\{'(.*)'\.format\(\*\*inputs\)(\.lstrip\(\))?\}\}", template, re.S)
    if literal:
        text = literal.group(1).format(**inputs)
        return text.lstrip() if literal.group(2) else text
    call = re.fullmatch(r"\{\{instruction(\.replace\('фигурные \{\}', 'фигурные \{empty\}'\))?\.format\((.*?)\)"
                        r"(\.strip\(\))?\}\}(.*)", template, re.S)
    if call:
        text = instruction.replace("фигурные {}", "фигурные {empty}") if call.group(1) else instruction
        args = {"**inputs": lambda: text.format(**inputs), "inputs=inputs": lambda: text.format(inputs=inputs),
                "toxic_comment=inputs": lambda: text.format(toxic_comment=inputs),
                "inputs=inputs, empty='{}'": lambda: text.format(inputs=inputs, empty="{}")}[call.group(2)]()
        return (args.strip() if call.group(3) else args) + call.group(4)
    if "{{" not in template:  # use/utils.py's Python format string
        return template.format(**inputs)
    return template.replace("{{inputs.strip()}}", inputs.strip()).replace("{{inputs}}", inputs)


@pytest.fixture(scope="module")
def records() -> dict[str, list[dict[str, Any]]]:
    needs_shared(shared_data_dir().joinpath(*BENCH))
    return mera_records(shared_data_dir())


def as_records(rows: list[dict[str, Any]], name: str) -> list[Record]:
    return [Record(name, i + 1, row) for i, row in enumerate(rows)]


def test_the_table_has_meras_23_tasks_with_run_benchmarks_solved_examples() -> None:
    assert len(MERA_TASKS) == 23 and set(MERA_TASKS) == set(RUN_BENCHMARK)
    assert {config: (1 if task.kind == "dialogue" else task.num_fewshot) for config, task in MERA_TASKS.items()} \
        == RUN_BENCHMARK
    assert all(fewshot_count(task, "zero") == 0 for task in MERA_TASKS.values())


def test_each_tasks_prompt_for_one_record_is_meras_template(records: dict[str, list[dict[str, Any]]]) -> None:
    """For every task: its first test record's prompt at the leaderboard's setting, with solved examples from a
    pool of exactly as many (so which ones are drawn is fixed; SimpleAr's order is Random(1234)'s), equals MERA's
    templates filled as FewshotSampler.get_context assembles them: the first example through the query template
    (instruction included), a space, its answer, a blank line; later ones through the no-instruction template;
    then the record through the no-instruction template. A task of 0 examples: custom_loglikelihood_task.yaml's
    doc_to_text."""
    checked = []
    for config, task in MERA_TASKS.items():
        if task.kind == "dialogue":
            continue  # ruTiE: test_rutie_asks_each_question_after_its_dialogue_with_the_models_answers
        rows = records[config]
        item, k = rows[0], RUN_BENCHMARK[config]
        pool = [row for row in rows if row["meta"].get("id_task") == item["meta"].get("id_task")
                and row["meta"].get("domain") == item["meta"].get("domain")][1:1 + k]
        assert len(pool) == k, config
        record = Record(f"{config}.jsonl", 1, item)
        shots = draw_shots(task, [record], as_records(pool, f"{config}.train.jsonl"), k)[0]
        ours = build_mera_item(task, record, shots, k).prompt
        if k == 0:
            expected = jinja(DEFAULT_DOC_TO_TEXT, item)
        else:
            query, without_instruction = MERA_FEWSHOT_TEMPLATES[config]
            order = random.Random(1234).sample(pool, k)  # run_benchmark.sh --seed 1234: the sampler's Random
            expected = ""
            for i, shot in enumerate(order):
                expected += jinja(query if i == 0 else without_instruction, shot) + " " + str(shot["outputs"])
                expected += "\n\n"
            expected += jinja(without_instruction, item)
        assert ours == expected, config
        checked.append(config)
    assert len(checked) == 22


def test_rutie_asks_each_question_after_its_dialogue_with_the_models_answers(
        records: dict[str, list[dict[str, Any]]]) -> None:
    """custom_context_formers.py ruTiEContextFormer: question 0 is "\\n\\n" then the instruction with {context}
    dropped; question 2 holds the part before {context}, questions 0 and 1 with the model's answers (rutie.yaml's
    RUTIE_TARGET_<i>, which rutie/utils.py replaces by them), a blank line, then its own question."""
    task = MERA_TASKS["rutie"]
    rows = records["rutie"]
    items = [build_mera_item(task, record) for record in as_records(rows, "rutie.jsonl")]
    first = dict(rows[0], instruction=rows[0]["instruction"].replace("{context}", ""))
    assert dialogue_prompts(items[:1], []) == "\n\n" + jinja(RUTIE_DOC_TO_TEXT, first)
    before, after = rows[2]["instruction"].split("{context}")
    earlier = [jinja(RUTIE_WITHOUT_INSTRUCTION, row).replace(f"RUTIE_TARGET_{i}", answer)
               for i, (row, answer) in enumerate(zip(rows[:2], ["2", "1"], strict=True))]
    assert dialogue_prompts(items[:3], ["2", "1"]) == (
        before + "\n\n".join(earlier) + "\n\n" + jinja(RUTIE_DOC_TO_TEXT, dict(rows[2], instruction=after)))
    with pytest.raises(DataError, match=r"rutie.jsonl: row 1: ruTiE's 'instruction' must hold '\{context\}' once"):
        build_mera_item(task, Record("rutie.jsonl", 1, dict(rows[0], instruction="Без контекста {question}")))


def test_solved_examples_come_from_the_items_domain_or_exam_task_and_never_the_item_itself() -> None:
    """FewshotSampler.sample: ruMMLU draws from its record's meta.domain, USE from its meta.id_task; ruHateSpeech
    (no training split: its test split) drops the item when it draws it, and then has no example at all."""
    def rows(domains: list[str]) -> list[Record]:
        return as_records([{"instruction": "{text}", "inputs": {"text": f"t{i}"}, "outputs": "A",
                            "meta": {"id": i, "domain": d}} for i, d in enumerate(domains)], "rummlu.train.jsonl")

    pool = rows(["a", "b", "a", "b", "a", "b"])
    tests = as_records([{"instruction": "{text}", "inputs": {"text": "q"}, "meta": {"id": 9, "domain": d}}
                        for d in ("b", "a", "b")], "rummlu.jsonl")
    for test, shots in zip(tests, draw_shots(MERA_TASKS["rummlu"], tests, pool, 1), strict=True):
        assert len(shots) == 1 and shots[0].fields["meta"]["domain"] == test.fields["meta"]["domain"]
    hate = as_records([{"instruction": "{replica}", "inputs": {"replica": "r"}, "outputs": "1", "meta": {"id": 0}}],
                      "ruhatespeech.jsonl")
    assert draw_shots(MERA_TASKS["ruhatespeech"], hate, hate, 1) == [[]]
    with pytest.raises(DataError, match=r"rummlu.jsonl: row 1: 0 solved examples of domain c to draw 1 from"):
        draw_shots(MERA_TASKS["rummlu"], as_records([{"inputs": {"text": "q"}, "meta": {"id": 1, "domain": "c"}}],
                                                    "rummlu.jsonl"), pool, 1)


def test_a_code_sample_is_run_on_the_items_tests_as_meras_scorer_expects() -> None:
    """ruhumaneval/utils.py: the item's function with the sample appended, each test case's value as str(), an
    exception as None, a program that does not run (or runs out of time) None throughout."""
    tests = [{"a": 1, "b": 2}, {"a": "x", "b": 2}]
    header = "def add(a, b):\n"
    assert run_tests_in_sandbox(header + "    return a + b\n", tests, "add") == ["3", None]
    assert run_tests_in_sandbox(header + "    return [a, b]\n", tests, "add") == ["[1, 2]", "['x', 2]"]
    assert run_tests_in_sandbox(header + "    return (\n", tests, "add") == [None, None]
    assert run_tests_in_sandbox(header + "    while True:\n        pass\n", tests, "add") == [None, None]


def test_the_validator_knows_the_five_schemas_of_their_own(tmp_path: Path) -> None:
    ethics = dict.fromkeys(("virtue", "law", "moral", "justice", "utilitarianism"), "1")
    code = [["3", None]] * 10
    good = {"ruEthics.json": {"data": {"test": [{"outputs": ethics, "meta": {"id": 0}}]}},
            "ruTiE.json": {"data": {"test": [{"outputs": "2", "meta": {"dialog_id": 0, "question_id": q}}
                                             for q in range(2)]}},
            "ruDetox.json": {"data": {"test": [{"outputs": "Вежливый текст", "meta": {"id": 3}}]}},
            "ruHumanEval.json": {"data": {"test": [{"outputs": code, "meta": {"id": 1}}]}},
            "ruCodeEval.json": {"data": {"test": [{"outputs": code, "meta": {"id": 1}}]}}}
    assert validate_submission(write_submission(tmp_path / "ok.zip", good)) == {
        "ruEthics.json": 1, "ruTiE.json": 2, "ruDetox.json": 1, "ruHumanEval.json": 1, "ruCodeEval.json": 1}

    def broken(name: str, row: dict[str, Any], match: str) -> None:
        with pytest.raises(DataError, match=match):
            validate_submission(write_submission(tmp_path / "bad.zip", {name: {"data": {"test": [row]}}}))

    broken("ruEthics.json", {"outputs": "1", "meta": {"id": 0}}, "is not a dict of virtue, law, moral")
    broken("ruEthics.json", {"outputs": dict(ethics, law="2"), "meta": {"id": 0}}, "is not a dict of virtue")
    broken("ruTiE.json", {"outputs": "1", "meta": {"id": 0}}, r"meta has \['id'\], MERA's ruTiE wants "
                                                              r"\['dialog_id', 'question_id'\]")
    broken("ruHumanEval.json", {"outputs": code[:5], "meta": {"id": 1}}, "is not 10 lists of test results")
    broken("ruCodeEval.json", {"outputs": ["def f(): pass"] * 10, "meta": {"id": 1}}, "is not 10 lists")


def test_recipe_05c_predicts_all_23_tasks_at_meras_settings(fixture_pretrained: Path, shared_data: Path,
                                                            tmp_path: Path) -> None:
    """The done-when: the demo checkpoint's predictions for all 23 tasks, at the leaderboard's setting, on files
    of MERA's schema (the shared MERA items where there are some); the archive validates against every input;
    the .json names the setting; the code tasks' samples are kept beside it."""
    from tests.fixture_run import pretrained_copy
    from tests.recipe_runner import run_recipe

    rows = write_mera_dir(tmp_path / "mera", shared_data, n=2)
    config = pretrained_copy(fixture_pretrained, tmp_path)
    run_recipe("05c_mera_submission.py", config, f"eval.mera_dir={tmp_path / 'mera'}", "eval.mera_max_items=2")
    (archive,) = (tmp_path / "runs" / "tiny" / "mera").glob("submission_step_*.zip")
    expected = {f"{MERA_TASKS[c].name}.json": [{key: row["meta"][key] for key in MERA_TASKS[c].meta_keys}
                                               for row in task_rows] for c, task_rows in rows.items()}
    assert validate_submission(archive, expected) == {name: 2 for name in expected}
    summary = json.loads(archive.with_suffix(".json").read_text(encoding="utf-8"))
    assert summary["fewshot"] == "leaderboard" and not summary["skipped"] and "seed 1234" in summary["settings"]
    assert summary["tasks"]["SimpleAr"]["fewshot"] == 2 and summary["tasks"]["MultiQ"]["fewshot"] == 0
    assert summary["tasks"]["RCB"]["examples_from"].endswith("rcb.train.jsonl")
    assert summary["tasks"]["ruHumanEval"]["temperature"] == 0.6 and summary["tasks"]["ruHumanEval"]["samples"] == 10
    with zipfile.ZipFile(archive) as z:
        ethics = json.loads(z.read("ruEthics.json"))["data"]["test"]
        code = json.loads(z.read("ruCodeEval.json"))["data"]["test"]
    assert all(len(set(row["outputs"].values())) == 1 for row in ethics)  # one answer, five criteria
    assert all(len(row["outputs"]) == 10 and all(len(sample) == 2 for sample in row["outputs"]) for row in code)
    samples = json.loads((archive.parent / archive.name.replace("submission", "code_samples")
                          .replace(".zip", ".json")).read_text(encoding="utf-8"))
    assert [len(item["samples"]) for item in samples["ruHumanEval"]] == [10, 10]


def test_recipe_05c_leaves_out_a_few_shot_task_without_its_examples(tmp_path: Path) -> None:
    """At the leaderboard's setting a task needs the split its examples come from: without it the task is skipped
    with the reason (never predicted zero-shot in its place); at eval.mera_fewshot=zero it is predicted."""
    import numpy as np

    from eval.harness import PairEncoder
    from eval.mera import Predictors, build_submission

    folder = tmp_path / "mera"
    folder.mkdir()
    (folder / "rcb.jsonl").write_text(json.dumps({"instruction": "{premise} {hypothesis}", "inputs": {
        "premise": "a", "hypothesis": "b"}, "meta": {"id": 0}}) + "\n", encoding="utf-8")
    predictors = Predictors(lambda tokens: np.zeros((*np.shape(tokens), 64), dtype=np.float32),
                            PairEncoder(lambda text: [ord(c) % 60 + 4 for c in text], 3),
                            lambda prompts, n, stop: [""] * len(prompts), batch_size=4, max_len=64)
    files, skipped, _, _ = build_submission(["rcb"], str(folder), predictors)
    assert not files and skipped["RCB"] == f"no rcb.train.jsonl or rcb.train.json in eval.mera_dir ({folder})"
    files, skipped, summary, _ = build_submission(["rcb"], str(folder), predictors, mode="zero")
    assert files["RCB.json"]["data"]["test"] == [{"outputs": "1", "meta": {"id": 0}}]
    assert summary["RCB"]["fewshot"] == 0 and not skipped


def stub_predictors(calls: list[str] | None = None, completions: list[str] | None = None) -> Any:
    """A model that learned nothing (every choice ties: the first wins; empty generations), or one whose code
    samples are ``completions``; ``calls`` records each scoring call."""
    import numpy as np

    from eval.harness import PairEncoder
    from eval.mera import Predictors

    def logits(tokens: Any) -> Any:
        if calls is not None:
            calls.append("logits")
        return np.zeros((*np.shape(tokens), 64), dtype=np.float32)

    def sample(prompts: list[str], n: int, stop: Any, temperature: float, top_k: int, seed: int) -> list[str]:
        assert (temperature, top_k, len(prompts)) == (0.6, 50, 10)
        return list(completions or [""] * len(prompts))

    return Predictors(logits, PairEncoder(lambda text: [ord(c) % 60 + 4 for c in text], 3),
                      lambda prompts, n, stop: [""] * len(prompts), batch_size=4, max_len=64, sample=sample,
                      run_tests=run_tests_in_sandbox)


def test_a_broken_record_of_a_later_task_stops_the_run_before_any_prediction(tmp_path: Path) -> None:
    from eval.mera import build_submission

    folder = tmp_path / "mera"
    folder.mkdir()
    (folder / "ruethics.jsonl").write_text(json.dumps({"instruction": "{text}", "inputs": {"text": "т"},
                                                       "meta": {"id": 0}}) + "\n", encoding="utf-8")
    (folder / "rutie.jsonl").write_text(json.dumps({"instruction": "{question}", "inputs": {"question": "в"},
                                                    "meta": {"dialog_id": 0, "question_id": 0}}) + "\n",
                                        encoding="utf-8")
    calls: list[str] = []
    with pytest.raises(DataError, match=r"rutie.jsonl: row 1: ruTiE's 'instruction' must hold '\{context\}' once"):
        build_submission(["ruethics", "rutie"], str(folder), stub_predictors(calls))
    assert calls == []  # ruEthics, read first, was not predicted either


def test_code_samples_are_cut_at_meras_stop_strings_unwrapped_and_run(tmp_path: Path) -> None:
    """ruhumaneval.yaml's until cuts each sample ("\\ndef" ends the function), a sample wrapped in ```python ...```
    is unwrapped (ruhumaneval/utils.py preprocess_generation), and each is appended to the item's function and run
    on its tests: the archive holds 10 samples' results per item, the samples themselves go beside it."""
    from eval.mera import build_submission

    folder = tmp_path / "mera"
    folder.mkdir()
    (folder / "ruhumaneval.jsonl").write_text(json.dumps({
        "instruction": "Допишите функцию.\n{function}", "inputs": {"function": "def add(a, b):\n",
                                                                 "tests": "[{'a': 1, 'b': 2}, {'a': 5, 'b': 0}]"},
        "outputs": ["3", "5"], "meta": {"id": 7, "entry_point": "add", "canonical_solution": ""}}) + "\n",
        encoding="utf-8")
    completions = (["    return a + b\ndef other():\n    return 0"] * 8 + ["```python    return a - b\n```"]
                   + ["    return a +"])
    files, skipped, summary, samples = build_submission(["ruhumaneval"], str(folder),
                                                        stub_predictors(completions=completions))
    (row,) = files["ruHumanEval.json"]["data"]["test"]
    assert row["meta"] == {"id": 7} and row["outputs"] == [["3", "5"]] * 8 + [["-1", "5"], [None, None]]
    assert samples["ruHumanEval"][0]["samples"][0] == "    return a + b"
    assert summary["ruHumanEval"]["until"] == ["\nclass", "\ndef", "\n#", "\nif", "\nprint"] and not skipped


def test_a_record_meras_templates_cannot_fill_is_one_line() -> None:
    use = MERA_TASKS["use"]
    meta = {"id": 1, "id_task": "1", "variant": 1}
    with pytest.raises(DataError, match=r"^use.jsonl: row 3: MERA's template for the item cannot be filled \(USE's "
                                        r"field 'meta.type' is 'odd', not one of text, "):
        build_mera_item(use, Record("use.jsonl", 3, {"instruction": "{task}", "inputs": {"task": "x", "text": "y"},
                                                     "meta": dict(meta, type="odd")}), [], 1)
    with pytest.raises(DataError, match=r"^use.jsonl: row 4: MERA's template for the item names 'text', which the "
                                        r"record's 'inputs' do not have$"):
        build_mera_item(use, Record("use.jsonl", 4, {"instruction": "{task}", "inputs": {"task": "x"},
                                                     "meta": dict(meta, type="text")}), [], 1)
    shot = Record("rcb.train.jsonl", 2, {"instruction": "{premise}", "inputs": {"premise": "п", "hypothesis": "г"},
                                         "meta": {"id": 5}})
    with pytest.raises(DataError, match=r"^rcb.train.jsonl: row 2: a solved example needs field 'outputs'"):
        build_mera_item(MERA_TASKS["rcb"], Record("rcb.jsonl", 1, dict(shot.fields, meta={"id": 0})), [shot], 1)


def test_a_code_item_without_its_tests_stops_the_run_before_any_prediction(tmp_path: Path) -> None:
    from eval.mera import build_submission

    folder = tmp_path / "mera"
    folder.mkdir()
    (folder / "ruethics.jsonl").write_text(json.dumps({"instruction": "{text}", "inputs": {"text": "т"},
                                                       "meta": {"id": 0}}) + "\n", encoding="utf-8")
    (folder / "rucodeeval.jsonl").write_text(json.dumps({"instruction": "{function}", "inputs": {
        "function": "def f(x):\n", "tests": "[{'x': 1}"}, "meta": {"id": 0, "entry_point": "f"}}) + "\n",
        encoding="utf-8")
    calls: list[str] = []
    with pytest.raises(DataError, match=r"rucodeeval.jsonl: row 1: a code item needs 'inputs.function', "
                                        r"'inputs.tests' \(a list of keyword arguments\) and 'meta.entry_point'"):
        build_submission(["ruethics", "rucodeeval"], str(folder), stub_predictors(calls))
    assert calls == []
