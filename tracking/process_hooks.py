"""Process-wide hooks that quiet what Orbax and tensorstore print after a write error the trainer reports.

They change state every module of the process shares (the ``absl`` logger's filters and
``sys.unraisablehook``), so no module installs them on import: a program that wants them calls
``install_process_hooks()`` once at start-up, as the recipe harness (``tracking.harness``) does.
Library users and tests that do not call it see Orbax's own output unchanged.

- A failed save (a full disk) makes each of Orbax's save threads log the error with a traceback
  through absl; the trainer raises it once as a one-line ``WriteError`` (``experiment.files.write_errno``
  recognises it), so those records are dropped.
- Orbax runs each save and restore in its own asyncio loop; when one tensorstore operation fails the
  loop ends while the others are in flight, and each of them later calls ``call_soon_threadsafe`` on
  the closed loop: ~100 unraisable ``RuntimeError: Event loop is closed`` tracebacks for an error
  reported once already. Those alone are not passed to the previous hook.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any

from experiment.files import write_errno

UnraisableHook = Callable[[Any], None]


class ReportedWriteErrors(logging.Filter):
    """Drops error records whose message or exception is a write error (the trainer reports it in one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += "".join(traceback.format_exception(record.exc_info[1]))
        return write_errno(text) is None


def is_closed_loop_callback(unraisable: Any) -> bool:
    """Tensorstore completing a read or write after Orbax's event loop has ended."""
    tb = unraisable.exc_traceback
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_name != "call_soon_threadsafe":
        tb = tb.tb_next
    return (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed"
            and tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe")


def quiet_closed_loop_callbacks(previous: UnraisableHook) -> UnraisableHook:
    """An unraisable hook that passes everything but closed-loop callbacks on to ``previous``."""
    def hook(unraisable: Any) -> None:
        if not is_closed_loop_callback(unraisable):
            previous(unraisable)

    return hook


# what install_process_hooks changed, so that it runs once and uninstall_process_hooks can undo it
_installed: tuple[ReportedWriteErrors, UnraisableHook, UnraisableHook] | None = None


def install_process_hooks() -> None:
    """Install both hooks (once; a second call does nothing)."""
    global _installed
    if _installed is not None:
        return
    log_filter = ReportedWriteErrors()
    logging.getLogger("absl").addFilter(log_filter)
    previous = sys.unraisablehook
    sys.unraisablehook = quiet_closed_loop_callbacks(previous)
    _installed = (log_filter, previous, sys.unraisablehook)


def uninstall_process_hooks() -> None:
    """Undo ``install_process_hooks`` (tests); a hook someone installed after ours is left in place."""
    global _installed
    if _installed is None:
        return
    log_filter, previous, ours = _installed
    logging.getLogger("absl").removeFilter(log_filter)
    if sys.unraisablehook is ours:
        sys.unraisablehook = previous
    _installed = None
