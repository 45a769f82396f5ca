"""The web pages through a signed-in browser session (forms with the CSRF token): the runs list,
a run, the inbox and its forms for decisions with options or a schema and for input requests."""

from __future__ import annotations

import re

from tests.console.conftest import READER, Console, wait_until


def test_runs_list_filters_and_renders_its_live_part(console: Console) -> None:
    browser, _ = console.browser()
    console.start("napping", run_id="nap-a")
    console.start("hostile", run_id="loud-b")
    page = browser.get("/")
    assert page.status_code == 200
    assert page.text.index("loud-b") < page.text.index("nap-a")
    assert 'data-live="/"' in page.text
    filtered = browser.get("/", params={"workflow": "napping"})
    assert "nap-a" in filtered.text and "loud-b" not in filtered.text
    partial = browser.get("/", params={"partial": "1", "q": "loud"})
    assert "<html" not in partial.text and "loud-b" in partial.text and "nap-a" not in partial.text


def test_a_decision_with_options_is_answered_from_the_inbox(console: Console) -> None:
    console.engine.runner()
    browser, csrf = console.browser()
    run_id = console.start("approval")
    (decision,) = wait_until(lambda: console.client.decisions(run_id), what="a decision")
    inbox = browser.get("/inbox")
    assert "Ship this version?" in inbox.text
    buttons = re.findall(r'<button name="response" value="(\w+)"', inbox.text)
    assert buttons == ["approve", "reject"]
    answered = browser.post(
        f"/decisions/{decision.decision_id}/answer",
        data={"csrf": csrf, "next": "/inbox", "response": "approve"},
    )
    assert (answered.status_code, answered.headers["location"]) == (303, "/inbox?notice=answered")
    console.wait_status(run_id, "done")
    assert "Nothing waits for a person" in browser.get("/inbox").text
    page = browser.get(f"/runs/{run_id}")
    assert re.search(r'id="run-status">done<', page.text)
    assert page.text.count('data-state="completed"') == 3


def test_a_schema_decision_gets_a_generated_form(console: Console) -> None:
    console.engine.runner()
    browser, csrf = console.browser()
    run_id = console.start("sized")
    (decision,) = wait_until(lambda: console.client.decisions(run_id), what="a decision")
    inbox = browser.get("/inbox").text
    assert 'type="number" step="1" name="f.count" required' in inbox
    assert 'type="text" name="f.note"' in inbox
    url = f"/decisions/{decision.decision_id}/answer"
    too_small = browser.post(url, data={"csrf": csrf, "f.count": "0", "f.note": ""})
    assert too_small.status_code == 422 and "does not match the decision&#39;s schema" in too_small.text
    not_a_number = browser.post(url, data={"csrf": csrf, "f.count": "three"})
    assert not_a_number.status_code == 422 and "is not a valid integer" in not_a_number.text
    assert console.client.decisions(run_id)[0].outcome is None
    answered = browser.post(url, data={"csrf": csrf, "f.count": "3", "f.note": ""})
    assert answered.status_code == 303
    console.wait_status(run_id, "done")
    assert console.client.result(run_id).output == {"provenance": "human", "response": {"count": 3}}


def test_an_input_request_is_answered_from_the_inbox(console: Console) -> None:
    console.engine.runner()
    browser, csrf = console.browser()
    run_id = console.start("asked", session_id="chat-7")
    (request,) = wait_until(lambda: console.client.store.requests(run_id=run_id), what="an input request")
    inbox = browser.get("/inbox").text
    assert "Your name?" in inbox and 'name="f.name"' in inbox
    url = f"/requests/{request.request_id}/submit"
    refused = browser.post(url, data={"csrf": csrf, "f.name": ""})
    assert refused.status_code == 422
    submitted = browser.post(url, data={"csrf": csrf, "f.name": "Grace", "next": f"/runs/{run_id}"})
    assert submitted.headers["location"] == f"/runs/{run_id}?notice=submitted"
    console.wait_status(run_id, "done")
    assert console.client.result(run_id).output == {"greeting": "hello Grace"}


