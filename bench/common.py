"""Shared pieces of the harness: statistics, progress counters, worker processes, PostgreSQL."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
SLOTS = 64


class BenchError(RuntimeError):
    """A workload could not produce its figure (a worker died, a drain timed out)."""


# -- statistics ------------------------------------------------------------------------------
def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (the samples are kept too)."""
    if not values:
        return {"median": None, "min": None, "max": None, "samples": []}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "samples": list(values),
    }


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values_ms)
    return {
        "p50_ms": statistics.median(ordered),
        "p99_ms": percentile(ordered, 0.99),
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
        "count": len(ordered),
    }


# -- progress counters shared with worker processes ------------------------------------------
class Counter:
    """Per-process slots of 64-bit counts in a memory-mapped file: each worker process bumps its
    own slot (under a lock, for threaded workers) and the parent reads the total without touching
    any database."""

    def __init__(self, path: Path, slot: int | None = None, *, create: bool = False) -> None:
        self.path = path
        self.slot = slot
        if create:
            path.write_bytes(b"\0" * 8 * SLOTS)
        self._file = open(path, "r+b")  # noqa: SIM115 - kept open for the mapping's lifetime
        self._map = mmap.mmap(self._file.fileno(), 8 * SLOTS)
        self._lock = threading.Lock()

    def bump(self) -> None:
        assert self.slot is not None
        offset = 8 * self.slot
        with self._lock:
            (value,) = struct.unpack_from("<Q", self._map, offset)
            struct.pack_into("<Q", self._map, offset, value + 1)

    def total(self) -> int:
        return sum(struct.unpack_from(f"<{SLOTS}Q", self._map, 0))

    def reset(self) -> None:
        self._map[:] = b"\0" * 8 * SLOTS

    def close(self) -> None:
        self._map.close()
        self._file.close()


# -- worker processes ------------------------------------------------------------------------
def python() -> str:
    return sys.executable


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def run_child(args: list[str], *, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m bench.worker ARGS`` to its end; its last stdout line is a JSON result."""
    done = subprocess.run(
        [python(), "-m", "bench.worker", *args],
        cwd=ROOT,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise BenchError(f"bench.worker {args[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"bench.worker {args[0]} printed no result: {done.stdout[-500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


class Worker:
    """A worker process started with ``python -m bench.worker work ...``: it prints ``ready`` once
    set up, waits for ``go`` on stdin, then runs its system's worker loop until SIGTERM."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [python(), "-m", "bench.worker", *args],
            cwd=ROOT,
            env=child_env(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_out(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready"):
                self._ready.set()
        self._ready.set()

    def _read_err(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.errors.append(line.rstrip("\n"))
            del self.errors[:-200]

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float) -> None:
        if not self._ready.wait(timeout) or self.process.poll() is not None:
            raise BenchError(f"worker did not start: {self.stderr_tail()}")

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr_tail(self) -> str:
        return "\n".join(self.errors[-30:])

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited in time. The exit status."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


def stop_all(workers: Sequence[Worker], timeout: float = 15.0) -> list[int]:
    """Stop workers together (SIGTERM to all first); their exit statuses."""
    for worker in workers:
        worker.terminate()
    return [worker.stop(timeout) for worker in workers]


def start_workers(
    args_for: list[list[str]], *, ready_timeout: float = 120.0, env: dict[str, str] | None = None
) -> list[Worker]:
    workers = [Worker(args, env) for args in args_for]
    try:
        for worker in workers:
            worker.wait_ready(ready_timeout)
    except BaseException:
        stop_all(workers, 5)
        raise
    return workers


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a live process in KiB, from /proc."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


# -- PostgreSQL ------------------------------------------------------------------------------
def pg_dsn(database: str) -> str:
    base, _, _ = PG_ADMIN.rpartition("/")
    return f"{base}/{database}"


def pg_available() -> str | None:
    """None when the server answers, else why it does not."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=5) as connection:
            connection.execute("SELECT 1")
    except Exception as error:
        return f"PostgreSQL at {PG_ADMIN} does not answer: {error}".strip()
    return None


def pg_setting(name: str) -> str:
    import psycopg

    with psycopg.connect(PG_ADMIN, connect_timeout=5) as connection:
        row = connection.execute(f"SHOW {name}").fetchone()
        return str(row[0]) if row else "?"


def pg_create(prefix: str) -> str:
    """Create a fresh database; its name."""
    import psycopg

    name = f"bench_{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return name


def pg_drop(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_count(database: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(pg_dsn(database), connect_timeout=5) as connection:
        row = connection.execute(sql).fetchone()
        return int(row[0]) if row else 0


def now_s() -> float:
    return time.perf_counter()


SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def sqlite_durability(connection: Any) -> str:
    """The ``synchronous`` setting a SQLite connection runs with, as a name."""
    value = connection.execute("PRAGMA synchronous").fetchone()[0]
    mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
    return f"synchronous={SQLITE_SYNCHRONOUS.get(int(value), value)}, journal_mode={mode}"


def copy_sqlite(source: Path, target: Path) -> None:
    """Copy a closed SQLite database with its write-ahead log and shared-memory files."""
    for suffix in ("", "-wal", "-shm"):
        found = Path(f"{source}{suffix}")
        if found.exists():
            shutil.copy(found, f"{target}{suffix}")
