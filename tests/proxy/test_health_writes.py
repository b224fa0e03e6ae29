"""proxy.outcomes.write_state: a health write the database does not take in time is given up with a
line in the log, and the request goes on."""

import logging
import threading
import time

from proxy import outcomes as health


async def test_a_write_the_database_does_not_answer_in_time_is_a_warning_line_without_traceback(caplog):
    release = threading.Event()
    finished = threading.Event()

    def stalled() -> None:  # stands for a write waiting on a lock held elsewhere
        release.wait(10)
        finished.set()

    caplog.set_level(logging.WARNING, logger="gateway")
    started = time.monotonic()
    await health.write_state(time.monotonic(), stalled)  # its deadline has passed: the floor's wait
    waited = time.monotonic() - started
    release.set()
    assert finished.wait(10)
    assert health.DB_WAIT_FLOOR_S <= waited < 5
    [record] = [r for r in caplog.records if "routing state could not be saved" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.exc_info is None  # a timeout is the designed give-up, not an error with a traceback