def test_a_run_page_cancels_and_restarts(console: Console) -> None:
    console.engine.runner()
    browser, csrf = console.browser()
    run_id = console.start("napping")
    wait_until(lambda: console.status(run_id)[0] == "parked", what="the run to sleep")
    page = browser.get(f"/runs/{run_id}")
    assert f'data-confirm="Cancel run {run_id}?"' in page.text
    assert f'data-stream="/api/v1/runs/{run_id}/events/stream"' in page.text
    assert "run.queued" in page.text
    cancelled = browser.post(f"/runs/{run_id}/cancel", data={"csrf": csrf, "next": f"/runs/{run_id}"})
    assert cancelled.status_code == 303
    after = browser.get(cancelled.headers["location"]).text
    assert "cancel: cancelled" in after and 'id="run-status">cancelled<' in after and "/restart" in after
    refused = browser.post(f"/runs/{run_id}/cancel", data={"csrf": csrf})
    assert refused.status_code == 409 and "already cancelled" in refused.text
    assert '<option value="nap">nap (reuse the steps before it)</option>' in after
    restarted = browser.post(f"/runs/{run_id}/restart", data={"csrf": csrf, "from_node": "nap"})
    assert restarted.status_code == 303 and restarted.headers["location"].endswith("?notice=forked")
    new_run = restarted.headers["location"].split("?")[0].rsplit("/", 1)[1]
    assert console.client.store.get_run_view(new_run) is not None
    assert console.client.lineage(new_run).from_node == "nap"


def test_the_run_page_and_api_show_a_running_steps_progress(console: Console) -> None:
    from tether.engine.graph import Workflow, compute

    latch = console.engine.latch()

    def copy(ctx):  # type: ignore[no-untyped-def]
        ctx.progress(3, 10, "copying <files>")
        latch.hold()

    console.engine.register(Workflow("copying", start="copy", nodes=[compute("copy", copy)]))
    console.engine.runner()
    run_id = console.start("copying")
    step = wait_until(
        lambda: (s := console.api.get(f"/api/v1/runs/{run_id}").json()["steps"][0])["progress"] and s,
        what="the step's progress in the API",
    )
    assert (step["progress"], step["fraction"]) == ("3/10 (30%) copying <files>", 0.3)
    page = console.api.get(f"/runs/{run_id}").text
    assert '<progress max="1" value="0.3">' in page
    assert "copying &lt;files&gt;" in page  # escaped like all run data
    latch.release.set()
    console.wait_status(run_id, "done")
    assert console.api.get(f"/api/v1/runs/{run_id}").json()["steps"][0]["progress"] is None


def test_a_fan_outs_items_are_counted_under_its_step_not_listed_one_by_one(console: Console) -> None:
    from tether.engine.graph import Workflow, fan_out

    console.engine.register(
        Workflow(
            "fanning",
            start="each",
            nodes=[fan_out("each", lambda ctx, item: item, items=lambda ctx: [1, 2, 3])],
        )
    )
    console.engine.runner()
    run_id = console.start("fanning")
    console.wait_status(run_id, "done")
    steps = console.api.get(f"/api/v1/runs/{run_id}").json()["steps"]
    assert [(s["node_id"], s["items_done"]) for s in steps] == [("each", 3)]
    page = console.api.get(f"/runs/{run_id}").text
    assert "3 items done" in page and "each[0]" not in page.split("<h2>Steps</h2>")[1].split("</ol>")[0]


def test_the_run_page_shows_an_agent_steps_conversation(console: Console) -> None:
    from tether.engine.graph import Workflow, agent
    from tether.engine.providers import ScriptedProvider, ToolCall, Turn, Usage

    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    model = ScriptedProvider(
        [Turn(calls=[ToolCall("add", {"a": 2, "b": 3})], usage=Usage(10, 5)), {"total": 5, "note": "<b>"}]
    )
    schema = {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}
    console.engine.register(
        Workflow(
            "adding", start="plan", nodes=[agent("plan", model, "Add 2 and 3", schema=schema, tools=[add])]
        )
    )
    console.engine.runner()
    run_id = console.start("adding")
    console.wait_status(run_id, "done")
    said = console.api.get(f"/api/v1/runs/{run_id}").json()["conversation"]
    assert [(m["who"], m["what"]) for m in said] == [
        ("user", "Add 2 and 3"),
        ("model", 'calls add({"a": 2, "b": 3})'),
        ("tool", "add → 5"),
        ("model", 'answers {"note": "<b>", "total": 5}'),
    ]
    assert said[1]["tokens"] == "10 in, 5 out"
    page = console.api.get(f"/runs/{run_id}").text
    assert "<h2>Conversation</h2>" in page and "calls add(" in page
    assert "&lt;b&gt;" in page and '"<b>"' not in page  # the model's words are escaped


