"""``tether mcp`` as an agent drives it: the ``mcp`` client library spawns
``tether --store URL --folder F mcp`` over stdio, lists its tools and calls them, while real
``tether worker`` processes execute the runs. On both backends.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from tests.integration.support import REPO, TETHER, Lab, clean_env
from tether.cli import build_parser
from tether.client import Tether

WRITING = {"start_run", "answer_decision", "submit_input", "cancel_run", "pause_run", "resume_run"}
READING = {"list_workflows", "get_run", "list_runs", "list_waiting"}

#: A workflow with an input schema, written beside the lab's flows.
GREETING = """
from tether.engine.graph import Workflow, compute

greeting = Workflow(
    "greeting",
    description="Greets a person by name",
    start="greet",
    nodes=[compute("greet", lambda ctx: {"text": "hello " + ctx.input["name"]})],
    input_schema={
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1}},
        "required": ["name"],
    },
)
"""


class Agent:
    """An MCP client session on a ``tether mcp`` process."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """Call a tool that must succeed; its JSON answer."""
        result = await self.session.call_tool(tool, arguments)
        assert not result.is_error, f"{tool} failed: {_text(result)}"
        answer = json.loads(_text(result))
        assert answer == result.structured_content
        assert isinstance(answer, dict)
        return answer

    async def refused(self, tool: str, **arguments: Any) -> str:
        """Call a tool that must be refused; the error's text."""
        result = await self.session.call_tool(tool, arguments)
        assert result.is_error, f"{tool} was not refused: {_text(result)}"
        assert "Traceback" not in _text(result)
        return _text(result)

    async def until(
        self, tool: str, check: Callable[[dict[str, Any]], bool], **arguments: Any
    ) -> dict[str, Any]:
        """Call a reading tool until its answer passes ``check`` (deadline 30 s)."""
        with anyio.fail_after(30):
            while True:
                answer = await self.call(tool, **arguments)
                if check(answer):
                    return answer
                await anyio.sleep(0.05)


