"""SIGTERM, how spot and preemptible VMs are stopped, asks for a checkpoint at the next step boundary.

The loop's preemption hook sees ``requested``, waits for the checkpoint and exits with
``PREEMPTED_EXIT_CODE``; if the save outlives ``train.preemption_grace_s`` the process exits anyway.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

log = logging.getLogger("trainer")
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what schedulers expect from a job stopped by SIGTERM


class PreemptionWatch:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested_at: float | None = None
        self._previous: Any = None

    def __enter__(self) -> PreemptionWatch:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.requested_at is not None:
            return
        self.requested_at = time.monotonic()
        # the last resort if the save outlives the grace period: the VM would be killed anyway
        timer = threading.Timer(self.grace_s, self._deadline)
        timer.daemon = True
        timer.start()

    def _deadline(self) -> None:
        log.error("SIGTERM grace period of %.0f s ran out before the checkpoint was saved: exiting now", self.grace_s)
        os._exit(PREEMPTED_EXIT_CODE)

    @property
    def requested(self) -> bool:
        return self.requested_at is not None
