"""The interface every system under test provides: ``enqueue(n)`` and ``drain(workers)``.

A subclass says how to set its storage up (``prepare``), how to enqueue one run at a time in a
child process (``enqueue_here``), how its standard worker runs in a worker process
(``worker_here``) and how many runs are durably finished (``done_count``). The base class turns
that into timed measurements with real processes:

- ``enqueue(n)`` runs ``enqueue_here`` in a fresh process and times the enqueue loop alone (the
  imports and the connection are set up before the clock starts);
- ``drain(workers)`` starts that many worker processes, waits until each is set up, releases them
  at once and stops the clock when every run is finished: the workers' task functions bump a shared
  counter (no database traffic), and once it reaches ``n`` the system's own storage is asked until
  it reports all ``n`` runs finished.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from bench.common import BenchError, Counter, run_child, start_workers, stop_all


class Peer:
    """One system in one configuration (a backend and a durability setting)."""

    #: Registry key (see bench.peers.PEERS).
    key: ClassVar[str] = ""
    #: "sqlite" or "postgres".
    backend: ClassVar[str] = "sqlite"
    #: How the drain runs, for the results.
    worker_note: ClassVar[str] = ""
    #: Modules the system needs (a missing one is reported, not faked).
    requires: ClassVar[tuple[str, ...]] = ()

    def __init__(self, workdir: Path, options: dict[str, Any] | None = None) -> None:
        self.workdir = Path(workdir)
        self.options: dict[str, Any] = dict(options or {})

    # -- identity ---------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.key

    def spec(self) -> str:
        return json.dumps({"key": self.key, "workdir": str(self.workdir), "options": self.options})

    def settings(self) -> dict[str, Any]:
        """What the results record about this configuration."""
        return {"backend": self.backend, "worker": self.worker_note, **self.options}

    @classmethod
    def missing(cls) -> str | None:
        """Why the system cannot run here, or None."""
        import importlib.util

        for module in cls.requires:
            if importlib.util.find_spec(module) is None:
                return f"the {module} package is not installed in this environment"
        return None

    # -- parent side ------------------------------------------------------------------------
    def prepare(self) -> None:
        """Fresh storage for one measurement."""
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def done_count(self, counter: Counter, n: int) -> int:
        """Runs durably finished. By default the count the workers report once each task is
        finished (for systems that keep no record of a finished task)."""
        return counter.total()

    # -- child side -------------------------------------------------------------------------
    def setup_here(self) -> dict[str, Any]:
        """One-time schema work in a child process (before any enqueue)."""
        return {}

    def enqueue_here(self, n: int) -> dict[str, Any]:
        """Enqueue ``n`` no-op runs one at a time; returns ``seconds`` and what it observed."""
        raise NotImplementedError

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        """Set the worker up (imports, connections); return the loop that runs until SIGTERM."""
        raise NotImplementedError

    # -- the common interface ---------------------------------------------------------------
    def setup(self) -> dict[str, Any]:
        if type(self).setup_here is Peer.setup_here:
            return {}
        return run_child(["setup", self.spec()], timeout=300)

    def enqueue(self, n: int) -> dict[str, Any]:
        result = run_child(["enqueue", self.spec(), str(n)], timeout=max(300.0, n / 5))
        result["runs_per_s"] = n / result["seconds"]
        return result

    def drain(self, workers: int, n: int, *, timeout: float | None = None) -> dict[str, Any]:
        """Start ``workers`` worker processes, release them together, time until ``n`` runs are
        finished. Returns seconds, runs/s and the number of task executions seen."""
        counter_path = self.workdir / "counter.bin"
        counter = Counter(counter_path, create=True)
        limit = timeout if timeout is not None else max(180.0, n / 2)
        processes = start_workers(
            [["work", self.spec(), str(slot), str(counter_path)] for slot in range(workers)]
        )
        try:
            for process in processes:
                process.go()
            started = time.perf_counter()
            deadline = started + limit
            while counter.total() < n or self.done_count(counter, n) < n:
                if time.perf_counter() > deadline:
                    raise BenchError(
                        f"{self.label}: drain of {n} runs with {workers} worker(s) timed out after "
                        f"{limit:.0f} s ({counter.total()} executed, {self.done_count(counter, n)} done)"
                    )
                for process in processes:
                    if not process.alive():
                        raise BenchError(f"{self.label}: a worker died: {process.stderr_tail()}")
                time.sleep(0.002 if counter.total() < n else 0.005)
            seconds = time.perf_counter() - started
            executions = counter.total()
        finally:
            statuses = stop_all(processes)
            counter.close()
        return {
            "seconds": seconds,
            "runs_per_s": n / seconds,
            "executions": executions,
            "duplicates": max(0, executions - n),
            "worker_exit": statuses,
        }
