"""The shared multi-device worker (tests/device_worker.py): one process serves many checks, and a check
that raises, prints, dies or hangs fails as itself without hiding the next check's result."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.device_worker import CheckFailed, DeviceWorker

pytestmark = pytest.mark.integration  # every test runs a recipe or another process


def devices_and_pid() -> list[int]:
    import jax

    print("noise on stdout must not reach the answers")
    os.write(1, b"nor from below Python\n")
    return [jax.device_count(), os.getpid()]


def raises(message: str) -> None:
    raise ValueError(message)


def dies() -> None:
    print("last words", file=sys.stderr, flush=True)
    os._exit(3)


def hangs() -> None:
    time.sleep(600)


def test_one_worker_serves_checks_that_raise_and_a_dead_one_is_replaced() -> None:
    with DeviceWorker(2) as worker:
        count, pid = worker.run(devices_and_pid)
        assert count == 2
        with pytest.raises(CheckFailed, match=r"(?s)tests.test_device_worker:raises raised .*ValueError: boom"):
            worker.run(raises, "boom")
        assert worker.run(devices_and_pid) == [2, pid] and worker.starts == 1  # the same process, still serving
        with pytest.raises(CheckFailed, match=r"(?s)worker died \(exit code 3\).*last words"):
            worker.run(dies)
        count, new_pid = worker.run(devices_and_pid)
        assert (count, worker.starts) == (2, 2) and new_pid != pid


def test_a_hung_check_times_out_and_the_next_check_gets_a_fresh_worker() -> None:
    with DeviceWorker(2) as worker:
        with pytest.raises(CheckFailed, match=r"hangs: no answer from the 2-device worker in 1 s"):
            worker.run(hangs, timeout=1)
        assert worker.run(devices_and_pid)[0] == 2 and worker.starts == 2
