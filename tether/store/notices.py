"""Change notices: wake an idle runner or an event follower as soon as the store changes.

A write transaction notes what it changed: ``runs`` when a run may have become claimable (reserved,
requeued, parked, released, its status or pause changed), ``events`` when the journal grew. On
PostgreSQL the notes go out as ``NOTIFY`` with the commit and a listening connection receives them
within milliseconds. SQLite has no push between processes, so its watcher polls ``PRAGMA
data_version`` (a counter that any other connection's commit moves), every 2 ms after a change and
backing off to 20 ms while the file is quiet; it cannot tell channels apart and wakes both. It
polls only while someone subscribes: a runner listens only while a slot is free and its last
claim found no run for it (while claims find runs, the next one comes with a completion, and a
notice would only wake it for nothing).

Notices are hints. A woken waiter re-reads the store, and every waiter also polls at its own
longest interval, so a lost notice (a dropped listening connection, a notice raced by the read)
costs latency, never correctness.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

from tether.errors import InvalidInput

log = logging.getLogger("tether.store")

CHANNELS = ("runs", "events")
SQLITE_POLL_S = (0.002, 0.02)
WATCH_SLICE_S = 0.5
#: How long a PostgreSQL watcher blocks at a time, so that closing the store ends it promptly.
LISTEN_SLICE_S = 0.05
RECONNECT_S = (0.1, 5.0)


class Watcher(Protocol):
    #: Whether waiting costs work of its own (a poll): such a watcher rests while nobody
    #: subscribes. A pushed watcher keeps reading, so that the server never queues notices for it.
    polls: bool

    def wait(self, timeout_s: float, stop: threading.Event) -> set[str]:
        """Block until notices arrive, ``timeout_s`` passes or ``stop`` is set; the channels
        noticed (none on timeout)."""
        ...

    def close(self) -> None: ...


class ChangeFeed:
    """One watcher thread per store that sets its subscribers' events on each notice.

    The thread starts with the first subscription; while its watcher is broken it reconnects with
    backoff and wakes everyone once it is back (notices sent meanwhile were lost).
    """

    def __init__(self, open_watcher: Callable[[], Watcher]) -> None:
        self._open_watcher = open_watcher
        self._subscribers: dict[str, set[threading.Event]] = {channel: set() for channel in CHANNELS}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        #: Set while anyone subscribes (or once closed): a polling watcher rests while it is clear.
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, channel: str, wake: threading.Event) -> None:
        if channel not in CHANNELS:
            raise InvalidInput(f"Unknown change channel {channel!r}; use one of {', '.join(CHANNELS)}")
        with self._lock:
            self._subscribers[channel].add(wake)
            self._wanted.set()
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._watch, name="tether-changes", daemon=True)
                self._thread.start()

    def unsubscribe(self, channel: str, wake: threading.Event) -> None:
        with self._lock:
            self._subscribers[channel].discard(wake)
            if not any(self._subscribers.values()):
                self._wanted.clear()

    @property
    def listening(self) -> bool:
        """Whether anyone subscribes to a channel now."""
        return self._wanted.is_set() and not self._closed.is_set()

    @contextmanager
    def subscription(self, channel: str) -> Iterator[threading.Event]:
        """An event set on each notice of ``channel`` while the block runs."""
        wake = threading.Event()
        self.subscribe(channel, wake)
        try:
            yield wake
        finally:
            self.unsubscribe(channel, wake)

    def close(self) -> None:
        self._closed.set()
        self._wanted.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=WATCH_SLICE_S * 4)

    def _wake(self, channels: set[str] | tuple[str, ...]) -> None:
        with self._lock:
            for channel in channels:
                for wake in self._subscribers.get(channel, ()):
                    wake.set()

    def _watch(self) -> None:
        watcher: Watcher | None = None
        backoff = RECONNECT_S[0]
        while not self._closed.is_set():
            try:
                if watcher is None:
                    watcher = self._open_watcher()
                    self._wake(CHANNELS)
                    backoff = RECONNECT_S[0]
                if watcher.polls and not self._wanted.is_set():
                    # Nobody to wake: a notice missed meanwhile changes nothing, as a subscriber
                    # reads the store after subscribing. Its next poll wakes it at once anyway
                    # (the file changed since this watcher's last read).
                    self._wanted.wait(WATCH_SLICE_S)
                    continue
                noticed = watcher.wait(WATCH_SLICE_S, self._closed)
            except Exception as error:  # the watcher's connection broke: reconnect
                log.warning("change notices unavailable (%s); retrying in %.1f s", error, backoff)
                if watcher is not None:
                    with suppress(Exception):
                        watcher.close()
                watcher = None
                self._closed.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_S[1])
                continue
            if noticed:
                self._wake(noticed)
        if watcher is not None:
            with suppress(Exception):
                watcher.close()


class SqliteWatcher:
    """Adaptive poll of ``PRAGMA data_version`` on a connection of its own."""

    polls = True

    def __init__(self, path: Path) -> None:
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._version = self._read()
        self._interval = SQLITE_POLL_S[0]

    def _read(self) -> int:
        row = self._connection.execute("PRAGMA data_version").fetchone()
        return int(row[0])

    def wait(self, timeout_s: float, stop: threading.Event) -> set[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            version = self._read()
            if version != self._version:
                self._version = version
                self._interval = SQLITE_POLL_S[0]
                return set(CHANNELS)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stop.wait(min(self._interval, remaining)):
                return set()
            self._interval = min(self._interval * 1.5, SQLITE_POLL_S[1])

    def close(self) -> None:
        self._connection.close()


def channel_name(channel: str) -> str:
    """The PostgreSQL ``LISTEN``/``NOTIFY`` channel of a change channel."""
    return f"tether_{channel}"


class PostgresWatcher:
    """A dedicated autocommit connection that ``LISTEN``s on every change channel."""

    polls = False

    def __init__(self, conninfo: str, settings: dict[str, Any]) -> None:
        import psycopg

        self._connection = psycopg.connect(conninfo, **settings)
        for channel in CHANNELS:
            self._connection.execute(f"LISTEN {channel_name(channel)}")

    def wait(self, timeout_s: float, stop: threading.Event) -> set[str]:
        noticed: set[str] = set()
        prefix = channel_name("")
        deadline = time.monotonic() + timeout_s
        while not noticed and not stop.is_set() and time.monotonic() < deadline:
            for notice in self._connection.notifies(timeout=LISTEN_SLICE_S, stop_after=1):
                noticed.add(notice.channel.removeprefix(prefix))
        if noticed:  # take whatever else already arrived without waiting
            for notice in self._connection.notifies(timeout=0):
                noticed.add(notice.channel.removeprefix(prefix))
        if self._connection.closed:
            raise ConnectionError("the listening connection closed")
        return noticed & set(CHANNELS)

    def close(self) -> None:
        self._connection.close()
