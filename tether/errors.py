"""Tether's exception types.

Every refusal the store expresses by raising is one of these. The docstring of each class is its
default message; ``code`` is a stable machine-readable name that the CLI and the HTTP API map to exit
codes and statuses in one place each.
"""

from __future__ import annotations


class TetherError(Exception):
    """Unexpected tether error."""

    code = "tether_error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class InvalidInput(TetherError):
    """A value passed to Tether is not valid."""

    code = "invalid_input"


class NotFound(TetherError):
    """The requested record does not exist."""

    code = "not_found"


class Conflict(TetherError):
    """The request conflicts with what is already stored."""

    code = "conflict"


class SessionBusy(Conflict):
    """The origin session already has an active interactive run."""

    code = "session_busy"


class ClaimLost(TetherError):
    """The claim is no longer live (expired, superseded or released); nothing was written."""

    code = "claim_lost"


class IllegalTransition(TetherError):
    """The status move is not an edge of the transition table; nothing was written."""

    code = "illegal_transition"


class ProjectNotRegistered(TetherError):
    """Project is not registered in the state database"""

    code = "project_not_registered"


class InconsistentState(TetherError):
    """The stored state changed underneath a transition; nothing was written."""

    code = "inconsistent_state"


class StoreError(TetherError):
    """The database refused the operation; nothing was written."""

    code = "store_error"


class StoreBusy(StoreError):
    """The database stayed locked by another writer past the busy timeout; retry the call."""

    code = "store_busy"


class SchemaTooNew(StoreError):
    """The database was written by a newer Tether; upgrade Tether to open it."""

    code = "schema_too_new"


class SchemaOutdated(StoreError):
    """The database schema is older than this Tether; run `tether db upgrade` first."""

    code = "schema_outdated"


class StoreUnavailable(StoreError):
    """The connection to the database was lost (a server restart, a terminated session, a
    network fault); nothing of the open transaction was written. Retry the call."""

    code = "store_unavailable"


class CommitUnknown(StoreUnavailable):
    """The connection broke while committing, so the write may or may not have landed; read the
    state back before repeating it."""

    code = "commit_unknown"


class CancelRequested(Conflict):
    """The run's cancel was requested: nothing more of it begins (its holder ends it)."""

    code = "cancel_requested"


class DeadlinePassed(Conflict):
    """The decision or input request closed when its deadline passed; its timeout policy applies."""

    code = "deadline_passed"


class WaitTimeout(TetherError):
    """The run did not finish in time."""

    code = "wait_timeout"


class ProviderError(TetherError):
    """The model provider failed or answered with something that is not JSON."""

    code = "provider_error"


class BudgetExceeded(TetherError):
    """An agent step used up one of its budgets (turns, tokens, invalid answers): the step fails."""

    code = "budget_exceeded"


class WorkflowLoadError(TetherError):
    """A workflow file or module could not be loaded."""

    code = "workflow_load_failed"


class LeaseUnproven(TetherError):
    """The runner can no longer prove its lease is live, so it stopped before writing."""

    code = "lease_unproven"
