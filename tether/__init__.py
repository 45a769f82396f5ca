"""Tether: durable workflow runs for Python.

The names an application needs are importable from here: the client (``Tether``, ``Session``), the
workflow builders, the runner, the records and status enums the store returns, and the errors.
"""

from tether.aio import AsyncTether
from tether.client import RunResult, Session, Tether, WaitTimeout
from tether.engine.graph import (
    Exit,
    Node,
    Workflow,
    agent,
    compute,
    decision,
    effect,
    include,
    input,
    notify,
    shell,
    sleep,
)
from tether.engine.runner import Context, Runner, RunnerConfig
from tether.errors import (
    ClaimLost,
    Conflict,
    InvalidInput,
    NotFound,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    TetherError,
)
from tether.store import (
    Attempt,
    Decision,
    Effect,
    InteractiveRequest,
    QueueStatus,
    RunEvent,
    RunRecord,
    RunStatus,
    RunView,
    Store,
    Submission,
    WorkflowMessage,
    open_store,
)

__all__ = [
    "AsyncTether",
    "Attempt",
    "ClaimLost",
    "Conflict",
    "Context",
    "Decision",
    "Effect",
    "Exit",
    "InteractiveRequest",
    "InvalidInput",
    "Node",
    "NotFound",
    "QueueStatus",
    "RunEvent",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "RunView",
    "Runner",
    "RunnerConfig",
    "Session",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "Submission",
    "Tether",
    "TetherError",
    "WaitTimeout",
    "Workflow",
    "WorkflowMessage",
    "agent",
    "compute",
    "decision",
    "effect",
    "include",
    "input",
    "notify",
    "open_store",
    "shell",
    "sleep",
]
__version__ = "0.1.0"
