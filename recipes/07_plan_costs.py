"""Recipe 07: estimate hours and rubles of a pretraining run on several accelerators (see cost/planner.py)."""

from cost.planner import plan_costs
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main("plan", "Plan a run's time and ruble cost per accelerator / slice / pricing option", plan_costs)
