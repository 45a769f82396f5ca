"""persist-queue's ``SQLiteAckQueue`` (its defaults). It ships no worker: the loop is get, run,
ack, as its README shows."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, sqlite_durability
from bench.peers import sigterm_event
from bench.peers.base import Peer


class PersistQueuePeer(Peer):
    key = "persist-queue"
    requires = ("persistqueue",)
    worker_note = "get / ack loop (persist-queue has no worker); get blocks up to 50 ms when empty"

    @property
    def folder(self) -> str:
        return str(self.workdir / "queue")

    def done_count(self, counter: Counter, n: int) -> int:
        from persistqueue.sqlackqueue import AckStatus

        with sqlite3.connect(f"{self.folder}/data.db", timeout=30) as connection:
            row = connection.execute(
                "SELECT count(*) FROM ack_queue_default WHERE status = ?", (int(AckStatus.acked),)
            ).fetchone()
            return int(row[0])

    def enqueue_here(self, n: int) -> dict[str, Any]:
        from persistqueue import SQLiteAckQueue

        queue = SQLiteAckQueue(self.folder)
        started = time.perf_counter()
        for _ in range(n):
            queue.put("noop")
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "durability": sqlite_durability(queue._putter)}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        from persistqueue import Empty, SQLiteAckQueue

        queue = SQLiteAckQueue(self.folder)
        stop = sigterm_event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    item = queue.get(block=True, timeout=0.05, raw=True)
                except Empty:
                    continue
                queue.ack(id=item["pqid"])
                counter.bump()

        return loop
