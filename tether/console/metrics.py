"""``/metrics`` in Prometheus' text format, from the store, computed when scraped.

Two kinds of figures:

- what the store holds now (gauges read at each scrape): runs in each active queue status, the
  number of runs stored, the age of the oldest queued run, open decisions, pending input requests
  and ambiguous effects;
- what happened since this console started (counters fed from the journal, which the console
  reads on from where the previous scrape stopped): journal events by type, steps started and
  finished by workflow, node kind and outcome, step durations and lease takeovers; and the
  console's own notification deliveries by outcome.

Nothing here runs inside a worker unless asked: ``tether worker --metrics-port`` serves a worker's
own counts (``WorkerCounts``: runs claimed, takeovers, writes refused for a stale claim, leases
lost), which only the worker knows; a worker without it pays one addition per count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tether.client import Tether
from tether.console.notify import Notifier
from tether.engine.runner import Runner
from tether.engine.worker.state import Tally
from tether.store import QueueStatus
from tether.store.states import QUEUE_TERMINAL

#: Queue statuses a run holds while it is not finished (finished runs are counted in the total).
ACTIVE_STATUSES = tuple(s.value for s in QueueStatus if s not in QUEUE_TERMINAL)
#: Journal events read per scrape at most (a first scrape of a busy store catches up over several).
CATCH_UP_LIMIT = 50_000
STEP_OUTCOMES = {
    "node.completed": "completed",
    "node.failed": "failed",
    "node.timed_out": "timed_out",
    "node.interrupted": "interrupted",
}


class StoreGauges:
    """A collector that reads the store's current figures at each scrape."""

    def __init__(self, tether: Tether) -> None:
        self.tether = tether

    def collect(self) -> Iterable[Metric]:
        store = self.tether.store
        runs = GaugeMetricFamily("tether_runs", "Runs in each active queue status", labels=["status"])
        oldest: datetime | None = None
        for status in ACTIVE_STATUSES:
            records = store.list_runs(statuses=[status])
            runs.add_metric([status], len(records))
            if status == "queued" and records:
                oldest = min(r.created_at for r in records)
        yield runs
        yield GaugeMetricFamily("tether_runs_stored", "Runs in the store", value=store.list_revision().total)
        age = 0.0 if oldest is None else max(0.0, (store.now() - oldest).total_seconds())
        yield GaugeMetricFamily(
            "tether_queue_oldest_age_seconds",
            "Age of the oldest queued run (0 when none is queued)",
            value=age,
        )
        yield GaugeMetricFamily(
            "tether_open_decisions",
            "Decisions waiting for a person",
            value=len(store.decisions(open_only=True)),
        )
        yield GaugeMetricFamily(
            "tether_pending_input_requests",
            "Input requests waiting for their session",
            value=len(store.requests(status="pending")),
        )
        yield GaugeMetricFamily(
            "tether_ambiguous_effects",
            "Effects waiting for an operator's decision",
            value=len(store.effects(status="ambiguous")),
        )


class Deliveries:
    """A collector of the console's notification deliveries, by outcome (delivered, failed)."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "tether_notification_deliveries",
            "Webhook deliveries finished since the console started, by outcome",
            labels=["outcome"],
        )
        for outcome, count in sorted(self.notifier.outcomes().items()):
            family.add_metric([outcome], count)
        yield family


class WorkerCounts:
    """A collector of one worker's own counts (``Tally``), labelled with its runner id."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def collect(self) -> Iterable[Metric]:
        counts = self.runner.tally.counts()
        for name, text in Tally.NAMES.items():
            family = CounterMetricFamily(f"tether_worker_{name}", text, labels=["runner_id"])
            family.add_metric([self.runner.runner_id], counts[name])
            yield family


def serve_worker_metrics(runner: Runner, port: int, host: str = "127.0.0.1") -> None:
    """Serve ``runner``'s counts at ``http://HOST:PORT/metrics`` from a background thread (no
    token: bind it where only the scraper reaches; nothing in it is secret)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(WorkerCounts(runner))
    start_http_server(port, addr=host, registry=registry)


class Metrics:
    """The console's metrics registry and the journal cursor that feeds its counters."""

    def __init__(self, tether: Tether, notifier: Notifier | None = None) -> None:
        self.tether = tether
        self.registry = registry = CollectorRegistry(auto_describe=True)
        registry.register(StoreGauges(tether))
        if notifier is not None:
            registry.register(Deliveries(notifier))
        self.takeovers = Counter(
            "tether_lease_takeovers",
            "Runs taken over from a runner that stopped mid-step (its lease lapsed)",
            registry=registry,
        )
        self.events = Counter(
            "tether_journal_events",
            "Journal events since the console started",
            ["type"],
            registry=registry,
        )
        self.steps_started = Counter(
            "tether_steps_started", "Steps started", ["workflow", "kind"], registry=registry
        )
        self.steps_finished = Counter(
            "tether_steps_finished",
            "Steps finished, by outcome",
            ["workflow", "kind", "outcome"],
            registry=registry,
        )
        self.durations = Histogram(
            "tether_step_duration_seconds",
            "Time from a step's start to its end, by outcome",
            ["workflow", "kind", "outcome"],
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600),
            registry=registry,
        )
        self._lock = threading.Lock()
        self._cursor = tether.store.last_event_seq()
        self._started: dict[str, datetime] = {}

    def _kind(self, workflow: str, node_id: str) -> str:
        registry = self.tether.registry
        if workflow in registry:
            node = registry.get(workflow).nodes.get(node_id)
            if node is not None:
                return node.kind
        return "unknown"

    def catch_up(self) -> None:
        """Count the journal events recorded since the last scrape."""
        store = self.tether.store
        with self._lock:
            read = 0
            while read < CATCH_UP_LIMIT:
                batch = store.events_after(self._cursor, limit=1000)
                for event in batch:
                    self._cursor = event.seq
                    self.events.labels(event.type).inc()
                    payload = event.payload if isinstance(event.payload, dict) else {}
                    # A takeover interrupts what the dead holder left running (a graceful
                    # stop's interrupted attempt carries no count).
                    if event.type == "node.interrupted" and "count" in payload:
                        self.takeovers.inc()
                    node_id, attempt_id = str(payload.get("nodeId", "")), str(payload.get("attemptId", ""))
                    if not node_id:
                        continue
                    workflow = event.workflow_ref.removeprefix("workflow:")
                    kind = self._kind(workflow, node_id)
                    if event.type == "node.started":
                        self.steps_started.labels(workflow, kind).inc()
                        if attempt_id:
                            self._started[attempt_id] = event.recorded_at
                    elif event.type in STEP_OUTCOMES:
                        outcome = STEP_OUTCOMES[event.type]
                        self.steps_finished.labels(workflow, kind, outcome).inc()
                        began = self._started.pop(attempt_id, None)
                        if began is not None:
                            seconds = (event.recorded_at - began).total_seconds()
                            self.durations.labels(workflow, kind, outcome).observe(max(0.0, seconds))
                read += len(batch)
                if len(batch) < 1000:
                    return

    def render(self) -> bytes:
        self.catch_up()
        return generate_latest(self.registry)
