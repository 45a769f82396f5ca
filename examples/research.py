"""A research-and-review agent: the model searches, then asks to write its report (a tool that
changes the world, so a person approves the call first), and a person reviews the report at the
end. The model is a small deterministic stand-in that answers from the conversation alone, so the
example runs offline and any worker gives the same answers; swap in ``AnthropicProvider(...)``
(``pip install 'tether[anthropic]'``) or ``OpenAICompatibleProvider(...)`` (``tether[openai]``)
for a real one, whose text then streams live into ``tether watch RUN_ID``.

    tether --folder examples start research --input '{"topic": "durable workflows"}'
    tether --folder examples worker --until-idle     # searches; waits for the write's approval
    tether --folder examples inbox                   # the approval, and the command that answers it
    tether --folder examples answer DECISION_ID approve
    tether --folder examples worker --until-idle     # writes the report; waits for the review
    tether --folder examples answer DECISION_ID publish
    tether --folder examples worker --until-idle     # done: tether show RUN_ID --conversation

The report is written under ``$TETHER_REPORTS`` (``./reports`` by default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tether import Workflow, agent, compute, decision, tool
from tether.engine.providers import ToolCall, Turn


@tool
def search(query: str) -> list[dict[str, str]]:
    """Search the knowledge base for a query (a stub with three fixed results)."""
    return [
        {"title": f"{query}: an overview", "url": "kb://overview"},
        {"title": f"{query} in practice", "url": "kb://practice"},
        {"title": f"Pitfalls of {query}", "url": "kb://pitfalls"},
    ]


@tool(effect=True, needs_approval=True)
def write_report(name: str, text: str, idempotency_key: str) -> dict[str, str]:
    """Write the report as a Markdown file in the reports folder."""
    folder = Path(os.environ.get("TETHER_REPORTS", "reports"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    # The key makes a repeated write recognisable (the outbox applies it at most once anyway).
    path.write_text(f"<!-- {idempotency_key} -->\n{text}\n", encoding="utf-8")
    return {"path": str(path)}


class OfflineResearcher:
    """Searches first, then asks to write the report, then answers: each turn decided by the
    tool results the conversation holds so far."""

    def turn(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        schema: dict[str, Any],
    ) -> Turn:
        results = {m.get("name"): m.get("content") for m in messages if m.get("role") == "tool"}
        topic = str(messages[0].get("content", "")).rsplit(":", 1)[-1].strip()
        if "search" not in results:
            return Turn(calls=[ToolCall("search", {"query": topic}, "search-1")])
        found = results["search"] if isinstance(results["search"], list) else []
        if "write_report" not in results:
            text = f"# {topic}\n\n" + "\n".join(f"- [{r['title']}]({r['url']})" for r in found)
            name = topic.replace(" ", "-")
            return Turn(calls=[ToolCall("write_report", {"name": name, "text": text}, "write-1")])
        written = results["write_report"]
        if isinstance(written, Mapping) and "path" in written:
            return Turn(answer={"report": written["path"], "sources": len(found)})
        return Turn(answer={"report": None, "sources": len(found)})  # the write was rejected


REPORT = {
    "type": "object",
    "properties": {"report": {"type": ["string", "null"]}, "sources": {"type": "integer"}},
    "required": ["report", "sources"],
}

research = Workflow(
    "research",
    description="An agent researches a topic and writes a report (approved first); a person reviews it",
    start="research",
    nodes=[
        agent(
            "research",
            OfflineResearcher(),
            lambda ctx: f"Research this topic and write a report: {ctx.input['topic']}",
            schema=REPORT,
            tools=[search, write_report],
            max_turns=5,
        ),
        decision(
            "review",
            lambda ctx: f"Publish the report at {ctx.outputs['research']['report']}?",
            options=["publish", "discard"],
        ),
        compute("publish", lambda ctx: {"published": ctx.outputs["research"]["report"]}),
        compute("discard", lambda ctx: {"published": None}),
    ],
    edges={"research": "review", "review.publish": "publish", "review.discard": "discard"},
    input_schema={"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]},
)
