"""SQLite only: the write-ahead log is copied back into the database file by a thread of the
store's own, not inside the commits of its writes (``tether.store.db.Checkpointer``)."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path

from tether.client import Tether
from tether.engine.graph import Workflow, compute
from tether.store.db import AUTOCHECKPOINT_PAGES, CHECKPOINT_COMMITS


def _client(path: Path) -> Tether:
    return Tether(
        f"sqlite:///{path}", workflows=[Workflow("noop", start="a", nodes=[compute("a", lambda ctx: None)])]
    )


def _runs_in_database_file(path: Path, scratch: Path) -> int:
    """The runs the database file holds by itself, without its write-ahead log (0 while not even
    the schema was copied into it)."""
    shutil.copy(path, scratch)
    connection = sqlite3.connect(scratch)
    try:
        if connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone() is None:
            return 0
        return int(connection.execute("SELECT count(*) FROM runs").fetchone()[0])
    finally:
        connection.close()


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tether-checkpoint"]


def test_sqlite_checkpoint__a_thread_copies_the_log_into_the_file_and_ends_with_the_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    client = _client(path)
    checkpointer = client.store.db.checkpointer
    started = 0
    try:
        # Up to one write commit short of the first checkpoint (opening the store wrote too).
        while checkpointer.commits < CHECKPOINT_COMMITS - 1:
            client.start("noop")
            started += 1
        assert checkpointer.checkpoints == 0 and not _checkpoint_threads()
        # Far below the log size at which a commit checkpoints by itself: only the thread copies.
        assert _runs_in_database_file(path, tmp_path / "copy.db") == 0
        client.start("noop")
        started += 1
        deadline = time.monotonic() + 10
        while checkpointer.checkpoints == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.checkpoints == 1
        assert _runs_in_database_file(path, tmp_path / "copy.db") == started
        assert len(_checkpoint_threads()) == 1
    finally:
        client.store.close()
    assert not _checkpoint_threads()


def test_sqlite_checkpoint__commits_checkpoint_by_themselves_only_past_the_backstop(tmp_path: Path) -> None:
    client = _client(tmp_path / "t.db")
    try:
        client.start("noop")
        with client.store.db._connection() as connection:
            pages = connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert pages == AUTOCHECKPOINT_PAGES
    finally:
        client.store.close()
