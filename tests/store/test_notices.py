"""Change notices and schema checks, on both backends: a subscriber is woken when another
connection reserves a run or appends an event, and not while the store is quiet; a SQLite watcher
polls only while anyone subscribes; ``migrate=False``
refuses a database that needs ``tether db upgrade`` and changes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tether import open_store
from tether.cli import main as cli_main
from tether.errors import InvalidInput, SchemaOutdated
from tether.store import Store, schema_version
from tether.store.db import migrations
from tether.store.notices import SqliteWatcher

from .conftest import reserve_args

WAKE_S = 10.0  # generous: a notice arrives in milliseconds, the machine is shared and noisy


def woken(subscriber: threading.Event) -> bool:
    """Whether the subscriber is woken; clears it for the next check."""
    result = subscriber.wait(WAKE_S)
    subscriber.clear()
    return result


def settle(subscriber: threading.Event) -> None:
    """Wait out the wake every new subscription gets, then expect quiet."""
    assert woken(subscriber), "a new subscription is woken once when its watcher starts"


def test_notices__a_reservation_by_another_connection_wakes_runs_and_events_subscribers(
    store: Store, open_at: Callable[..., Store]
) -> None:
    writer = open_at()
    runs, events = threading.Event(), threading.Event()
    store.changes.subscribe("runs", runs)
    store.changes.subscribe("events", events)
    settle(runs)
    settle(events)
    assert not runs.wait(0.3) and not events.wait(0.3), "woken while nothing changed"
    writer.reserve(**reserve_args("run-1"))
    assert woken(runs)
    assert woken(events)


def test_notices__an_appended_event_wakes_a_follower_and_an_unsubscribed_event_stays_unset(
    store: Store, open_at: Callable[..., Store]
) -> None:
    writer = open_at()
    writer.reserve(**reserve_args("run-1"))
    with store.changes.subscription("events") as events:
        settle(events)
        gone = threading.Event()
        store.changes.subscribe("events", gone)
        store.changes.unsubscribe("events", gone)
        gone.clear()
        writer.record_event(run_id="run-1", workflow_ref="x", type="note", payload={"n": 1})
        assert woken(events)
        assert not gone.is_set()
    assert [e.type for e in store.events_after(0)] == ["run.queued", "note"]


def test_notices__the_feed_listens_while_anyone_subscribes_and_wakes_a_returning_subscriber(
    store: Store, open_at: Callable[..., Store]
) -> None:
    writer = open_at()
    runs = threading.Event()
    assert not store.changes.listening
    store.changes.subscribe("runs", runs)
    settle(runs)
    assert store.changes.listening
    store.changes.unsubscribe("runs", runs)
    assert not store.changes.listening
    writer.reserve(**reserve_args("run-1"))
    runs.clear()
    with store.changes.subscription("runs") as back:
        assert store.changes.listening
        writer.reserve(**reserve_args("run-2", origin_session_id="session-2"))
        assert woken(back)
    assert not runs.is_set(), "an unsubscribed event was woken"
    assert not store.changes.listening


def test_notices__a_sqlite_watcher_does_not_poll_while_nobody_subscribes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls: list[int] = []
    read = SqliteWatcher._read

    def counted(watcher: SqliteWatcher) -> int:
        polls.append(1)
        return read(watcher)

    monkeypatch.setattr(SqliteWatcher, "_read", counted)
    url = f"sqlite:///{tmp_path / 'quiet.db'}"
    with open_store(url) as store, open_store(url) as writer:
        with store.changes.subscription("runs") as runs:
            settle(runs)
        writer.reserve(**reserve_args("run-1"))  # ends the poll under way when the last one left
        time.sleep(0.2)
        resting = len(polls)
        for n in range(2, 12):
            writer.reserve(**reserve_args(f"run-{n}", origin_session_id=f"session-{n}"))
            time.sleep(0.03)
        assert len(polls) == resting, "the watcher polled with nobody subscribed"
        with store.changes.subscription("runs") as back:
            assert woken(back), "the change made while it rested wakes the next subscriber"
        assert len(polls) > resting


def test_notices__an_unknown_channel_is_refused(store: Store) -> None:
    with pytest.raises(InvalidInput, match="Unknown change channel"):
        store.changes.subscribe("everything", threading.Event())


def test_notices__closing_the_store_stops_its_watcher(open_at: Callable[..., Store]) -> None:
    store = open_at()
    with store.changes.subscription("runs") as runs:
        settle(runs)
    watcher = store.changes._thread
    assert watcher is not None and watcher.is_alive()
    store.close()
    assert not watcher.is_alive()
    store.changes.subscribe("runs", threading.Event())
    assert store.changes._thread is watcher, "a closed store starts no new watcher"


# -- schema versions ------------------------------------------------------------------------------
def test_schema__an_opened_store_is_at_the_latest_version(store: Store, store_url: str) -> None:
    latest = migrations(store.db.backend)[-1][0]
    assert schema_version(store_url) == (latest, latest)
    with open_store(store_url, migrate=False) as current:
        assert current.get_run("nothing") is None


def test_schema__migrate_false_refuses_a_missing_sqlite_store_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "none.db"
    with pytest.raises(SchemaOutdated, match="tether db upgrade"):
        open_store(f"sqlite:///{path}", migrate=False)
    assert not path.exists() and not path.parent.exists()
    with pytest.raises(SchemaOutdated):
        schema_version(f"sqlite:///{path}")
    with pytest.raises(InvalidInput, match="migrate must be True or False"):
        open_store(f"sqlite:///{path}", migrate="no")  # type: ignore[arg-type]
    assert not path.exists()


def test_schema__db_upgrade_creates_the_store_and_db_status_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    latest = migrations("sqlite")[-1][0]
    assert cli_main(["--store", url, "db", "status"]) == 1
    assert "tether db upgrade" in capsys.readouterr().err
    assert cli_main(["--store", url, "db", "upgrade"]) == 0
    assert f"schema version {latest}" in capsys.readouterr().out
    assert cli_main(["--store", url, "--no-migrate", "db", "status", "--json"]) == 0
    assert '"current": true' in capsys.readouterr().out
    assert cli_main(["--store", url, "--no-migrate", "runs"]) == 0
