"""Which chips a run pays for: the priced ``cost.chips`` against the chips that actually train it.

The rule: on an accelerator the two must agree (pricing 8 chips while 16 train, or the reverse,
would make every ruble figure wrong), so a mismatch stops the run before it starts. A CPU-only
host may price "as if" on the configured slice (a rehearsal of a TPU run's accounting on a laptop);
that is said once in the log. MFU always divides by the chips in use, never by the priced ones.
Both numbers reach the W&B run: ``cost_chips`` in its config, ``cost/chips_in_use`` in its summary.
"""

from __future__ import annotations

import logging

from experiment.errors import ConfigError

log = logging.getLogger("cost.chips")


def reconcile_chips(priced: int, in_use: int, platform: str) -> int:
    """Check ``cost.chips`` (``priced``) against the ``in_use`` chips of ``platform``; returns ``in_use``."""
    if priced == in_use:
        return in_use
    if platform != "cpu":
        raise ConfigError(f"config key 'cost.chips': {priced} chip(s) priced, but {in_use} {platform} chip(s) train "
                          f"this run: set cost.chips={in_use}")
    log.info("pricing %d chip(s) as configured (cost.chips) while %d CPU host(s) train: the rubles are those of "
             "the configured slice, MFU is per host in use", priced, in_use)
    return in_use
