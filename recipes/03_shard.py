"""Recipe 03: tokenize the cleaned corpus into TFRecord shards with index sidecars and a manifest."""

from data_prep.sharding import shard_corpus
from experiment.cli import recipe_main
from experiment.stages import SHARDS

if __name__ == "__main__":
    recipe_main(SHARDS, "Tokenize the corpus and write train/validation TFRecord shards", shard_corpus)
