"""An order's journey: pack its lines in parallel, ship it as a run of its own, then wait for the
carrier's delivery event before closing the order.

    tether --folder examples start order --input '{"order": "A-17", "lines": ["mug", "tea", "card"]}'
    tether --folder examples worker --until-idle        # packs, ships, then waits for the event
    tether --folder examples event send RUN_ID delivered --payload '{"signed_by": "R. Diaz"}'
    tether --folder examples worker --until-idle        # closes the order
    tether --folder examples show RUN_ID
"""

from __future__ import annotations

from tether import Workflow, child, compute, fan_out, wait_for_event


def pack_line(ctx, line):  # type: ignore[no-untyped-def]
    # Each line is packed once: a worker that dies mid-order packs only the lines not yet done.
    return {"line": line, "box": f"{ctx.input['order']}-{line}"}


def label(ctx):  # type: ignore[no-untyped-def]
    return {"tracking": f"TRK-{ctx.input['order']}-{len(ctx.input['boxes'])}"}


shipment = Workflow(
    "shipment",
    description="Label the boxes of an order (started by order, as a run of its own)",
    start="label",
    nodes=[compute("label", label)],
)

DELIVERED = {"type": "object", "properties": {"signed_by": {"type": "string"}}, "required": ["signed_by"]}

order = Workflow(
    "order",
    description="Pack the lines in parallel, ship as a child run, wait for the delivery event",
    start="pack",
    nodes=[
        fan_out("pack", pack_line, items=lambda ctx: ctx.input["lines"], parallelism=4, retries=1),
        child(
            "ship",
            shipment,
            input=lambda ctx: {"order": ctx.input["order"], "boxes": [b["box"] for b in ctx.outputs["pack"]]},
        ),
        wait_for_event("delivered", "delivered", schema=DELIVERED),
        compute(
            "close",
            lambda ctx: {
                "order": ctx.input["order"],
                "tracking": ctx.outputs["ship"]["tracking"],
                "signed_by": ctx.outputs["delivered"]["payload"]["signed_by"],
            },
        ),
    ],
    edges={"pack": "ship", "ship": "delivered", "delivered": "close"},
    input_schema={
        "type": "object",
        "properties": {"order": {"type": "string"}, "lines": {"type": "array", "items": {"type": "string"}}},
        "required": ["order", "lines"],
    },
)
