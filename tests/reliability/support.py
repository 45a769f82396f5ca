"""Shared machinery of the reliability suite: the soak switch, the tracing runner, the recording
store proxy, runner processes and the operator, the append-only sinks and the soak report.

Worker processes write their records as JSON lines into one file per process (a SIGKILL can only
tear the last line of its own file, which readers skip).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from tests.integration.support import clean_env, stop_outside_write
from tether.engine.runner import Runner, _Active
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

    def _execute(self, active: _Active) -> None:
        CURRENT.run_id = active.run_id
        CURRENT.generation = active.run.claim_generation
        CURRENT.runner_id = self.runner_id
        try:
            super()._execute(active)
        finally:
            CURRENT.generation = None


#: Store calls that return a claim (and so issue a token).
CLAIM_CALLS = frozenset({"claim", "claim_next", "claim_for_control", "claim_for_interaction_validation"})


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
            elif token is not None and result is False:
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
        current = self._store.get_run(run_id)
        # The lease generation even when nobody holds the run (the record shows it only when owned).
        row = self._store.db.one("run_row", run_id=run_id)
        still_live = self._store.verify_claim(run_id=run_id, claim_token=token)
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


def wait_for(predicate: Any, *, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- runner processes -----------------------------------------------------------------------------
@dataclass
class Worker:
    slot: int
    name: str
    process: subprocess.Popen[bytes]
    stopped_until: float | None = None


@dataclass
class WorkerPool:
    """Runner processes (``tests.reliability.chaos_worker``) on one store, one per slot; the chaos
    driver kills, freezes and wakes them, and a slot whose process died gets a new one."""

    url: str
    db: Path
    records: Path
    lease_ms: int = 1500
    concurrency: int = 4
    max_takeovers: int = 10
    workers: list[Worker] = field(default_factory=list)
    spawned: int = 0
    kills: int = 0
    stops: int = 0
    deaths: int = 0
    stopped_pids: set[int] = field(default_factory=set)

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
                self.url,
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
        """SIGSTOP a runner at a moment it holds no write lock, for ``seconds``."""
        candidates = [w for w in self.workers if w.stopped_until is None and w.process.poll() is None]
        if len(candidates) <= 1:
            return
        victim = rng.choice(candidates)
        try:
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
                self.spawn(worker.slot)

    def shutdown(self) -> None:
        self.wake(everyone=True)
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
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
            "SELECT run_id, error_code FROM run_queue WHERE status = 'parked' "
            "AND error_code IN ('effectAmbiguous', 'runnerNoProgress')",
        )
        finished: set[str] | None = None
        for run_id, code in parked:
            try:
                if code == "effectAmbiguous":
                    if finished is None:
                        sink = read_lines(self.records.glob("sink-*.jsonl"))
                        finished = {r["key"] for r in sink if r.get("phase") == "end"}
                    for effect in store.effects(run_id=run_id, status="ambiguous"):
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
