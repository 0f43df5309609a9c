"""Recipe 01: build a clean, deduplicated Russian corpus (docs-NNNNN.jsonl + manifest.json in corpus/),
decontaminated against the benchmarks recipes 05 and 05c read (corpus.decontamination, docs/corpus.md)."""

from typing import Any

from data_prep.corpus.build import build_corpus
from data_prep.corpus.decontam import BenchmarkIndex
from eval.decontam import benchmark_index
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import CORPUS
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    index: dict[str, BenchmarkIndex | None] = {}

    def read_benchmarks(cfg: ExperimentConfig, run_folder: RunFolder) -> None:
        # before anything is written: a benchmark that cannot be read (corpus.decontamination.missing=error) stops
        # the recipe with nothing of this run touched
        index["benchmarks"] = benchmark_index(cfg)

    def build(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any) -> dict[str, Any]:
        return build_corpus(cfg, run_folder, wandb_run, benchmarks=index["benchmarks"])

    recipe_main(CORPUS, "Build the cleaned Russian corpus from the configured sources.", build, argv=argv,
                check=read_benchmarks)


if __name__ == "__main__":
    main()
