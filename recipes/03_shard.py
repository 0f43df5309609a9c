"""Recipe 03: tokenize the cleaned corpus into TFRecord shards with index sidecars and a manifest."""

from data_prep.shards.build import shard_corpus
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main("shards", "Tokenize the corpus and write train/validation TFRecord shards", shard_corpus)
