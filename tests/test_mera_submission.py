"""A MERA submission (recipe 05c, eval/mera.py): a checkpoint's predictions for MERA's test inputs, packed as the
archive the MERA site takes, read back against that schema; broken inputs and archives are one line each."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from eval.loaders import Record
from eval.mera import MERA_TASKS, build_mera_item, validate_submission, write_submission
from experiment.errors import DataError
from experiment.sections.eval import MERA_CONFIGS

RCB_INSTRUCTION = "Ситуация: {premise}\nГипотеза: {hypothesis}\nОтвет (1 — следует, 2 — противоречит, 3 — нейтрально):"


def test_the_config_knows_every_task_the_table_predicts() -> None:
    assert tuple(MERA_TASKS) == MERA_CONFIGS  # experiment/ cannot import eval/: the two lists are kept equal


def test_a_record_becomes_its_prompt_and_meta_and_a_broken_one_is_one_line() -> None:
    rcb, use = MERA_TASKS["rcb"], MERA_TASKS["use"]
    item = build_mera_item(rcb, Record("rcb.jsonl", 1, {"instruction": RCB_INSTRUCTION, "meta": {"id": 7},
                                                       "inputs": {"premise": "Идёт дождь.", "hypothesis": "Сухо."}}))
    assert item.meta == {"id": 7} and item.prompt.startswith("Ситуация: Идёт дождь.\nГипотеза: Сухо.")
    plain = build_mera_item(MERA_TASKS["simplear"], Record("s.jsonl", 1, {"inputs": "1 + 2", "meta": {"id": 0}}))
    assert plain.prompt == "1 + 2"  # no instruction: the inputs alone
    with pytest.raises(DataError, match=r"use.jsonl: row 4: missing field 'meta.id_task'"):
        build_mera_item(use, Record("use.jsonl", 4, {"inputs": "x", "meta": {"id": 1, "variant": 2}}))
    with pytest.raises(DataError, match=r"rcb.jsonl: row 2: field 'instruction' names 'premise'"):
        build_mera_item(rcb, Record("rcb.jsonl", 2, {"instruction": RCB_INSTRUCTION, "meta": {"id": 1},
                                                    "inputs": {"hypothesis": "Сухо."}}))


def test_the_validator_refuses_what_the_site_would(tmp_path: Path) -> None:
    good = {"RCB.json": {"data": {"test": [{"outputs": "1", "meta": {"id": 0}}, {"outputs": "3", "meta": {"id": 1}}]}},
            "SimpleAr.json": {"data": {"test": [{"outputs": "12", "meta": {"id": 5}}]}}}
    path = write_submission(tmp_path / "ok.zip", good)
    assert validate_submission(path, {"RCB.json": [{"id": 0}, {"id": 1}], "SimpleAr.json": [{"id": 5}]}) == \
        {"RCB.json": 2, "SimpleAr.json": 1}

    def broken(files: dict, match: str, expected: dict | None = None) -> None:
        with pytest.raises(DataError, match=match):
            validate_submission(write_submission(tmp_path / "bad.zip", files), expected)

    broken({"Rcb.json": good["RCB.json"]}, "member 'Rcb.json' is not a MERA task")
    broken({"RCB.json": {"data": {"test": [{"outputs": "4", "meta": {"id": 0}}]}}}, r"outputs '4' is not one of")
    broken({"RCB.json": {"data": {"test": [{"outputs": "1", "meta": {"id": 0}}] * 2}}}, "appears twice")
    broken({"RCB.json": {"data": [{"outputs": "1", "meta": {"id": 0}}]}}, r"is not \{'data': \{'test'")
    broken({"RCB.json": good["RCB.json"]}, "predicts 2 items, its inputs have 3",
           {"RCB.json": [{"id": i} for i in range(3)]})
    (tmp_path / "torn.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(DataError, match="not a readable ZIP"):
        validate_submission(tmp_path / "torn.zip")


def mera_inputs(folder: Path, shared: Path) -> dict[str, int]:
    """MERA-schema test files made from the shared MERA human-benchmark items (their ids: the row numbers)."""
    folder.mkdir()
    bench = shared / "bench" / "mera_humanbench"
    rcb = [json.loads(line) for line in (bench / "rcb_items_human_mv.jsonl").read_text(encoding="utf-8").splitlines()]
    simplear = [json.loads(line) for line in
                (bench / "simplear_items_human_mv.jsonl").read_text(encoding="utf-8").splitlines()]
    files = {
        "rcb": [{"instruction": RCB_INSTRUCTION, "inputs": {"premise": r["premise"], "hypothesis": r["hypothesis"]},
                 "outputs": "", "meta": {"id": i}} for i, r in enumerate(rcb[:9])],
        "simplear": [{"instruction": "Вычислите.\n{inputs} =", "inputs": r["formula"], "outputs": "",
                      "meta": {"id": i}} for i, r in enumerate(simplear[:7])],
        "use": [{"instruction": "Задание {inputs}", "inputs": f"{i}: найдите ошибку.", "outputs": "",
                 "meta": {"id": i, "id_task": str(i % 3), "variant": 1}} for i in range(4)],
    }
    for name, rows in files.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                              encoding="utf-8")
    return {name: len(rows) for name, rows in files.items()}


def test_recipe_05c_writes_a_submission_the_validator_reads_back(fixture_pretrained: Path, shared_data: Path,
                                                                 tmp_path: Path) -> None:
    from tests.fixture_run import pretrained_copy
    from tests.recipe_runner import run_recipe

    sizes = mera_inputs(tmp_path / "mera", shared_data)
    config = pretrained_copy(fixture_pretrained, tmp_path)
    run_recipe("05c_mera_submission.py", config, f"eval.mera_dir={tmp_path / 'mera'}",
               "eval.mera_tasks=[parus,rcb,simplear,use]", "eval.mera_fewshot=zero")
    folder = tmp_path / "runs" / "tiny" / "mera"
    (archive,) = folder.glob("submission_step_*.zip")
    metas = {f"{MERA_TASKS[name].name}.json": [{"id": i} if name != "use" else
                                               {"id": i, "id_task": str(i % 3), "variant": 1} for i in range(n)]
             for name, n in sizes.items()}
    assert validate_submission(archive, metas) == {"RCB.json": 9, "SimpleAr.json": 7, "USE.json": 4}
    with zipfile.ZipFile(archive) as z:
        rcb = json.loads(z.read("RCB.json"))["data"]["test"]
    assert all(row["outputs"] in ("1", "2", "3") for row in rcb)
    summary = json.loads(archive.with_suffix(".json").read_text(encoding="utf-8"))
    assert summary["skipped"]["PARus"] == f"no parus.jsonl or parus.json in eval.mera_dir ({tmp_path / 'mera'})"
    assert summary["tasks"]["RCB"]["items"] == 9 and summary["tasks"]["SimpleAr"]["kind"] == "text"
    assert (not (tmp_path / "runs" / "tiny" / "eval").exists()
            or not list((tmp_path / "runs" / "tiny" / "eval").glob("*")))


def test_an_archive_of_one_answer_throughout_is_flagged_per_task(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A model whose logits are the same for every token (every choice ties: the first wins) and whose generations
    are empty fills a valid archive with one answer per task; recipe 05's check (eval.harness.one_answer) flags each
    task in the log and in the summary, as recipe 05 does; a task whose answers vary is not flagged."""
    import logging

    import numpy as np

    from eval.harness import PairEncoder
    from eval.mera import Predictors, build_submission

    folder = tmp_path / "mera"
    folder.mkdir()
    rows = {"rcb": [{"instruction": RCB_INSTRUCTION, "inputs": {"premise": f"Посылка {i}.", "hypothesis": "Вывод."},
                     "meta": {"id": i}} for i in range(20)],
            "simplear": [{"instruction": "{inputs} =", "inputs": f"{i} + {i}", "meta": {"id": i}} for i in range(20)],
            "multiq": [{"instruction": "{inputs}", "inputs": f"Вопрос {i}?", "meta": {"id": i}} for i in range(20)]}
    for name, records in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                              encoding="utf-8")

    def flat_logits(tokens):  # the same logits everywhere: a model that learned nothing
        return np.zeros((*np.shape(tokens), 64), dtype=np.float32)

    def generate(prompts, max_new_tokens, stop):  # empty for the arithmetic, the question's number for MultiQ
        return ["" if "=" in p else p.split()[-1] for p in prompts]

    with caplog.at_level(logging.WARNING, logger="eval.mera"):
        files, _, summary, _ = build_submission(
            ["rcb", "simplear", "multiq"], str(folder), Predictors(
                flat_logits, PairEncoder(lambda text: [ord(c) % 60 + 4 for c in text], 3), generate, batch_size=8,
                max_len=64), mode="zero")
    write_submission(tmp_path / "submission.zip", files)
    assert validate_submission(tmp_path / "submission.zip")  # the site would take it
    assert summary["RCB"]["one_answer"] and summary["RCB"]["top_answer"] == "1" and summary["RCB"]["top_share"] == 1
    assert summary["SimpleAr"]["one_answer"] and summary["SimpleAr"]["top_answer"] == ""
    assert not summary["MultiQ"]["one_answer"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["MERA RCB: one answer ('1') takes 100% of the predictions: the site will score that, not the "
                        "model", "MERA SimpleAr: an empty answer takes 100% of the predictions: the site will score "
                        "that, not the model"]
