"""Shared machinery of the reliability suite: the soak switch, the tracing runner, the recording
store proxy, runner processes and the operator, the append-only sinks and the soak report.

Worker processes write their records as JSON lines into one file per process (a SIGKILL can only
tear the last line of its own file, which readers skip).

The runner processes run on either backend: a SQLite file, or a PostgreSQL database where each
runner process connects under its own ``application_name`` so that ``PgSessions`` can find its
server sessions in ``pg_stat_activity`` and end them with ``pg_terminate_backend``.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.integration.support import clean_env, stop_outside_write
from tests.waiting import wait_until as wait_for  # noqa: F401 - imported from here by the harnesses
from tether.engine.runner import ActiveRun, Runner
from tether.errors import ClaimLost, TetherError
from tether.store import RunRecord, Store

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
#: Where step functions running in this process append their records (set per process).
DIR_ENV = "RELIABILITY_DIR"

#: The claim a run thread executes under (TracingRunner sets it; step functions read it).
CURRENT = threading.local()


def soak_enabled(config: Any = None) -> bool:
    if os.environ.get("TETHER_SOAK", "") not in ("", "0"):
        return True
    return bool(config is not None and config.getoption("--soak", default=False))


# -- append-only JSON-lines sinks -----------------------------------------------------------------
def append_line(path: Path, record: Mapping[str, Any]) -> None:
    """One JSON line, written with a single ``write`` on an O_APPEND descriptor."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_lines(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every complete JSON line of the files (a torn last line of a killed writer is skipped)."""
    records: list[dict[str, Any]] = []
    for path in sorted(paths):
        for line in path.read_text("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def process_file(kind: str, folder: Path | None = None) -> Path:
    base = folder if folder is not None else Path(os.environ[DIR_ENV])
    return base / f"{kind}-{os.getpid()}.jsonl"


def sink_dir() -> Path | None:
    raw = os.environ.get(DIR_ENV)
    return Path(raw) if raw else None


# -- the runner and the store as the suite observes them ------------------------------------------
class TracingRunner(Runner):
    """A Runner that exposes, to the step functions of a run thread, the lease generation the
    thread executes under: sinks key every record by (run id, generation)."""

    def _execute(self, active: ActiveRun) -> None:
        CURRENT.run_id = active.run_id
        CURRENT.generation = active.run.claim_generation
        CURRENT.runner_id = self.runner_id
        try:
            super()._execute(active)
        finally:
            CURRENT.generation = None

    def call_step(self, active: ActiveRun, fn: Callable[..., Any], *args: Any) -> Any:
        # The items of a fan-out and the branches of a parallel node run on threads of their node:
        # each call is told the claim it runs under, as the run thread is.
        held = getattr(CURRENT, "generation", None)
        CURRENT.generation = active.run.claim_generation
        try:
            return super().call_step(active, fn, *args)
        finally:
            CURRENT.generation = held


#: Store calls that return a claim (and so issue a token).
CLAIM_CALLS = frozenset({"claim", "claim_next", "claim_for_control", "claim_for_interaction_validation"})
#: Store calls that only read whether a token holds its run: False is an answer, not a refused
#: write. A runner asks after a claim transaction whose commit outcome it did not learn, and a
#: claim that did not land never held the run (its generation may be another runner's since).
CLAIM_READS = frozenset({"verify_claim"})


class RecordingStore:
    """A Store proxy for a runner: it remembers every token it was issued (token file, outside the
    logs) and records every claim-gated call the store refused, with the run's lease as it stood
    right after the refusal, so the oracle can tell a stale attempt from a wrongful refusal."""

    def __init__(self, store: Store, folder: Path) -> None:
        self._store = store
        self._folder = folder
        self._generations: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name.startswith("_") or not callable(attribute) or name == "transaction":
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            token = kwargs.get("claim_token")
            try:
                result = attribute(*args, **kwargs)
            except ClaimLost:
                if token is not None:
                    self._refused(name, kwargs, "ClaimLost")
                raise
            if name in CLAIM_CALLS:
                if isinstance(result, RunRecord) and token is not None:
                    self._issued(token, result)
            elif token is not None and result is False and name not in CLAIM_READS:
                self._refused(name, kwargs, "False")
            return result

        return call

    def _issued(self, token: str, record: RunRecord) -> None:
        with self._lock:
            self._generations[token] = int(record.claim_generation or 0)
        append_line(
            process_file("tokens", self._folder),
            {"token": token, "run_id": record.run_id, "generation": record.claim_generation},
        )

    def _refused(self, op: str, kwargs: Mapping[str, Any], how: str) -> None:
        token = str(kwargs["claim_token"])
        run_id = str(kwargs.get("run_id"))
        with self._lock:
            generation = self._generations.get(token)
        if generation is None:
            return  # not a token this process was issued (a tokenless control call)
        found = self._lease_after_refusal(run_id, token)
        if found is None:
            return
        current, row, still_live = found
        expires = current.claim_expires_at if current is not None else None
        append_line(
            process_file("rejections", self._folder),
            {
                "op": op,
                "how": how,
                "run_id": run_id,
                "generation": generation,
                "current_generation": None if current is None else current.claim_generation,
                "latest_generation": None if row is None else row["generation"],
                "current_status": None if current is None else current.status,
                "expired": expires is None or expires.timestamp() <= time.time(),
                "still_live": still_live,
                "pid": os.getpid(),
                "t": time.time(),
            },
        )

    def _lease_after_refusal(self, run_id: str, token: str) -> tuple[Any, Any, bool] | None:
        """The run, its lease row (the generation even when nobody holds the run: the record shows
        it only when owned) and whether ``token`` is live, read right after a refusal; None when
        they cannot be read three times running (a database session ended under the chaos): the
        refusal then stands for the runner and goes unrecorded rather than misrecorded."""
        for tries_left in (2, 1, 0):
            try:
                current = self._store.get_run(run_id)
                row = self._store.db.one("run_row", run_id=run_id)
                return current, row, self._store.verify_claim(run_id=run_id, claim_token=token)
            except TetherError:
                if not tries_left:
                    return None
                time.sleep(0.05)
        return None


# -- soak report --------------------------------------------------------------------------------
REPORT_ENV = "TETHER_SOAK_REPORT"


def soak_report(section: str, counts: Mapping[str, Any], notes: Iterable[str] = ()) -> None:
    """Append a section to the soak report named by TETHER_SOAK_REPORT (nothing without it)."""
    raw = os.environ.get(REPORT_ENV)
    if not raw:
        return
    path = Path(raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(f"# Reliability soak {date.today().isoformat()}\n\n", "utf-8")
    lines = [f"## {section}", "", "| count | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in counts.items()]
    lines += ["", *notes, ""]
    with path.open("a", encoding="utf-8") as report:
        report.write("\n".join(lines) + "\n")


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- runner processes -----------------------------------------------------------------------------
def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` set in its query string (replacing any of the same name)."""
    parts = urlsplit(url)
    pairs = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    return urlunsplit(parts._replace(query=urlencode([*pairs, *params.items()])))


#: What a runner logs when a database session ended under it (psycopg's words, through the store).
CONNECTION_LOST = (
    r"terminating connection due to administrator command|server closed the connection|"
    r"consuming input failed|connection is lost|the connection is closed|connection was closed"
)
#: What a runner logs when the store refused a call as ``StoreBusy`` (retry): the database was
#: locked past the lock timeout, or no pooled connection came free within the pool timeout.
STORE_BUSY = r"locked by another writer"
POOL_TIMEOUT = r"No database connection became free"
#: pg_stat_activity states of a session inside a transaction (it may hold row locks).
IN_TRANSACTION = ("active", "idle in transaction", "idle in transaction (aborted)", "fastpath function call")


@dataclass
class PgSessions:
    """The PostgreSQL server sessions of a WorkerPool's runner processes. Each runner process
    connects under its own ``application_name`` (``<prefix><runner id>``, passed through the store
    URL to libpq), so an admin connection finds its sessions in ``pg_stat_activity`` and ends them
    with ``pg_terminate_backend``, as a failover, an operator or a cut network would."""

    #: A superuser URL of the runners' database (the admin connection's).
    url: str
    prefix: str = "chaos-"
    #: Strikes made, sessions ended, and of those the ones caught inside a transaction.
    strikes: int = 0
    terminated: int = 0
    in_transaction: int = 0
    #: Whole runner processes whose every session was ended at once.
    runners_cut: int = 0
    #: Sessions ended because they were inside a transaction when their process was frozen.
    frozen_in_transaction: int = 0
    _admin: Any = None

    def application_name(self, runner_id: str) -> str:
        name = f"{self.prefix}{runner_id}"
        assert len(name) < 64, f"application_name {name!r} would be truncated by the server"
        return name

    def admin(self) -> Any:
        if self._admin is None or self._admin.closed:
            import psycopg

            self._admin = psycopg.connect(self.url, autocommit=True, application_name="chaos-admin")
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def sessions(self, runner_id: str | None = None) -> list[tuple[int, str, str | None]]:
        """(backend pid, application_name, state) of the runners' sessions (of one runner)."""
        pattern = self.prefix.replace("_", r"\_").replace("%", r"\%") + "%"
        return [
            (int(pid), str(name), state)
            for pid, name, state in self.admin().execute(
                "SELECT pid, application_name, state FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() AND "
                + ("application_name = %s" if runner_id is not None else "application_name LIKE %s"),
                (self.application_name(runner_id) if runner_id is not None else pattern,),
            )
        ]

    def terminate(self, pids: Iterable[tuple[int, str | None]]) -> int:
        ended = 0
        for pid, state in pids:
            (done,) = self.admin().execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
            if done:
                ended += 1
                self.terminated += 1
                self.in_transaction += state in IN_TRANSACTION
        return ended

    def strike(self, rng: random.Random, workers: Iterable[Worker]) -> int:
        """End the session of one runner process (one caught inside a transaction when there is
        one), or every session of one runner process; the number of sessions ended."""
        live = {w.name for w in workers if w.process.poll() is None}
        found = [s for s in self.sessions() if s[1][len(self.prefix) :] in live]
        if not found:
            return 0
        self.strikes += 1
        if rng.random() < 0.3:
            name = rng.choice(sorted({n for _, n, _ in found}))
            self.runners_cut += 1
            return self.terminate((pid, state) for pid, n, state in found if n == name)
        busy = [s for s in found if s[2] in IN_TRANSACTION]
        pid, _, state = rng.choice(busy or found)
        return self.terminate([(pid, state)])

    def freeze(self, process: subprocess.Popen[bytes], runner_id: str) -> None:
        """SIGSTOP a runner process and end each of its sessions caught inside a transaction, as
        ``idle_in_transaction_session_timeout`` or an operator would: the frozen process stands for
        a stalled runner, not a stalled database (its row locks are freed at once), and wakes to
        dead connections as well as to lost leases. Checked twice: a statement sent just before
        the stop may still reach the server."""
        os.kill(process.pid, signal.SIGSTOP)
        for _ in range(2):
            time.sleep(0.02)
            busy = [(pid, state) for pid, _, state in self.sessions(runner_id) if state in IN_TRANSACTION]
            self.frozen_in_transaction += self.terminate(busy)


@dataclass
class Worker:
    slot: int
    name: str
    process: subprocess.Popen[bytes]
    stopped_until: float | None = None


@dataclass
class WorkerPool:
    """Runner processes (``tests.reliability.chaos_worker``) on one store, one per slot; the chaos
    driver kills, freezes and wakes them, and a slot whose process died gets a new one.

    ``db`` is the SQLite file (None on PostgreSQL); ``sessions`` names each runner process's
    PostgreSQL sessions (None on SQLite)."""

    url: str
    db: Path | None
    records: Path
    lease_ms: int = 1500
    concurrency: int = 4
    max_takeovers: int = 10
    poll_ms: int = 50
    sessions: PgSessions | None = None
    workers: list[Worker] = field(default_factory=list)
    spawned: int = 0
    kills: int = 0
    stops: int = 0
    deaths: int = 0
    #: (runner id, exit status) of every runner process that died without being killed.
    died: list[tuple[str, int]] = field(default_factory=list)
    stopped_pids: set[int] = field(default_factory=set)
    #: How long the runners get to stop after SIGTERM; the ones still running then are killed.
    stop_timeout_s: float = 30
    killed_at_shutdown: list[str] = field(default_factory=list)

    def worker_url(self, name: str) -> str:
        if self.sessions is None:
            return self.url
        return with_query(self.url, application_name=self.sessions.application_name(name))

    def spawn(self, slot: int) -> Worker:
        self.spawned += 1
        name = f"host-s{slot}-{self.spawned}"
        log = open(self.records / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it open
        process = subprocess.Popen(
            [
                str(PYTHON),
                "-m",
                "tests.reliability.chaos_worker",
                "--store",
                self.worker_url(name),
                "--dir",
                str(self.records),
                "--runner-id",
                name,
                "--lease-ms",
                str(self.lease_ms),
                "--concurrency",
                str(self.concurrency),
                "--max-takeovers",
                str(self.max_takeovers),
                "--poll-ms",
                str(self.poll_ms),
            ],
            cwd=REPO,
            env=clean_env(**{DIR_ENV: str(self.records)}),
            stdout=log,
            stderr=log,
        )
        log.close()
        worker = Worker(slot, name, process)
        if slot < len(self.workers):
            self.workers[slot] = worker
        else:
            self.workers.append(worker)
        return worker

    def start(self, count: int) -> None:
        for slot in range(count):
            self.spawn(slot)

    def kill_one(self, rng: random.Random) -> None:
        candidates = [w for w in self.workers if w.stopped_until is None]
        if candidates:
            victim = rng.choice(candidates)
            victim.process.kill()
            victim.process.wait(timeout=10)
            self.kills += 1
            self.spawn(victim.slot)

    def stop_one(self, rng: random.Random, seconds: float) -> None:
        """SIGSTOP a runner for ``seconds``: on SQLite at a moment it holds no write lock; on
        PostgreSQL its sessions inside a transaction are ended (``PgSessions.freeze``)."""
        candidates = [w for w in self.workers if w.stopped_until is None and w.process.poll() is None]
        if len(candidates) <= 1:
            return
        victim = rng.choice(candidates)
        try:
            if self.sessions is not None:
                self.sessions.freeze(victim.process, victim.name)
            else:
                assert self.db is not None, "a SQLite pool needs its database file"
                stop_outside_write(victim.process, self.db)
        except AssertionError:
            return  # it held the write lock every time: another moment will do
        self.stops += 1
        self.stopped_pids.add(victim.process.pid)
        victim.stopped_until = time.monotonic() + seconds

    def wake(self, everyone: bool = False) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.stopped_until is not None and (everyone or now >= worker.stopped_until):
                os.kill(worker.process.pid, signal.SIGCONT)
                worker.stopped_until = None

    def respawn_dead(self) -> None:
        """A runner that died by itself (a poison run killed it) is replaced."""
        for worker in list(self.workers):
            if worker.process.poll() is not None:
                self.deaths += 1
                self.died.append((worker.name, int(worker.process.returncode)))
                self.spawn(worker.slot)

    def shutdown(self) -> None:
        self.wake(everyone=True)
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.killed_at_shutdown.append(worker.name)
                worker.process.send_signal(signal.SIGUSR1)  # its threads' stacks, into its log
                time.sleep(0.5)
                worker.process.kill()
                worker.process.wait(timeout=10)

    def history(self, history: Any) -> Any:
        """Fill an oracle History with what the processes recorded."""
        issued = read_lines(self.records.glob("tokens-*.jsonl"))
        history.tokens = {r["token"] for r in issued}
        history.issued = [(r["run_id"], r["token"], r["generation"]) for r in issued]
        history.rejections = read_lines(self.records.glob("rejections-*.jsonl"))
        history.sink = read_lines(self.records.glob("sink-*.jsonl"))
        history.logs = [
            *self.records.glob("*.log"),
            *self.records.glob("sink-*.jsonl"),
            *self.records.glob("rejections-*.jsonl"),
        ]
        return history

    def tracebacks(self) -> int:
        return sum(p.read_text(errors="replace").count("Traceback") for p in self.records.glob("*.log"))

    def log_lines(self, pattern: str) -> list[str]:
        """Lines of the runner logs that match the regular expression ``pattern``."""
        found = re.compile(pattern)
        return [
            line
            for path in sorted(self.records.glob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if found.search(line)
        ]

    def logged_errors(self) -> list[tuple[str, str, list[str]]]:
        """Every traceback the runners logged: (log file, the log line that introduced it, the
        exceptions of its chain, the one it ended in last)."""
        header = re.compile(r"^\d{4}-\d\d-\d\d \d")
        raised = re.compile(r"^(?!(?:CONTEXT|DETAIL|HINT|Traceback)\b)[A-Za-z_][\w.]*(?::|$)")
        found: list[tuple[str, str, list[str]]] = []
        for path in sorted(self.records.glob("*.log")):
            intro, chain, inside = "", [], False
            for line in [*path.read_text(errors="replace").splitlines(), "0000-00-00 0 (end)"]:
                if header.match(line):
                    if inside:
                        found.append((path.name, intro, chain))
                    intro, chain, inside = line, [], False
                elif line.startswith("Traceback"):
                    inside = True
                elif inside and raised.match(line):
                    chain.append(line)
        return found

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.records / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Operator:
    """Settles what a crash leaves for a person: an ambiguous effect is resolved ``applied`` when
    the world (the sink) shows it finished, else ``retry``; a run parked for an operator is put
    back in the queue."""

    records: Path
    applied: int = 0
    retried: int = 0
    resumed: int = 0

    def act(self, store: Store) -> None:
        from tests.store.conftest import rows

        parked = rows(
            store,
            "SELECT run_id FROM run_queue WHERE status = 'parked' "
            "AND error_code IN ('effectAmbiguous', 'runnerNoProgress')",
        )
        finished: set[str] | None = None
        for (run_id,) in parked:
            try:
                # A run parked for no progress can hold an ambiguous effect too (its runner lost
                # the database while it parked the run for the effect): resume refuses such a run
                # until the effect is resolved, so the effect comes first whatever the code.
                for effect in store.effects(run_id=run_id, status="ambiguous"):
                    if finished is None:
                        sink = read_lines(self.records.glob("sink-*.jsonl"))
                        finished = {r["key"] for r in sink if r.get("phase") == "end"}
                    outcome = "applied" if effect.idempotency_key in finished else "retry"
                    store.effect_resolve(effect_id=effect.effect_id, outcome=outcome)
                    if outcome == "applied":
                        self.applied += 1
                    else:
                        self.retried += 1
                if store.request_resume(run_id=run_id):
                    self.resumed += 1
            except TetherError:
                continue  # it moved on meanwhile; the next pass sees it again


def unfinished(store: Store) -> int:
    from tests.store.conftest import rows

    ((count,),) = rows(
        store, "SELECT count(*) FROM run_queue WHERE status NOT IN ('done', 'failed', 'cancelled')"
    )
    return int(count)
