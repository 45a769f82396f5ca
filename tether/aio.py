"""The client for asyncio applications: ``AsyncTether``.

Every store call runs on the client's own small thread pool, never on the event loop and never on
the loop's default executor, so a FastAPI app (or any asyncio service) keeps serving while Tether
reads and writes. Waiting costs no thread: one notice thread per client listens to the store's
change notices and wakes every waiting coroutine whose run may have moved, so a hundred ``wait``
calls hold a hundred futures, not a hundred threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from tether.client import DEFAULT_STORE, RunResult, Session, Started, Tether, WaitTimeout
from tether.engine.graph import Workflow
from tether.engine.providers import Usage
from tether.errors import InvalidInput, TetherError
from tether.store import (
    AgentMessage,
    ChildRun,
    Decision,
    InboxEvent,
    Lineage,
    LiveText,
    ParentLink,
    RunEvent,
    RunRecord,
    ScheduleRecord,
    Store,
    Submission,
)
from tether.values import Json

T = TypeVar("T")

#: Store calls one client runs at once; more wait their turn in the client's own queue.
DEFAULT_THREADS = 4
#: The longest a waiter goes without re-reading, should a change notice be lost.
POLL_S = 1.0


class AsyncTether:
    """``Tether`` for coroutines: the same operations, awaited.

    Give it a store URL (or a ``Store``) like ``Tether``, or wrap an existing ``Tether`` with
    ``AsyncTether(client)``. Use it as an async context manager, or call ``aclose()``; closing
    stops its threads and, when it opened the store, closes the store."""

    def __init__(
        self,
        store: Tether | Store | str = DEFAULT_STORE,
        *,
        workflows: Iterable[Workflow] = (),
        folder: str | Path | None = None,
        modules: Sequence[str] = (),
        project: str = "default",
        migrate: bool = True,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
            raise InvalidInput("threads must be a whole number from 1 to 64")
        if isinstance(store, Tether):
            self.client = store
            self._owns_store = False
        else:
            self._owns_store = not isinstance(store, Store)
            self.client = Tether(
                store, workflows=workflows, folder=folder, modules=modules, project=project, migrate=migrate
            )
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tether-async")
        self._notices = _Notices(self.client.store)
        self._closed = False

    async def __aenter__(self) -> AsyncTether:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def close(self) -> None:
        """The same as ``aclose()``."""
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the notice thread and the pool (after the calls in flight), then close the store
        if this client opened it."""
        if self._closed:
            return
        self._closed = True
        self._notices.close()
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        if self._owns_store:
            self.client.store.close()

    @property
    def store(self) -> Store:
        return self.client.store

    async def _call(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        if self._closed:
            raise TetherError("This AsyncTether is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    # -- starting and waiting ----------------------------------------------------------------
    async def start(
        self,
        workflow: str | Workflow,
        input: Json = None,
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        launch_options: Json = None,
    ) -> Started:
        """``Tether.start``: reserve a run, idempotent by ``run_id`` (``adopted`` tells)."""
        return await self._call(
            self.client.start,
            workflow,
            input,
            run_id=run_id,
            session_id=session_id,
            launch_options=launch_options,
        )

    async def result(self, run_id: str) -> RunResult:
        return await self._call(self.client.result, run_id)

    async def runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        workflow: str | None = None,
        limit: int | None = 100,
    ) -> list[RunRecord]:
        """``Tether.runs``: runs newest first, filtered by queue status and workflow."""
        return await self._call(self.client.runs, status=status, workflow=workflow, limit=limit)

    async def wait(self, run_id: str, *, timeout_s: float | None = None) -> RunResult:
        """Until the run is finished (done, failed or cancelled), woken by change notices; raises
        ``WaitTimeout`` after ``timeout_s``. Cancelling the awaiting task stops the wait."""
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0
        ):
            raise InvalidInput("timeout_s must be a non-negative number of seconds")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        with self._notices.listen(loop) as changed:
            while True:
                changed.clear()
                result = await self.result(run_id)
                if result.finished:
                    return result
                remaining = POLL_S if deadline is None else deadline - loop.time()
                if remaining <= 0:
                    raise WaitTimeout(f"Workflow run {run_id} is still {result.status} after {timeout_s} s")
                await _notice_or_timeout(changed, min(POLL_S, remaining))

    # -- control and people ------------------------------------------------------------------
    async def cancel(self, run_id: str) -> str:
        return await self._call(self.client.cancel, run_id)

    async def pause(self, run_id: str) -> None:
        await self._call(self.client.pause, run_id)

    async def resume(self, run_id: str) -> None:
        await self._call(self.client.resume, run_id)

    async def restart(
        self,
        run_id: str,
        *,
        input: Json = None,
        new_run_id: str | None = None,
        from_node: str | None = None,
        actor_id: str = "operator",
    ) -> RunRecord:
        """``Tether.restart``: a new run linked to a finished one; ``from_node`` forks it there."""
        return await self._call(
            self.client.restart,
            run_id,
            input=input,
            new_run_id=new_run_id,
            from_node=from_node,
            actor_id=actor_id,
        )

    async def lineage(self, run_id: str) -> Lineage:
        """``Tether.lineage``: the run's parent and child in its restart family."""
        return await self._call(self.client.lineage, run_id)

    async def conversation(self, run_id: str, node_id: str | None = None) -> list[AgentMessage]:
        """``Tether.conversation``: the run's recorded agent messages (one node's with ``node_id``)."""
        return await self._call(self.client.conversation, run_id, node_id)

    async def live_text(self, run_id: str) -> dict[str, LiveText]:
        """``Tether.live_text``: the text the run's agent steps' models are streaming, by node id."""
        return await self._call(self.client.live_text, run_id)

    async def usage(self, run_id: str) -> dict[str, Usage]:
        """``Tether.usage``: the tokens the run's agent steps used, by node id."""
        return await self._call(self.client.usage, run_id)

    async def children(self, run_id: str) -> list[ChildRun]:
        """``Tether.children``: the child runs the run's ``child`` nodes started."""
        return await self._call(self.client.children, run_id)

    async def parent(self, run_id: str) -> ParentLink | None:
        """``Tether.parent``: the run (and node) that started this one as a child run."""
        return await self._call(self.client.parent, run_id)

    async def decisions(self, run_id: str | None = None, *, open_only: bool = True) -> list[Decision]:
        return await self._call(self.client.decisions, run_id, open_only=open_only)

    async def answer(self, decision_id: str, response: Json, *, actor_id: str = "human") -> Decision:
        return await self._call(self.client.answer, decision_id, response, actor_id=actor_id)

    async def submit(self, request_id: str, session_id: str, payload: Json) -> Submission:
        return await self._call(self.client.submit, request_id, session_id, payload)

    def session(self, session_id: str) -> Session:
        """The synchronous ``Session`` (its calls are short reads and writes; wrap them with
        ``submit`` here when they must not run on the loop)."""
        return self.client.session(session_id)

    # -- events into runs and schedules -------------------------------------------------------
    async def send_event(
        self, run_id: str, name: str, payload: Json = None, *, actor_id: str = "operator"
    ) -> InboxEvent:
        """``Tether.send_event``: keep an event for the run's ``wait_for_event`` node of that
        name (refused, writing nothing, for an unknown name, a payload breaking the node's schema
        or a finished run)."""
        return await self._call(self.client.send_event, run_id, name, payload, actor_id=actor_id)

    async def add_schedule(
        self,
        workflow: str,
        cron: str,
        *,
        tz: str = "UTC",
        input: Json = None,
        name: str | None = None,
        catch_up: str = "skip",
    ) -> ScheduleRecord:
        """``Tether.add_schedule``: a cron schedule starting runs of a workflow this client loaded."""
        return await self._call(
            self.client.add_schedule, workflow, cron, tz=tz, input=input, name=name, catch_up=catch_up
        )

    async def schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]:
        """``Tether.schedules``: the schedules by name (one workflow's with ``workflow``)."""
        return await self._call(self.client.schedules, workflow=workflow)

    async def schedule(self, name: str) -> ScheduleRecord:
        """``Tether.schedule``: the schedule of that name (``NotFound`` for an unknown one)."""
        return await self._call(self.client.schedule, name)

    async def pause_schedule(self, name: str) -> bool:
        """``Tether.pause_schedule``: False when it was paused already."""
        return await self._call(self.client.pause_schedule, name)

    async def resume_schedule(self, name: str) -> bool:
        """``Tether.resume_schedule``: False when it was not paused."""
        return await self._call(self.client.resume_schedule, name)

    async def remove_schedule(self, name: str) -> None:
        """``Tether.remove_schedule``: delete a schedule added at run time (``Conflict`` for one
        declared in code)."""
        await self._call(self.client.remove_schedule, name)

    async def declare_schedules(self) -> list[str]:
        """``Tether.declare_schedules``: write the schedules the loaded workflows declare."""
        return await self._call(self.client.declare_schedules)

    # -- reading -----------------------------------------------------------------------------
    async def events(
        self, after: int = 0, *, run_id: str | None = None, follow: bool = False
    ) -> AsyncIterator[RunEvent]:
        """The journal after ``after``, in order; with ``follow`` it waits for new entries, woken
        by change notices. Stop following by leaving the ``async for`` (or cancelling its task)."""
        loop = asyncio.get_running_loop()
        with self._notices.listen(loop) as changed:
            while True:
                changed.clear()
                batch = await self._call(self.client.store.events_after, after, run_id=run_id, limit=500)
                for event in batch:
                    after = event.seq
                    yield event
                if len(batch) == 500:
                    continue
                if not follow:
                    return
                await _notice_or_timeout(changed, POLL_S)


