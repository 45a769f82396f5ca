"""The HTTP providers against a local server: retries on rate limits and server errors (with a
fake sleep), and the Anthropic Messages wire format, alone and through an agent step with tools
(both stores)."""

from __future__ import annotations

import email.utils
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Literal

import pytest

from tether.engine.graph import Workflow, agent
from tether.engine.providers import AnthropicProvider, OpenAICompatibleProvider, ToolCall, Turn, Usage
from tether.engine.tools import tool
from tether.errors import InvalidInput, ProviderError

from ..model_wire import events_for
from .conftest import Engine

#: A reply: status, headers, JSON body; or a function of the request body returning one.
Reply = tuple[int, dict[str, str], Any]

ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
TOTAL = {
    "type": "object",
    "properties": {"total": {"type": "number"}, "city": {"type": "string"}},
    "required": ["total", "city"],
}


class _Server:
    """A local model endpoint: answers each POST with the next reply and records the requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[Reply | Callable[[dict[str, Any]], Reply]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                server.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
                reply = server.replies.pop(0)
                status, headers, payload = reply(body) if callable(reply) else reply
                if body.get("stream") and status == 200:
                    # A streaming request gets the reply as server-sent events.
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for event in events_for(body, payload):
                        self.wfile.write(event)
                        self.wfile.flush()
                    self.close_connection = True
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def server() -> Iterator[_Server]:
    served = _Server()
    try:
        yield served
    finally:
        served.close()


def _chat(content: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": json.dumps(content)}}]}


def _message(content: Any) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": json.dumps(content)}],
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }


def _openai(server: _Server, sleeps: list[float], **options: Any) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(
        base_url=server.url + "/v1", model="m", timeout_s=5, sleep=sleeps.append, **options
    )


def _anthropic(server: _Server, sleeps: list[float], **options: Any) -> AnthropicProvider:
    return AnthropicProvider(
        model="claude-test",
        api_key="sk-test",
        base_url=server.url,
        timeout_s=5,
        sleep=sleeps.append,
        **options,
    )


def _anthropic_key(headers: dict[str, str]) -> str | None:
    """The API key a Messages request carries (SDK versions send it as ``x-api-key`` or as a
    bearer token)."""
    bearer = headers.get("authorization", "")
    return headers.get("x-api-key") or (bearer.removeprefix("Bearer ") if bearer else None)


# -- retries ---------------------------------------------------------------------------------
def test_retries__a_429_waits_as_retry_after_says_then_succeeds(server: _Server) -> None:
    server.replies += [
        (429, {"Retry-After": "7"}, {"error": {"message": "slow down"}}),
        (200, {}, _chat({"answer": "ok"})),
    ]
    sleeps: list[float] = []
    assert _openai(server, sleeps).complete("hi", ANSWER) == {"answer": "ok"}
    assert len(server.requests) == 2
    assert sleeps == [7.0]
    # The retry sends the same request again.
    assert server.requests[0]["body"] == server.requests[1]["body"]


def test_retries__retry_after_as_an_http_date(server: _Server) -> None:
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.replies += [(429, {"Retry-After": later}, {}), (200, {}, _chat({"answer": "ok"}))]
    sleeps: list[float] = []
    assert _openai(server, sleeps).complete("hi", ANSWER) == {"answer": "ok"}
    (wait,) = sleeps
    assert 20 < wait <= 30


def test_retries__server_errors_back_off_exponentially_then_succeed(server: _Server) -> None:
    server.replies += [(503, {}, {}), (503, {}, {}), (200, {}, _chat({"answer": "ok"}))]
    sleeps: list[float] = []
    assert _openai(server, sleeps).complete("hi", ANSWER) == {"answer": "ok"}
    assert len(server.requests) == 3
    # The SDK's backoff: half a second, doubling, less up to a quarter of jitter.
    assert 0.375 <= sleeps[0] <= 0.5 and 0.75 <= sleeps[1] <= 1.0


def test_retries__waits_are_capped_and_the_last_error_is_raised(server: _Server) -> None:
    server.replies += [
        (500, {}, {}),
        (429, {"Retry-After": "90"}, {}),
        (502, {}, {"error": {"message": "bad gateway"}}),
    ]
    sleeps: list[float] = []
    provider = _openai(server, sleeps, retries=2, max_wait_s=0.3)
    with pytest.raises(ProviderError, match=r"answered HTTP 502 \(after 3 tries\): bad gateway"):
        provider.complete("hi", ANSWER)
    assert len(server.requests) == 3
    assert sleeps == [0.3, 0.3]


def test_retries__a_retry_after_beyond_two_minutes_is_not_waited_for(server: _Server) -> None:
    # The SDK does not retry when the server asks for a longer wait than it allows.
    server.replies += [(429, {"Retry-After": "3600"}, {"error": {"message": "come back later"}})]
    sleeps: list[float] = []
    with pytest.raises(ProviderError, match="answered HTTP 429: come back later"):
        _openai(server, sleeps).complete("hi", ANSWER)
    assert len(server.requests) == 1 and sleeps == []


def test_retries__a_400_is_not_retried_and_names_the_server_s_message(server: _Server) -> None:
    server.replies.append((400, {}, {"error": {"message": "model 'm' does not exist"}}))
    sleeps: list[float] = []
    with pytest.raises(ProviderError, match="answered HTTP 400: model 'm' does not exist"):
        _openai(server, sleeps).complete("hi", ANSWER)
    assert len(server.requests) == 1
    assert sleeps == []


def test_retries__the_anthropic_provider_retries_the_same_way(server: _Server) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.replies += [
        (529, {}, overloaded),
        (429, {"retry-after": "2"}, {}),
        (200, {}, _message({"answer": "ok"})),
    ]
    sleeps: list[float] = []
    assert _anthropic(server, sleeps).complete("hi", ANSWER) == {"answer": "ok"}
    assert 0.375 <= sleeps[0] <= 0.5 and sleeps[1] == 2.0
    server.replies.append(
        (
            401,
            {},
            {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
        )
    )
    with pytest.raises(ProviderError, match="answered HTTP 401: invalid x-api-key"):
        _anthropic(server, sleeps).complete("hi", ANSWER)
    assert len(server.requests) == 4


def test_retries__options_are_checked() -> None:
    with pytest.raises(InvalidInput, match="retries"):
        OpenAICompatibleProvider(base_url="http://localhost", model="m", retries=-1)
    with pytest.raises(InvalidInput, match="max_wait_s"):
        AnthropicProvider(model="claude-test", max_wait_s=-1)
    with pytest.raises(InvalidInput, match="max_tokens"):
        AnthropicProvider(model="claude-test", max_tokens=0)
    with pytest.raises(InvalidInput, match="http"):
        AnthropicProvider(model="claude-test", base_url="api.anthropic.com")


# -- the Anthropic Messages wire format ------------------------------------------------------
def test_anthropic__sends_a_messages_request_and_reads_tool_use(server: _Server) -> None:
    server.replies.append(
        (
            200,
            {},
            {
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "city", "input": {"code": "CDG"}},
                ],
                "usage": {"input_tokens": 12, "output_tokens": 4},
            },
        )
    )
    provider = _anthropic(server, [])
    tools = [{"name": "city", "description": "A city.", "parameters": {"type": "object"}}]
    turn = provider.turn([{"role": "user", "content": "Where?"}], tools, ANSWER)
    assert turn == Turn(calls=[ToolCall("city", {"code": "CDG"}, "toolu_1")], usage=Usage(12, 4))
    (sent,) = server.requests
    assert sent["path"] == "/v1/messages"
    assert _anthropic_key(sent["headers"]) == "sk-test"
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    body = sent["body"]
    assert body["model"] == "claude-test" and body["max_tokens"] == 4096
    assert json.dumps(ANSWER) in body["system"]
    assert body["tools"] == [{"name": "city", "description": "A city.", "input_schema": {"type": "object"}}]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Where?"}]}]


def test_anthropic__a_fenced_json_answer_is_parsed_and_plain_text_refused(server: _Server) -> None:
    fenced = '```json\n{"answer": "fenced"}\n```'
    server.replies += [
        (200, {}, {"content": [{"type": "text", "text": fenced}]}),
        (200, {}, {"content": [{"type": "text", "text": "I cannot answer in JSON."}]}),
        (200, {}, {"nothing": []}),
    ]
    provider = _anthropic(server, [])
    assert provider.turn([{"role": "user", "content": "hi"}], [], ANSWER) == Turn(answer={"answer": "fenced"})
    with pytest.raises(ProviderError, match="not a JSON completion: I cannot answer"):
        provider.complete("hi", ANSWER)
    with pytest.raises(ProviderError, match="not a Messages reply"):
        provider.complete("hi", ANSWER)


# -- a two-tool conversation through an agent step, on both wire formats ---------------------
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool(description="The city an airport code names.")
def city(code: Literal["LHR", "CDG"]) -> str:
    return {"LHR": "London", "CDG": "Paris"}[code]


def _openai_turns(body: dict[str, Any]) -> Reply:
    """First turn: call both tools; then answer from their results."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        calls = [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "c2", "type": "function", "function": {"name": "city", "arguments": '{"code": "CDG"}'}},
        ]
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
    else:
        message = {
            "role": "assistant",
            "content": json.dumps({"total": float(results[0]), "city": results[1]}),
        }
    return (
        200,
        {},
        {"choices": [{"message": message}], "usage": {"prompt_tokens": 20, "completion_tokens": 5}},
    )


