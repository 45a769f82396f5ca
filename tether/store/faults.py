"""Crash points for the fault-injection suite.

With ``TETHER_FAULT=<point>:<n>`` in the environment the process exits abruptly (``os._exit``, no
cleanup, like a power cut for this process) the n-th time it reaches ``<point>``. Points:
``begin`` (after BEGIN), ``statement`` (after each statement inside a write transaction),
``before_commit`` and ``after_commit``. Unset, a check costs one comparison.
"""

from __future__ import annotations

import os

EXIT_CODE = 97
_plan: tuple[str, int] | None = None
_hits = 0


def _load() -> tuple[str, int] | None:
    raw = os.environ.get("TETHER_FAULT")
    if not raw:
        return None
    point, _, count = raw.partition(":")
    return point, int(count or "1")


_plan = _load()


def fault_point(name: str) -> None:
    global _hits
    if _plan is None or _plan[0] != name:
        return
    _hits += 1
    if _hits == _plan[1]:
        os._exit(EXIT_CODE)
