"""The fake clock the engine tests run the runner on: it moves only when advanced."""

from __future__ import annotations

import threading

import pytest

from tests.waiting import wait_until
from tether.engine.clock import FakeClock, SystemClock


def test_fake_clock__a_wait_ends_when_advanced_past_its_timeout_or_when_its_event_is_set() -> None:
    clock = FakeClock(start=10.0)
    event, results = threading.Event(), []
    waiter = threading.Thread(target=lambda: results.append(clock.wait(event, 5.0)))
    waiter.start()
    wait_until(lambda: clock.waiters() == [5.0], timeout=5, what="the wait to begin")
    clock.advance(4.0)
    assert clock.waiters() == [1.0] and not results
    clock.advance(1.0)
    waiter.join(5)
    assert results == [False] and clock.monotonic() == 15.0

    setter = threading.Thread(target=lambda: results.append(clock.wait(event, None)))
    setter.start()
    wait_until(lambda: clock.waiters() == [float("inf")], timeout=5, what="the second wait to begin")
    event.set()
    setter.join(5)
    assert results == [False, True] and clock.waiters() == []


def test_fake_clock__wall_time_moves_with_it_and_never_back() -> None:
    clock = FakeClock(start=0.0, wall=100.0)
    clock.advance(2.5)
    assert clock.time() == 102.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_system_clock__waits_on_the_event() -> None:
    event = threading.Event()
    event.set()
    assert SystemClock().wait(event, 5.0) is True
    assert SystemClock().monotonic() <= SystemClock().monotonic()
