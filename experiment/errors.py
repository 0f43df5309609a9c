"""Errors that end a recipe with one plain line and a non-zero exit code."""


class RecipeError(Exception):
    """A problem the user can fix: bad input, a missing stage, a wrong config value."""


class ConfigError(RecipeError):
    """The experiment config or an override is wrong (names the key)."""


class MissingStageError(RecipeError):
    """An earlier stage's output is missing or stale (names the recipe to run first)."""


class DataError(RecipeError):
    """An input file or record is unreadable or malformed (names the file and record)."""


class WriteError(RecipeError):
    """A file could not be written: disk full, quota, read-only or failing disk (names the path and
    the free space); nothing half-written is trusted, so the same command can simply be rerun."""
