"""Recipe 05: bits per byte, perplexity and Russian benchmarks for a checkpoint (see eval/)."""

from eval.run import evaluate
from experiment.stages import EVAL
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(EVAL, "Evaluate a checkpoint: bits per byte, perplexity, RuBLiMP and other Russian tasks",
                evaluate, argv=argv)


if __name__ == "__main__":
    main()
