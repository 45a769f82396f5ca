"""``/metrics``: the store's current figures and the steps counted from the journal since the
console started, in Prometheus' text format, behind a token like every other route."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.console.conftest import Console, wait_until


def samples(console: Console) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = console.reader.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_count_runs_steps_and_what_waits(console: Console) -> None:
    assert console.anonymous.get("/metrics").status_code == 401
    console.start("napping", run_id="queued-one")
    before = samples(console)
    assert before[("tether_runs", (("status", "queued"),))] == 1
    assert before[("tether_runs_stored", ())] == 1
    assert before[("tether_queue_oldest_age_seconds", ())] >= 0

    console.engine.runner()
    run_id = console.start("approval")
    wait_until(lambda: console.client.decisions(run_id), what="a decision")
    waiting = samples(console)
    assert waiting[("tether_open_decisions", ())] == 1
    assert waiting[("tether_steps_started_total", (("kind", "compute"), ("workflow", "approval")))] == 1
    finished = (
        "tether_steps_finished_total",
        (("kind", "compute"), ("outcome", "completed"), ("workflow", "approval")),
    )
    assert waiting[finished] == 1
    count = (
        "tether_step_duration_seconds_count",
        (("kind", "compute"), ("outcome", "completed"), ("workflow", "approval")),
    )
    assert waiting[count] == 1

    (decision,) = console.client.decisions(run_id)
    console.api.post(f"/api/v1/decisions/{decision.decision_id}/answer", json={"response": "approve"})
    console.wait_status(run_id, "done")
    after = samples(console)
    assert after[("tether_open_decisions", ())] == 0
    assert after[finished] == 2
    assert after[("tether_journal_events_total", (("type", "run.queue_done"),))] == 1
    assert after[("tether_runs", (("status", "queued"),))] == 0
    assert after[("tether_runs_stored", ())] == 2


def test_metrics_count_lease_takeovers(console: Console) -> None:
    run_id = console.start("hostile")
    store = console.client.store
    # A runner that starts the step and dies: its lease lapses with the step still running.
    assert store.claim(run_id=run_id, runner_id="host-dead", claim_token="dead-token", lease_ms=300)
    assert store.mark_running(run_id=run_id, claim_token="dead-token")
    store.set_run_status(run_id=run_id, claim_token="dead-token", status="running")
    store.attempt_start(run_id=run_id, claim_token="dead-token", node_id="emit")
    wait_until(
        lambda: not store.verify_claim(run_id=run_id, claim_token="dead-token"),
        what="the dead lease to lapse",
    )
    assert samples(console)[("tether_lease_takeovers_total", ())] == 0
    console.engine.runner()
    console.wait_status(run_id, "done")
    assert samples(console)[("tether_lease_takeovers_total", ())] == 1
