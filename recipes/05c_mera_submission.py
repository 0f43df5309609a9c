"""Recipe 05c: a checkpoint's predictions for MERA's closed test splits, as the archive the MERA site takes
(see eval/mera.py)."""

from eval.mera_recipe import mera_submission
from experiment.stages import MERA
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(MERA, "Predict MERA's test splits (eval.mera_tasks; inputs from eval.mera_dir, else the hub) with a "
                "checkpoint (eval.checkpoint_step, else the latest) and write mera/submission_step_NNNNNNN.zip",
                mera_submission, argv=argv)


if __name__ == "__main__":
    main()
