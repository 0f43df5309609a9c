"""Recipe 04b: compile the train step for TPU slices on this CPU and report HBM per device (needs libtpu)."""

from tracking.harness import recipe_main
from trainer.fit_check import fit_check

if __name__ == "__main__":
    recipe_main("fit_check", "Check that the train step fits in the HBM of the TPU slices in train.fit_topologies",
                fit_check)
