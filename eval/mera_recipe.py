"""Recipe 05c's entry: one checkpoint's predictions for MERA's closed test splits, packed and checked as the archive
the MERA site takes (the settings, prompts and schema: eval/mera.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from eval.harness import PairEncoder
from eval.mera import (
    MERA_COMMIT,
    Predictors,
    build_submission,
    run_tests_in_sandbox,
    validate_submission,
    write_submission,
)
from eval.run import max_len_of, step_name, text_generator, text_sampler
from eval.scoring import model_logits_fn
from experiment.errors import DataError
from experiment.files import atomic_write_json
from experiment.schema import ExperimentConfig
from experiment.stages import MERA
from tokenizer.loaded import load_run_tokenizer

log = logging.getLogger("eval.mera")


def mera_submission(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any) -> Path:
    """Recipe 05c: the predictions of one checkpoint (``eval.checkpoint_step``, else the latest) for the MERA tasks
    ``eval.mera_tasks`` at MERA's settings (``eval.mera_fewshot``), as ``mera/submission_step_NNNNNNN.zip``
    (validated by reading it back) beside a ``.json`` saying the setting, what each task's inputs were and which
    tasks were skipped, and why, and the code tasks' samples as ``code_samples_step_NNNNNNN.json``."""
    from trainer.trained_model import load_trained_model

    eval_cfg = cfg.eval  # its mera_tasks were checked against experiment.sections.eval.MERA_CONFIGS at load
    tok = load_run_tokenizer(run_folder.tokenizer)
    model, step, meta = load_trained_model(run_folder, step=eval_cfg.checkpoint_step)
    max_len = max_len_of(cfg, meta)
    predictors = Predictors(model_logits_fn(model), PairEncoder(tok.encode, tok.eos_id, tok.normalize),
                            text_generator(model, tok, max_len), eval_cfg.batch_size, max_len, tok.pad_id,
                            sample=text_sampler(model, tok, max_len), run_tests=run_tests_in_sandbox)
    files, skipped, summary, code_samples = build_submission(
        eval_cfg.mera_tasks, eval_cfg.mera_dir, predictors, mode=eval_cfg.mera_fewshot,
        max_items=eval_cfg.mera_max_items)
    if not files:
        raise DataError(f"no MERA task's test inputs could be read ({'; '.join(skipped.values())}): set "
                        "eval.mera_dir to a folder of <task>.jsonl files in MERA's schema")
    out = MERA.dir(run_folder) / f"submission_{step_name(int(step))}.zip"
    write_submission(out, files)
    counts = validate_submission(out, {name: [row["meta"] for row in body["data"]["test"]]
                                       for name, body in files.items()})
    if code_samples:
        atomic_write_json(out.parent / f"code_samples_{step_name(int(step))}.json", code_samples)
    atomic_write_json(out.with_suffix(".json"), {
        "step": int(step), "archive": out.name, "fewshot": eval_cfg.mera_fewshot,
        "settings": f"MERA v1.2.0 (MERA-Evaluation/MERA {MERA_COMMIT[:7]}): "
                    + ("each task's number of solved examples (scripts/run_benchmark.sh), drawn with seed 1234"
                       if eval_cfg.mera_fewshot == "leaderboard" else
                       "zero-shot (no solved examples; not the leaderboard's setting)"),
        "tasks": summary, "predictions": counts, "skipped": skipped})
    flagged = [name for name, task in summary.items() if task.get("one_answer")]
    log.info("MERA submission of step %d (%s): %s (%d tasks, %d predictions; skipped: %s; one answer throughout: "
             "%s)", step, eval_cfg.mera_fewshot, out, len(counts), sum(counts.values()), ", ".join(skipped) or "none",
             ", ".join(flagged) or "none")
    print(out)
    if wandb_run is not None:
        wandb_run.summary.update({"mera/archive": str(out), "mera/tasks": len(counts), "mera/step": int(step),
                                  "mera/one_answer_tasks": len(flagged), "mera/fewshot": eval_cfg.mera_fewshot})
    return out