def _text(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def drive(lab: Lab, scenario: Callable[[Agent], Awaitable[None]], *extra: str) -> None:
    """Run ``scenario`` against ``tether --store URL --folder F mcp EXTRA...`` over stdio."""

    async def main() -> None:
        params = StdioServerParameters(
            command=str(TETHER),
            args=["--store", lab.url, "--folder", str(lab.folder), "mcp", *extra],
            env=clean_env(),
            cwd=str(lab.base),
        )
        with open(lab.base / "mcp.err", "w", encoding="utf-8") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                await scenario(Agent(session))

    anyio.run(main)


def nothing_written(lab: Lab) -> Callable[[], None]:
    """A check that no run and no event was written since it was made (on either backend)."""
    store = lab.client.store
    before = (store.last_event_seq(), [r.run_id for r in store.list_runs()])

    def check() -> None:
        assert (store.last_event_seq(), [r.run_id for r in store.list_runs()]) == before

    return check


def test_mcp__lists_every_tool_with_a_closed_schema(any_lab: Lab) -> None:
    async def scenario(agent: Agent) -> None:
        listed = (await agent.session.list_tools()).tools
        assert {t.name for t in listed} == READING | WRITING
        for tool in listed:
            assert tool.description
            assert tool.input_schema["type"] == "object"
            assert tool.input_schema["additionalProperties"] is False
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is (tool.name in READING)
        start = next(t for t in listed if t.name == "start_run")
        assert start.input_schema["required"] == ["workflow"]
        assert set(start.input_schema["properties"]) == {"workflow", "input", "run_id", "session_id"}

    drive(any_lab, scenario)


def test_mcp__start_run_a_worker_executes_and_the_agent_reads_its_result(any_lab: Lab) -> None:
    any_lab.worker("w1")

    async def scenario(agent: Agent) -> None:
        workflows = {w["name"]: w for w in (await agent.call("list_workflows"))["workflows"]}
        assert workflows["healthy"]["description"] == "Two quick steps"
        assert [n["id"] for n in workflows["healthy"]["nodes"]] == ["one", "two"]
        assert workflows["form"]["needs_session"] is True

        started = await agent.call("start_run", workflow="healthy", input={"n": 1}, run_id="agent-1")
        assert started == {"run_id": "agent-1", "workflow": "healthy", "status": "queued", "adopted": False}
        again = await agent.call("start_run", workflow="healthy", input={"n": 1}, run_id="agent-1")
        assert again["run_id"] == "agent-1"
        assert again["adopted"] is True

        run = await agent.until("get_run", lambda r: r["finished"], run_id="agent-1", wait_seconds=5)
        assert run["status"] == "done"
        assert run["state"] == "completed"
        assert run["input"] == {"n": 1}
        assert run["result"]["node"] == "two"
        assert [(s["step"], s["status"]) for s in run["steps"]] == [
            ("one", "completed"),
            ("two", "completed"),
        ]
        assert run["error"] is None and run["waiting_for"] == []

        listed = await agent.call("list_runs", workflow="healthy", status=["done"])
        assert [r["run_id"] for r in listed["runs"]] == ["agent-1"]
        assert (await agent.call("list_runs", status=["queued", "failed"]))["runs"] == []

    drive(any_lab, scenario)
    # One run, executed once: adopting the second start wrote no second run.
    assert [r.run_id for r in any_lab.client.runs()] == ["agent-1"]
    executed = [json.loads(line)["node_id"] for line in any_lab.sink.read_text().splitlines()]
    assert executed == ["one", "two"]


def test_mcp__answering_a_decision_lets_the_run_continue(any_lab: Lab) -> None:
    any_lab.worker("w1")

    async def scenario(agent: Agent) -> None:
        await agent.call("start_run", workflow="approval", run_id="ship-1")
        waiting = await agent.until("list_waiting", lambda w: bool(w["decisions"]), run_id="ship-1")
        decision = waiting["decisions"][0]
        assert decision["question"] == "Ship it?"
        assert decision["options"] == ["approve", "reject"]
        run = await agent.call("get_run", run_id="ship-1")
        assert run["state"] == "waiting"
        assert [w["decision_id"] for w in run["waiting_for"]] == [decision["decision_id"]]

        refused = await agent.refused(
            "answer_decision", decision_id=decision["decision_id"], response="maybe"
        )
        assert refused == "Answer must be one of approve, reject"
        answered = await agent.call(
            "answer_decision", decision_id=decision["decision_id"], response="approve"
        )
        assert answered == {"decision_id": decision["decision_id"], "run_id": "ship-1", "outcome": "accepted"}

        run = await agent.until("get_run", lambda r: r["finished"], run_id="ship-1", wait_seconds=5)
        assert run["status"] == "done"
        assert [s["step"] for s in run["steps"]] == ["ask", "shipped"]
        again = await agent.refused("answer_decision", decision_id=decision["decision_id"], response="reject")
        assert again == f"Decision {decision['decision_id']} was already resolved"
        assert (await agent.call("list_waiting"))["decisions"] == []

    drive(any_lab, scenario)
    decision = any_lab.client.decisions("ship-1", open_only=False)[0]
    assert (decision.response, decision.actor_id) == ("approve", "agent")


def test_mcp__submitting_input_pausing_and_resuming_a_session_run(any_lab: Lab) -> None:
    any_lab.worker("w1")

    async def scenario(agent: Agent) -> None:
        refused = await agent.refused("start_run", workflow="form", run_id="form-1")
        assert "start it with a session_id" in refused
        await agent.call("start_run", workflow="form", run_id="form-1", session_id="chat-1")
        waiting = await agent.until("list_waiting", lambda w: bool(w["input_requests"]), run_id="form-1")
        request = waiting["input_requests"][0]
        assert (request["prompt"], request["session_id"]) == ("Your name?", "chat-1")

        assert (await agent.call("pause_run", run_id="form-1"))["outcome"] == "paused"
        assert (await agent.call("get_run", run_id="form-1"))["paused"] is True
        assert (await agent.call("resume_run", run_id="form-1"))["outcome"] == "resumed"
        assert (await agent.call("get_run", run_id="form-1"))["paused"] is False

        bad = await agent.refused("submit_input", request_id=request["request_id"], payload={"name": ""})
        assert bad.startswith("Input does not match the request's schema")
        await agent.call("submit_input", request_id=request["request_id"], payload={"name": "Ada"})
        run = await agent.until("get_run", lambda r: r["finished"], run_id="form-1", wait_seconds=5)
        assert run["status"] == "done"
        assert [s["step"] for s in run["steps"]] == ["ask", "greet", "reply"]

    drive(any_lab, scenario)


def test_mcp__cancel_a_queued_run(any_lab: Lab) -> None:
    async def scenario(agent: Agent) -> None:
        await agent.call("start_run", workflow="healthy", run_id="doomed")
        assert await agent.call("cancel_run", run_id="doomed") == {"run_id": "doomed", "outcome": "cancelled"}
        run = await agent.call("get_run", run_id="doomed")
        assert (run["status"], run["finished"]) == ("cancelled", True)

    drive(any_lab, scenario)


def test_mcp__refusals_are_tool_errors_that_change_nothing(any_lab: Lab) -> None:
    (any_lab.folder / "greeting.py").write_text(GREETING)
    any_lab.start("healthy", run_id="existing")
    unchanged = nothing_written(any_lab)

    async def scenario(agent: Agent) -> None:
        unknown = await agent.refused("start_run", workflow="nope")
        assert unknown.startswith("Unknown workflow 'nope' (known: ")
        bad_input = await agent.refused("start_run", workflow="greeting", input={"name": 7})
        assert "name" in bad_input and "string" in bad_input
        assert await agent.refused("start_run", workflow="greeting", run_id="bad id!", input={"name": "x"})
        taken = await agent.refused("start_run", workflow="greeting", run_id="existing", input={"name": "x"})
        assert "already used by a run of workflow healthy" in taken
        other_input = await agent.refused("start_run", workflow="healthy", run_id="existing", input={"n": 2})
        assert other_input.startswith("Run id existing is already used by a run with a different input")
        assert await agent.refused("get_run", run_id="ghost") == "Workflow run not found: ghost"
        assert await agent.refused("cancel_run", run_id="ghost") == "Workflow run not found: ghost"
        assert await agent.refused("list_waiting", run_id="ghost") == "Workflow run not found: ghost"
        assert await agent.refused("answer_decision", decision_id="d-ghost", response="yes") == (
            "Decision not found: d-ghost"
        )
        assert await agent.refused("submit_input", request_id="r-ghost", payload={}) == (
            "Input request not found: r-ghost"
        )
        arguments = await agent.refused("list_runs", limit="ten", colour="red")
        assert (
            arguments
            == "Invalid arguments for list_runs: colour: not allowed; limit: expected integer, got str"
        )
        missing = await agent.refused("start_run")
        assert missing == "Invalid arguments for start_run: workflow: required"
        assert (await agent.refused("drop_tables")).startswith("Unknown tool 'drop_tables'")
        await agent.refused("pause_run", run_id="existing")

    drive(any_lab, scenario)
    unchanged()


def test_mcp__read_only_offers_and_serves_only_reading_tools(any_lab: Lab) -> None:
    any_lab.start("healthy", run_id="existing")
    unchanged = nothing_written(any_lab)

    async def scenario(agent: Agent) -> None:
        assert {t.name for t in (await agent.session.list_tools()).tools} == READING
        refused = await agent.refused("start_run", workflow="healthy")
        assert refused.startswith("Tool start_run changes runs, and this server is read-only")
        assert (await agent.refused("cancel_run", run_id="existing")).startswith(
            "Tool cancel_run changes runs"
        )
        assert (await agent.call("get_run", run_id="existing"))["status"] == "queued"

    drive(any_lab, scenario, "--read-only")
    unchanged()
    assert "workflows, read-only): an MCP client talks to it" in (any_lab.base / "mcp.err").read_text()
    assert any_lab.view("existing").status == "queued"


def test_mcp__without_the_extra_names_the_install_command(lab: Lab) -> None:
    # The mcp package made unimportable: the command fails with one line naming the extra.
    code = "import sys; sys.modules['mcp'] = None; from tether.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "--store", lab.url, "--folder", str(lab.folder), "mcp"],
        cwd=lab.base,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "tether mcp needs the mcp extra: pip install 'tether[mcp]'" in lines[0]


def test_mcp__what_a_workflow_file_prints_stays_off_the_protocol(lab: Lab) -> None:
    (lab.folder / "noisy.py").write_text("print('loading noisy workflows')\n")

    async def scenario(agent: Agent) -> None:
        assert "healthy" in {w["name"] for w in (await agent.call("list_workflows"))["workflows"]}

    drive(lab, scenario)
    log = (lab.base / "mcp.err").read_text()
    assert "loading noisy workflows" in log
    assert f"tether mcp on sqlite:///{lab.db} (" in log


def test_mcp__a_workflow_file_that_fails_to_load_stops_the_server_with_one_line(lab: Lab) -> None:
    (lab.folder / "broken.py").write_text("raise RuntimeError('no config')\n")
    done = lab.cli("mcp", timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("tether: ") and "no config" in done.stderr
    assert "Traceback" not in done.stderr


def test_mcp__the_claude_desktop_config_in_the_docs_starts_tether_mcp() -> None:
    text = (REPO / "docs" / "agents.md").read_text(encoding="utf-8")
    [snippet] = [b.split("```", 1)[0] for b in text.split("```json\n")[1:]]
    server = json.loads(snippet)["mcpServers"]["tether"]
    assert server["command"].endswith("/bin/tether")
    args = build_parser().parse_args(server["args"])
    assert args.command == "mcp"
    assert args.store.startswith("sqlite:////") and args.folder.startswith("/")


def test_mcp__an_unexpected_failure_is_a_tool_error_without_its_traceback(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # In process: the server built on the lab's store, a tool whose call breaks.
    from mcp import Client

    from tether.mcp import server, tools

    def broken(tether: Tether, arguments: dict[str, Any], actor: str) -> dict[str, Any]:
        raise KeyError("internal detail")

    index = next(i for i, t in enumerate(tools.TOOLS) if t.name == "list_runs")
    patched = dataclasses.replace(tools.TOOLS[index], call=broken)
    monkeypatch.setattr(tools, "TOOLS", (*tools.TOOLS[:index], patched, *tools.TOOLS[index + 1 :]))

    async def main() -> None:
        async with Client(server.build(lab.client)) as client:
            result = await client.call_tool("list_runs", {})
            assert result.is_error
            assert _text(result) == (
                "Tool list_runs failed unexpectedly (KeyError); the server's log has the details"
            )
            assert result.structured_content == {"error": "internal_error", "message": _text(result)}
            assert (await client.call_tool("list_workflows", {})).is_error is False

    with caplog.at_level(logging.ERROR, logger="tether.mcp"):
        anyio.run(main)
    assert "internal detail" in caplog.text
