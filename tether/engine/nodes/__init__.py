"""One module per node kind, each a ``NodeHandler`` (see ``base``). ``HANDLERS`` maps a node's
kind to its handler; the runner's drive loop dispatches through it. (An ``include`` node never
runs itself: the graph enters its sub-workflow's start.)"""

from __future__ import annotations

from tether.engine.nodes import (
    agent,
    child,
    compute,
    decision,
    effect,
    event,
    fanout,
    input,
    notify,
    shell,
    sleep,
)
from tether.engine.nodes.base import NodeHandler, StepHost

HANDLERS: dict[str, NodeHandler] = {
    "compute": compute.run,
    "agent": agent.run,
    "shell": shell.run,
    "effect": effect.run,
    "decision": decision.run,
    "input": input.run,
    "notify": notify.run,
    "sleep": sleep.run,
    "event": event.run,
    "fan_out": fanout.run_fan_out,
    "parallel": fanout.run_parallel,
    "child": child.run,
}

__all__ = ["HANDLERS", "NodeHandler", "StepHost"]
