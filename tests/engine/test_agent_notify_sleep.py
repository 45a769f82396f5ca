"""Agent nodes through providers (scripted and an OpenAI-compatible HTTP endpoint), notify and
durable sleep."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from tether.engine.graph import Workflow, agent, compute, notify, sleep
from tether.engine.providers import OpenAICompatibleProvider, ProviderError, ScriptedProvider, ToolCall, Usage
from tether.errors import InvalidInput

from ..model_wire import events_for
from .conftest import Engine, wait_until

SUMMARY = {
    "type": "object",
    "properties": {"summary": {"type": "string", "minLength": 1}},
    "required": ["summary"],
}


# -- scripted provider -----------------------------------------------------------------------
def test_agent__schema_valid_output_completes_the_node(engine: Engine) -> None:
    model = ScriptedProvider([{"summary": "all good"}])
    wf = Workflow(
        "agent-ok",
        start="think",
        nodes=[agent("think", model, lambda ctx: f"Summarise {ctx.input['topic']}", schema=SUMMARY)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-ok", {"topic": "the release"})
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"summary": "all good"}
    assert model.prompts == ["Summarise the release"]


def test_agent__invalid_output_fails_the_node(engine: Engine) -> None:
    model = ScriptedProvider([{"summary": 42}])
    wf = Workflow("agent-bad", start="think", nodes=[agent("think", model, "Summarise", schema=SUMMARY)])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-bad")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "model output does not match the schema" in (result.error_message or "")
    assert "$.summary: expected string, got int" in (result.error_message or "")


def test_agent__invalid_output_is_retried(engine: Engine) -> None:
    model = ScriptedProvider([{"wrong": True}, lambda prompt: {"summary": f"ok: {prompt}"}])
    wf = Workflow(
        "agent-retry", start="think", nodes=[agent("think", model, "Summarise", schema=SUMMARY, retries=1)]
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-retry")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"summary": "ok: Summarise"}
    assert [a.status for a in engine.attempts(run.run_id)] == ["failed", "completed"]
    assert model.prompts == ["Summarise", "Summarise"]


def test_agent__provider_error_fails_the_node(engine: Engine) -> None:
    model = ScriptedProvider([])
    wf = Workflow("agent-empty", start="think", nodes=[agent("think", model, "Summarise", schema=SUMMARY)])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-empty")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "ProviderError: The scripted provider has no responses left" in (result.error_message or "")


# -- OpenAI-compatible provider ---------------------------------------------------------------
class _Endpoint:
    """A local chat-completions endpoint: answers from ``replies`` and records requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[tuple[int, bytes]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                endpoint.requests.append(
                    {
                        "path": self.path,
                        "auth": self.headers.get("Authorization"),
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                status, body = endpoint.replies.pop(0)
                asked = endpoint.requests[-1]["body"]
                if asked.get("stream") and status == 200:
                    # A streaming request gets the reply as server-sent events.
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for event in events_for(asked, json.loads(body)):
                        self.wfile.write(event)
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def reply(self, content: Any, status: int = 200) -> None:
        body = {"choices": [{"message": {"role": "assistant", "content": content}}]}
        self.replies.append((status, json.dumps(body).encode()))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def endpoint() -> Iterator[_Endpoint]:
    served = _Endpoint()
    try:
        yield served
    finally:
        served.close()


def test_openai_provider__sends_a_chat_completion_and_parses_json(endpoint: _Endpoint) -> None:
    endpoint.reply(json.dumps({"summary": "from the model"}))
    provider = OpenAICompatibleProvider(
        base_url=endpoint.url + "/", model="test-model", api_key="k-123", timeout_s=5
    )
    assert provider.complete("Summarise this", SUMMARY) == {"summary": "from the model"}
    (sent,) = endpoint.requests
    assert sent["path"] == "/v1/chat/completions"
    assert sent["auth"] == "Bearer k-123"
    body = sent["body"]
    assert body["model"] == "test-model"
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][-1] == {"role": "user", "content": "Summarise this"}
    assert json.dumps(SUMMARY) in body["messages"][0]["content"]


def test_openai_provider__http_error_raises_provider_error(
    endpoint: _Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    endpoint.replies.append((500, b'{"error": "boom"}'))
    provider = OpenAICompatibleProvider(base_url=endpoint.url, model="m", timeout_s=5, retries=0)
    with pytest.raises(ProviderError, match="answered HTTP 500: boom"):
        provider.complete("hi", SUMMARY)
    # Without a key (given or in OPENAI_API_KEY) a placeholder goes: the SDK always sends one.
    assert endpoint.requests[0]["auth"] == "Bearer no-key"


def test_openai_provider__non_json_content_raises_provider_error(endpoint: _Endpoint) -> None:
    endpoint.reply("this is not json")
    provider = OpenAICompatibleProvider(base_url=endpoint.url, model="m", timeout_s=5)
    with pytest.raises(ProviderError, match="not a JSON completion"):
        provider.complete("hi", SUMMARY)


def test_openai_provider__unreachable_endpoint_raises_provider_error() -> None:
    server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    provider = OpenAICompatibleProvider(base_url=f"http://127.0.0.1:{port}", model="m", timeout_s=2)
    with pytest.raises(ProviderError, match="could not be reached"):
        provider.complete("hi", SUMMARY)


def test_openai_provider__refuses_a_non_http_url() -> None:
    with pytest.raises(InvalidInput, match="http"):
        OpenAICompatibleProvider(base_url="ftp://example", model="m")


def test_agent__runs_through_the_http_provider(engine: Engine, endpoint: _Endpoint) -> None:
    endpoint.reply(json.dumps({"summary": "served"}))
    provider = OpenAICompatibleProvider(base_url=endpoint.url, model="m", timeout_s=5)
    wf = Workflow("agent-http", start="think", nodes=[agent("think", provider, "Summarise", schema=SUMMARY)])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-http")
    assert engine.wait(run.run_id).output == {"summary": "served"}
    assert len(endpoint.requests) == 1


def test_agent__http_error_fails_the_node(engine: Engine, endpoint: _Endpoint) -> None:
    endpoint.replies.append((503, b"{}"))
    provider = OpenAICompatibleProvider(base_url=endpoint.url, model="m", timeout_s=5, retries=0)
    wf = Workflow(
        "agent-http-err", start="think", nodes=[agent("think", provider, "Summarise", schema=SUMMARY)]
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-http-err")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "ProviderError: The model provider answered HTTP 503" in (result.error_message or "")


# -- notify ----------------------------------------------------------------------------------
def test_notify__queues_messages_to_the_origin_session(engine: Engine) -> None:
    wf = Workflow(
        "notify",
        start="hello",
        nodes=[notify("hello", "hello there"), notify("dynamic", lambda ctx: {"text": f"run {ctx.run_id}"})],
        edges={"hello": "dynamic"},
    )
    engine.register(wf)
    engine.runner()
    session = engine.client.session("session-notify")
    run = session.start("notify")
    result = engine.wait(run.run_id)
    assert result.output == {"delivered": True}
    messages = session.messages()
    assert [(m.kind, m.payload) for m in messages] == [
        ("notification", {"text": "hello there"}),
        ("notification", {"text": f"run {run.run_id}"}),
        ("terminal", {"status": "completed", "output": {"delivered": True}}),
    ]


def test_notify__a_headless_start_is_refused_and_writes_nothing(engine: Engine) -> None:
    wf = Workflow("notify-headless", start="hello", nodes=[notify("hello", "nobody listens")])
    engine.register(wf)
    with pytest.raises(InvalidInput, match=r"notify-headless talks to its run's session \(nodes hello\)"):
        engine.client.start("notify-headless", run_id="run-headless")
    assert engine.store.get_run("run-headless") is None
    assert engine.store.list_runs() == []


# -- sleep -----------------------------------------------------------------------------------
def test_sleep__parks_the_run_until_it_wakes(engine: Engine) -> None:
    seconds = 0.8
    wf = Workflow(
        "nap",
        start="rest",
        nodes=[sleep("rest", seconds), compute("after", lambda ctx: {"woke": True})],
        edges={"rest": "after"},
    )
    engine.register(wf)
    runner = engine.runner()
    started = time.monotonic()
    run = engine.client.start("nap")
    (rest,) = wait_until(lambda: engine.attempts(run.run_id, "rest"), what="the sleep node")
    assert rest.status == "completed"
    wake = datetime.fromisoformat(rest.output["wakeAt"])
    assert engine.statuses(run.run_id) == ("parked", "running")
    (available_at,) = engine.sql("SELECT available_at FROM run_queue WHERE run_id = ?", run.run_id)[0]
    assert abs(available_at - wake.timestamp() * 1000) <= 1
    assert rest.finished_at is not None
    assert (wake - rest.finished_at).total_seconds() >= seconds - 0.01
    # Nobody claims the run while it sleeps.
    assert engine.store.claim_next(runner_id="other", claim_token="t-other", lease_ms=1000) is None
    assert run.run_id not in runner.active_run_ids

    result = engine.wait(run.run_id)
    assert result.output == {"woke": True}
    assert time.monotonic() - started >= seconds
    after = engine.attempts(run.run_id, "after")[0]
    assert after.started_at >= wake


def test_sleep__as_the_last_node_still_sleeps_before_the_run_completes(engine: Engine) -> None:
    seconds = 0.6
    engine.register(Workflow("nap-last", start="rest", nodes=[sleep("rest", seconds)]))
    engine.runner()
    started = time.monotonic()
    run = engine.client.start("nap-last")
    (rest,) = wait_until(lambda: engine.attempts(run.run_id, "rest"), what="the sleep node")
    assert engine.statuses(run.run_id)[0] == "parked"
    result = engine.wait(run.run_id)
    assert result.status == "done" and result.output == {"wakeAt": rest.output["wakeAt"]}
    assert time.monotonic() - started >= seconds


def test_agent__a_failing_prompt_function_fails_the_node(engine: Engine) -> None:
    model = ScriptedProvider([{"summary": "unused"}])
    wf = Workflow(
        "agent-prompt-bug",
        start="think",
        nodes=[agent("think", model, lambda ctx: "Summarise " + ctx.input["missing"], schema=SUMMARY)],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("agent-prompt-bug", {})
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "KeyError: 'missing'" in (result.error_message or "")
    assert model.prompts == []


def test_notify__a_failing_message_function_fails_the_node(engine: Engine) -> None:
    wf = Workflow(
        "notify-bug", start="tell", nodes=[notify("tell", lambda ctx: {"text": ctx.input["missing"]})]
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("notify-bug", {}, session_id="session-notify-bug")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "KeyError: 'missing'" in (result.error_message or "")
    assert [a.status for a in engine.attempts(run.run_id)] == ["failed"]


def test_notify__a_non_json_message_fails_the_node(engine: Engine) -> None:
    wf = Workflow("notify-nonjson", start="tell", nodes=[notify("tell", lambda ctx: {"when": object()})])
    engine.register(wf)
    engine.runner()
    run = engine.client.start("notify-nonjson", session_id="session-notify-nonjson")
    result = engine.wait(run.run_id)
    assert result.error_code == "nodeFailed"
    assert "Unsupported JSON value type" in (result.error_message or "")


def test_openai_provider__a_turn_sends_tools_and_parses_tool_calls_and_usage(endpoint: _Endpoint) -> None:
    reply = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 1}'},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "add", "arguments": "not json"},
                        },
                    ],
                }
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    endpoint.replies.append((200, json.dumps(reply).encode()))
    endpoint.reply("plain words")
    provider = OpenAICompatibleProvider(base_url=endpoint.url, model="m", timeout_s=5)
    tools = [{"name": "add", "description": "Add", "parameters": {"type": "object"}}]
    history = [
        {"role": "user", "content": "Add"},
        {
            "role": "assistant",
            "content": None,
            "toolCalls": [{"id": "c0", "name": "add", "arguments": {"b": 2, "a": 1}}],
        },
        {"role": "tool", "toolCallId": "c0", "name": "add", "content": {"sum": 3}},
    ]
    turn = provider.turn(history, tools, SUMMARY)
    assert turn.calls == (
        [ToolCall("add", {"a": 1}, "c1"), ToolCall("add", "not json", "c2")]
    ) and turn.usage == Usage(7, 3)
    sent = endpoint.requests[0]["body"]
    assert sent["tools"] == [{"type": "function", "function": tools[0]}]
    assert sent["messages"][1:] == [
        {"role": "user", "content": "Add"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": '{"sum": 3}'},
    ]
    # Text that is not JSON is the answer as it is (the step's schema then refuses it); no
    # tools: no tools key.
    final = provider.turn(history[:1], [], SUMMARY)
    assert (final.calls, final.answer, final.usage) == ((), "plain words", None)
    assert "tools" not in endpoint.requests[1]["body"]
