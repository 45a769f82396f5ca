"""Agent conversations in real worker processes: an OpenAI-compatible endpoint (a local server
speaking the chat-completions wire format, tool calls included), an Anthropic Messages endpoint
that rate-limits once, a worker killed between turns, and ``tether show --conversation`` as a
user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support import TETHER, Lab, clean_env, stop_outside_write, wait_for
from tests.model_wire import events_for

FLOW = '''
"""An agent that looks the weather up with a tool, through a chat-completions endpoint."""

import json
import os
from pathlib import Path

from tether.engine.graph import Workflow, agent
from tether.engine.providers import OpenAICompatibleProvider

TOOL_SINK = Path(__SINK__)


def weather(city: str) -> dict:
    """Today's weather in a city."""
    with open(TOOL_SINK, "a", encoding="utf-8") as sink:
        sink.write(json.dumps({"city": city, "pid": os.getpid()}) + "\\n")
    return {"city": city, "sky": "sunny", "celsius": 21}


REPORT = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "summary": {"type": "string"}},
    "required": ["city", "summary"],
}

forecast = Workflow(
    "forecast",
    start="ask",
    nodes=[
        agent(
            "ask",
            OpenAICompatibleProvider(base_url=__URL__, model="test-model", timeout_s=30),
            "What is the weather in Paris?",
            schema=REPORT,
            tools=[weather],
            max_turns=4,
        )
    ],
)
'''


class ChatServer:
    """A chat-completions endpoint that calls the ``weather`` tool on a conversation without a
    tool result, and answers once it has one. With ``hold`` set, it keeps the first request that
    carries a tool result waiting until ``release`` is set (the worker dies meanwhile)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.hold = False
        self.holding = threading.Event()
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                server.requests.append(body)
                results = [m for m in body["messages"] if m["role"] == "tool"]
                if not results:
                    message: dict[str, Any] = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})},
                            }
                        ],
                    }
                else:
                    if server.hold and not server.holding.is_set():
                        server.holding.set()
                        server.release.wait(30)
                    sky = json.loads(results[-1]["content"])["sky"]
                    answer = {"city": "Paris", "summary": f"{sky}, 21 C"}
                    message = {"role": "assistant", "content": json.dumps(answer)}
                reply = {
                    "choices": [{"message": message}],
                    "usage": {"prompt_tokens": 30, "completion_tokens": 10},
                }
                with contextlib.suppress(OSError):  # the worker that asked was killed
                    _send(self, 200, {}, body, reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    served = ChatServer()
    try:
        yield served
    finally:
        served.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _refused_writes(port: int) -> float:
    """How many stale writes a worker counted, scraped from its --metrics-port."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode("utf-8")
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return samples["tether_worker_stale_writes_refused_total"]


def _install(lab: Lab, chat: ChatServer) -> Path:
    sink = lab.base / "tools.jsonl"
    text = FLOW.replace("__SINK__", repr(str(sink))).replace("__URL__", repr(chat.url))
    (lab.folder / "forecast.py").write_text(text)
    return sink


def _tool_calls(sink: Path) -> list[dict[str, Any]]:
    if not sink.exists():
        return []
    return [json.loads(line) for line in sink.read_text().splitlines()]


def test_agent__a_worker_killed_between_turns_is_taken_over_without_asking_the_model_again(
    any_lab: Lab, chat: ChatServer
) -> None:
    lab = any_lab
    sink = _install(lab, chat)
    chat.hold = True
    run_id = lab.start("forecast")
    first = lab.worker("agent-first")
    # The first turn (a tool call) and the tool's result are recorded; the second request waits.
    assert chat.holding.wait(30), lab.worker_log("agent-first")
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    chat.release.set()
    lab.worker("agent-second")
    result = lab.wait_finished(run_id)

    assert result.status == "done", result.error_message
    assert result.output == {"city": "Paris", "summary": "sunny, 21 C"}
    # Three requests: the first turn once, the second turn twice (the killed worker's, and the
    # new worker's, which sent the recorded tool call and result back).
    assert len(chat.requests) == 3
    assert [len(r["messages"]) for r in chat.requests] == [2, 4, 4]
    assert chat.requests[2]["messages"] == chat.requests[1]["messages"]
    assert chat.requests[0]["tools"][0]["function"]["name"] == "weather"
    # The tool ran once, in the killed worker.
    assert [c["pid"] for c in _tool_calls(sink)] == [first.pid]
    interrupted, completed = lab.client.store.attempts(run_id)
    assert (interrupted.status, completed.status) == ("interrupted", "completed")
    recorded = lab.client.conversation(run_id)
    assert [(m.index, m.role) for m in recorded] == [
        (1, "user"),
        (2, "assistant"),
        (3, "tool"),
        (4, "assistant"),
    ]
    assert {m.conversation for m in recorded} == {interrupted.attempt_id}
    assert [m.attempt_id for m in recorded] == [interrupted.attempt_id] * 3 + [completed.attempt_id]
    assert recorded[3].body["usage"] == {"inputTokens": 30, "outputTokens": 10}


def test_show_conversation__prints_the_recorded_turns(any_lab: Lab, chat: ChatServer) -> None:
    lab = any_lab
    _install(lab, chat)
    run_id = lab.start("forecast")
    lab.worker("agent-one")
    assert lab.wait_finished(run_id).status == "done"

    shown = lab.cli("show", run_id, "--conversation")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "conversation of ask" in out
    assert "What is the weather in Paris?" in out
    assert 'calls weather({"city": "Paris"})' in out
    assert 'tool   weather → {"celsius": 21, "city": "Paris", "sky": "sunny"}' in out
    assert 'answers {"city": "Paris", "summary": "sunny, 21 C"}' in out
    assert "(30 in, 10 out)" in out
    # Two turns of 30 in and 10 out each, totalled for the step.
    assert "tokens used\n  ask  60 in, 20 out (80)" in out
    assert "Traceback" not in shown.stderr

    as_json = lab.cli("show", run_id, "--conversation", "--json")
    assert as_json.returncode == 0, as_json.stderr
    roles = [m["role"] for m in json.loads(as_json.stdout)["conversation"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert json.loads(as_json.stdout)["usage"] == {"ask": {"input_tokens": 60, "output_tokens": 20}}

    missing = lab.cli("show", "run-nope", "--conversation")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    plain = lab.cli("show", run_id)
    assert "conversation of" not in plain.stdout

    # tether watch follows the conversation too, one line per message.
    watched = lab.cli("watch", run_id)
    assert watched.returncode == 0, watched.stderr
    assert 'ask 2 model  calls weather({"city": "Paris"})' in watched.stdout
    assert "ask 3 tool   weather →" in watched.stdout


def test_agent__a_stale_worker_s_late_turn_is_refused_after_a_takeover(lab: Lab, chat: ChatServer) -> None:
    _install(lab, chat)
    chat.hold = True
    run_id = lab.start("forecast")
    stale_port = _free_port()
    stale = lab.worker("agent-stale", "--metrics-port", str(stale_port))
    assert chat.holding.wait(30), lab.worker_log("agent-stale")
    # Frozen while it waits for the model's second response; another worker takes the run over.
    stop_outside_write(stale, lab.db)
    lab.worker("agent-fresh")
    result = lab.wait_finished(run_id)
    assert result.output == {"city": "Paris", "summary": "sunny, 21 C"}
    before = lab.fingerprint()

    # The stale worker gets its answer now: the message it would record is refused.
    chat.release.set()
    os.kill(stale.pid, signal.SIGCONT)
    wait_for(
        lambda: _refused_writes(stale_port) >= 1,
        what="the stale worker to count its refused write",
    )
    stale.send_signal(signal.SIGTERM)
    assert stale.wait(timeout=15) == 0
    assert lab.fingerprint() == before, "the stale worker wrote after the takeover"
    recorded = lab.client.conversation(run_id)
    assert [(m.index, m.role) for m in recorded] == [
        (1, "user"),
        (2, "assistant"),
        (3, "tool"),
        (4, "assistant"),
    ]
    interrupted, completed = lab.client.store.attempts(run_id)
    assert (interrupted.status, completed.status) == ("interrupted", "completed")
    assert recorded[3].attempt_id == completed.attempt_id
    assert len(chat.requests) == 3


class MessagesServer:
    """An Anthropic Messages endpoint: a 429 with ``Retry-After: 0`` first, then the ``weather``
    tool called as a ``tool_use`` block, then the answer once a ``tool_result`` comes back."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                server.requests.append(
                    {
                        "path": self.path,
                        # SDK versions send the key as x-api-key or as a bearer token.
                        "key": self.headers.get("x-api-key")
                        or (self.headers.get("Authorization") or "").removeprefix("Bearer "),
                        "body": body,
                    }
                )
                status, headers = 200, {"Content-Type": "application/json"}
                results = [
                    b["content"] for m in body["messages"] for b in m["content"] if b["type"] == "tool_result"
                ]
                if len(server.requests) == 1:
                    status, headers["Retry-After"] = 429, "0"
                    reply: dict[str, Any] = {
                        "type": "error",
                        "error": {"type": "rate_limit_error", "message": "slow"},
                    }
                elif not results:
                    call = {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Paris"},
                    }
                    reply = {"content": [call], "usage": {"input_tokens": 40, "output_tokens": 8}}
                else:
                    answer = {"city": "Paris", "summary": f"{json.loads(results[0])['sky']}, 21 C"}
                    text = {"type": "text", "text": json.dumps(answer)}
                    reply = {"content": [text], "usage": {"input_tokens": 60, "output_tokens": 12}}
                _send(self, status, headers, body, reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_anthropic_provider__a_worker_runs_the_tool_conversation_and_show_totals_its_tokens(
    any_lab: Lab,
) -> None:
    messages = MessagesServer()
    try:
        provider = f"AnthropicProvider(model='claude-test', api_key='sk-test', base_url={messages.url!r})"
        text = (
            FLOW.replace("__SINK__", repr(str(any_lab.base / "tools.jsonl")))
            .replace("import OpenAICompatibleProvider", "import AnthropicProvider")
            .replace('OpenAICompatibleProvider(base_url=__URL__, model="test-model", timeout_s=30)', provider)
        )
        (any_lab.folder / "forecast.py").write_text(text)
        run_id = any_lab.start("forecast")
        any_lab.worker("agent-claude")
        result = any_lab.wait_finished(run_id)
        assert result.status == "done", result
    finally:
        messages.close()
    # The rate-limited request was sent again; the tool result went back as a tool_result block.
    assert [r["path"] for r in messages.requests] == ["/v1/messages"] * 3
    assert {r["key"] for r in messages.requests} == {"sk-test"}
    assert messages.requests[0]["body"] == messages.requests[1]["body"]
    assert messages.requests[1]["body"]["tools"][0]["input_schema"]["required"] == ["city"]

    shown = any_lab.cli("show", run_id, "--conversation")
    assert shown.returncode == 0, shown.stderr
    assert 'calls weather({"city": "Paris"})  (40 in, 8 out)' in shown.stdout
    assert 'answers {"city": "Paris", "summary": "sunny, 21 C"}  (60 in, 12 out)' in shown.stdout
    assert "tokens used\n  ask  100 in, 20 out (120)" in shown.stdout


def _send(
    handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: Any, reply: Any
) -> None:
    """The reply as one JSON body, or as server-sent events to a streaming request."""
    streams = isinstance(body, dict) and body.get("stream") and status == 200
    data = b"".join(events_for(body, reply)) if streams else json.dumps(reply).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "text/event-stream" if streams else "application/json")
    for name, value in headers.items():
        if name.lower() != "content-type":
            handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


STREAMED = """
from tether.engine.graph import Workflow, agent
from tether.engine.providers import OpenAICompatibleProvider

ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}

tides = Workflow(
    "tides",
    start="think",
    nodes=[
        agent(
            "think",
            OpenAICompatibleProvider(base_url=__URL__, model="test-model", api_key="k", timeout_s=30),
            "Why are there tides?",
            schema=ANSWER,
            max_turns=3,
        )
    ],
)
"""


def test_watch__shows_the_text_a_model_streams_while_its_turn_runs(any_lab: Lab) -> None:
    from tests.engine.test_streaming_turns import FINAL, _SlowServer

    slow = _SlowServer()
    try:
        (any_lab.folder / "tides.py").write_text(STREAMED.replace("__URL__", repr(slow.url + "/v1")))
        run_id = any_lab.start("tides")
        any_lab.worker("agent-stream")
        watch = subprocess.Popen(
            [str(TETHER), "--store", any_lab.url, "--folder", str(any_lab.folder), "watch", run_id],
            cwd=any_lab.base,
            env=clean_env(COLUMNS="200"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        any_lab.processes.append(watch)  # type: ignore[arg-type]
        seen: list[str] = []
        streaming = threading.Event()

        def read() -> None:
            assert watch.stdout is not None
            for line in watch.stdout:
                seen.append(line)
                if "✎ think" in line:
                    streaming.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # The server holds the rest of the answer back: watch shows the start of it meanwhile.
        assert streaming.wait(30), "".join(seen) + any_lab.worker_log("agent-stream")
        assert not any("completed" in line for line in seen)
        slow.release.set()
        assert watch.wait(timeout=30) == 0, watch.stderr.read() if watch.stderr else ""
        reader.join(5)
    finally:
        slow.close()
    shown = "".join(seen)
    pieces = "".join(line.split("✎ think ", 1)[1].rstrip("\n") for line in seen if "✎ think " in line)
    assert pieces and FINAL.startswith(pieces)
    assert "completed" in shown and "The tide comes in twice a day" in shown
