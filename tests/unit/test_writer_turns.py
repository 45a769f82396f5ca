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


def test_writer_turns__a_stream_of_first_writers_does_not_starve_another_writer() -> None:
    """A thread that takes first turns back to back (a run thread claiming with every completion)
    lets a waiting other writer (the runner's timer sweep) in within a few turns: a release hands
    the turn to a waiting writer, so asking again queues behind it."""
    turns = WriterTurns()
    stop = threading.Event()
    turns_taken = 0

    def stream() -> None:
        nonlocal turns_taken
        while not stop.is_set():
            assert turns.acquire(5, first=True)
            turns_taken += 1
            time.sleep(0.001)
            turns.release()

    streamer = threading.Thread(target=stream)
    streamer.start()
    wait_until(lambda: turns_taken > 10, what="the stream of first writers")
    try:
        streak_before = turns_taken
        assert turns.acquire(2.0), "the other writer got a turn"
        passed = turns_taken - streak_before
        turns.release()
    finally:
        stop.set()
        streamer.join(5)
    assert passed <= WriterTurns.FIRST_STREAK + 1, passed


def test_writer_turns__first_writers_go_ahead_of_others_but_only_so_many_in_a_row() -> None:
    """With both kinds waiting, first writers take the turn FIRST_STREAK times in a row, then the
    longest-waiting other writer; each kind in the order it came."""
    turns = WriterTurns()
    assert turns.acquire(1)
    order: list[str] = []
    threads: list[threading.Thread] = []
    for name, first in [("other-0", False), ("other-1", False)] + [(f"first-{i}", True) for i in range(6)]:
        thread = threading.Thread(target=_take_turn, args=(turns, order, name, first))
        thread.start()
        threads.append(thread)
        queued = len(threads)
        wait_until(lambda: turns.waiting == queued, what=f"{name} waiting")  # noqa: B023 - used at once
    turns.release()
    for thread in threads:
        thread.join(5)
    streak = WriterTurns.FIRST_STREAK
    assert order == [
        *[f"first-{i}" for i in range(streak)],
        "other-0",
        *[f"first-{i}" for i in range(streak, 6)],
        "other-1",
    ]


def _take_turn(turns: WriterTurns, order: list[str], name: str, first: bool) -> None:
    assert turns.acquire(5, first=first)
    order.append(name)
    turns.release()
