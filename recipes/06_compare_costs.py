"""Recipe 06: the experiments' costs in rubles against what they bought (loss, eval), from W&B (see cost/)."""

from cost.compare import compare_costs
from experiment.stages import COMPARE
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main(COMPARE, "Compare experiments' ruble costs, losses and eval scores; write reports/costs.*",
                compare_costs)