def test_the_runs_list_and_run_page_say_a_run_waits_for_an_event(console: Console) -> None:
    console.engine.runner()
    browser, _ = console.browser()
    run_id = console.start("shipping", run_id="ship-7")
    wait_until(lambda: console.client.store.event_wait(run_id) is not None, what="the run to wait")
    console.wait_status(run_id, "parked")
    listed = browser.get("/")
    assert re.search(r'class="summary">waiting for event delivered \(times out at [^<]+\)<', listed.text)
    assert '<option value="waiting_for_event" >waiting for an event</option>' in listed.text
    filtered = browser.get("/", params={"status": "waiting_for_event"})
    assert "ship-7" in filtered.text
    page = browser.get(f"/runs/{run_id}")
    assert re.search(r'id="run-waiting">waiting: waiting for event delivered \(times out at', page.text)
    assert f"tether event send {run_id} delivered --payload JSON" in page.text
    assert "Nothing waits for a person" in browser.get("/inbox").text


def test_schedules_page_lists_them_and_operators_pause_resume_and_remove(console: Console) -> None:
    console.client.add_schedule("napping", "0 9 * * *", name="daily")
    console.client.add_schedule("hostile", "0 10 * * *", name="paused-one")
    console.client.pause_schedule("paused-one")
    browser, csrf = console.browser()
    page = browser.get("/schedules")
    assert page.status_code == 200
    assert 'href="/schedules" aria-current="page"' in page.text
    assert 'data-schedule="daily"' in page.text and "<code>0 9 * * *</code>" in page.text
    next_tick = console.client.schedule("daily").next_due_at.isoformat().replace("+00:00", "Z")
    assert f'<time datetime="{next_tick}">' in page.text
    assert 'action="/schedules/paused-one/resume"' in page.text
    assert 'action="/schedules/daily/pause"' in page.text

    refused = browser.post("/schedules/daily/pause", data={"next": "/schedules"})
    assert refused.status_code == 403 and not console.client.schedule("daily").paused
    paused = browser.post("/schedules/daily/pause", data={"csrf": csrf, "next": "/schedules"})
    assert (paused.status_code, paused.headers["location"]) == (303, "/schedules?notice=daily%3A%20paused")
    assert console.client.schedule("daily").paused
    browser.post("/schedules/paused-one/resume", data={"csrf": csrf})
    assert not console.client.schedule("paused-one").paused
    removed = browser.post("/schedules/daily/remove", data={"csrf": csrf, "next": "/schedules"})
    assert removed.status_code == 303
    assert [s.name for s in console.client.schedules()] == ["paused-one"]

    reader, reader_csrf = console.browser(READER)
    seen = reader.get("/schedules")
    assert 'data-schedule="paused-one"' in seen.text and "<form" not in seen.text.split("<main>")[1]
    assert reader.post("/schedules/paused-one/pause", data={"csrf": reader_csrf}).status_code == 403
    assert not console.client.schedule("paused-one").paused


def test_the_run_page_shows_the_text_a_model_streams_while_its_turn_runs(console: Console) -> None:
    from tests.engine.test_streaming_turns import FINAL, _SlowServer
    from tether.engine.graph import Workflow, agent
    from tether.engine.providers import OpenAICompatibleProvider

    slow = _SlowServer()
    try:
        model = OpenAICompatibleProvider(base_url=slow.url + "/v1", model="m", api_key="k", timeout_s=30)
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        console.engine.register(
            Workflow(
                "tides", start="think", nodes=[agent("think", model, "Tides?", schema=schema, max_turns=3)]
            )
        )
        console.engine.runner()
        run_id = console.start("tides")
        (live,) = wait_until(
            lambda: console.api.get(f"/api/v1/runs/{run_id}").json()["live_text"], what="streamed text"
        )
        # The server holds the rest back: the start of the answer shows, escaped, on the page.
        assert live["node_id"] == "think" and live["text"] and FINAL.startswith(live["text"])
        partial = console.api.get(f"/runs/{run_id}", params={"partial": "1"}).text
        assert '<li class="streaming" data-node="think">' in partial and "(writing)" in partial
        assert "&#34;answ" in partial or "&quot;answ" in partial
        slow.release.set()
        console.wait_status(run_id, "done")
    finally:
        slow.close()
    detail = console.api.get(f"/api/v1/runs/{run_id}").json()
    assert detail["live_text"] == [] and detail["conversation"][-1]["who"] == "model"
    assert 'class="streaming"' not in console.api.get(f"/runs/{run_id}").text
