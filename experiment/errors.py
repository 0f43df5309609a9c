"""Errors that end a recipe with one plain line and a non-zero exit code."""

import reprlib


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


# How much of a value an error message echoes: a config value can be a megabyte string, or a list that YAML
# aliases multiply, and one error line must stay one line a terminal and a log can hold.
ECHO_LIMIT = 80
_ECHO = reprlib.Repr()
_ECHO.maxlevel, _ECHO.maxlist, _ECHO.maxtuple, _ECHO.maxdict, _ECHO.maxset = 3, 6, 6, 6, 6
_ECHO.maxstring = _ECHO.maxother = _ECHO.maxlong = ECHO_LIMIT


def echo(value: object) -> str:
    """``repr(value)`` as an error message quotes it: at most ``ECHO_LIMIT`` characters, a longer one cut with
    "..." (reprlib: the repr of a large value is never built whole)."""
    text = _ECHO.repr(value)
    return text if len(text) <= ECHO_LIMIT else f"{text[:ECHO_LIMIT - 3]}..."
