"""Concurrency limits in the store: claim_next takes a limited run only while its key has a free
slot; a slot is held while the run's lease is live (released by a park, a finish, a lapse);
racing claimers never exceed the cap; slot_waits says who waits for which key."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tether.errors import InvalidInput
from tether.store import RunLimit, RunRecord, Store

from .conftest import LEASE, at, reserve_args, rows, snapshot
from .test_concurrency import race

ACME = RunLimit("demo:customer_id=acme", 1)
GLOBEX = RunLimit("demo:customer_id=globex", 1)


def reserve_limited(store: Store, run_id: str, limit: RunLimit | None, now: int = 0) -> RunRecord:
    return store.reserve(**reserve_args(run_id, origin_session_id=f"s-{run_id}", limit=limit, now=at(now)))


def claim_next(store: Store, runner: str = "host-a", now: int = 10, **extra: object) -> str | None:
    record = store.claim_next(
        runner_id=runner, claim_token=f"tok-{runner}-{now}", lease_ms=LEASE, now=at(now), **extra
    )
    return None if record is None else record.run_id


def test_claim_next__skips_a_run_whose_key_has_no_free_slot(store: Store) -> None:
    reserve_limited(store, "acme-1", ACME, 0)
    reserve_limited(store, "acme-2", ACME, 1)
    reserve_limited(store, "globex-1", GLOBEX, 2)
    reserve_limited(store, "free", None, 3)
    assert claim_next(store, now=10) == "acme-1"
    # acme's one slot is held: the next in queue order of another key, then the unlimited run.
    assert claim_next(store, now=11, exclude_run_ids=["acme-1"]) == "globex-1"
    assert claim_next(store, now=12, exclude_run_ids=["acme-1", "globex-1"]) == "free"
    assert claim_next(store, now=13, exclude_run_ids=["acme-1", "globex-1", "free"]) is None


def test_claim_next__a_finished_or_parked_run_frees_its_slot(store: Store) -> None:
    reserve_limited(store, "acme-1", ACME, 0)
    reserve_limited(store, "acme-2", ACME, 1)
    reserve_limited(store, "acme-3", ACME, 2)
    assert claim_next(store, now=10) == "acme-1"
    assert claim_next(store, now=11, exclude_run_ids=["acme-1"]) is None
    assert store.park(run_id="acme-1", claim_token="tok-host-a-10", now=at(12))
    # Parked (for a person, a sleep, a backoff): it holds no slot, and acme-1 is next again.
    assert claim_next(store, now=13, exclude_run_ids=["acme-1"]) == "acme-2"
    assert store.complete(run_id="acme-2", claim_token="tok-host-a-13", now=at(14))
    assert claim_next(store, now=15, exclude_run_ids=["acme-1"]) == "acme-3"


def test_claim_next__a_lapsed_lease_frees_its_slot(store: Store) -> None:
    reserve_limited(store, "acme-1", ACME, 0)
    reserve_limited(store, "acme-2", ACME, 1)
    assert claim_next(store, "dead", now=10) == "acme-1"
    assert claim_next(store, "other", now=10 + LEASE - 1, exclude_run_ids=["acme-1"]) is None
    # The dead runner's lease lapsed: its slot is free (and its run may be taken over).
    assert claim_next(store, "other", now=10 + LEASE, exclude_run_ids=["acme-1"]) == "acme-2"


def test_claim_next__a_workflow_wide_cap_counts_every_run(store: Store) -> None:
    cap = RunLimit("demo", 2)
    for n in range(4):
        reserve_limited(store, f"run-{n}", cap, n)
    assert claim_next(store, "a", now=10) == "run-0"
    assert claim_next(store, "b", now=11) == "run-1"
    assert claim_next(store, "c", now=12) is None


def test_claim_next__keys_of_other_projects_are_counted_apart(
    store: Store, open_at: Callable[..., Store]
) -> None:
    other = open_at("other-project")
    reserve_limited(store, "acme-1", ACME, 0)
    reserve_limited(other, "acme-elsewhere", ACME, 1)
    assert claim_next(store, now=10) == "acme-1"
    assert claim_next(other, now=11) == "acme-elsewhere"


def test_race__claimers_of_one_key_never_exceed_its_cap(store: Store, open_at: Callable[..., Store]) -> None:
    cap = RunLimit("demo:tenant=t", 2)
    claimers = [open_at() for _ in range(4)]
    for round_number in range(5):
        with store.transaction():
            for n in range(6):
                reserve_limited(store, f"r{round_number}-{n}", cap, round_number * 100 + n)
        now = round_number * 100 + 50

        def claim(i: int, now: int = now) -> str | None:
            return claim_next(claimers[i], f"host-{i}", now=now)

        claimed = [run for run in race(4, claim) if run is not None]
        held = rows(
            store,
            "SELECT count(*) FROM run_queue q JOIN runs r ON r.run_id = q.run_id "
            "JOIN leases l ON l.resource_id = r.resource_id "
            "WHERE q.limit_key = ? AND l.owner_id IS NOT NULL AND q.finished_at IS NULL",
            cap.key,
        )[0][0]
        assert len(claimed) <= 2 and held <= 2, (round_number, claimed, held)
        for run_id in claimed:
            token = next(
                f"tok-host-{i}-{now}"
                for i in range(4)
                if store.verify_claim(run_id=run_id, claim_token=f"tok-host-{i}-{now}", now=at(now))
            )
            assert store.complete(run_id=run_id, claim_token=token, now=at(now + 1))
        for n in range(6):
            run = store.get_run(f"r{round_number}-{n}")
            if run is not None and run.status == "queued":
                assert store.cancel(run_id=run.run_id, now=at(now + 2))


def test_slot_waits__names_the_key_and_the_slots_in_use(store: Store) -> None:
    reserve_limited(store, "acme-1", ACME, 0)
    reserve_limited(store, "acme-2", ACME, 1)
    reserve_limited(store, "globex-1", GLOBEX, 2)
    reserve_limited(store, "free", None, 3)
    assert store.slot_waits(["acme-1", "acme-2", "globex-1", "free"], now=at(5)) == {}
    assert claim_next(store, now=10) == "acme-1"
    waits = store.slot_waits(["acme-1", "acme-2", "globex-1", "free"], now=at(11))
    assert list(waits) == ["acme-2"]
    assert waits["acme-2"].text == "waiting for a slot of customer_id=acme (1 of 1 in use)"
    assert store.slot_waits(["acme-2"], now=at(10 + LEASE)) == {}


def test_reserve__stores_the_limit_with_the_run(store: Store) -> None:
    reserve_limited(store, "acme-1", ACME)
    reserve_limited(store, "free", None)
    found = rows(store, "SELECT run_id, limit_key, limit_max FROM run_queue ORDER BY run_id")
    assert [tuple(r) for r in found] == [("acme-1", "demo:customer_id=acme", 1), ("free", None, None)]


@pytest.mark.parametrize(
    ("key", "cap"), [("", 1), ("1bad", 1), ("demo", 0), ("demo", True), ("demo:" + "x" * 600, 1)]
)
def test_run_limit__refuses_a_bad_key_or_cap(key: str, cap: int) -> None:
    with pytest.raises(InvalidInput):
        RunLimit(key, cap)


def test_claim__a_run_by_id_needs_a_free_slot_too_but_a_control_claim_does_not(store: Store) -> None:
    reserve_limited(store, "acme-1", ACME, 0)
    reserve_limited(store, "acme-2", ACME, 1)
    assert claim_next(store, now=10) == "acme-1"
    assert (
        store.claim(run_id="acme-2", runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(11))
        is None
    )
    control = store.claim_for_control(
        run_id="acme-2", runner_id="ctl", claim_token="tok-c", lease_ms=LEASE, now=at(12)
    )
    assert control is not None and control.status == "queued"


def test_reserve__refuses_a_limit_of_another_workflow_and_writes_nothing(store: Store) -> None:
    before = snapshot(store)
    with pytest.raises(InvalidInput, match="does not belong to workflow demo"):
        reserve_limited(store, "acme-1", RunLimit("other:customer_id=acme", 1))
    assert snapshot(store) == before
