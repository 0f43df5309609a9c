"""Recipe 01: build a clean, deduplicated Russian corpus (docs-NNNNN.jsonl + manifest.json in corpus/)."""

from data_prep.corpus.build import build_corpus
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main("corpus", "Build the cleaned Russian corpus from the configured sources.", build_corpus)
