"""A PostgreSQL store through a database outage: the database is reached through a TCP relay
that the test stops and starts (the shared server itself keeps running). While it is away every
call fails with ``StoreUnavailable`` instead of waiting out the pool; once it is back the next
calls work, without waiting for the pool's reconnect pauses."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from tether import open_store
from tether.errors import StoreBusy, StoreUnavailable

from .conftest import PG_SKIP, PG_URL, _pg_empty, reserve_args

pytestmark = pytest.mark.skipif(not PG_URL, reason=PG_SKIP)


class Relay:
    """Forwards TCP connections from a local port to the database; ``stop`` closes the port and
    every connection through it (an outage), ``start`` opens the same port again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):  # shutdown wakes the accepting thread; close alone does not
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay(pg_database: str) -> Iterator[tuple[Relay, str]]:
    _pg_empty(pg_database)
    parts = urlsplit(pg_database)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    relay.start()
    netloc = f"{parts.username}@127.0.0.1:{relay.port}" if parts.username else f"127.0.0.1:{relay.port}"
    # A wait for a free connection far longer than the test may take: an outage must not wait it out.
    url = urlunsplit((parts.scheme, netloc, parts.path, "pool_timeout_ms=600000&pool_max=4", ""))
    yield relay, url
    relay.stop()


def call_within(seconds: float, call: object) -> object:
    """Run ``call`` in a thread: its result or the exception it raised; fail if it takes longer
    than ``seconds`` (it waited out the pool)."""
    outcome: list[object] = []

    def main() -> None:
        try:
            outcome.append(call())  # type: ignore[operator]
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the call still waited after {seconds} s"
    return outcome[0]


def test_outage__calls_fail_as_unavailable_at_once_and_work_again_when_the_database_is_back(
    relay: tuple[Relay, str],
) -> None:
    proxy, url = relay
    store = open_store(url)
    try:
        store.reserve(**reserve_args("run-1", now=None))
        proxy.stop()
        for _ in range(3):
            failed = call_within(20, lambda: store.get_run("run-1"))
            assert isinstance(failed, StoreUnavailable), failed
            assert not isinstance(failed, StoreBusy)
            failed = call_within(20, lambda: store.reserve(**reserve_args("run-2", origin_session_id="s2")))
            assert isinstance(failed, StoreUnavailable), failed
        proxy.start()
        # Back: the very next calls work (the pool's own reconnect pauses are not waited for).
        found = call_within(20, lambda: store.get_run("run-1"))
        assert not isinstance(found, Exception), found
        made = call_within(20, lambda: store.reserve(**reserve_args("run-2", origin_session_id="s2")))
        assert not isinstance(made, Exception), made
        assert {r.run_id for r in store.list_runs()} == {"run-1", "run-2"}
    finally:
        store.close()


def test_outage__a_store_opened_while_the_database_is_away_is_unavailable(relay: tuple[Relay, str]) -> None:
    proxy, url = relay
    proxy.stop()
    with pytest.raises(StoreUnavailable, match="Cannot connect"):
        open_store(url)


def test_pool_timeout__a_pool_with_every_connection_in_use_is_busy_after_the_wait(pg_database: str) -> None:
    _pg_empty(pg_database)
    store = open_store(f"{pg_database}?pool_max=1&pool_timeout_ms=300")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            store.reserve(**reserve_args("run-held"))
            holding.set()
            release.wait(20)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(20)
        failed = call_within(20, lambda: store.get_run("run-held"))
        assert isinstance(failed, StoreBusy) and "pool_timeout_ms (300 ms)" in str(failed), failed
    finally:
        release.set()
        thread.join(20)
    assert store.get_run("run-held") is not None
    store.close()


@pytest.mark.parametrize("value", ["-1", "soon"])
def test_pool_timeout__must_be_a_whole_number_not_negative(pg_database: str, value: str) -> None:
    from tether.errors import InvalidInput

    with pytest.raises(InvalidInput, match="pool_timeout_ms"):
        open_store(f"{pg_database}?pool_timeout_ms={value}")
