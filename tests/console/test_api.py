"""The JSON API on both backends: runs, control, people's answers, effects, the journal and its
event stream, errors, and the OpenAPI document."""

from __future__ import annotations

import threading

from tests.console import workflows
from tests.console.conftest import Console, wait_until
from tether.console.api import ENDPOINTS, PREFIX
from tether.engine.clock import FakeClock
from tether.engine.graph import Workflow, compute, decision

API = PREFIX


def test_health_and_readiness_need_no_token(console: Console) -> None:
    assert console.anonymous.get("/healthz").json() == {"status": "ok"}
    assert console.anonymous.get("/readyz").json() == {"status": "ready"}


def test_start_is_idempotent_by_run_id_and_lists_filter(console: Console) -> None:
    first = console.api.post(f"{API}/runs", json={"workflow": "napping", "run_id": "nap-1"})
    assert first.status_code == 201 and first.json()["adopted"] is False
    again = console.api.post(f"{API}/runs", json={"workflow": "napping", "run_id": "nap-1"})
    assert again.status_code == 200 and again.json() == {
        "run_id": "nap-1",
        "status": "queued",
        "adopted": True,
    }
    console.start("hostile", run_id="other-2")

    listed = console.api.get(f"{API}/runs").json()
    assert [r["run_id"] for r in listed["runs"]] == ["other-2", "nap-1"]
    assert listed["total"] == 2
    by_workflow = console.api.get(f"{API}/runs", params={"workflow": "napping"}).json()
    assert [r["run_id"] for r in by_workflow["runs"]] == ["nap-1"]
    by_text = console.api.get(f"{API}/runs", params={"q": "HER"}).json()
    assert [r["run_id"] for r in by_text["runs"]] == ["other-2"]
    by_status = console.api.get(f"{API}/runs", params={"status": "done"}).json()
    assert by_status["runs"] == [] and by_status["total"] == 0
    revision = console.api.get(f"{API}/runs/revision").json()
    assert revision == {"total": 2, "revision": listed["revision"]}


