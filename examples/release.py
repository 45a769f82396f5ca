"""A human-approved release checklist with an effect.

The checklist is computed, a person approves or rejects it (the default after the deadline is
``reject``), and an approved release is published through the effects outbox: the publish function
gets an idempotency key and runs at most once per attempt; a crash mid-publish parks the run as
ambiguous until an operator decides.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tether.engine.graph import Workflow, compute, decision, effect, notify


def checklist(ctx):  # type: ignore[no-untyped-def]
    version = (ctx.input or {}).get("version", "0.0.1")
    return {"version": version, "items": ["tests green", "changelog written", "docs built"]}


def publish(ctx, idempotency_key):  # type: ignore[no-untyped-def]
    folder = Path(os.environ.get("TETHER_RELEASES", ".tether/releases"))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{ctx.outputs['checklist']['version']}.json"
    # The key makes a repeated publish recognisable on the receiving side.
    target.write_text(json.dumps({"key": idempotency_key, "checklist": ctx.outputs["checklist"]}))
    return {"published": str(target)}


release = Workflow(
    "release",
    description="Checklist, human approval with a deadline, publish as an effect",
    start="checklist",
    nodes=[
        compute("checklist", checklist),
        decision(
            "approve",
            lambda ctx: f"Publish release {ctx.outputs['checklist']['version']}?",
            options=["approve", "reject"],
            deadline_s=3600,
            default="reject",
        ),
        effect("publish", publish, effect_type="release.publish"),
        notify("announce", lambda ctx: {"text": f"released {ctx.outputs['checklist']['version']}"}),
        notify("rejected", "release rejected"),
    ],
    edges={
        "checklist": "approve",
        "approve.approve": "publish",
        "approve.reject": "rejected",
        "publish": "announce",
    },
)
