"""Recipe 03: tokenize the cleaned corpus into TFRecord shards with index sidecars and a manifest."""

from data_prep.shards.build import shard_corpus
from experiment.stages import SHARDS
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(SHARDS, "Tokenize the corpus and write train/validation TFRecord shards", shard_corpus, argv=argv)


if __name__ == "__main__":
    main()
