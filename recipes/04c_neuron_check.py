"""Recipe 04c: trace the train step as jax-neuronx (AWS Trainium) would run it, on this CPU, and list what AWS
documents as unsupported there (no Neuron packages needed)."""

from experiment.stages import NEURON_CHECK
from tracking.harness import recipe_main
from trainer.neuron_check import neuron_check


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    recipe_main(NEURON_CHECK, "Check the train step for constructs jax-neuronx (AWS Trainium) documents as unsupported",
                neuron_check, argv=argv)


if __name__ == "__main__":
    main()
