"""Crash storm on PostgreSQL: runner processes with their own runner (host) ids, all on one
PostgreSQL database, killed, frozen and cut off from the database while they drain the queue.

The harness is the crash storm's (``run_storm``), with its mix of workflows (fan-outs and parallel
branches among them); only the store and the chaos differ. Each runner
process connects under its own ``application_name`` (the store URL's query string goes to libpq),
so the chaos driver finds its sessions in ``pg_stat_activity``. Besides SIGKILLing a random runner
(and starting another in its slot), the driver:

- ends runner sessions from an admin connection with ``pg_terminate_backend``: one session
  (preferably one inside a transaction), or every session of one runner process at once;
- SIGSTOPs a runner past its lease and ends its sessions caught inside a transaction (as
  ``idle_in_transaction_session_timeout`` would, so that it stalls itself, not the database),
  then SIGCONTs it: a holder that wakes after takeover, to dead connections;
- starts runs while the storm goes on, in transactions over several runs that also repeat the
  start of runs the runners hold: those meet the runners' row locks and get ``StoreBusy``, and are
  retried.

A runner must discard a connection whose session ended and carry on (or die and be replaced);
none may die by itself, and every error it logs must be a lost connection (or a claim gone after
one). Afterwards the oracle checks the database and what the processes recorded:
every run done, none completed twice (nor any item of its fan-outs), no write accepted from a
stale claim; then a sample of the
stale tokens is written with, as a zombie holder would, and every such write must be refused.

CI size: 5 runners and 1,500 runs (300 of them started during the storm): 1.5 to 2 minutes on the
shared two-core machine, which also runs the PostgreSQL server (while other suites ran there).
``--soak`` or ``TETHER_SOAK=1`` runs 10,000 runs and probes every stale token.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.reliability.support import CONNECTION_LOST, PgSessions, soak_report
from tests.reliability.test_crash_storm import Size, Storm, run_storm
from tests.store.conftest import _pg_empty

pytestmark = pytest.mark.slow

CI = Size(
    runners=5,
    runs=1500,
    kill_every=(1.5, 3.0),
    stop_every=(3.0, 5.0),
    terminate_every=(0.4, 1.0),
    chaos_seconds=90,
    drain_seconds=90,
    probes=400,
    feed_runs=300,
    feed_batch=10,
    feed_every=(1.5, 3.0),
    stop_timeout_s=10,
)
SOAK = Size(
    runners=6,
    runs=10_000,
    kill_every=(1.0, 2.0),
    stop_every=(3.0, 5.0),
    terminate_every=(0.3, 0.8),
    chaos_seconds=1200,
    drain_seconds=600,
    probes=-1,
    feed_runs=2000,
    feed_batch=10,
    feed_every=(1.5, 3.0),
)


def test_crash_storm_postgres__sessions_ended_and_runners_killed_lose_and_repeat_nothing(
    pg_database: str, tmp_path: Path, seed: int, soak: bool
) -> None:
    _pg_empty(pg_database)
    size = SOAK if soak else CI
    sessions = PgSessions(pg_database)
    pool, verdict, measured = run_storm(tmp_path, size, seed, Storm(pg_database, sessions=sessions))
    soak_report(
        "Crash storm on PostgreSQL",
        measured,
        [
            f"seed {seed}; {size.runners} runners x {size.concurrency} runs each, lease {size.lease_ms} ms; "
            "sessions ended with pg_terminate_backend."
        ],
    )
    died = "\n".join(
        f"--- {name} (exit status {status}):\n{pool.log_tail(name)}" for name, status in pool.died
    )
    assert pool.deaths == 0, f"runner process(es) died without being killed:\n{died}"
    # The runner logs a traceback where it parks a run for an operator (an error it did not
    # expect): under this storm that may only be a lost database session somewhere in the chain
    # (or, parking after one, a claim already gone). Anything else is a fault the operator's
    # resume would paper over.
    foreign = [
        f"{log}: {intro}\n    " + "\n    ".join(chain)
        for log, intro, chain in pool.logged_errors()
        if not any(re.search(CONNECTION_LOST, raised) for raised in chain)
        and not (chain and chain[-1].startswith("tether.errors.ClaimLost"))
    ]
    assert not foreign, "runners logged errors other than a lost connection:\n" + "\n".join(foreign[:20])
    # A lost session is passing trouble: the runner hands the run back for anyone to retry, it
    # does not park it for an operator.
    assert measured["runs parked for no progress"] == 0, measured
    assert pool.kills > 0 and pool.stops > 0, measured
    assert sessions.in_transaction > 0 and sessions.runners_cut > 0, (
        f"no session was ended inside a transaction, or no runner cut off whole: {measured}"
    )
    assert measured["connection errors the runners logged"] > 0, (
        f"no runner ever saw its database session end: the terminations did not bite ({measured})"
    )
    assert verdict.counts["takeovers"] > 0, "no run was taken over: the storm did not bite"
    assert measured["rejected after waking from SIGSTOP"] > 0, "no holder woke after a takeover"
    assert measured["rejected stale attempts by runners"] > 0, measured
    assert measured["stale tokens probed after the drain"] > 0, measured
    assert measured["runs started during the storm"] == size.feed_runs, measured
    assert measured["start batches refused StoreBusy (retried)"] > 0, (
        f"no transaction over several runs met a runner's lock: the contention did not bite ({measured})"
    )
    assert verdict.counts.get("queue_done", 0) == size.runs, (
        f"every run must end done: {measured['done / failed / cancelled']} (done / failed / cancelled)"
    )
