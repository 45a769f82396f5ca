"""The suites' one way to wait for a condition: poll it until it holds, fail the test at a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 20.0, what: str = "a condition", interval: float = 0.01
) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy (and return
    that); raise AssertionError once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
