"""``fan_out`` and ``parallel``: many calls of one node at once, each durable on its own.

The node's own attempt stays active while its calls run on threads of their own, at most the
node's parallelism at once, within the run its worker holds (the heartbeat renews the run's lease
meanwhile). Each try of a call is recorded as it ends, under the live claim
(``Store.attempt_record``; the tries that end together share one transaction), as an attempt
named ``NODE[key]``: item 7 of a fan-out is ``fan[7]``, branch ``fast`` of a parallel node
``race[fast]``. The calls of this visit of the
node are the item attempts recorded after the run's last completed step (the one that led
here), so a worker that takes the run over after a crash calls only the items with no completed
try, and the failed tries already recorded count against their retries.

An effect item (``fan_out(..., effect=True)``, an ``effect`` branch of a parallel node) is an
effect through the outbox, keyed ``RUN:NODE[key]:VISIT`` (the visit: the node's completed
attempts, plus one), so every worker that calls the item finds the same effect: recorded and
begun (``pending``, then ``applying``) under the live claim before its function is called, and
settled (``applied`` or ``rejected``) in the transaction that records its try. Begins and tries
go into the same groups: a thread waits for the group that begins its effect before it calls.
An applied item is never called again (its result is the item's output); an item caught
applying by a crash is found ``ambiguous`` by the next worker (``Recovery._take_up``), and one
abandoned at its deadline is marked so here: the node lets the items running end, then hands
its run to a person as an ``effect`` node does. A store that has a cancel committed refuses to
begin an effect, so no item of a cancelled run begins one.

Once the node has what it needs (every item; a parallel node's ``join`` branches), its attempt
completes with their outputs. No call records anything after that (the node's ending waits for a
write under way and drops the tries still waiting), so a branch a ``join=n`` left running is never
mistaken for a call of a later visit.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tether.engine.context import Context
from tether.engine.failures import story, summary
from tether.engine.graph import Node, Workflow, is_item, item_node_id
from tether.engine.nodes.base import StepHost
from tether.engine.worker.deadlines import RunTimedOut, StepTimedOut, routes
from tether.engine.worker.state import ActiveRun, Parked
from tether.errors import ClaimLost, LeaseUnproven
from tether.store import Attempt, Effect, SettledTry
from tether.values import Json, canonical_json

#: How often the node's thread looks at its run's cancel signal and its runner's stop while its
#: calls run (a call's end wakes it at once).
WATCH_S = 0.05


@dataclasses.dataclass
class Entry:
    """One try of a call, waiting to be recorded with a group (``FanOut._record``); or the begin
    of an effect item's effect (``begin``: its type and idempotency key), waiting for a group to
    record and begin it (``FanOut._begin_effect``)."""

    node_id: str
    key: str
    status: str
    ran_ms: int
    output: Json
    error_message: str | None
    #: An effect item's effect, settled with the try (``applied`` when completed, else
    #: ``rejected`` with ``effect_error``).
    effect_id: str | None = None
    effect_error: str | None = None
    #: A begin: the effect's type and key, and the effect as the group left it.
    begin: tuple[str, str] | None = None
    effect: Effect | None = None
    #: Whether a group took it and ended; whether that group wrote it; the group's error.
    done: bool = False
    written: bool = False
    error: BaseException | None = None


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of the node: ``fn(ctx, *args)`` under ``key``, retried ``retries`` times, each
    try under the deadline of ``node`` (the fan-out node's ``timeout_s``, a branch's own; the
    run's). An effect call (``effect_type`` set) is ``fn(ctx, *args, idempotency_key)``, through
    the outbox, and never retried."""

    key: str
    fn: Callable[..., Any]
    args: tuple[Json, ...]
    retries: int
    backoff_s: float
    node: Node
    effect_type: str | None = None


