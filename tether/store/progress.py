"""Progress from inside a step: how far a long step has come, journalled as ``node.progress``.

A step reports ``done`` of ``total`` (and a short message) through its context; the runner passes
the reports on at a bounded rate, each in a transaction of its own that re-checks the claim, so a
runner that lost its run records nothing. Readers (``tether watch``, ``show``, the console) take a
step's progress from its ``node.progress`` entries (``latest_progress``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tether.errors import InvalidInput
from tether.store.forks import ForkOps
from tether.store.runs import Now
from tether.values import Json, require_text

PROGRESS_EVENT = "node.progress"
#: The longest message kept with a report.
MESSAGE_LIMIT = 500


@dataclass(frozen=True)
class Progress:
    """A step's latest progress report; ``first_*``: its attempt's first report, for the rate."""

    run_id: str
    node_id: str
    attempt: int
    done: float
    total: float | None
    message: str | None
    at: datetime
    first_done: float
    first_at: datetime

    @property
    def fraction(self) -> float | None:
        return None if not self.total else min(1.0, self.done / self.total)

    @property
    def seconds_left(self) -> float | None:
        """The time left at the rate since the first report (None without a total or a rate)."""
        if not self.total or self.done >= self.total:
            return None
        elapsed = (self.at - self.first_at).total_seconds()
        gained = self.done - self.first_done
        if elapsed <= 0 or gained <= 0:
            return None
        return (self.total - self.done) * elapsed / gained


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        raise InvalidInput(f"progress {name} must be a number of at least 0, not {value!r}")
    return float(value)


def check_progress(done: object, total: object, message: object) -> tuple[float, float | None, str | None]:
    """The report's values checked: ``done`` at least 0, ``total`` None or above 0 and at least
    ``done``, ``message`` None or text (cut to ``MESSAGE_LIMIT`` characters)."""
    counted = _number("done", done)
    whole = None if total is None else _number("total", total)
    if whole is not None and (whole == 0 or counted > whole):
        raise InvalidInput(f"progress total must be above 0 and at least done ({counted:g}), not {whole:g}")
    if message is not None and not isinstance(message, str):
        raise InvalidInput("progress message must be text or None")
    return counted, whole, None if message is None else message[:MESSAGE_LIMIT]


class ProgressOps(ForkOps):
    """Recording and reading step progress."""

    def record_progress(
        self,
        *,
        run_id: str,
        claim_token: str,
        node_id: str,
        attempt: int,
        done: float,
        total: float | None = None,
        message: str | None = None,
        now: Now = None,
    ) -> None:
        """Journal a progress report of the running step ``node_id`` under the live claim
        (``ClaimLost`` when the claim is gone; nothing is written then)."""
        at = self._args(run_id, claim_token, now)
        require_text("node_id", node_id, limit=1000)
        counted, whole, text = check_progress(done, total, message)
        payload: dict[str, Json] = {"nodeId": node_id, "attempt": attempt, "done": counted, "total": whole}
        if text is not None:
            payload["message"] = text
        with self.db.transaction():
            row = self._held(run_id, claim_token, at)
            self._bump_emit(row, PROGRESS_EVENT, payload, at)

    def latest_progress(self, run_id: str) -> dict[str, Progress]:
        """Each step's latest progress report in the run, by node id (of its latest attempt)."""
        found: dict[str, Progress] = {}
        for event in self.events_after(0, run_id=run_id, event_type=PROGRESS_EVENT, limit=100_000):
            body = event.payload if isinstance(event.payload, dict) else {}
            node_id, attempt = str(body.get("nodeId", "")), int(body.get("attempt") or 0)
            done, total = float(body.get("done") or 0), body.get("total")
            earlier = found.get(node_id)
            first = earlier is not None and earlier.attempt == attempt
            found[node_id] = Progress(
                run_id,
                node_id,
                attempt,
                done,
                float(total) if isinstance(total, int | float) else None,
                message if isinstance(message := body.get("message"), str) else None,
                event.recorded_at,
                earlier.first_done if first and earlier else done,
                earlier.first_at if first and earlier else event.recorded_at,
            )
        return found
