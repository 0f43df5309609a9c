"""Recipe 01: build a clean, deduplicated Russian corpus (docs-NNNNN.jsonl + manifest.json in corpus/)."""

from data_prep.corpus.build import build_corpus
from experiment.stages import CORPUS
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(CORPUS, "Build the cleaned Russian corpus from the configured sources.", build_corpus, argv=argv)


if __name__ == "__main__":
    main()
