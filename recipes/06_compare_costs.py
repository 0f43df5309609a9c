"""Recipe 06: the experiments' costs in rubles against what they bought (loss, eval), from W&B (see cost/)."""

from cost.compare import compare_costs
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main("compare", "Compare experiments' ruble costs, losses and eval scores; write reports/costs.*",
                compare_costs)
