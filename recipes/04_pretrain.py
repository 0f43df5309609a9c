"""Recipe 04: pretrain the decoder on the shards (resumes from the latest checkpoint)."""

from experiment.cli import recipe_main
from experiment.stages import PRETRAIN
from trainer.cpu_host import prepare_cpu_host
from trainer.train import pretrain, resume_wandb_run_id

if __name__ == "__main__":
    recipe_main(PRETRAIN, "Pretrain the Flax decoder; rerun the same command to resume", pretrain,
                wandb_run_id=resume_wandb_run_id, prepare=lambda cfg: prepare_cpu_host(cfg.train))
