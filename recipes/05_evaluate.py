"""Recipe 05: bits per byte, perplexity and Russian benchmarks for a checkpoint (see eval/)."""

from eval.run import evaluate
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main("eval", "Evaluate a checkpoint: bits per byte, perplexity, RuBLiMP and other Russian tasks", evaluate)
