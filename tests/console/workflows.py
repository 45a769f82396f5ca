"""Workflows the console tests run: a decision with options, a decision with a schema, an input
request with a schema, a durable sleep to cancel, hostile output, a wait for an event with a
timeout, and an effect held mid-apply."""

from __future__ import annotations

from typing import Any

from tests.engine.conftest import Latch
from tether.engine.graph import Workflow, compute, decision, effect, input, sleep, wait_for_event

HOSTILE = "<script>alert('run data')</script>"


def prepare(ctx: Any) -> dict[str, Any]:
    return {"version": (ctx.input or {}).get("version", "1.0")}


def ship(ctx: Any) -> dict[str, Any]:
    return {"shipped": ctx.outputs["prepare"]["version"]}


approval = Workflow(
    "approval",
    description="prepare, a person approves, ship",
    start="prepare",
    nodes=[
        compute("prepare", prepare),
        decision("approve", "Ship this version?", options=["approve", "reject"]),
        compute("ship", ship),
    ],
    edges={"prepare": "approve", "approve.approve": "ship"},
)

sized = Workflow(
    "sized",
    start="size",
    nodes=[
        decision(
            "size",
            "How many?",
            schema={
                "type": "object",
                "properties": {"count": {"type": "integer", "minimum": 1}, "note": {"type": "string"}},
                "required": ["count"],
            },
        ),
        compute("echo", lambda ctx: ctx.outputs["size"]),
    ],
    edges={"size": "echo"},
)

asked = Workflow(
    "asked",
    start="name",
    nodes=[
        input(
            "name",
            "Your name?",
            schema={
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 1}},
                "required": ["name"],
            },
        ),
        compute("greet", lambda ctx: {"greeting": "hello " + ctx.outputs["name"]["value"]["name"]}),
    ],
    edges={"name": "greet"},
)

napping = Workflow("napping", start="nap", nodes=[sleep("nap", 3600)])

hostile = Workflow("hostile", start="emit", nodes=[compute("emit", lambda ctx: {"html": HOSTILE})])


shipping = Workflow(
    "shipping",
    start="delivered",
    nodes=[wait_for_event("delivered", "delivered", timeout_s=7200)],
)


def explode(ctx: Any) -> None:
    raise RuntimeError("the disk is on fire")


broken = Workflow("broken", start="explode", nodes=[compute("explode", explode)])


def held_effect(latch: Latch) -> Workflow:
    def publish(ctx: Any, key: str) -> dict[str, Any]:
        latch.hold()
        return {"late": True}

    return Workflow("held", start="publish", nodes=[effect("publish", publish)])


ALL = [approval, sized, asked, napping, hostile, broken, shipping]
