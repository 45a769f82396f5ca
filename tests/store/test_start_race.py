"""Many callers start the same run id at the same moment: every one adopts the reservation one
of them made (or gets the field-by-field conflict when its preparation differs), on both
backends, from threads and from processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.store.conftest import reserve_args
from tether import open_store
from tether.errors import Conflict

REPO = Path(__file__).resolve().parents[2]

RACER = """
import json, sys
from tests.store.conftest import reserve_args
from tether import open_store
from tether.errors import TetherError
url, run_id, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = open_store(url)
import time
time.sleep(max(0.0, start_at - time.time()))
try:
    print(json.dumps(store.reserve_or_adopt(**reserve_args(run_id, execution_mode="headless")).state))
except TetherError as error:
    print(json.dumps(f"{type(error).__name__}: {error}"))
store.close()
"""


def race(store_url: str, run_id: str, racers: int, input_of: Any = lambda i: {"n": 1}) -> list[str]:
    """``racers`` threads, each with a store of its own, call reserve_or_adopt for ``run_id`` at
    once: each one's outcome ("reserved", "adopted") or its error."""
    stores = [open_store(store_url) for _ in range(racers)]
    barrier = threading.Barrier(racers)
    outcomes: list[str] = [""] * racers

    def racer(i: int) -> None:
        barrier.wait()
        try:
            args = reserve_args(run_id, execution_mode="headless", input=input_of(i))
            outcomes[i] = stores[i].reserve_or_adopt(**args).state
        except Exception as error:
            outcomes[i] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for store in stores:
        store.close()
    return outcomes


def test_start_race__threads_starting_one_run_id_all_adopt(store_url: str) -> None:
    for round_ in range(10):
        outcomes = race(store_url, f"run-race-{round_}", 10)
        assert sorted(outcomes) == ["adopted"] * 9 + ["reserved"], outcomes


def test_start_race__a_racer_with_another_preparation_gets_the_field_conflict(store_url: str) -> None:
    for round_ in range(5):
        outcomes = race(store_url, f"run-odd-{round_}", 6, lambda i: {"n": 2 if i == 0 else 1})
        assert outcomes.count("reserved") == 1, outcomes
        conflict = "Conflict: Workflow run preparation conflicts"
        if outcomes[0] == "reserved":  # the odd one won: every other racer conflicts
            assert all(o.startswith(conflict) for o in outcomes[1:]), outcomes
        else:
            assert outcomes[0].startswith(conflict), outcomes
            assert sorted(outcomes[1:]) == ["adopted"] * 4 + ["reserved"], outcomes


def test_start_race__processes_starting_one_run_id_all_adopt(store_url: str) -> None:
    import time

    open_store(store_url).close()  # migrated before the racers start
    start_at = time.time() + 2.0
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, store_url, "run-proc", str(start_at)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outcomes = [json.loads(racer.communicate(timeout=120)[0].strip().splitlines()[-1]) for racer in racers]
    assert sorted(outcomes) == ["adopted"] * 5 + ["reserved"], outcomes
    store = open_store(store_url)
    try:
        assert store.get_run("run-proc") is not None
        try:
            store.reserve(**reserve_args("run-proc", execution_mode="headless"))
        except Conflict as error:
            assert str(error) == "Workflow run already reserved: run-proc"
        else:
            raise AssertionError("a second reserve must be refused")
    finally:
        store.close()
