"""What recipe 05 and the trainer's eval say in the log: one line per sample (its line breaks escaped), and each
task's verdict the one the report gives (after the random-init model has joined the baselines)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from tests.fixture_run import PRETRAINED_TRAIN, fixture_config, pretrained_copy

pytestmark = pytest.mark.integration  # every test runs a recipe or reads a trained run

TASK_LINE = re.compile(r"eval: (\S+): (\S+) [\d.]+ \[[\d.]+, [\d.]+\] \(strongest baseline (\S+) ([\d.]+): "
                       r"(above|below|not distinguishable);")


def test_samples_are_one_log_line_each(fixture_pretrained: Path, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    from eval.run import sample_completions
    from experiment.config import load_config
    from experiment.runfolder import RunFolder
    from trainer.trained_model import load_trained_model

    pretrained_copy(fixture_pretrained, tmp_path)
    prompts = ["Первая строка\nвторая строка", "Стихи:\r\nМороз и солнце"]
    config = fixture_config(tmp_path, train=PRETRAINED_TRAIN, eval={"sample_prompts": prompts,
                                                                    "sample_max_new_tokens": 8})
    cfg = load_config(config, [])
    run_folder = RunFolder.for_config(cfg)
    model, step, _ = load_trained_model(run_folder)
    with caplog.at_level(logging.INFO, logger="eval"):
        records = sample_completions(model, cfg, run_folder, int(step))
    (message,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("samples at step")]
    assert "\n" not in message and "\r" not in message
    assert "Первая строка\\nвторая строка" in message and "Стихи:\\r\\nМороз и солнце" in message
    assert [r["prompt"] for r in records] == prompts  # the records keep the text as it is


def test_the_logged_verdicts_are_the_reports(fixture_pretrained: Path, tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Recipe 05's order: the tasks scored (eval.run.score_tasks, the trained checkpoint), the random-init model's
    scores joined as a baseline (here a step-0 model that answered every item right: it is the strongest baseline
    and the verdict against it differs from the one against the no-model rules), then the task lines logged from
    those results: each line names the baseline and verdict that the JSON results and the Markdown report give."""
    import copy

    from eval.harness import headline_metric
    from eval.report import render_markdown
    from eval.run import add_random_init, log_task_results, score_tasks
    from experiment.config import load_config
    from experiment.runfolder import RunFolder
    from tokenizer.loaded import load_run_tokenizer
    from trainer.trained_model import load_trained_model

    config = pretrained_copy(fixture_pretrained, tmp_path)
    cfg = load_config(config, ["eval.tasks=[parus,terra]", "eval.max_items_per_task=8"])
    run_folder = RunFolder.for_config(cfg)
    from eval.scoring import model_logits_fn

    model, _, _ = load_trained_model(run_folder)
    tasks, _ = score_tasks(model_logits_fn(model), load_run_tokenizer(run_folder.tokenizer), cfg.eval,
                           tasks=cfg.eval.tasks, max_items=8, max_len=64)
    perfect = copy.deepcopy(tasks)
    for result in perfect.values():
        result["metrics"][headline_metric(result)].update(value=1.0, ci95=[0.68, 1.0])
    results = {"step": 6, "tasks": tasks}
    before = {task: r["vs_strongest_baseline"]["verdict"] for task, r in tasks.items()}
    add_random_init(results, perfect, {"seed": 0, "seed_from": "experiment.seed"})
    with caplog.at_level(logging.INFO, logger="eval"):
        log_task_results(results["tasks"])
    logged = {m.group(1): (m.group(2), m.group(3), float(m.group(4)), m.group(5))
              for m in TASK_LINE.finditer("\n".join(f"eval: {r.getMessage()}" for r in caplog.records))}
    reported = {task: (headline_metric(r), r["vs_strongest_baseline"]["baseline"],
                       round(r["vs_strongest_baseline"]["baseline_value"], 3), r["vs_strongest_baseline"]["verdict"])
                for task, r in results["tasks"].items()}
    assert all(baseline == "random_init" and verdict == "below" for _, baseline, _, verdict in reported.values())
    assert before != {task: verdict for task, (*_, verdict) in reported.items()}  # the case at issue
    assert logged == reported
    report = render_markdown(results)
    for task, (_, _, _, verdict) in reported.items():
        row = rf"^\| {task} \|.*\| random init \| 1\.000 .*\| {verdict}( \(one answer throughout\))? \|"
        assert re.search(row, report, re.M), report
