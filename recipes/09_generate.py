"""Recipe 09: continue prompts with a trained checkpoint (or generate.hf_model) and print them
(see eval/completions.py)."""

from eval.completions import generate_stage
from experiment.stages import GENERATE
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(GENERATE, "Continue the generate.prompts (and generate.prompt_file's lines) with a checkpoint "
                "(generate.checkpoint_step, else the latest) or a Hugging Face folder (generate.hf_model); print "
                "them and write generate/<UTC time>.jsonl", generate_stage, argv=argv)


if __name__ == "__main__":
    main()
