"""The two status axes of a run and the only legal moves between their values.

Every status write in the store takes its allowed source statuses from these tables
(``sources(...)``), so a write that the table forbids matches no row and changes nothing.
"""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Final


class QueueStatus(StrEnum):
    """Who may execute the run now (the queue/launch view)."""

    QUEUED = "queued"  #: waiting for a runner to claim it
    STARTING = "starting"  #: claimed; the runner has not reported it running yet
    RUNNING = "running"  #: a runner reported that it executes the run
    PARKED = "parked"  #: released by its runner; resumable
    DONE = "done"  #: finished successfully (terminal)
    FAILED = "failed"  #: finished with an error (terminal)
    CANCELLED = "cancelled"  #: stopped on request (terminal)


class RunStatus(StrEnum):
    """What the workflow reached (the engine's durable view)."""

    QUEUED = "queued"  #: reserved, not yet initialised by an engine
    RUNNING = "running"  #: the engine is executing nodes
    WAITING = "waiting"  #: blocked on input, a decision or an operator
    COMPLETED = "completed"  #: the last node finished (terminal)
    FAILED = "failed"  #: a node or the runner failed it (terminal)
    TIMED_OUT = "timed_out"  #: a deadline expired with no default (terminal)
    CANCELLED = "cancelled"  #: cancelled (terminal)


Q, R = QueueStatus, RunStatus
_LIVE_QUEUE: Final = frozenset({Q.STARTING, Q.RUNNING, Q.PARKED, Q.QUEUED, Q.FAILED, Q.CANCELLED})

QUEUE_TRANSITIONS: Final[dict[QueueStatus, frozenset[QueueStatus]]] = {
    Q.QUEUED: _LIVE_QUEUE,
    Q.STARTING: _LIVE_QUEUE | {Q.DONE},
    Q.RUNNING: _LIVE_QUEUE | {Q.DONE},
    Q.PARKED: _LIVE_QUEUE | {Q.DONE},
    Q.DONE: frozenset(),
    Q.FAILED: frozenset(),
    Q.CANCELLED: frozenset(),
}

RUN_TRANSITIONS: Final[dict[RunStatus, frozenset[RunStatus]]] = {
    # A run that waited in the queue past its deadline times out without ever running.
    R.QUEUED: frozenset({R.RUNNING, R.FAILED, R.TIMED_OUT, R.CANCELLED}),
    R.RUNNING: frozenset({R.RUNNING, R.WAITING, R.COMPLETED, R.FAILED, R.TIMED_OUT, R.CANCELLED}),
    R.WAITING: frozenset({R.RUNNING, R.WAITING, R.COMPLETED, R.FAILED, R.TIMED_OUT, R.CANCELLED}),
    R.COMPLETED: frozenset(),
    R.FAILED: frozenset(),
    R.TIMED_OUT: frozenset(),
    R.CANCELLED: frozenset(),
}

QUEUE_TERMINAL: Final = frozenset(s for s, moves in QUEUE_TRANSITIONS.items() if not moves)
RUN_TERMINAL: Final = frozenset(s for s, moves in RUN_TRANSITIONS.items() if not moves)

#: Queue/run pairs that hosts accept as consistent; anything else is a contradiction.
CONSISTENT_PAIRS: Final = frozenset(
    {
        (Q.QUEUED, R.QUEUED),
        (Q.STARTING, R.RUNNING),
        (Q.RUNNING, R.RUNNING),
        (Q.PARKED, R.RUNNING),
        (Q.PARKED, R.WAITING),
        (Q.DONE, R.COMPLETED),
        (Q.FAILED, R.FAILED),
        (Q.FAILED, R.TIMED_OUT),
        (Q.CANCELLED, R.CANCELLED),
    }
)


@functools.cache
def queue_sources(target: QueueStatus) -> tuple[str, ...]:
    """The queue statuses from which ``target`` may be entered, in a stable order."""
    return tuple(s.value for s, moves in QUEUE_TRANSITIONS.items() if target in moves)


@functools.cache
def run_sources(target: RunStatus) -> tuple[str, ...]:
    """The run statuses from which ``target`` may be entered, in a stable order."""
    return tuple(s.value for s, moves in RUN_TRANSITIONS.items() if target in moves)


def mermaid(
    transitions: dict[QueueStatus, frozenset[QueueStatus]] | dict[RunStatus, frozenset[RunStatus]],
) -> str:
    """A Mermaid state diagram of one transition table (docs/state-machine.md is built from it)."""
    lines = ["stateDiagram-v2"]
    for source, targets in transitions.items():
        for target in sorted(targets, key=lambda s: list(transitions).index(s)):
            if source != target:
                lines.append(f"    {source.value} --> {target.value}")
        if not targets:
            lines.append(f"    {source.value} --> [*]")
    return "\n".join(lines)