def run_fan_out(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    waiting: Attempt | None,
) -> None:
    attempt = host.begin_node(active, ctx.node_id)
    assert node.fn is not None
    try:
        items = node.hooks["items"](ctx)
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise TypeError(f"the items function of node {node.id} returned {items!r}, not a list")
        items = list(items)
        canonical_json(items)
    except ClaimLost:
        raise
    except BaseException as error:
        if active.cancelled.is_set():
            raise Parked("step ended by its run's cancel") from None
        host.fail_node(active, node, attempt, summary(error), 0, 0, 1.0, raised=error)
        return
    retries, backoff_s = int(node.spec["retries"]), float(node.spec["backoffS"])
    effect_type = node.spec.get("effectType")
    calls = [
        Call(
            str(n),
            node.fn,
            (item,),
            retries,
            backoff_s,
            node,
            None if effect_type is None else str(effect_type),
        )
        for n, item in enumerate(items)
    ]
    fan = FanOut(host, active, ctx, attempt, calls, int(node.spec["parallelism"]), len(calls))
    try:
        fan.run()
    except RunTimedOut:
        host.time_out_run(active)  # raises Parked
        return
    outputs = [fan.outputs.get(call.key) for call in calls]
    _settle(host, active, wf, node, ctx, attempt, fan, outputs)


def run_parallel(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    waiting: Attempt | None,
) -> None:
    attempt = host.begin_node(active, ctx.node_id)
    calls = []
    for branch in node.branches:
        assert branch.fn is not None
        if branch.kind == "effect":
            calls.append(Call(branch.id, branch.fn, (), 0, 1.0, branch, str(branch.spec["effectType"])))
            continue
        calls.append(
            Call(
                branch.id, branch.fn, (), int(branch.spec["retries"]), float(branch.spec["backoffS"]), branch
            )
        )
    fan = FanOut(host, active, ctx, attempt, calls, len(calls), int(node.spec["join"]))
    try:
        fan.run()
    except RunTimedOut:
        host.time_out_run(active)  # raises Parked
        return
    outputs = {call.key: fan.outputs[call.key] for call in calls if call.key in fan.outputs}
    _settle(host, active, wf, node, ctx, attempt, fan, outputs)


def _settle(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    attempt: Attempt,
    fan: FanOut,
    outputs: Json,
) -> None:
    """End the node's attempt: completed with ``outputs``; or, when calls failed, by the
    ``error`` exit if the workflow routes it, else failed (which fails the run)."""
    if not fan.errors:
        host.complete_node(active, attempt, outputs)
        return
    if routes(wf, ctx.node_id, "error"):
        host.complete_node(active, attempt, {"outputs": outputs, "errors": dict(fan.errors)}, "error")
        return
    key, error = next(iter(sorted(fan.errors.items(), key=lambda pair: fan.order[pair[0]])))
    more = f" (and {len(fan.errors) - 1} more)" if len(fan.errors) > 1 else ""
    message = f"{item_node_id(ctx.node_id, key)} failed{more}: {error}"
    host.fail_node(active, node, attempt, message, 0, 0, 1.0)


def recorded(attempts: Sequence[Attempt], node_id: str) -> tuple[dict[str, Json], dict[str, list[str]]]:
    """The calls of this visit of ``node_id`` recorded already: the completed ones' outputs, and
    the errors of each call's failed tries, by key. This visit's tries are the ones recorded
    after the run's last completed step."""
    start = 0
    for index, attempt in enumerate(attempts):
        if attempt.status == "completed" and not is_item(attempt.node_id):
            start = index + 1
    prefix = f"{node_id}["
    outputs: dict[str, Json] = {}
    errors: dict[str, list[str]] = {}
    for attempt in attempts[start:]:
        if not (attempt.node_id.startswith(prefix) and is_item(attempt.node_id)):
            continue
        key = attempt.node_id[len(prefix) : -1]
        if attempt.status == "completed":
            outputs[key] = attempt.output
        elif attempt.status in ("failed", "timed_out"):
            errors.setdefault(key, []).append(attempt.error_message or attempt.status)
    return outputs, errors


