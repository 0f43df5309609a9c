"""Recipe 04: pretrain the decoder on the shards (resumes from the latest checkpoint)."""

import functools

from eval.run import evaluate_model, sample_completions
from experiment.stages import PRETRAIN
from tracking.harness import recipe_main
from trainer.distributed import prepare_processes, reports
from trainer.hooks import EvalHook
from trainer.resume import resume_wandb_run_id
from trainer.train import check, pretrain


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(PRETRAIN, "Pretrain the Flax decoder; rerun the same command to resume",
                functools.partial(pretrain, hooks=[EvalHook(evaluate_model, sample_completions)]),
                wandb_run_id=resume_wandb_run_id, prepare=prepare_processes, reports=reports, check=check, argv=argv)


if __name__ == "__main__":
    main()