def _anthropic_turns(body: dict[str, Any]) -> Reply:
    results = [
        block["content"] for m in body["messages"] for block in m["content"] if block["type"] == "tool_result"
    ]
    if not results:
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
            {"type": "tool_use", "id": "toolu_2", "name": "city", "input": {"code": "CDG"}},
        ]
    else:
        content = [{"type": "text", "text": json.dumps({"total": float(results[0]), "city": results[1]})}]
    return 200, {}, {"content": content, "usage": {"input_tokens": 20, "output_tokens": 5}}


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_agent__two_tools_over_two_turns_through_an_http_provider(
    engine: Engine, server: _Server, wire: str
) -> None:
    sleeps: list[float] = []
    turns = _anthropic_turns if wire == "anthropic" else _openai_turns
    # A rate limit before the first turn is retried inside the step, not recorded as a turn.
    server.replies += [(429, {"Retry-After": "1"}, {}), turns, turns]
    provider = _openai(server, sleeps) if wire == "openai" else _anthropic(server, sleeps)
    wf = Workflow(
        f"agent-{wire}",
        start="plan",
        nodes=[agent("plan", provider, "Add 2 and 3, and name CDG", schema=TOTAL, tools=[add, city])],
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start(f"agent-{wire}")
    result = engine.wait(run.run_id)
    assert result.status == "done", result.error_message
    assert result.output == {"total": 5, "city": "Paris"}
    assert sleeps == [1.0] and len(server.requests) == 3
    recorded = engine.client.conversation(run.run_id)
    assert [m.role for m in recorded] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m.body["usage"] for m in recorded if m.role == "assistant"] == [
        {"inputTokens": 20, "outputTokens": 5}
    ] * 2
    last = server.requests[-1]["body"]
    if wire == "anthropic":
        assert _anthropic_key(server.requests[-1]["headers"]) == "sk-test"
        assert [t["name"] for t in last["tools"]] == ["add", "city"]
        assert last["tools"][1]["input_schema"]["properties"]["code"]["enum"] == ["LHR", "CDG"]
        # The tool results go back as one user message of tool_result blocks, after the tool_use turn.
        assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user"]
        assert [b["type"] for b in last["messages"][1]["content"]] == ["tool_use", "tool_use"]
        assert last["messages"][2]["content"] == [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Paris"},
        ]
    else:
        assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "tool", "tool"]
        assert [m.get("tool_call_id") for m in last["messages"][3:]] == ["c1", "c2"]


def test_streaming__a_broken_event_stream_is_a_provider_error(server: _Server) -> None:
    def broken(body: dict[str, Any]) -> Reply:
        return 200, {}, {"choices": [{"message": {"role": "assistant", "content": "x"}}]}

    server.replies.append(broken)
    provider = _openai(server, [])
    original = server.server.RequestHandlerClass.do_POST  # type: ignore[attr-defined]

    def garbage(handler: Any) -> None:
        length = int(handler.headers.get("Content-Length", "0"))
        handler.rfile.read(length)
        server.replies.pop(0)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        handler.wfile.write(b"data: {not json\n\n")
        handler.close_connection = True

    server.server.RequestHandlerClass.do_POST = garbage  # type: ignore[attr-defined]
    try:
        with pytest.raises(ProviderError, match="could not be read"):
            provider.turn([{"role": "user", "content": "hi"}], [], ANSWER, on_text=lambda piece: None)
    finally:
        server.server.RequestHandlerClass.do_POST = original  # type: ignore[attr-defined]
