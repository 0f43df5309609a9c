"""Recipe 04: pretrain the decoder on the shards (resumes from the latest checkpoint)."""

import functools

from eval.run import evaluate_model
from tracking.harness import recipe_main
from trainer.distributed import prepare_processes, reports
from trainer.hooks import EvalHook
from trainer.resume import resume_wandb_run_id
from trainer.train import pretrain

if __name__ == "__main__":
    recipe_main("pretrain", "Pretrain the Flax decoder; rerun the same command to resume",
                functools.partial(pretrain, hooks=[EvalHook(evaluate_model)]),
                wandb_run_id=resume_wandb_run_id, prepare=prepare_processes, reports=reports)
