"""Recipe 05b: a checkpoint as a Hugging Face Transformers folder, without evaluating it (see eval/hf_export.py)."""

from eval.hf_export import export_only
from experiment.stages import EXPORT
from tracking.harness import recipe_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(EXPORT, "Export a checkpoint (eval.checkpoint_step, else the latest) as a Hugging Face folder in "
                "export/hf/step_NNNNNNN; eval/ is left as it is", export_only, argv=argv)


if __name__ == "__main__":
    main()
