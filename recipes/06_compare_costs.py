"""Recipe 06: the experiments' costs in rubles against what they bought (loss, eval), from W&B (see cost/)."""

from cost.compare import compare_costs
from experiment.stages import COMPARE
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(COMPARE, "Compare experiments' ruble costs, losses and eval scores; write reports/costs.*",
                compare_costs, argv=argv)


if __name__ == "__main__":
    main()
