"""The event loop a runner runs ``async def`` node functions on.

One loop per runner, in a thread of its own, started with the runner's first coroutine and
stopped when the runner finishes. A step's thread hands its coroutine to the loop and waits for
the result, so a step is a step whether its function is async or not: the same claim checks, the
same retries. Cancelling the waiting future (``StepLoop.submit``) cancels the coroutine's task.

Every async step of a runner shares its loop: a coroutine that blocks (``time.sleep``, a
synchronous client) holds up the runner's other async steps while it does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

from tether.errors import TetherError

log = logging.getLogger("tether.runner")

T = TypeVar("T")

#: How long a stopping loop waits for its cancelled tasks to end (a task that ignores its
#: cancellation is left behind; the loop's thread is a daemon).
STOP_WAIT_S = 5.0


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class StepLoop:
    """An event loop in a thread of its own, started lazily by the first ``submit``."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: Guards starting and stopping, and each submission: a coroutine submitted before a stop
        #: is scheduled ahead of the stop, so it is cancelled with the others, never stranded.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        #: The futures of the coroutines not finished yet (a stop cancels them).
        self._running: set[concurrent.futures.Future[Any]] = set()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def submit(self, awaitable: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Run ``awaitable`` on the loop; the returned future holds its result. Cancelling the
        future cancels the task. Refused (``TetherError``) once the loop was stopped."""
        with self._lock:
            if self._closed:
                close = getattr(awaitable, "close", None)
                if callable(close):
                    close()  # never awaited: say nothing about it
                raise TetherError(f"{self.name}: the runner stopped; its event loop takes no more steps")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=self._serve, args=(loop,), name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            future = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._loop)
            self._running.add(future)
        future.add_done_callback(self._running.discard)
        return future

    def stop(self) -> None:
        """Cancel the coroutines still running, stop the loop, and wait for its thread (the
        cancelled tasks get ``STOP_WAIT_S`` to end)."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            # Cancelled here, each step's thread wakes at once, even for a coroutine that
            # ignores its task's cancellation.
            for future in list(self._running):
                future.cancel()
            if loop is not None:
                loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(STOP_WAIT_S + 1)

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # A task left at the stop belongs to a step its runner abandoned: cancel it, so the
            # step's thread (waiting on the task's future) wakes and the coroutine's cleanup runs.
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=STOP_WAIT_S))
                if pending:
                    log.warning(
                        "%d async step(s) ignored their cancellation at the runner's stop", len(pending)
                    )
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