async def _notice_or_timeout(changed: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(changed.wait(), timeout_s)


class _Notices:
    """One thread per client that waits on the store's change notices and sets the asyncio
    events of every coroutine listening (through its loop: asyncio objects are not thread-safe)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._listeners: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def listen(self, loop: asyncio.AbstractEventLoop) -> _Listening:
        return _Listening(self, loop)

    def add(self, loop: asyncio.AbstractEventLoop, changed: asyncio.Event) -> None:
        with self._lock:
            self._listeners.add((loop, changed))
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._pump, name="tether-async-notices", daemon=True)
                self._thread.start()

    def remove(self, loop: asyncio.AbstractEventLoop, changed: asyncio.Event) -> None:
        with self._lock:
            self._listeners.discard((loop, changed))

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(POLL_S * 2)

    def _pump(self) -> None:
        with self._store.changes.subscription("events") as changed:
            while not self._stop.is_set():
                if not changed.wait(POLL_S / 4):
                    continue
                changed.clear()
                with self._lock:
                    listeners = list(self._listeners)
                for loop, event in listeners:
                    try:
                        loop.call_soon_threadsafe(event.set)
                    except RuntimeError:  # that loop closed; its listener is gone with it
                        self.remove(loop, event)


class _Listening:
    """A context manager: an ``asyncio.Event`` set on every change notice while inside."""

    def __init__(self, notices: _Notices, loop: asyncio.AbstractEventLoop) -> None:
        self._notices = notices
        self._loop = loop
        self._changed = asyncio.Event()

    def __enter__(self) -> asyncio.Event:
        self._notices.add(self._loop, self._changed)
        return self._changed

    def __exit__(self, *exc: object) -> None:
        self._notices.remove(self._loop, self._changed)
