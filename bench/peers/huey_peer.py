"""Huey with ``SqliteHuey`` (its defaults) and its standard consumer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, sqlite_durability
from bench.peers.base import Peer


def noop() -> None:
    """The benchmark's task: returns at once (None, so Huey stores no result)."""


class HueyPeer(Peer):
    key = "huey"
    requires = ("huey",)
    worker_note = "huey Consumer as huey_consumer starts it (defaults: 1 thread worker, 0.1 s initial poll)"

    @property
    def path(self) -> str:
        return str(self.workdir / "huey.db")

    def app(self) -> tuple[Any, Any]:
        from huey import SqliteHuey

        huey = SqliteHuey(name="bench", filename=self.path)
        return huey, huey.task(name="noop")(noop)

    def enqueue_here(self, n: int) -> dict[str, Any]:
        huey, task = self.app()
        huey.storage.conn  # noqa: B018 - open the connection before the clock starts
        started = time.perf_counter()
        for _ in range(n):
            task()
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "durability": sqlite_durability(huey.storage.conn)}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        from huey.signals import SIGNAL_COMPLETE

        huey, _ = self.app()

        @huey.signal(SIGNAL_COMPLETE)
        def finished(signal: str, task: Any) -> None:
            counter.bump()

        consumer = huey.create_consumer()
        return consumer.run
