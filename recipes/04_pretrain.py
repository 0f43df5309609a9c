"""Recipe 04: pretrain the decoder on the shards (resumes from the latest checkpoint)."""

from tracking.harness import recipe_main
from trainer.cpu_host import prepare_cpu_host
from trainer.train import pretrain, resume_wandb_run_id

if __name__ == "__main__":
    recipe_main("pretrain", "Pretrain the Flax decoder; rerun the same command to resume", pretrain,
                wandb_run_id=resume_wandb_run_id, prepare=lambda cfg: prepare_cpu_host(cfg.train))
