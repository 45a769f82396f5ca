"""Immutable records the store returns. Field names are the seed's record fields in snake_case."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from tether.values import Json


@dataclass(frozen=True)
class RunRecord:
    """A run as a runner or a control surface sees it (claims, ``get_run``, ``list_runs``)."""

    run_id: str
    workflow_name: str
    workflow_source_ref: str
    workflow_source: Json
    initialized: bool
    definition_digest: str
    input: Json
    launch_options: Json
    status: str
    runner_id: str | None
    #: The raw token, only on the record a successful claim returns to its claimer.
    claim_token: str | None = field(repr=False)
    claim_generation: int | None
    claim_expires_at: datetime | None
    origin_session_id: str | None
    execution_mode: str
    parent_run_id: str | None
    root_run_id: str
    lineage_kind: str | None
    restart_number: int
    parent_run_revision: int | None
    error_code: str | None
    error_message: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    #: For a child run: the run whose node started it, and that node (see ``Store.children``).
    child_of: str | None = None
    child_of_node: str | None = None


@dataclass(frozen=True)
class RunView:
    """A run as a read-only viewer sees it: no input, options or claim; the durable status too."""

    run_id: str
    workflow_name: str
    workflow_source_ref: str
    workflow_source: Json
    initialized: bool
    definition_digest: str
    run_state_status: str
    paused: bool
    status: str
    origin_session_id: str | None
    execution_mode: str
    parent_run_id: str | None
    root_run_id: str
    lineage_kind: str | None
    restart_number: int
    parent_run_revision: int | None
    error_code: str | None
    error_message: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    #: For a child run: the run whose node started it, and that node.
    child_of: str | None = None
    child_of_node: str | None = None


@dataclass(frozen=True)
class Preparation:
    """What ``reserve_or_adopt`` did: reserved a new run or adopted the existing one."""

    state: Literal["reserved", "adopted"]
    run: RunRecord


@dataclass(frozen=True)
class ListRevision:
    total: int
    revision: str


@dataclass(frozen=True)
class RunViewPage:
    total: int
    revision: str
    runs: list[RunView]


@dataclass(frozen=True)
class Actor:
    type: str
    id: str


@dataclass(frozen=True)
class ClaimAuthority:
    actor: Actor
    owner_type: str
    owner_id: str
    token: str = field(repr=False)
    generation: int
    lease_ms: int


@dataclass(frozen=True)
class RunEvent:
    """One journal entry of a run."""

    seq: int
    recorded_at: datetime
    run_id: str
    workflow_ref: str
    type: str
    runner_id: str | None
    payload: Json


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    run_id: str
    node_id: str
    attempt_number: int
    status: str
    output: Json
    exit_name: str | None
    error_message: str | None
    timeout_ms: int | None
    elapsed_ms: int
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class SettledTry:
    """One try of an item of a fan-out node, to record once it ended (``Store.attempt_record``):
    ``completed`` with its ``output``, or ``failed`` or ``timed_out`` with its ``error_message``,
    after running
    ``ran_ms`` milliseconds."""

    node_id: str
    status: str
    ran_ms: int = 0
    output: Json = None
    error_message: str | None = None


@dataclass(frozen=True)
class InteractiveRequest:
    request_id: str
    run_id: str
    attempt_id: str
    target_session_id: str
    kind: str
    revision: int
    status: str
    payload: Json
    created_at: datetime


@dataclass(frozen=True)
class Submission:
    submission_id: str
    request_id: str
    outcome: str
    payload: Json
    receipt: Json
    created_at: datetime


@dataclass(frozen=True)
class Decision:
    decision_id: str
    run_id: str
    node_id: str
    request: Json
    request_digest: str
    deadline_at: datetime | None
    created_at: datetime
    outcome: str | None
    provenance: str | None
    response: Json
    reason: str | None
    actor_id: str | None
    resolved_at: datetime | None


@dataclass(frozen=True)
class Effect:
    effect_id: str
    run_id: str
    effect_type: str
    idempotency_key: str
    payload: Json
    result: Json
    status: str
    attempt_count: int
    error_message: str | None
    created_at: datetime
    settled_at: datetime | None


@dataclass(frozen=True)
class WorkflowMessage:
    message_id: str
    run_id: str
    target_session_id: str
    kind: str
    status: str
    payload: Json
    created_at: datetime


@dataclass(frozen=True)
class ViewerDelta:
    presentation_revision: int
    target_type: str
    target_key: str
    patch: Json


@dataclass(frozen=True)
class ViewerChanges:
    """Deltas after a viewer's revision, or ``snapshot_required`` when they cannot bridge the gap."""

    run_id: str
    revision: int
    snapshot_required: bool
    deltas: list[ViewerDelta]
    #: (target_type, target_key) pairs the viewer should refetch, in first-named order.
    targets: list[tuple[str, str]]


@dataclass(frozen=True)
class ViewerTarget:
    """One bounded target of a viewer change, with the caller's JSON-patch operations."""

    target_type: str
    target_key: str = ""
    ops: tuple[Json, ...] = ()
