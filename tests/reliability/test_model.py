"""Model-based test: a Hypothesis state machine drives the public store API and a small pure-Python
reference model side by side, on every backend of the contract suite.

Rules: reserve (new and repeated ids, adopt), claim, claim_next, renew, mark running, start, wait
for input (request_open + park in one transaction), park, complete, fail and cancel (with a token and
without), pause, resume (paused interaction and operator resume), restart (with the exact and a
stale parent revision), effects (enqueue, begin, finish), the tries of fan-out items (recorded
in groups beside the run's active attempt, as a fan-out node's threads do), stale-runner writes with
superseded or expired tokens, and clock moves (forward jumps and backward steps) through ``now=``. After every
step the store must match the model and the oracle must hold; each example ends with a drain
(every run cancelled once its lease has passed) and the full oracle.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.reliability import oracle
from tests.reliability.support import soak_report
from tests.store.conftest import _pg_empty
from tether import open_store
from tether.engine.graph import is_item
from tether.errors import ClaimLost, Conflict, IllegalTransition, InvalidInput
from tether.store import SettledTry, Store
from tether.values import definition_digest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASES = (1_000, 5_000)
RUNNERS = ("host-a", "host-b", "runner-c")
SOURCE = {"kind": "builtin", "id": "model", "revision": "1"}
SNAPSHOT = {"name": "model", "nodes": ["ask"]}
DIGEST = definition_digest(SNAPSHOT)
QUEUE_TERMINAL = {"done", "failed", "cancelled"}
RUN_TERMINAL = {"completed", "failed", "timed_out", "cancelled"}
#: Operations a claim holder performs; each is refused (nothing written) without a live claim.
CONTROL = ("fail_without_token", "cancel_without_token", "pause", "resume_interaction", "request_resume")
CLAIMED_OPS = (
    "renew",
    "mark_running",
    "start",
    "park",
    "complete",
    "fail",
    "cancel",
    "wait_for_input",
    "effect_enqueue",
    "effect_begin",
    "effect_finish",
    "record_items",
)


class ReleaseRefused(Exception):
    """complete() returned False inside a transaction: roll the transaction back."""


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


@dataclass
class MRun:
    """The model of one run."""

    run_id: str
    session: str
    interactive: bool
    created: int
    queue: str = "queued"
    state: str = "queued"
    paused: bool = False
    generation: int = 0
    owner: str | None = None
    token: str | None = None
    expires: int | None = None
    revision: int = 1
    available: int = 0
    pending_request: bool = False
    restarted: bool = False
    parent: str | None = None
    #: (token, generation) of every claim issued on the run.
    tokens: list[tuple[str, int]] = field(default_factory=list)
    effects: list[str] = field(default_factory=list)
    #: (node id, status, output) of every fan-out item try recorded.
    items: list[tuple[str, str, Any]] = field(default_factory=list)

    def live(self, now: int) -> bool:
        return self.owner is not None and self.expires is not None and self.expires > now

    def holds(self, token: str | None, now: int) -> bool:
        return token is not None and token == self.token and self.live(now)

    @property
    def terminal(self) -> bool:
        return self.queue in QUEUE_TERMINAL

    def release(self) -> None:
        self.owner = self.token = self.expires = None


class StoreMachine(RuleBasedStateMachine):
    """The store against the model. ``fresh_url`` gives each example an empty database."""

    fresh_url: Callable[[], str]
    totals: dict[str, int]

    def __init__(self) -> None:
        super().__init__()
        self.store: Store = open_store(type(self).fresh_url())
        self.now = 0
        self.runs: dict[str, MRun] = {}
        self.ids = itertools.count(1)
        self.history = oracle.History(drained=False, min_rejections=0)

    # -- helpers -----------------------------------------------------------------------------
    def _pick(self, index: int, which: Callable[[MRun], bool] = lambda r: True) -> MRun | None:
        candidates = [r for r in self.runs.values() if which(r)]
        return candidates[index % len(candidates)] if candidates else None

    def _reserve_args(self, run_id: str, session: str, interactive: bool, **extra: Any) -> dict[str, Any]:
        return {
            "run_id": run_id,
            "workflow_name": "model",
            "workflow_source_ref": "builtin:model",
            "workflow_source": SOURCE,
            "definition_digest": DIGEST,
            "definition_snapshot": SNAPSHOT,
            "input": {"run": run_id},
            "origin_session_id": session,
            "execution_mode": "interactive" if interactive else "headless",
            "now": at(self.now),
            **extra,
        }

    def _refused(self, run: MRun, op: str, token: str | None) -> None:
        """A claim-gated call the model says is stale was refused: record the stale attempt."""
        generation = next((g for t, g in run.tokens if t == token), None)
        if generation is None:
            return
        self.history.rejections.append(
            {
                "op": op,
                "run_id": run.run_id,
                "generation": generation,
                "current_generation": run.generation if run.owner is not None else None,
                "current_status": run.queue,
                "expired": token == run.token and not run.live(self.now),
                "still_live": False,
            }
        )
        type(self).totals["rejected"] += 1

    def _settle_effects_on_end(self, run: MRun, cancelled: bool) -> None:
        """Ending a run classifies its in-flight effects: applying ones become ambiguous; a cancel
        also cancels the pending ones (a fail or complete leaves them never applied)."""
        for index, status in enumerate(run.effects):
            if status == "applying":
                run.effects[index] = "ambiguous"
            elif status == "pending" and cancelled:
                run.effects[index] = "cancelled"

    # -- reservation -------------------------------------------------------------------------
    @initialize(interactive=st.booleans())
    def first_run(self, interactive: bool) -> None:
        self.reserve_new(interactive)

    @rule(
        kind=st.sampled_from(("new", "new", "repeat", "adopt", "adopt_changed")),
        interactive=st.booleans(),
        index=st.integers(0, 50),
    )
    def reserve(self, kind: str, interactive: bool, index: int) -> None:
        """Reserve a new id, or an existing one again (refused, or adopted without a write)."""
        if kind == "new":
            self.reserve_new(interactive)
        else:
            self.reserve_repeated(index, adopt=kind != "repeat", same=kind != "adopt_changed")

    def reserve_new(self, interactive: bool) -> None:
        n = next(self.ids)
        run_id, session = f"run-{n}", f"session-{n}"
        record = self.store.reserve(**self._reserve_args(run_id, session, interactive))
        assert record.status == "queued" and record.claim_generation is None
        self.runs[run_id] = MRun(run_id, session, interactive, self.now, available=self.now)
        self.history.reserved.add(run_id)

    def reserve_repeated(self, index: int, adopt: bool, same: bool) -> None:
        run = self._pick(index)
        assert run is not None
        seq = self.store.last_event_seq()
        args = self._reserve_args(run.run_id, run.session, run.interactive)
        if not same:
            args["input"] = {"run": run.run_id, "changed": True}
        if adopt and same and run.parent is None:
            prepared = self.store.reserve_or_adopt(**args)
            assert prepared.state == "adopted"
        else:
            with pytest.raises(Conflict):
                (self.store.reserve_or_adopt if adopt else self.store.reserve)(**args)
        assert self.store.last_event_seq() == seq

    @precondition(lambda self: any(r.terminal and r.state in RUN_TERMINAL for r in self.runs.values()))
    @rule(index=st.integers(0, 50), stale=st.booleans())
    def restart(self, index: int, stale: bool) -> None:
        parent = self._pick(index, lambda r: r.terminal and r.state in RUN_TERMINAL)
        assert parent is not None
        n = next(self.ids)
        child_id = f"run-{n}"
        args = self._reserve_args(
            child_id,
            parent.session,
            parent.interactive,
            parent_run_id=parent.run_id,
            lineage_kind="restart",
            parent_run_revision=parent.revision - 1 if stale else parent.revision,
        )
        seq = self.store.last_event_seq()
        if stale or parent.restarted:
            with pytest.raises(Conflict):
                self.store.reserve(**args)
            assert self.store.last_event_seq() == seq
            return
        record = self.store.reserve(**args)
        assert record.parent_run_id == parent.run_id and record.lineage_kind == "restart"
        parent.restarted = True
        self.runs[child_id] = MRun(
            child_id, parent.session, parent.interactive, self.now, available=self.now, parent=parent.run_id
        )
        self.history.reserved.add(child_id)

    # -- claims ------------------------------------------------------------------------------
    @precondition(lambda self: self.runs)
    @rule(
        index=st.integers(0, 50),
        runner=st.sampled_from(RUNNERS),
        lease=st.sampled_from(LEASES),
        next_in_queue=st.booleans(),
    )
    def claim(self, index: int, runner: str, lease: int, next_in_queue: bool) -> None:
        if next_in_queue:
            self.claim_next(runner, lease)
            return
        run = self._pick(index)
        assert run is not None
        token = f"tok-{next(self.ids)}"
        expected = not (run.terminal or run.pending_request or (run.live(self.now) and run.owner != runner))
        record = self.store.claim(
            run_id=run.run_id, runner_id=runner, claim_token=token, lease_ms=lease, now=at(self.now)
        )
        assert (record is not None) == expected, (run, self.now)
        if record is not None:
            self._claimed(run, runner, token, lease)
            assert record.claim_generation == run.generation and record.claim_token == token

    def _claimed(self, run: MRun, runner: str, token: str, lease: int) -> None:
        run.generation += 1
        run.owner, run.token, run.expires = runner, token, self.now + lease
        run.queue = "starting"
        run.revision += 1
        run.tokens.append((token, run.generation))
        self.history.tokens.add(token)
        type(self).totals["claims"] += 1

    def claim_next(self, runner: str, lease: int) -> None:
        eligible = [
            r
            for r in self.runs.values()
            if r.queue in ("queued", "parked", "starting", "running")
            and r.available <= self.now
            and (r.owner is None or (r.expires or 0) <= self.now or r.owner == runner)
            and not (r.queue == "parked" and (r.state == "waiting" or r.paused))
            and not r.pending_request
        ]
        eligible.sort(key=lambda r: (r.available, r.created, r.run_id))
        token = f"tok-{next(self.ids)}"
        record = self.store.claim_next(runner_id=runner, claim_token=token, lease_ms=lease, now=at(self.now))
        if not eligible:
            assert record is None
            return
        assert record is not None and record.run_id == eligible[0].run_id, (record, eligible[0])
        self._claimed(eligible[0], runner, token, lease)

    # -- writes under a claim (the current token, or an older one) ---------------------------
    @precondition(lambda self: any(r.token for r in self.runs.values()))
    @rule(
        ops=st.lists(st.sampled_from(CLAIMED_OPS), min_size=1, max_size=6),
        index=st.integers(0, 50),
        lease=st.sampled_from(LEASES),
    )
    def act_as_holder(self, ops: list[str], index: int, lease: int) -> None:
        """A holder's burst of writes (the store and the oracle are checked after each one)."""
        run = self._pick(index, lambda r: r.token is not None)
        assert run is not None
        token = run.token
        for op in ops:
            self._act(run, op, token, lease)
            self.check()

    @precondition(lambda self: any(r.token for r in self.runs.values()))
    @rule(
        ending=st.sampled_from(("fail", "complete", "cancel", "park")),
        index=st.integers(0, 50),
        lease=st.sampled_from(LEASES),
    )
    def end_with_an_effect_in_flight(self, ending: str, index: int, lease: int) -> None:
        """The holder begins an effect and ends (or parks) the run while it is still applying."""
        run = self._pick(index, lambda r: r.token is not None)
        assert run is not None
        token = run.token
        for op in ("start", "effect_enqueue", "effect_begin", ending):
            self._act(run, op, token, lease)
            self.check()

    @precondition(lambda self: any(r.token for r in self.runs.values()))
    @rule(
        ending=st.sampled_from(("renew", "complete", "park", "fail")),
        index=st.integers(0, 50),
        lease=st.sampled_from(LEASES),
    )
    def record_fan_out_items(self, ending: str, index: int, lease: int) -> None:
        """The holder records its fan-out's item tries in groups, as the node's threads do, then
        renews, ends or parks the run."""
        run = self._pick(index, lambda r: r.token is not None)
        assert run is not None
        token = run.token
        for op in ("start", "record_items", "record_items", ending):
            self._act(run, op, token, lease)
            self.check()

    @precondition(lambda self: any(r.tokens for r in self.runs.values()))
    @rule(
        op=st.sampled_from(CLAIMED_OPS),
        index=st.integers(0, 50),
        which=st.integers(0, 50),
        lease=st.sampled_from(LEASES),
    )
    def act_with_an_old_token(self, op: str, index: int, which: int, lease: int) -> None:
        run = self._pick(index, lambda r: bool(r.tokens))
        assert run is not None
        token, _ = run.tokens[which % len(run.tokens)]
        self._act(run, op, token, lease)

    def _act(self, run: MRun, op: str, token: str | None, lease: int) -> None:
        holds = run.holds(token, self.now)
        store, now, run_id = self.store, at(self.now), run.run_id
        assert token is not None
        before = self.store.last_event_seq()
        if not holds:
            type(self).totals["stale_tries"] += 1
            refused = self._call(op, run, token, lease)
            assert refused is False, f"{op} with a stale token was accepted: {run}"
            assert self.store.last_event_seq() == before
            self._refused(run, op, token)
            return
        if op == "renew":
            assert store.renew(run_id=run_id, claim_token=token, lease_ms=lease, now=now)
            run.expires = self.now + lease
        elif op == "mark_running":
            assert store.mark_running(run_id=run_id, claim_token=token, now=now)
            run.queue = "running"
            run.revision += 1
        elif op == "start":
            store.set_run_status(run_id=run_id, claim_token=token, status="running", now=now)
            run.state = "running"
            run.revision += 1
        elif op == "park":
            assert store.park(run_id=run_id, claim_token=token, now=now)
            run.queue = "parked"
            run.revision += 1
            run.release()
        elif op == "complete":
            if run.state not in ("running", "waiting"):
                with pytest.raises(IllegalTransition):
                    self._complete(run_id, token, now)
                return
            if run.queue == "queued":
                # A revived claim (the clock stepped back over its expiry) on a run an operator
                # put back in the queue meanwhile: the queue cannot move from queued to done.
                assert not self._complete(run_id, token, now)
                assert self.store.last_event_seq() == before
                return
            assert self._complete(run_id, token, now)
            run.queue, run.state, run.paused = "done", "completed", False
            run.revision += 2
            run.release()
            self._settle_effects_on_end(run, cancelled=False)
            self.history.accepted_terminals[run_id] += 1
        elif op in ("fail", "cancel"):
            if op == "fail":
                assert store.fail(
                    run_id=run_id, claim_token=token, error_code="modelFail", error_message="x", now=now
                )
                run.queue = run.state = "failed"
            else:
                assert store.cancel(run_id=run_id, claim_token=token, now=now)
                run.queue = run.state = "cancelled"
            run.paused = False
            run.pending_request = False
            run.revision += 1
            run.release()
            self._settle_effects_on_end(run, cancelled=op == "cancel")
            self.history.accepted_terminals[run_id] += 1
        elif op == "wait_for_input":
            if not run.interactive:
                with pytest.raises(InvalidInput):
                    self._wait_for_input(run, token, now)
                assert self.store.last_event_seq() == before
                return
            self._wait_for_input(run, token, now)
            run.revision += 3 + (run.state == "queued")
            run.state, run.queue, run.pending_request = "waiting", "parked", True
            run.release()
        elif op == "effect_enqueue":
            key = f"{run_id}-e{len(run.effects)}"
            effect = store.effect_enqueue(
                run_id=run_id, claim_token=token, effect_type="mail.send", idempotency_key=key, now=now
            )
            assert effect.status == "pending"
            run.effects.append("pending")
            run.revision += 1
        elif op == "record_items":
            # A group of tries that ended together: item n completed, item n + 1 failed (one
            # journal entry each).
            n = len(run.items)
            recorded = [(f"fan[{n}]", "completed", {"item": n}), (f"fan[{n + 1}]", "failed", None)]
            ids = store.attempt_record(
                run_id=run_id,
                claim_token=token,
                tries=[
                    SettledTry(node_id, status, 3, output, None if output else "item failed")
                    for node_id, status, output in recorded
                ],
                now=now,
            )
            assert len(ids) == len(recorded)
            run.items += recorded
            run.revision += len(recorded)
            type(self).totals["item_tries"] += len(recorded)
        elif op in ("effect_begin", "effect_finish"):
            wanted = "pending" if op == "effect_begin" else "applying"
            found = [e for e in store.effects(run_id=run_id) if e.status == wanted]
            assert len(found) == run.effects.count(wanted)
            if not found:
                return
            index = run.effects.index(wanted)
            if op == "effect_begin":
                store.effect_begin(run_id=run_id, claim_token=token, effect_id=found[0].effect_id, now=now)
                run.effects[index] = "applying"
            else:
                applied = len(run.effects) % 2 == 1
                store.effect_finish(
                    run_id=run_id, claim_token=token, effect_id=found[0].effect_id, applied=applied, now=now
                )
                run.effects[index] = "applied" if applied else "rejected"
            run.revision += 1

    def _complete(self, run_id: str, token: str, now: datetime) -> bool:
        """The engine's finish: the durable status and the release in one transaction, rolled back
        whole when the release is refused (as the runner does)."""
        try:
            with self.store.transaction():
                self.store.set_run_status(run_id=run_id, claim_token=token, status="completed", now=now)
                if not self.store.complete(run_id=run_id, claim_token=token, now=now):
                    raise ReleaseRefused
        except ReleaseRefused:
            return False
        return True

    def _wait_for_input(self, run: MRun, token: str, now: datetime) -> None:
        with self.store.transaction():
            if run.state == "queued":
                self.store.set_run_status(run_id=run.run_id, claim_token=token, status="running", now=now)
            attempt = self.store.attempt_start(run_id=run.run_id, claim_token=token, node_id="ask", now=now)
            self.store.request_open(
                run_id=run.run_id,
                claim_token=token,
                attempt_id=attempt.attempt_id,
                kind="input",
                payload={"q": 1},
                now=now,
            )
            assert self.store.park(run_id=run.run_id, claim_token=token, now=now)

    def _call(self, op: str, run: MRun, token: str, lease: int) -> bool:
        """A claim-gated call expected to be refused: False when it was (returned False or raised
        ClaimLost), True when the store accepted it."""
        store, now, run_id = self.store, at(self.now), run.run_id
        try:
            if op == "renew":
                return store.renew(run_id=run_id, claim_token=token, lease_ms=lease, now=now)
            if op == "mark_running":
                return store.mark_running(run_id=run_id, claim_token=token, now=now)
            if op == "start":
                store.set_run_status(run_id=run_id, claim_token=token, status="running", now=now)
                return True
            if op == "park":
                return store.park(run_id=run_id, claim_token=token, now=now)
            if op == "complete":
                with store.transaction():
                    return store.complete(run_id=run_id, claim_token=token, now=now)
            if op == "fail":
                return store.fail(
                    run_id=run_id, claim_token=token, error_code="stale", error_message="x", now=now
                )
            if op == "cancel":
                return store.cancel(run_id=run_id, claim_token=token, now=now)
            if op == "wait_for_input":
                self._wait_for_input(run, token, now)
                return True
            if op == "record_items":
                store.attempt_record(
                    run_id=run_id,
                    claim_token=token,
                    tries=[SettledTry("fan[stale]", "completed", 1, {"stale": True})],
                    now=now,
                )
                return True
            if op == "effect_enqueue":
                store.effect_enqueue(
                    run_id=run_id,
                    claim_token=token,
                    effect_type="mail.send",
                    idempotency_key="stale",
                    now=now,
                )
                return True
            effects = store.effects(run_id=run_id)
            if not effects:
                store.attempt_start(run_id=run_id, claim_token=token, node_id="stale", now=now)
                return True
            if op == "effect_begin":
                store.effect_begin(run_id=run_id, claim_token=token, effect_id=effects[0].effect_id, now=now)
            else:
                store.effect_finish(
                    run_id=run_id, claim_token=token, effect_id=effects[0].effect_id, applied=True, now=now
                )
            return True
        except ClaimLost:
            return False

    # -- control without a claim -------------------------------------------------------------
    @precondition(lambda self: self.runs)
    @rule(action=st.sampled_from(CONTROL), index=st.integers(0, 50))
    def control(self, action: str, index: int) -> None:
        """A control surface acts without a claim."""
        getattr(self, action)(index)

    def fail_without_token(self, index: int) -> None:
        run = self._pick(index)
        assert run is not None
        expected = (
            not run.terminal and run.state not in RUN_TERMINAL and run.queue in ("queued", "starting")
        ) and run.owner is None
        done = self.store.fail(run_id=run.run_id, error_code="operator", error_message="x", now=at(self.now))
        assert done == expected, run
        if done:
            run.queue = run.state = "failed"
            run.paused = run.pending_request = False
            run.revision += 1
            self._settle_effects_on_end(run, cancelled=False)
            self.history.accepted_terminals[run.run_id] += 1

    def cancel_without_token(self, index: int) -> None:
        run = self._pick(index)
        assert run is not None
        direct = not run.terminal and run.queue in ("queued", "starting") and run.owner is None
        stale = not run.terminal and not direct and not run.live(self.now)
        done = self.store.cancel(run_id=run.run_id, now=at(self.now))
        assert done == (direct or stale), run
        if done:
            self._cancelled(run, control_claim=stale)

    def _cancelled(self, run: MRun, *, control_claim: bool) -> None:
        if control_claim:
            run.generation += 1  # cancel_stale takes (and releases) a control claim
        run.queue = run.state = "cancelled"
        run.paused = run.pending_request = False
        run.revision += 1
        run.release()
        self._settle_effects_on_end(run, cancelled=True)
        self.history.accepted_terminals[run.run_id] += 1

    def pause(self, index: int) -> None:
        run = self._pick(index)
        assert run is not None
        eligible = run.queue == "parked" and not run.live(self.now) and run.pending_request
        changes = eligible and not run.paused and run.state in ("running", "waiting")
        done = self.store.pause_parked(run_id=run.run_id, now=at(self.now))
        assert done == (eligible and (run.paused or changes)), run
        if changes:
            run.paused = True
            run.revision += 1

    def resume_interaction(self, index: int) -> None:
        run = self._pick(index)
        assert run is not None
        expected = (
            run.queue == "parked"
            and run.state == "waiting"
            and run.paused
            and not run.live(self.now)
            and run.pending_request
        )
        assert self.store.resume_paused_interaction(run_id=run.run_id, now=at(self.now)) == expected
        if expected:
            run.paused = False
            run.revision += 1

    def request_resume(self, index: int) -> None:
        run = self._pick(index)
        assert run is not None
        expected = not (
            run.terminal or run.live(self.now) or run.pending_request or "ambiguous" in run.effects
        )
        assert self.store.request_resume(run_id=run.run_id, now=at(self.now)) == expected, run
        if expected:
            if run.state in ("queued", "running", "waiting"):
                run.paused = False
            run.queue, run.available = "queued", self.now
            run.revision += 1

    # -- the clock ---------------------------------------------------------------------------
    @rule(ms=st.integers(-max(LEASES), 2 * max(LEASES)).filter(bool))
    def clock(self, ms: int) -> None:
        """The clock jumps forward or steps back (a wall clock is not monotonic)."""
        self.now = max(0, self.now + ms)

    # -- invariants --------------------------------------------------------------------------
    def check_model(self) -> None:
        for run in self.runs.values():
            record = self.store.get_run(run.run_id)
            view = self.store.get_run_view(run.run_id)
            assert record is not None and view is not None
            assert (record.status, view.run_state_status, view.paused) == (
                run.queue,
                run.state,
                run.paused,
            ), run
            assert record.runner_id == run.owner, run
            assert record.claim_generation == (run.generation if run.owner else None), run
            if run.owner is not None:
                assert record.claim_expires_at == at(run.expires or 0), run
                assert self.store.verify_claim(
                    run_id=run.run_id, claim_token=run.token or "-", now=at(self.now)
                ) == run.live(self.now)
            assert self.store.run_revision(run.run_id) == run.revision, run
            stored = sorted(e.status for e in self.store.effects(run_id=run.run_id))
            assert stored == sorted(run.effects), run
            items = [
                (a.node_id, a.status, a.output) for a in self.store.attempts(run.run_id) if is_item(a.node_id)
            ]
            assert sorted(items, key=repr) == sorted(run.items, key=repr), run

    def check(self) -> None:
        self.check_model()
        oracle.check(self.store, self.history)

    @invariant()
    def store_matches_model_and_oracle_holds(self) -> None:
        self.check()

    def teardown(self) -> None:
        try:
            # The drain: once every lease has passed, cancelling ends every unfinished run.
            self.now = max([self.now, *(r.expires or 0 for r in self.runs.values())]) + 1
            for run in list(self.runs.values()):
                if not run.terminal:
                    assert self.store.cancel(run_id=run.run_id, now=at(self.now)), run
                    direct = run.queue in ("queued", "starting") and run.owner is None
                    self._cancelled(run, control_claim=not direct)
            self.check_model()
            self.history.drained = True
            oracle.check(self.store, self.history)
            type(self).totals["examples"] += 1
        finally:
            self.store.close()


