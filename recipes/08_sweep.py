"""Recipe 08: run every variant of an experiment (recipes 04-05 each, one W&B group), then compare them
(recipe 06); rerun the same command to resume (see tracking/sweep.py)."""

from tracking.sweep import sweep_main


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    sweep_main(argv)


if __name__ == "__main__":
    main()
