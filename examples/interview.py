"""An interactive, agent-style flow: a model drafts a question, the origin session answers it, the
model summarises the answer, and the summary is sent back to the session.

The model here is a small deterministic stand-in so the example needs no network; swap in
``OpenAICompatibleProvider(base_url=..., model=...)`` (``pip install 'tether[openai]'``) for a real
one.

The run talks to the session that started it, so it needs one::

    tether --folder examples run interview --session chat-1
    tether submit REQUEST_ID '{"answer": "invoices"}' --session chat-1
    tether --folder examples worker --until-idle
    tether messages --session chat-1
"""

from __future__ import annotations

from typing import Any

from tether.engine.graph import Workflow, agent, input, notify


class OfflineModel:
    """Answers from the prompt alone, so any worker process gives the same answer."""

    def complete(self, prompt: str, schema: dict[str, Any]) -> dict[str, str]:
        if prompt.startswith("Summarise"):
            return {"summary": "The user wants: " + prompt.split(":", 1)[1].strip()}
        return {"question": "What should this workflow automate?"}


model = OfflineModel()
QUESTION = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
}
SUMMARY = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}

interview = Workflow(
    "interview",
    description="Model question, session answer (5 minute active-time deadline), model summary",
    start="draft",
    nodes=[
        agent("draft", model, "Draft one question for the user.", schema=QUESTION),
        # The prompt is a function of the context: the person sees the question the model drafted.
        input("ask", lambda ctx: ctx.outputs["draft"]["question"], schema=ANSWER, timeout_s=300),
        agent(
            "summarize",
            model,
            lambda ctx: "Summarise the answer: " + ctx.outputs["ask"]["value"]["answer"],
            schema=SUMMARY,
        ),
        notify("reply", lambda ctx: {"text": ctx.outputs["summarize"]["summary"]}),
    ],
    edges={"draft": "ask", "ask": "summarize", "summarize": "reply"},
)
