"""An interactive, agent-style flow: a model drafts a question, the origin session answers it, the
model summarises the answer, and the summary is sent back to the session.

The model is the deterministic ``ScriptedProvider`` so the example needs no network; swap in
``OpenAICompatibleProvider(base_url=..., model=...)`` for a real one.
"""

from __future__ import annotations

from tether.engine.graph import Workflow, agent, input, notify
from tether.engine.providers import ScriptedProvider


def _summary(prompt: str) -> dict[str, str]:
    return {"summary": "The user wants: " + prompt.rsplit(":", 1)[-1].strip()}


model = ScriptedProvider([{"question": "What should this workflow automate?"}, _summary] * 1000)

interview = Workflow(
    "interview",
    description="Model question, session answer (5 minute active-time deadline), model summary",
    start="draft",
    nodes=[
        agent(
            "draft",
            model,
            "Draft one question for the user.",
            schema={
                "type": "object",
                "properties": {"question": {"type": "string"}},
                "required": ["question"],
            },
        ),
        input(
            "ask",
            "Answer the model's question",
            schema={
                "type": "object",
                "properties": {"answer": {"type": "string", "minLength": 1}},
                "required": ["answer"],
            },
            timeout_s=300,
        ),
        agent(
            "summarize",
            model,
            lambda ctx: "Summarise the answer: " + ctx.outputs["ask"]["value"]["answer"],
            schema={
                "type": "object",
                "properties": {"summary": {"type": "string"}},
                "required": ["summary"],
            },
        ),
        notify("reply", lambda ctx: {"text": ctx.outputs["summarize"]["summary"]}),
    ],
    edges={"draft": "ask", "ask": "summarize", "summarize": "reply"},
)
