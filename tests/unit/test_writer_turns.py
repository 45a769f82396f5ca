"""The turns of one process's SQLite writers (``WriterTurns``): one at a time, ``first`` writers
ahead of the others, a wait bounded by its timeout."""

from __future__ import annotations

import threading
import time

from tether.store.db import WriterTurns

from ..waiting import wait_until


def test_writer_turns__one_writer_at_a_time_and_a_wait_past_its_timeout_is_refused() -> None:
    turns = WriterTurns()
    assert turns.acquire(1)
    started = time.monotonic()
    assert not turns.acquire(0.05)
    assert time.monotonic() - started >= 0.05
    assert turns.waiting == 0
    turns.release()
    assert turns.acquire(0.05)
    turns.release()


def test_writer_turns__others_go_once_a_first_writer_gave_up_waiting() -> None:
    """A first writer that times out no longer holds the others back, and the turn it did not
    take passes on at the next release (no lost wake-up)."""
    turns = WriterTurns()
    assert turns.acquire(1)
    results: dict[str, bool] = {}

    def wait(name: str, timeout: float, first: bool) -> None:
        results[name] = turns.acquire(timeout, first=first)
        if results[name]:
            turns.release()

    first = threading.Thread(target=wait, args=("first", 0.1, True))
    first.start()
    wait_until(lambda: turns.waiting == 1, what="the first writer waiting")
    other = threading.Thread(target=wait, args=("other", 10.0, False))
    other.start()
    first.join(5)
    assert results == {"first": False}
    assert other.is_alive()  # still held by this thread's turn
    turns.release()
    other.join(5)
    assert results == {"first": False, "other": True}
    assert turns.acquire(0.05)  # and the other gave its turn back
