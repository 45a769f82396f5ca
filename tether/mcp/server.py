"""The Model Context Protocol server of ``tether mcp``: the tools of ``tether.mcp.tools`` on stdio.

Needs the ``mcp`` extra (``pip install 'tether[mcp]'``). A tool's answer is its JSON object, as
text and as structured content; a refused call is a tool error (``isError``) whose text is the
client's one-line message and whose structured content carries the error's code. An unexpected
failure is a tool error naming its type; its traceback goes only to the server's log (stderr).
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from tether.client import Tether
from tether.clioutput import mask_urls, to_json
from tether.errors import TetherError
from tether.mcp import tools

log = logging.getLogger("tether.mcp")

INSTRUCTIONS = """\
Tether runs durable workflows: a run survives crashes and restarts, and a worker process executes \
its steps in the background. start_run reserves a run and returns at once; follow it with get_run \
(wait_seconds waits for it to finish or to need a person). A run may stop to wait for a person: \
list_waiting shows the open decisions (answer_decision) and input requests (submit_input); the run \
continues once answered. Give start_run a run_id of your own to make retries safe. A run stays \
queued while no worker (`tether worker`) is running."""


def build(tether: Tether, *, read_only: bool = False, actor: str = "agent") -> Server[Any]:
    """The server: the catalogue's tools (only the reading ones with ``read_only``), each call
    made through ``tether`` in a worker thread with ``actor`` as who acted."""
    offered = [_describe(tool) for tool in tools.offered(read_only=read_only)]

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=offered)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        work = functools.partial(
            tools.call, tether, params.name, params.arguments, actor=actor, read_only=read_only
        )
        try:
            value = await anyio.to_thread.run_sync(work)
        except TetherError as error:
            log.info("tool %s refused: %s", params.name, error)
            return _error(mask_urls(str(error)), error.code)
        except Exception as error:
            log.exception("tool %s failed", params.name)
            return _error(
                f"Tool {params.name} failed unexpectedly ({type(error).__name__}); the server's log has "
                "the details",
                "internal_error",
            )
        text = to_json(value)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=json.loads(text)
        )

    return Server(
        "tether",
        version=_version(),
        title="Tether",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def serve(tether: Tether, *, read_only: bool = False, actor: str = "agent") -> None:
    """Serve the tools on stdin/stdout until the client closes the connection."""
    server = build(tether, read_only=read_only, actor=actor)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


def _describe(tool: tools.Tool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=tool.description,
        input_schema=tool.input_schema,
        annotations=types.ToolAnnotations(
            title=tool.title,
            read_only_hint=not tool.writes,
            destructive_hint=tool.destructive,
            idempotent_hint=tool.idempotent,
            open_world_hint=False,
        ),
    )


def _error(message: str, code: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)],
        structured_content={"error": code, "message": message},
        is_error=True,
    )


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tether")
    except metadata.PackageNotFoundError:
        return "unknown"