class FanOut:
    """The calls of one fan-out or parallel node's attempt, run on a pool of threads.

    ``need``: how many completed calls end the node (every call; a parallel node's ``join``).
    After ``run()``: ``outputs`` by key (this visit's, recorded before too), ``errors`` by key
    (the last error of each call that failed after its retries)."""

    def __init__(
        self,
        host: StepHost,
        active: ActiveRun,
        ctx: Context,
        attempt: Attempt,
        calls: Sequence[Call],
        parallelism: int,
        need: int,
    ) -> None:
        self.host = host
        self.active = active
        self.ctx = ctx
        self.attempt = attempt
        self.calls = list(calls)
        self.order = {call.key: n for n, call in enumerate(calls)}
        self.parallelism = parallelism
        self.need = need
        #: Guards the fields below, ``outputs`` and ``errors``; wakes the threads waiting for the
        #: group that writes their tries.
        self._turns = threading.Condition()
        #: Whether a thread is writing a group of tries now.
        self._writing = False
        #: Held by each of the node's transactions (a group's, an effect marked ambiguous): they
        #: write the run's journal, and on PostgreSQL two at once on one run's journal make one
        #: of them fail, so the node's writes take turns.
        self._store_turn = threading.Lock()
        #: Set by the node's ending (``_close``, once no group is being written): from then on no
        #: try is recorded.
        self._closed = False
        #: The tries waiting to be written by the next group.
        self._queue: list[Entry] = []
        #: Completed tries recorded or waiting to be (never more than ``need``).
        self._promised = 0
        #: No call starts (nor tries again) once set: a call failed for good, the node has what it
        #: needs, the run is cancelled, or the runner is stopping.
        self._halted = threading.Event()
        #: The calls' ``ctx.cancelled``: set when the run is cancelled, and for the calls a
        #: parallel node's join no longer needs.
        self._signal = threading.Event()
        #: Set when a call ends and when a thread of the node ends: wakes the node's thread.
        self._ended = threading.Event()
        #: The node's threads still running.
        self._live = 0
        #: A store refusal or failure met while recording (the claim was lost, the store was
        #: unreachable): the node's thread raises it.
        self._trouble: BaseException | None = None
        self.outputs: dict[str, Json] = {}
        self.errors: dict[str, str] = {}
        self._failures: dict[str, int] = {}
        #: The visit of the node its effect items' keys name (set by ``run``).
        self._visit = 1
        #: Why each effect item whose outcome is unknown is so, by key: the node ends by handing
        #: its run to a person.
        self.ambiguous: dict[str, str] = {}

    def run(self) -> None:
        """Call every call not completed in this visit yet, at most ``parallelism`` at once, and
        return once the node has what it needs or a call failed for good (then once the calls
        running ended, each recorded). Raises ``Parked`` once the run is cancelled and
        ``ClaimLost`` once its claim is; a runner that stops meanwhile lets the calls running end,
        marks the node's attempt interrupted and gives the run back (``Parked``)."""
        host, active = self.host, self.active
        attempts = host.store.attempts(active.run_id)
        self._visit = (
            sum(1 for a in attempts if a.node_id == self.ctx.node_id and a.status == "completed") + 1
        )
        outputs, failed = recorded(attempts, self.ctx.node_id)
        self.outputs = {key: value for key, value in outputs.items() if key in self.order}
        for call in self.calls:
            tries = failed.get(call.key, [])
            self._failures[call.key] = len(tries)
            if call.key not in self.outputs and len(tries) > call.retries:
                # Failed for good before a crash: its last error's first line (the kind and message).
                self.errors[call.key] = tries[-1].splitlines()[0] if tries[-1] else "failed"
        todo = [call for call in self.calls if call.key not in self.outputs]
        if self.errors or len(self.outputs) >= self.need or not todo:
            self._close()
            return
        # Daemon threads, as the runner's own: a call left running (a branch a join no longer
        # needs, a call of a cancelled run) never holds up the worker's exit.
        pending = collections.deque(todo)
        self._live = min(self.parallelism, len(todo))
        for n in range(self._live):
            name = f"tether-{self.ctx.node_id}-{n + 1}"
            threading.Thread(target=self._serve, args=(pending,), name=name, daemon=True).start()
        while True:
            self._ended.wait(WATCH_S)
            self._ended.clear()
            if active.cancelled.is_set():
                self._stop(signal=True)
                raise Parked("fan-out ended by its run's cancel")
            if active.lost.is_set() or self._trouble is not None:
                self._stop(signal=True)
                if self._trouble is not None:
                    raise self._trouble
                raise ClaimLost(f"The lease on workflow run {active.run_id} was lost")
            if len(self.outputs) >= self.need:
                # A parallel node's join: the calls still running are told to stop and whatever
                # they return is not recorded.
                self._stop(signal=True)
                break
            if host.stopping:
                self._halted.set()  # the calls running end and are recorded
            with self._turns:
                if not self._live:
                    break
        self._close()
        if self._trouble is not None:
            raise self._trouble
        if self.ambiguous:
            key, why = next(iter(sorted(self.ambiguous.items(), key=lambda pair: self.order[pair[0]])))
            with host.store.transaction():
                # Interrupted, as after a crash: once a person settled the effect, the next
                # worker runs the node again and its items find their effects.
                host.store.attempt_finish(
                    run_id=active.run_id,
                    claim_token=active.token,
                    attempt_id=self.attempt.attempt_id,
                    status="interrupted",
                    error_message=f"{item_node_id(self.ctx.node_id, key)} {why}",
                )
                host.ensure(
                    host.store.park_for_ambiguous_effect(run_id=active.run_id, claim_token=active.token)
                )
            raise Parked("an effect of the fan-out is ambiguous")
        if host.stopping and not self.errors and len(self.outputs) < self.need:
            with host.store.transaction():
                host.store.attempt_finish(
                    run_id=active.run_id,
                    claim_token=active.token,
                    attempt_id=self.attempt.attempt_id,
                    status="interrupted",
                    error_message="interrupted by runner shutdown",
                )
                host.ensure(host.store.park(run_id=active.run_id, claim_token=active.token))
            raise Parked("fan-out interrupted by runner shutdown")

    def _stop(self, *, signal: bool) -> None:
        self._halted.set()
        if signal:
            self._signal.set()
        self._close()

    def _close(self) -> None:
        """Record nothing more: a write under way ends first (an effect being marked ambiguous
        too), the tries and begins waiting are dropped."""
        with self._turns:
            while self._writing:
                self._turns.wait()
            self._closed = True
            for entry in self._queue:
                entry.done = True
            self._queue = []
            self._turns.notify_all()
        # Not under ``_turns``: a group's writer takes ``_turns`` while it holds the store's turn.
        with self._store_turn:
            pass

    def _serve(self, pending: collections.deque[Call]) -> None:
        """One thread of the node: call the pending calls one after the other until none is left
        or no call may start."""
        try:
            while not self._halted.is_set():
                try:
                    call = pending.popleft()
                except IndexError:
                    return
                self._call(call)
                self._ended.set()
        finally:
            with self._turns:
                self._live -= 1
            self._ended.set()

    def _call(self, call: Call) -> None:
        """Call ``call`` until it completes or fails for good, recording each try."""
        try:
            self._tries(call)
        except BaseException as error:
            # A store refusal or failure while recording: the node's thread raises it.
            with self._turns:
                if self._trouble is None:
                    self._trouble = error
            self._halted.set()

    def _tries(self, call: Call) -> None:
        if call.effect_type is not None:
            self._apply(call)
            return
        host, clock = self.host, self.host.clock
        # A stopping runner starts no call (the node's thread sees the stop a moment later).
        while not self._halted.is_set() and not host.stopping:
            tries = self._failures[call.key]
            ctx = self._item_ctx(call, tries + 1)
            began = clock.monotonic()
            status = "failed"
            error: BaseException
            try:
                attempt_call = functools.partial(host.call_step, self.active, call.fn, ctx, *call.args)
                value = host.call_with_deadline(self.active, call.node, ctx, attempt_call)
                canonical_json(value)
            except RunTimedOut:
                raise  # the run's deadline: the node's thread ends the run
            except StepTimedOut as late:
                # Abandoned at its deadline: a try that failed, recorded timed_out.
                status, error = "timed_out", late
            # BaseException too, as in a compute step: a call's sys.exit() is that call's failure.
            except BaseException as raised:
                error = raised
            else:
                self._record(call, "completed", began, output=value)
                return
            if self._signal.is_set():
                return  # told to stop: its end is not a failure
            tries += 1
            self._failures[call.key] = tries
            text = str(error) if status == "timed_out" else story(error)
            if not self._record(call, status, began, error_message=text):
                return
            if tries > call.retries:
                self._fail_for_good(call, summary(error))
                return
            if self._halted.wait(call.backoff_s * 2 ** (tries - 1)):
                return

    def _item_ctx(self, call: Call, attempt: int) -> Context:
        return dataclasses.replace(
            self.ctx,
            node_id=item_node_id(self.ctx.node_id, call.key),
            attempt=attempt,
            cancel_signal=self._signal,
            # Set when this call is abandoned at its deadline (its own signal: the others run on).
            abandon_signal=threading.Event() if self.host.needs_deadline(self.active, call.node) else None,
        )

    def _fail_for_good(self, call: Call, summary_text: str) -> None:
        with self._turns:
            self.errors[call.key] = summary_text
        self._halted.set()  # a call failed for good: no other starts

    def _begin_effect(self, call: Call, key: str) -> Effect | None:
        """Record the item's effect (or find it, recorded by an earlier worker) and begin it when
        pending, with a group (``_submit``): then ``applying``, and only then is its function
        called. None when the node ended or halted first."""
        assert call.effect_type is not None
        node_id = item_node_id(self.ctx.node_id, call.key)
        entry = Entry(node_id, call.key, "begin", 0, None, None, begin=(call.effect_type, key))
        if not self._submit(entry):
            return None
        return entry.effect

    def _begin_all(self, begins: list[Entry]) -> list[tuple[Effect | None, BaseException | None]]:
        """Record and begin the effects of ``begins`` (in the caller's transaction): the effects
        as they are then (None: the node halted first, nothing recorded), each with the error
        its thread raises. A lease that cannot be proven live begins none (``LeaseUnproven`` for
        their threads) and leaves the group's tries to be written: an item whose effect was
        applied still has it settled."""
        host, store, active = self.host, self.host.store, self.active
        effects: list[tuple[Effect | None, BaseException | None]] = []
        for entry in begins:
            assert entry.begin is not None
            effect_type, key = entry.begin
            if self._halted.is_set() or self._signal.is_set():
                effects.append((None, None))
                continue
            effect = store.effect_enqueue(
                run_id=active.run_id,
                claim_token=active.token,
                effect_type=effect_type,
                idempotency_key=key,
                payload={"nodeId": entry.node_id},
            )
            if effect.status == "applying":
                # Left applying by a holder that lost the run without a takeover settling it
                # (never called again here: it may have happened).
                effect = store.effect_mark_ambiguous(
                    run_id=active.run_id, claim_token=active.token, effect_id=effect.effect_id
                )
            elif effect.status == "pending":
                if not active.provably_live(host.config.effect_guard_ms, host.clock.monotonic()):
                    unproven = LeaseUnproven(
                        f"the lease on {active.run_id} cannot be proven live; effect {key} was not applied"
                    )
                    effects.append((effect, unproven))
                    continue
                # Refused (CancelRequested) once a cancel of the run committed.
                effect = store.effect_begin(
                    run_id=active.run_id, claim_token=active.token, effect_id=effect.effect_id
                )
            effects.append((effect, None))
        return effects

    def _apply(self, call: Call) -> None:
        """Call an effect item once through the outbox (see the module's docstring)."""
        host, store, active = self.host, self.host.store, self.active
        if self._halted.is_set() or host.stopping:
            return
        key = f"{active.run_id}:{item_node_id(self.ctx.node_id, call.key)}:{self._visit}"
        began = host.clock.monotonic()
        effect = self._begin_effect(call, key)
        if effect is None:
            return  # the node ended or halted before it began
        if effect.status == "applied":
            # Applied before (a person said so, or its try's record was lost): never again.
            self._record(call, "completed", began, output=effect.result)
            return
        if effect.status == "ambiguous":
            with self._turns:
                self.ambiguous[call.key] = "has an effect whose outcome is unknown"
            self._halted.set()
            return
        if effect.status != "applying":
            # Rejected (by its function, or by a person), or cancelled: the item failed for good.
            text = f"effect {key} was {effect.status}: {effect.error_message or 'no detail'}"
            if self._record(call, "failed", began, error_message=text):
                self._fail_for_good(call, text)
            return
        ctx = self._item_ctx(call, 1)
        try:
            attempt_call = functools.partial(host.call_step, active, call.fn, ctx, *call.args, key)
            value = host.call_with_deadline(active, call.node, ctx, attempt_call)
            canonical_json(value)
        except RunTimedOut:
            raise  # the run's deadline: the node's thread ends the run (its effect ambiguous)
        except StepTimedOut as late:
            # It may have happened, or may yet: its outcome is unknown, as after a crash. No try
            # is recorded: once a person settled the effect, the item finds it.
            with self._store_turn:
                # Once the node ended (a cancel, a lost claim) the run's ending or the next
                # holder classifies it.
                if not self._closed:
                    store.effect_mark_ambiguous(
                        run_id=active.run_id, claim_token=active.token, effect_id=effect.effect_id
                    )
            with self._turns:
                self.ambiguous[call.key] = f"effect {key} {late}; its outcome is unknown"
            self._halted.set()
            return
        except BaseException as error:
            if self._signal.is_set():
                return  # a cancel: its effect, still applying, becomes ambiguous with the run
            # Rejected: it may have done part of its work, so it is not retried.
            if self._record(
                call,
                "failed",
                began,
                error_message=story(error),
                effect_id=effect.effect_id,
                effect_error=summary(error),
            ):
                self._fail_for_good(call, summary(error))
            return
        self._record(call, "completed", began, output=value, effect_id=effect.effect_id)

    def _record(
        self,
        call: Call,
        status: str,
        began: float,
        *,
        output: Json = None,
        error_message: str | None = None,
        effect_id: str | None = None,
        effect_error: str | None = None,
    ) -> bool:
        """Record one try of ``call``, unless the node ended already (or, for a completed try,
        has all the completed calls it needs). Whether it was recorded.

        The tries that end while another thread's are being written wait, and the next thread to
        write takes them all into one transaction (a group commit): a fan-out of quick calls
        commits far fewer times than it has items."""
        ran_ms = max(0, int((self.host.clock.monotonic() - began) * 1000))
        entry = Entry(
            item_node_id(self.ctx.node_id, call.key),
            call.key,
            status,
            ran_ms,
            output,
            error_message,
            effect_id,
            effect_error,
        )
        with self._turns:
            if self._closed:
                return False
            if status == "completed":
                if self._promised >= self.need:
                    return False
                self._promised += 1
        return self._submit(entry)

    def _submit(self, entry: Entry) -> bool:
        """Write ``entry`` with a group: whether it was written (not once the node ended)."""
        with self._turns:
            if self._closed:
                return False
            self._queue.append(entry)
            while self._writing and not entry.done:
                self._turns.wait()
            if entry.done:
                return self._outcome(entry)
            # This thread writes the group: every try queued up while the last group was written.
            self._writing = True
            batch, self._queue = self._queue, []
        try:
            self._commit(batch)
        finally:
            with self._turns:
                self._writing = False
                for member in batch:
                    member.done = True
                self._turns.notify_all()
        return self._outcome(entry)

    @staticmethod
    def _outcome(entry: Entry) -> bool:
        if entry.error is not None:
            raise entry.error
        return entry.written

    def _commit(self, batch: list[Entry]) -> None:
        """Write ``batch`` in one transaction under the live claim (its effect items' effects
        settled with their tries, the effects of its begins recorded and begun) and note the
        outcome in each entry: written, or the error its thread raises (``ClaimLost`` for a stale
        runner)."""
        store, active = self.host.store, self.active
        begins = [entry for entry in batch if entry.begin is not None]
        tries = [entry for entry in batch if entry.begin is None]
        try:
            with self._store_turn, store.transaction():
                for entry in tries:
                    if entry.effect_id is not None:
                        applied = entry.status == "completed"
                        store.effect_finish(
                            run_id=active.run_id,
                            claim_token=active.token,
                            effect_id=entry.effect_id,
                            applied=applied,
                            result=entry.output if applied else None,
                            error_message=None if applied else entry.effect_error,
                        )
                if tries:
                    store.attempt_record(
                        run_id=active.run_id,
                        claim_token=active.token,
                        tries=[
                            SettledTry(
                                entry.node_id, entry.status, entry.ran_ms, entry.output, entry.error_message
                            )
                            for entry in tries
                        ],
                    )
                effects = self._begin_all(begins)
        except BaseException as error:
            for entry in batch:
                entry.error = error
            return
        with self._turns:
            for entry, (effect, refused) in zip(begins, effects, strict=True):
                entry.effect, entry.error = effect, refused
            for entry in batch:
                if entry.status == "completed":
                    self.outputs[entry.key] = entry.output
                entry.written = True
