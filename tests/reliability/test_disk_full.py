"""A database that cannot be written: a full disk (a small tmpfs) and a read-only file system (the
tmpfs remounted read-only). Each refused write is one of Tether's errors with a message that says
why, and writes nothing; once the condition clears (the tmpfs grows, or is remounted read-write)
the same store works again and nothing committed before is lost.

Needs root to mount a tmpfs (the suite runs as root); elsewhere these tests skip.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability import oracle
from tests.store.conftest import LEASE, at, reserve_args, snapshot
from tether import open_store
from tether.errors import StoreError, TetherError
from tether.store import Store


def mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def make_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount a tmpfs of the given size for this test (unmounted at teardown)."""
    mounted: list[Path] = []

    def make(size: str) -> Path:
        folder = tmp_path / f"disk-{len(mounted)}"
        folder.mkdir()
        done = mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    try:
        yield make
    finally:
        for folder in mounted:
            mount("-o", "remount,rw", str(folder))
            subprocess.run(["umount", "-l", str(folder)], check=False)


def reserve(store: Store, run_id: str, size: int) -> None:
    store.reserve(
        **reserve_args(run_id, origin_session_id=f"session-{run_id}", input={"pad": "x" * size}, now=at(1))
    )


@pytest.mark.slow
def test_disk_full__refused_writes_say_why_and_write_nothing_then_the_store_recovers(
    make_disk: Callable[[str], Path], seed: int
) -> None:
    disk = make_disk("1m")
    rng = random.Random(seed)
    store = open_store(f"sqlite:///{disk}/tether.db")
    history = oracle.History(seed=seed, drained=False, min_rejections=0)
    errors: list[TetherError] = []
    n = 0
    while len(errors) < 5 and n < 500:
        run_id = f"run-{n}"
        n += 1
        before = snapshot(store)
        try:
            reserve(store, run_id, rng.randrange(10_000, 60_000))
        except TetherError as error:
            errors.append(error)
            assert snapshot(store) == before, "a write refused for a full disk left rows behind"
            continue
        history.reserved.add(run_id)
    assert errors, "the disk never filled"
    assert all(isinstance(e, StoreError) for e in errors), errors
    assert all("full" in str(e) for e in errors), [str(e) for e in errors]
    accepted = sorted(history.reserved)
    assert len(accepted) >= 3
    # A claim and an event on a full disk: refused with the same clear error, or accepted whole.
    token = "tok-full"
    try:
        if store.claim(run_id=accepted[0], runner_id="host-a", claim_token=token, lease_ms=LEASE, now=at(2)):
            history.tokens.add(token)
    except StoreError as error:
        assert "full" in str(error)
    oracle.check(store, history)

    assert mount("-o", "remount,size=64m", str(disk)).returncode == 0
    # The condition cleared: the same store object takes the refused write, nothing was lost.
    failed = f"run-{n}"
    reserve(store, failed, 60_000)
    history.reserved.add(failed)
    assert {r.run_id for r in store.list_runs()} == history.reserved
    store.close()
    again = open_store(f"sqlite:///{disk}/tether.db")
    oracle.check(again, history)
    again.close()


@pytest.mark.slow
def test_read_only_disk__opening_and_writes_refused_with_a_clear_error_then_the_store_recovers(
    make_disk: Callable[[str], Path], seed: int
) -> None:
    disk = make_disk("16m")
    url = f"sqlite:///{disk}/tether.db"
    store = open_store(url)
    history = oracle.History(seed=seed, drained=False, min_rejections=0)
    for n in range(3):
        reserve(store, f"run-{n}", 1000)
        history.reserved.add(f"run-{n}")
    token = "tok-ro"
    assert store.claim(run_id="run-0", runner_id="host-a", claim_token=token, lease_ms=LEASE, now=at(2))
    history.tokens.add(token)
    before = snapshot(store)
    store.close()

    # The file system turns read-only (a remount needs no file open for writing on it).
    assert mount("-o", "remount,ro", str(disk)).returncode == 0
    refusals: list[str] = []
    for attempt in range(3):
        try:
            other = open_store(url)
        except TetherError as error:
            assert isinstance(error, StoreError), error
            refusals.append(str(error))
            continue
        try:  # it opened (reads may work): every write is refused
            with pytest.raises(StoreError) as refused:
                reserve(other, f"run-ro-{attempt}", 10)
            refusals.append(str(refused.value))
        finally:
            other.close()
    assert all("read-only" in text for text in refusals), refusals

    assert mount("-o", "remount,rw", str(disk)).returncode == 0
    store = open_store(url)
    assert snapshot(store) == before, "the read-only period changed the database"
    # Nothing was lost: the claim taken before still holds, and writes go through again.
    assert store.mark_running(run_id="run-0", claim_token=token, now=at(6))
    reserve(store, "run-new", 1000)
    history.reserved.add("run-new")
    oracle.check(store, history)
    store.close()
