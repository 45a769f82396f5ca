"""litequeue (its defaults). It ships no worker: the loop is pop, run, done, as its README shows."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, sqlite_durability
from bench.peers import sigterm_event
from bench.peers.base import Peer


class LiteQueuePeer(Peer):
    key = "litequeue"
    requires = ("litequeue",)
    worker_note = "pop / done loop (litequeue has no worker); 1 ms sleep when the queue is empty"

    @property
    def path(self) -> str:
        return str(self.workdir / "litequeue.db")

    def done_count(self, counter: Counter, n: int) -> int:
        from litequeue import MessageStatus

        with sqlite3.connect(self.path, timeout=30) as connection:
            row = connection.execute(
                "SELECT count(*) FROM Queue WHERE status = ?", (MessageStatus.DONE.value,)
            ).fetchone()
            return int(row[0])

    def enqueue_here(self, n: int) -> dict[str, Any]:
        from litequeue import LiteQueue

        queue = LiteQueue(self.path)
        started = time.perf_counter()
        for _ in range(n):
            queue.put("noop")
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "durability": sqlite_durability(queue.conn)}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        from litequeue import LiteQueue

        queue = LiteQueue(self.path)
        stop = sigterm_event()

        def loop() -> None:
            while not stop.is_set():
                message = queue.pop()
                if message is None:
                    time.sleep(0.001)
                    continue
                queue.done(message.message_id)
                counter.bump()

        return loop
