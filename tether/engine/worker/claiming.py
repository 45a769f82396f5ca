"""Claiming runs for free slots (in batches, with their take-up) and handing them to run threads."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tether.engine.worker.core import RunnerCore
from tether.engine.worker.state import CLAIM_BATCH, ActiveRun, TakeUpFailed
from tether.errors import CommitUnknown, TetherError

log = logging.getLogger("tether.runner")


class Claiming(RunnerCore):
    """Claiming runs for free slots (in batches, with their take-up) and handing them to run threads."""

    def _claim_some(self) -> bool | None:
        """Claim runs for the free slots and hand them to run threads: whether any was claimed
        (False: the queue held none to claim), None when this call looked at no queue (no slot
        free, another thread claiming, the runner stopping). The claim loop and a run thread that
        just finished a run both call this, one at a time."""
        if not self._claiming.acquire(blocking=False):
            return None  # another thread is claiming for the same free slots
        try:
            return None if self._stopping.is_set() else self._claim_for_free_slots()
        finally:
            self._claiming.release()

    def _claim_for_free_slots(self) -> bool | None:
        free = self._free_slots()
        if free <= 0:
            return None
        token = str(uuid.uuid4())
        exclude = self.active_run_ids
        # The lease is judged from before the claim call: the store stamps it no earlier.
        asked_at = self.clock.monotonic()
        for run_id in self._validations_due(exclude):
            record = self.store.claim_for_interaction_validation(
                run_id=run_id, runner_id=self.runner_id, claim_token=token, lease_ms=self.config.lease_ms
            )
            if record is not None:
                self._start(record, token, asked_at)
                return True
        # Claims for the free slots commit together, ahead of this process's other waiting writers
        # (first=True): a runner whose threads are busy still takes over an expired lease within
        # a poll. Should a take-up fail unexpectedly, the batch rolls back and that run is claimed
        # again alone; its thread takes it up and parks it as making no progress if it fails the
        # same way.
        try:
            with self._claim_transaction() as ready:
                claimed, taken = self._claim_batch(exclude, free, asked_at)
                ready.extend(taken)
        except TakeUpFailed as failed:
            log.exception("run %s could not be taken up with its claim", failed.run_id)
            record = self.store.claim(
                run_id=failed.run_id,
                runner_id=self.runner_id,
                claim_token=token,
                lease_ms=self.config.lease_ms,
            )
            if record is not None:
                self._start(record, token, asked_at)
            return True
        return claimed

    @contextmanager
    def _claim_transaction(self) -> Iterator[list[ActiveRun]]:
        """A write transaction ahead of this process's waiting writers, and a list for the runs
        the block claims and takes up: launched once it committed; should its commit's outcome
        be unknown, those whose claim landed. Nothing raises after the commit: what it wrote
        stands, and a run that cannot be started is left to its lease to lapse."""
        claimed: list[ActiveRun] = []
        try:
            with self.store.transaction(first=True):
                yield claimed
        except CommitUnknown:
            self._launch_landed(claimed)
            raise
        for active in claimed:
            try:
                self._launch(active)
            except Exception:
                log.exception(
                    "run %s: claimed, but could not be started; its lease will lapse", active.run_id
                )

    def _claim_batch(self, exclude: list[str], free: int, asked_at: float) -> tuple[bool, list[ActiveRun]]:
        """Claim up to ``free`` runs in the caller's transaction: whether any was claimed, and the
        ones to execute. New runs (up to CLAIM_BATCH) are taken up here too (nothing to
        settle: one commit for claim, take-up and first node); a takeover's take-up settles what
        the dead holder left, so its own thread does that after the claim, keeping the batch short
        however many runs a dead runner left."""
        seen: list[str] = []
        ready: list[ActiveRun] = []
        fresh = 0
        while len(seen) < free and fresh < CLAIM_BATCH:
            token = str(uuid.uuid4())
            record = self.store.claim_next(
                runner_id=self.runner_id,
                claim_token=token,
                lease_ms=self.config.lease_ms,
                exclude_run_ids=[*exclude, *seen],
                # Only runs of the definitions loaded here: others wait for a worker that has them.
                definition_digests=self.registry.digests(),
            )
            if record is None:
                break
            seen.append(record.run_id)
            active = self._active_for(record, token, asked_at)
            if record.claim_generation != 1:
                ready.append(active)  # a takeover: its own thread takes it up
                continue
            fresh += 1
            active.taken_up = True
            try:
                taken_up = self._take_up(active)
            except TetherError:
                raise
            except Exception as error:
                raise TakeUpFailed(record.run_id) from error
            if taken_up:
                ready.append(active)
        if free > 0:
            self._found_none = not seen
        return bool(seen), ready

    def _validation_waits(self, exclude: list[str]) -> bool:
        """Whether a group commit should leave its slots to the claim loop, which claims a session
        answer waiting for validation before any other run. Asked at most every housekeeping
        interval (a query, a round trip on PostgreSQL, that would otherwise come with every
        completion): an answer waits that much longer for a slot while runs keep completing."""
        now = self.clock.monotonic()
        if now - self._validations_asked_at < self._housekeeping_every:
            return False
        self._validations_asked_at = now
        return bool(self._validations_due(exclude))

    def _validations_due(self, exclude: list[str]) -> list[str]:
        """The runs not in ``exclude`` whose session answer waits for validation (paused ones are
        not listed)."""
        return [
            run_id
            for run_id in self.store.runs_with_validating_submissions()
            if run_id not in exclude and self._executable(run_id)
        ]

    def _executable(self, run_id: str) -> bool:
        """Whether the run's definition is one this runner loaded (claims for a session's answer
        or an input deadline name a run; ``claim_next`` filters by definition itself)."""
        run = self.store.get_run(run_id)
        return run is not None and run.definition_digest in self.registry.digests()

    def _launch_landed(self, claimed: list[ActiveRun]) -> None:
        """After a claim transaction whose commit had an unknown outcome (``CommitUnknown``): launch
        the runs whose claim landed (the token holds the lease; their take-up landed with it).
        The others were never claimed and stay queued for any runner."""
        for active in claimed:
            try:
                landed = self.store.verify_claim(run_id=active.run_id, claim_token=active.token)
            except TetherError as error:
                log.warning("run %s: whether its claim landed is unknown (%s)", active.run_id, error)
                continue  # if it did, its lease lapses and a runner takes it over
            if landed:
                self._launch(active)

    def _launch(self, active: ActiveRun) -> None:
        """Hold the run (its slot taken, its lease renewed) and hand it to an idle run thread, or
        to a new one; with twice the concurrency in threads, to the first thread back (a
        thread still busy has a completed run to let go of)."""
        self.tally.add("runs_claimed")
        if log.isEnabledFor(logging.INFO):
            log.info(
                "run %s (%s) claimed by %s",
                active.run_id,
                active.run.workflow_name,
                self.label,
                extra=self._fields(active),
            )
        with self._lock:
            self._active[active.run_id] = active
            self._busy += 1
            thread = None
            if self._idle_threads <= 0 and len(self._threads) < 2 * self.config.concurrency:
                thread = threading.Thread(
                    target=self._work, name=f"tether-run-{len(self._threads) + 1}", daemon=True
                )
                self._threads.append(thread)
            else:
                self._idle_threads -= 1
        self._runs.put(active)
        if thread is not None:
            thread.start()
        if self._cancels is not None:
            self._cancels.nudge.set()

    def _work(self) -> None:
        """A run thread: execute the runs handed to it until the runner stops."""
        while True:
            active = self._runs.get()
            if active is None:
                return
            self._execute(active)
            with self._lock:
                self._idle_threads += 1
            # The slot this run held is free, unless runs were claimed with its completion: claim
            # the next run here (this thread then takes it up without a hand-off), else let the
            # claim loop try.
            claimed = not self._stopping.is_set() and self._claim_next_here()
            with self._lock:
                self._busy -= 1
            if not claimed and self._free_slots() > 0:
                self._wake.set()

    def _claim_next_here(self) -> bool:
        try:
            return bool(self._claim_some())
        except TetherError as error:
            self._trouble("claim", error)
        except Exception:
            # This thread must stay alive to take the runs handed to it; the claim loop retries.
            log.exception("runner %s: claiming after a run failed", self.runner_id)
        return False