@pytest.mark.slow
def test_store_against_model__every_step_matches_and_the_oracle_holds(
    store_url: str, seed: int, soak: bool, tmp_path: Any
) -> None:
    counter = itertools.count()

    def fresh_url() -> str:
        if store_url.startswith("sqlite"):
            return f"sqlite:///{tmp_path}/model-{next(counter)}.db"
        _pg_empty(store_url)
        return store_url

    machine = type(
        "Machine",
        (StoreMachine,),
        {
            "fresh_url": staticmethod(fresh_url),
            "totals": {"examples": 0, "claims": 0, "stale_tries": 0, "rejected": 0, "item_tries": 0},
        },
    )
    hypothesis.seed(seed)(machine)  # run_state_machine_as_test draws from this seed
    run_state_machine_as_test(
        machine,
        settings=settings(
            # PostgreSQL steps cost several round trips each: fewer examples keep make test short.
            max_examples=400 if soak else (60 if store_url.startswith("sqlite") else 20),
            stateful_step_count=80 if soak else 40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    totals = machine.totals
    print("model:", totals)
    backend = "postgres" if store_url.startswith("postgres") else "sqlite"
    soak_report(f"Model-based test ({backend})", totals, [f"seed {seed}."])
    assert totals["examples"] > 0 and totals["item_tries"] > 0, totals
    # Across the examples the stale-writer rules ran and every stale write was refused.
    assert totals["rejected"] > 0 and totals["rejected"] == totals["stale_tries"], totals