def test_start_refusals_are_json_with_the_library_message(console: Console) -> None:
    unknown = console.api.post(f"{API}/runs", json={"workflow": "nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"
    assert "Unknown workflow 'nope'" in unknown.json()["error"]["message"]
    broken = console.api.post(
        f"{API}/runs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["error"]["code"] == "invalid_input"
    bad_id = console.api.post(f"{API}/runs", json={"workflow": "napping", "run_id": ""})
    assert bad_id.status_code == 422 and bad_id.json()["error"]["code"] == "invalid_input"
    missing = console.api.get(f"{API}/runs/no-such-run")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "not_found", "message": "Workflow run not found: no-such-run"}
    }
    assert console.api.get(f"{API}/runs").json()["total"] == 0


def test_start_checks_the_input_against_the_workflow_input_schema(console: Console) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    console.engine.register(
        Workflow("typed", start="a", nodes=[compute("a", lambda ctx: ctx.input)], input_schema=schema)
    )
    refused = console.api.post(f"{API}/runs", json={"workflow": "typed", "input": {"n": "one"}})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_input"
    assert "$.n: expected integer, got str" in refused.json()["error"]["message"]
    assert console.api.get(f"{API}/runs").json()["total"] == 0
    assert console.api.post(f"{API}/runs", json={"workflow": "typed", "input": {"n": 1}}).status_code == 201


def test_decision_answered_through_the_api_finishes_the_run(console: Console) -> None:
    console.engine.runner()
    run_id = console.start("approval", input={"version": "2.0"})
    decisions = wait_until(
        lambda: console.api.get(f"{API}/decisions", params={"run_id": run_id}).json()["decisions"],
        what="an open decision",
    )
    (decision,) = decisions
    assert decision["request"]["options"] == ["approve", "reject"]
    assert [d["decision_id"] for d in console.api.get(f"{API}/inbox").json()["decisions"]] == [
        decision["decision_id"]
    ]
    wrong = console.api.post(f"{API}/decisions/{decision['decision_id']}/answer", json={"response": "maybe"})
    assert wrong.status_code == 422
    assert wrong.json()["error"]["message"] == "Answer must be one of approve, reject"

    answered = console.api.post(
        f"{API}/decisions/{decision['decision_id']}/answer", json={"response": "approve"}
    )
    assert answered.status_code == 200 and answered.json()["outcome"] == "accepted"
    console.wait_status(run_id, "done")
    detail = console.api.get(f"{API}/runs/{run_id}").json()
    assert [(s["node_id"], s["state"]) for s in detail["steps"]] == [
        ("prepare", "completed"),
        ("approve", "completed"),
        ("ship", "completed"),
    ]
    assert detail["result"]["output"] == {"shipped": "2.0"}
    assert detail["decisions"][0]["actor_id"] == "console-operator"
    again = console.api.post(f"{API}/decisions/{decision['decision_id']}/answer", json={"response": "reject"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert (
        console.api.get(f"{API}/decisions", params={"all": "1"}).json()["decisions"][0]["response"]
        == "approve"
    )


def test_an_answer_after_the_decisions_deadline_is_refused_with_409(console: Console) -> None:
    """The store refuses it, whoever asks: the API says why, and the decision stays open for its
    timeout policy (the runner's own clock, not moved, sweeps no deadline meanwhile)."""
    console.engine.register(
        Workflow(
            "hurried",
            start="ask",
            nodes=[
                decision("ask", "Ship?", options=["approve", "reject"], deadline_s=0.2, default="reject"),
                compute("done", lambda ctx: ctx.outputs["ask"]["response"]),
            ],
            edges={"ask": "done"},
        )
    )
    console.engine.runner(clock=FakeClock(), lease_ms=60_000, renew_ms=20_000)
    run_id = console.start("hurried")
    (decision_row,) = wait_until(
        lambda: console.api.get(f"{API}/decisions", params={"run_id": run_id}).json()["decisions"],
        what="an open decision",
    )
    opened = console.client.decisions(run_id)[0]
    assert opened.deadline_at is not None
    wait_until(lambda: console.client.store.now() > opened.deadline_at, what="the deadline to pass")
    late = console.api.post(
        f"{API}/decisions/{decision_row['decision_id']}/answer", json={"response": "approve"}
    )
    assert late.status_code == 409
    error = late.json()["error"]
    assert error["code"] == "deadline_passed"
    assert error["message"].endswith('its deadline passed; the default "reject" applies')
    assert console.client.decisions(run_id)[0].outcome is None


def test_input_request_submission_is_checked_against_its_schema(console: Console) -> None:
    console.engine.runner()
    run_id = console.start("asked", session_id="chat-1")
    (request,) = wait_until(
        lambda: console.api.get(f"{API}/requests", params={"run_id": run_id}).json()["requests"],
        what="a pending input request",
    )
    url = f"{API}/requests/{request['request_id']}/submit"
    refused = console.api.post(url, json={"payload": {"name": ""}})
    assert refused.status_code == 422
    assert "does not match the request's schema" in refused.json()["error"]["message"]
    assert (
        console.api.get(f"{API}/requests", params={"run_id": run_id}).json()["requests"][0]["status"]
        == "pending"
    )
    accepted = console.api.post(url, json={"payload": {"name": "Ada"}})
    assert accepted.status_code == 200, accepted.text
    console.wait_status(run_id, "done")
    assert console.api.get(f"{API}/runs/{run_id}").json()["result"]["output"] == {"greeting": "hello Ada"}
    late = console.api.post(url, json={"payload": {"name": "Bob"}})
    assert late.status_code == 409


def test_cancel_pause_resume_restart(console: Console) -> None:
    console.engine.runner()
    run_id = console.start("napping")
    wait_until(lambda: console.status(run_id) == ("parked", "running"), what="the run to sleep")
    paused = console.api.post(f"{API}/runs/{run_id}/pause")
    assert paused.status_code == 409 and "cannot be paused" in paused.json()["error"]["message"]
    cancelled = console.api.post(f"{API}/runs/{run_id}/cancel")
    assert cancelled.json() == {"run_id": run_id, "outcome": "cancelled"}
    assert console.status(run_id)[0] == "cancelled"
    assert console.api.post(f"{API}/runs/{run_id}/cancel").status_code == 409
    assert console.api.post(f"{API}/runs/{run_id}/resume").status_code == 409
    restarted = console.api.post(f"{API}/runs/{run_id}/restart", json={"new_run_id": "nap-again"})
    assert restarted.json() == {"run_id": run_id, "outcome": "restarted", "new_run_id": "nap-again"}
    child = console.api.get(f"{API}/runs/nap-again").json()["run"]
    assert (child["parent_run_id"], child["lineage_kind"]) == (run_id, "restart")
    assert console.api.post(f"{API}/runs/{run_id}/explode").status_code == 404


def test_restart_from_a_node_forks_the_run_reusing_the_answered_decision(console: Console) -> None:
    console.engine.runner()
    run_id = console.start("approval", run_id="ship-1", input={"version": "2.1"})
    wait_until(lambda: console.status(run_id) == ("parked", "waiting"), what="the run to ask")
    (decision,) = console.api.get(f"{API}/decisions", params={"run_id": run_id}).json()["decisions"]
    answer = {"response": "approve"}
    assert (
        console.api.post(f"{API}/decisions/{decision['decision_id']}/answer", json=answer).status_code == 200
    )
    console.wait_status(run_id, "done")
    unknown = console.api.post(f"{API}/runs/{run_id}/restart", json={"from_node": "nope"})
    assert unknown.status_code == 422 and "has no node nope" in unknown.json()["error"]["message"]
    bad = console.api.post(f"{API}/runs/{run_id}/restart", json={"from_node": 3})
    assert bad.status_code == 422 and "from_node must be a string" in bad.json()["error"]["message"]
    forked = console.api.post(f"{API}/runs/{run_id}/restart", json={"from_node": "ship"})
    assert forked.json() == {"run_id": run_id, "outcome": "forked", "new_run_id": "ship-1-r1"}
    console.wait_status("ship-1-r1", "done")
    child = console.api.get(f"{API}/runs/ship-1-r1").json()
    # The person's answer is reused: the fork asked nobody and shipped the parent's version.
    assert [a["node_id"] for a in child["attempts"]] == ["prepare", "approve", "ship"]
    assert child["decisions"] == []
    assert child["result"]["output"] == {"shipped": "2.1"}


def test_effects_listed_and_an_ambiguous_one_resolved(console: Console) -> None:
    latch = console.engine.latch()
    console.engine.register(workflows.held_effect(latch))
    console.engine.runner()
    run_id = console.start("held")
    assert latch.entered.wait(10)
    assert console.api.post(f"{API}/runs/{run_id}/cancel").json()["outcome"] == "requested"
    console.wait_status(run_id, "cancelled")
    (effect,) = console.api.get(f"{API}/effects", params={"status": "ambiguous"}).json()["effects"]
    assert effect["run_id"] == run_id
    assert [e["effect_id"] for e in console.api.get(f"{API}/inbox").json()["effects"]] == [
        effect["effect_id"]
    ]
    url = f"{API}/effects/{effect['effect_id']}/resolve"
    assert console.api.post(url, json={"outcome": "perhaps"}).status_code == 422
    resolved = console.api.post(url, json={"outcome": "applied"})
    assert resolved.json()["status"] == "applied"
    assert console.api.post(url, json={"outcome": "applied"}).status_code == 409
    latch.release.set()


def _stream(console: Console, run_id: str, **headers: str) -> list[tuple[int, dict[str, object]]]:
    import json

    response = console.api.get(f"{API}/runs/{run_id}/events/stream", params={"follow": "0"}, headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    found = []
    for block in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in lines:
            found.append((int(lines["id"]), json.loads(lines["data"])))
    return found


def test_journal_and_its_event_stream_resume_from_last_event_id(console: Console) -> None:
    console.engine.runner()
    run_id = console.start("hostile")
    console.wait_status(run_id, "done")
    journal = console.api.get(f"{API}/runs/{run_id}/events").json()["events"]
    assert journal[0]["type"] == "run.queued" and len(journal) > 3
    streamed = _stream(console, run_id)
    assert [seq for seq, _ in streamed] == [e["seq"] for e in journal]
    assert [event["type"] for _, event in streamed] == [e["type"] for e in journal]
    # A browser reconnecting after the third event gets exactly the rest.
    resumed = _stream(console, run_id, **{"Last-Event-ID": str(journal[2]["seq"])})
    assert [seq for seq, _ in resumed] == [e["seq"] for e in journal[3:]]
    everything = console.api.get(f"{API}/events", params={"after": journal[0]["seq"]}).json()["events"]
    assert [e["seq"] for e in everything] == [e["seq"] for e in journal[1:]]
    bad = console.api.get(f"{API}/runs/{run_id}/events/stream", headers={"Last-Event-ID": "x"})
    assert bad.status_code == 422


def test_event_stream_follows_a_live_run(console: Console) -> None:
    """Followed from the start, the stream delivers every event of a run that finishes meanwhile."""
    run_id = console.start("approval")
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        with console.api.stream("GET", f"{API}/runs/{run_id}/events/stream") as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    seen.append(line)
                    if '"run.queue_done"' in line:
                        done.set()
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    console.engine.runner()
    (decision,) = wait_until(lambda: console.client.decisions(run_id), what="a decision")
    console.api.post(f"{API}/decisions/{decision.decision_id}/answer", json={"response": "approve"})
    assert done.wait(15), seen
    reader.join(5)
    journal = console.api.get(f"{API}/runs/{run_id}/events").json()["events"]
    assert len(seen) == len(journal)


def test_no_claim_token_in_any_response(console: Console) -> None:
    latch = console.engine.latch()
    console.engine.register(workflows.held_effect(latch))
    console.engine.runner()
    run_id = console.start("held")
    assert latch.entered.wait(10)
    for path in (f"{API}/runs", f"{API}/runs/{run_id}", f"{API}/runs/{run_id}/events", f"{API}/effects"):
        text = console.api.get(path).text
        assert "claim_token" not in text and "claim_generation" not in text
    assert console.status(run_id)[0] == "running"
    latch.release.set()


def test_openapi_document_describes_every_api_route(console: Console) -> None:
    document = console.api.get(f"{API}/openapi.json").json()
    assert document["openapi"].startswith("3.")
    described = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    served = {
        (method, route.path)
        for route in console.app.routes
        if getattr(route, "path", "").startswith(API)
        for method in (route.methods or ()) - {"HEAD"}  # type: ignore[attr-defined]
    }
    assert described == served
    assert len(served) == len(ENDPOINTS)
    assert {op["operationId"] for ops in document["paths"].values() for op in ops.values()}.__len__() == len(
        ENDPOINTS
    )


def test_every_read_route_answers_an_operator_and_a_reader(console: Console) -> None:
    console.engine.runner()
    run_id = console.start("hostile")
    console.wait_status(run_id, "done")
    reads = [e for e in ENDPOINTS if e.method == "GET"]
    assert len(reads) >= 12
    for endpoint in reads:
        path = API + endpoint.path.replace("{run_id}", run_id)
        for caller in (console.api, console.reader):
            response = caller.get(path, params={"follow": "0"} if endpoint.stream else None)
            assert response.status_code == 200, (path, response.text)
    names = [w["name"] for w in console.api.get(f"{API}/workflows").json()["workflows"]]
    assert names == sorted(w.name for w in workflows.ALL)


def test_an_event_sent_through_the_api_reaches_the_waiting_run(console: Console) -> None:
    from tether import wait_for_event

    console.engine.register(
        Workflow(
            "awaiting",
            start="go",
            nodes=[wait_for_event("go", "approved", schema={"type": "object", "required": ["by"]})],
        )
    )
    console.engine.runner()
    run_id = console.start("awaiting")
    refused = console.api.post(f"{API}/runs/{run_id}/events", json={"name": "approved", "payload": {}})
    assert refused.status_code == 422 and "by" in refused.json()["error"]["message"]
    assert console.reader.post(f"{API}/runs/{run_id}/events", json={"name": "approved"}).status_code == 403
    assert console.api.post(f"{API}/runs/{run_id}/events", json={"payload": 1}).status_code == 422
    sent = console.api.post(
        f"{API}/runs/{run_id}/events", json={"name": "approved", "payload": {"by": "ops"}}
    )
    assert sent.status_code == 201, sent.text
    assert sent.json()["event"]["name"] == "approved"
    console.wait_status(run_id, "done")
    run = console.api.get(f"{API}/runs/{run_id}").json()
    assert run["result"]["output"]["payload"] == {"by": "ops"}


def test_schedules_are_listed_paused_resumed_and_removed_through_the_api(console: Console) -> None:
    from tether.engine.schedules import Schedule

    console.engine.register(
        Workflow(
            "nightly",
            start="a",
            nodes=[compute("a", lambda ctx: 1)],
            schedules=[Schedule("0 2 * * *", name="night")],
        )
    )
    console.client.declare_schedules()
    added = console.client.add_schedule("napping", "30 6 * * 1-5", tz="Europe/Paris", name="morning")
    listed = console.reader.get(f"{API}/schedules")
    assert listed.status_code == 200, listed.text
    rows = {s["name"]: s for s in listed.json()["schedules"]}
    assert set(rows) == {"morning", "nightly:night"}
    morning = rows["morning"]
    assert (morning["workflow_name"], morning["cron"], morning["timezone"]) == (
        "napping",
        "30 6 * * 1-5",
        "Europe/Paris",
    )
    assert (morning["paused"], morning["origin"], morning["last_run_id"]) == (False, "added", None)
    assert morning["next_due_at"] == added.next_due_at.isoformat().replace("+00:00", "Z")
    assert rows["nightly:night"]["origin"] == "declared"

    # A reader may look but not change; an unknown action or name changes nothing.
    assert console.reader.post(f"{API}/schedules/morning/pause").status_code == 403
    unknown = console.api.post(f"{API}/schedules/morning/delete")
    assert (
        unknown.status_code == 404 and "Unknown schedule action: delete" in unknown.json()["error"]["message"]
    )
    absent = console.api.post(f"{API}/schedules/evening/pause")
    assert absent.status_code == 404
    assert "Schedule not found: evening" in absent.json()["error"]["message"]
    assert [s.paused for s in console.client.schedules()] == [False, False]

    paused = console.api.post(f"{API}/schedules/morning/pause")
    assert paused.json() == {"name": "morning", "outcome": "paused", "changed": True}
    assert console.client.schedule("morning").paused
    again = console.api.post(f"{API}/schedules/morning/pause")
    assert again.json() == {"name": "morning", "outcome": "paused already", "changed": False}
    assert console.api.get(f"{API}/schedules").json()["schedules"][0]["paused"] is True
    resumed = console.api.post(f"{API}/schedules/morning/resume")
    assert resumed.json()["outcome"] == "resumed" and not console.client.schedule("morning").paused

    # A schedule declared in code is paused, not removed.
    declared = console.api.post(f"{API}/schedules/nightly:night/remove")
    assert declared.status_code == 409, declared.text
    assert [s.name for s in console.client.schedules()] == ["morning", "nightly:night"]
    removed = console.api.post(f"{API}/schedules/morning/remove")
    assert removed.json() == {"name": "morning", "outcome": "removed", "changed": True}
    assert [s.name for s in console.client.schedules()] == ["nightly:night"]

    document = console.api.get(f"{API}/openapi.json").json()
    assert "get" in document["paths"][f"{API}/schedules"]
    assert "post" in document["paths"][f"{API}/schedules/{{name}}/{{action}}"]


def test_a_run_waiting_for_an_event_says_so_and_is_filtered_but_not_in_the_inbox(console: Console) -> None:
    console.engine.runner()
    waiting = console.start("shipping", run_id="ship-1")
    other = console.start("napping", run_id="nap-1")
    wait_until(
        lambda: (
            console.client.store.event_wait(waiting) is not None and console.status(waiting)[0] == "parked"
        ),
        what="the run to wait for its event",
    )
    console.wait_status(other, "parked")
    deadline = console.client.store.event_wait(waiting).deadline_at  # type: ignore[union-attr]
    assert deadline is not None

    listed = {r["run_id"]: r for r in console.api.get(f"{API}/runs").json()["runs"]}
    summary = listed[waiting]["summary"]
    assert summary.startswith(
        f"waiting for event delivered (times out at {deadline:%Y-%m-%d %H:%M:%S} UTC, in "
    )
    assert listed[waiting]["action"] == f"tether event send {waiting} delivered --payload JSON"
    assert listed[other]["summary"].startswith("sleeping until")

    only = console.api.get(f"{API}/runs", params={"status": "waiting_for_event"}).json()
    assert [r["run_id"] for r in only["runs"]] == [waiting] and only["total"] == 1

    detail = console.api.get(f"{API}/runs/{waiting}").json()
    assert detail["run"]["summary"] == summary
    assert detail["waiting_for_event"]["name"] == "delivered"
    assert console.api.get(f"{API}/runs/{other}").json()["waiting_for_event"] is None

    # It waits for a system, not a person: the inbox stays empty.
    assert console.api.get(f"{API}/inbox").json() == {"decisions": [], "requests": [], "effects": []}

    console.api.post(f"{API}/runs/{waiting}/events", json={"name": "delivered"})
    console.wait_status(waiting, "done")
    assert console.api.get(f"{API}/runs", params={"status": "waiting_for_event"}).json()["runs"] == []
    assert console.api.get(f"{API}/runs/{waiting}").json()["waiting_for_event"] is None
