"""The runner's clock: its own timing (idle waits and backoffs between claims, the lease renewal
and housekeeping cadences, step deadlines, how long a lease is provably live) reads this, so tests
can run the runner on a ``FakeClock`` instead of sleeping.

The store judges leases, durable sleeps and retry backoffs by its own clock (the database's); a
fake runner clock does not move those.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals, wall time for instants, and waiting on either."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        ...

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds passed on this clock; whether it was set."""
        ...


class SystemClock:
    """The system's clocks: ``time.monotonic()``, ``time.time()``, real sleeps and waits."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(None if timeout is None else max(0.0, timeout))


#: Real seconds a ``FakeClock`` wait rests between looks at its event (an ``Event`` cannot tell
#: the clock it was set).
FAKE_WAIT_SLICE_S = 0.005


class FakeClock:
    """A clock that moves only when told (``advance``): sleeps and waits end once it was advanced
    far enough (a wait also when its event is set). For tests; thread-safe."""

    def __init__(self, start: float = 1000.0, wall: float = 1_800_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall - start
        self._moved = threading.Condition()
        #: The deadlines of the sleeps and waits under way (what ``waiters`` reports).
        self._deadlines: list[float] = []

    def monotonic(self) -> float:
        with self._moved:
            return self._now

    def time(self) -> float:
        with self._moved:
            return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move the clock forward, ending the sleeps and waits that are due."""
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        with self._moved:
            self._now += seconds
            self._moved.notify_all()

    def waiters(self) -> list[float]:
        """How far ahead of now each sleep or wait under way ends (seconds; ``inf`` for none)."""
        with self._moved:
            return sorted(deadline - self._now for deadline in self._deadlines)

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        with self._moved:
            deadline = float("inf") if timeout is None else self._now + max(0.0, timeout)
            self._deadlines.append(deadline)
            try:
                while not event.is_set() and self._now < deadline:
                    self._moved.wait(FAKE_WAIT_SLICE_S)
            finally:
                self._deadlines.remove(deadline)
            return event.is_set()
