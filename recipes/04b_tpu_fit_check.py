"""Recipe 04b: compile the train step for TPU slices on this CPU and report HBM per device (needs libtpu)."""

from experiment.stages import FIT_CHECK
from tracking.harness import recipe_main
from trainer.fit_check import fit_check


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(FIT_CHECK, "Check that the train step fits in the HBM of the TPU slices in train.fit_topologies",
                fit_check, argv=argv)


if __name__ == "__main__":
    main()
