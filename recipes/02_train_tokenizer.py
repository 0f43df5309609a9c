"""Recipe 02: train the Russian SentencePiece tokenizer on the cleaned corpus (or, with tokenizer.adopt_from,
adopt a base model's tokenizer) and report on it."""

from typing import Any

from experiment.schema import ExperimentConfig
from experiment.stages import TOKENIZER
from tokenizer.train import train_tokenizer
from tracking.harness import recipe_main


def train(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any) -> dict[str, Any]:
    """The stage, with tokenizer.extra_train_sources read here (their readers are recipe 01's)."""
    sources = cfg.tokenizer.extra_train_sources
    if not sources or cfg.tokenizer.adopt_from:
        return train_tokenizer(cfg, run_folder, wandb_run)
    from data_prep.corpus.build import cache_root_for  # only then: the corpus readers take a second to import
    from data_prep.corpus.sources import normalized_texts

    extra = normalized_texts(sources, cache_root_for(run_folder), "tokenizer.extra_train_sources")
    return train_tokenizer(cfg, run_folder, wandb_run, extra)


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(TOKENIZER,
                "Train the SentencePiece tokenizer (or adopt a base model's), its report and Hugging Face export",
                train, argv=argv)


if __name__ == "__main__":
    main()
