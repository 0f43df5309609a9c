"""Recipe 07: estimate hours and rubles of a pretraining run on several accelerators (see cost/planner.py)."""

from cost.planner import plan_costs
from experiment.stages import PLAN
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(PLAN, "Plan a run's time and ruble cost per accelerator / slice / pricing option",
                plan_costs, argv=argv)


if __name__ == "__main__":
    main()
