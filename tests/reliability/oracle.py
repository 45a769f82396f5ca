"""The oracle every reliability harness runs on the final database and the recorded history.

Tether's promise, as checks:

- **No run lost.** Every reserved id exists and, after the drain, is terminal on both axes with a
  consistent pair; no run exists that nobody reserved (a refused reserve wrote nothing).
- **One ending.** At most one accepted terminal transition per run, and it is the run's last event.
- **Fencing.** Every journal entry written under a claim (a non-NULL lease generation) carries the
  generation current when it committed; generations only rise, by one, at a claim. No mutation from
  an older generation, and a nonzero count of refused stale attempts, each of which really was
  stale (superseded, expired or released) and never a live claim refused.
- **Journal.** Per resource the revisions are exactly 1..n with one event each, the sequence rises
  with the revision, and the global sequence is unique (and gap-free: nothing here deletes).
- **Effects.** Each effect is classified: applied, not applied (rejected, cancelled, or pending on a
  finished run) or ambiguous; never left ``applying`` on a finished run; never begun after its
  run's terminal commit. Against a sink of what was done in the world: a cancelled effect never
  began, an applied one finished, and repeats happen only to effects that were ambiguous.
- **Fan-outs.** Of a fan-out or parallel node visited once, every item (or branch) has at most one
  completed attempt (``each[3]``, ``both[left]``); the node's output lists exactly the completed
  items' outputs, in item order (a parallel node's maps its joined branches); no item is recorded
  after its node completed; each completed item was accepted under the claim it ran under (its
  journal entry's generation is the one its output records, which the fencing check proves was
  live); and a finished run of a known fan-out completed every item.
- **Secrets.** No raw claim token in the database files or in any log.
- **Storage.** ``PRAGMA integrity_check`` is ``ok`` and no foreign key dangles.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.store.conftest import rows, snapshot
from tether.store import Store
from tether.store.states import CONSISTENT_PAIRS, QUEUE_TERMINAL, RUN_TERMINAL, QueueStatus, RunStatus

TERMINAL_EVENTS = frozenset({"run.queue_done", "run.queue_failed", "run.queue_cancelled"})
#: Events that introduce a new lease generation (a claim, or cancel_stale's control claim).
CLAIM_EVENTS = frozenset({"lease.claimed", "run.queue_cancelled"})
#: Events after which the run is not held (the releasing call cleared the lease).
RELEASE_EVENTS = frozenset(
    {
        "run.queue_parked",
        "run.queue_done",
        "run.queue_failed",
        "run.queue_cancelled",
        "run.worker_no_progress",
        "run.source_changed",
        "run.effect_ambiguous",
    }
)
EFFECT_SETTLED = frozenset({"applied", "rejected", "ambiguous", "cancelled"})
UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class History:
    """What a harness recorded while it ran (the oracle's second input besides the database)."""

    #: Ids whose reservation was accepted.
    reserved: set[str] = field(default_factory=set)
    #: Every raw claim token handed out (kept outside the logs).
    tokens: set[str] = field(default_factory=set)
    #: (run id, token, generation) of every claim handed out, where the harness knows them.
    issued: list[tuple[str, str, int]] = field(default_factory=list)
    #: Refused claim-gated calls: run_id, generation, and how the lease stood right after.
    rejections: list[dict[str, Any]] = field(default_factory=list)
    #: Accepted terminal transitions the harness observed, per run.
    accepted_terminals: Counter[str] = field(default_factory=Counter)
    #: Log files that must not contain a raw token.
    logs: list[Path] = field(default_factory=list)
    #: Sink records (what executed in the world): steps and effect begin/end, keyed by run and
    #: generation; effects also by idempotency key.
    sink: list[dict[str, Any]] | None = None
    #: Every reserved run must be terminal (after a drain).
    drained: bool = True
    #: The least number of refused stale attempts that proves the run exercised fencing.
    min_rejections: int = 1
    #: Runs that exist without an accepted reserve are a partial write (off for harnesses that
    #: cannot know every accepted reserve, such as a killed child process).
    exact_reservations: bool = True
    #: (workflow name, fan-out node id) -> how many items the node maps over: a run that finished
    #: done completed exactly that many items of the node.
    fan_out_items: dict[tuple[str, str], int] = field(default_factory=dict)
    seed: int | None = None


@dataclass
class Verdict:
    counts: dict[str, int]
    violations: list[str]


def check(store: Store, history: History) -> Verdict:
    """Run every check; raise AssertionError listing the violations (with the seed)."""
    return judge(inspect(store, history), history)


def judge(verdict: Verdict, history: History) -> Verdict:
    """Raise AssertionError listing the verdict's violations (with the seed); else the verdict."""
    if verdict.violations:
        shown = "\n  ".join(verdict.violations[:40])
        more = len(verdict.violations) - 40
        raise AssertionError(
            f"oracle: {len(verdict.violations)} violation(s) (seed {history.seed}, replay with "
            f"TETHER_SEED={history.seed}):\n  {shown}" + (f"\n  ... and {more} more" if more > 0 else "")
        )
    return verdict


def inspect(store: Store, history: History) -> Verdict:
    v: list[str] = []
    counts: Counter[str] = Counter()
    _storage(store, v)
    runs = {
        r[0]: {
            "resource": r[1],
            "run_status": r[2],
            "queue": r[3],
            "generation": r[4],
            "owner": r[5],
            "revision": r[6],
        }
        for r in rows(
            store,
            "SELECT r.run_id, r.resource_id, r.status, q.status, l.generation, l.owner_id, res.revision "
            "FROM runs r JOIN run_queue q ON q.run_id = r.run_id "
            "JOIN leases l ON l.resource_id = r.resource_id "
            "JOIN resources res ON res.resource_id = r.resource_id",
        )
    }
    by_resource = {run["resource"]: run_id for run_id, run in runs.items()}
    resources = {r[0]: r[1] for r in rows(store, "SELECT resource_id, revision FROM resources")}
    events = [
        {"seq": r[0], "resource": r[1], "revision": r[2], "type": r[3], "generation": r[4]}
        for r in rows(
            store,
            "SELECT event_seq, resource_id, resource_revision, event_type, lease_generation "
            "FROM events ORDER BY event_seq",
        )
    ]
    effects = {
        r[0]: {
            "resource": r[1],
            "run_id": by_resource.get(r[2]),
            "status": r[3],
            "attempt_count": r[4],
            "key": r[5],
        }
        for r in rows(
            store,
            "SELECT effect_id, resource_id, source_resource_id, status, attempt_count, idempotency_key "
            "FROM effects",
        )
    }
    effect_attempts: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows(
        store,
        "SELECT effect_id, attempt_number, outcome, finished_at, lease_generation FROM effect_attempts "
        "ORDER BY effect_id, attempt_number",
    ):
        effect_attempts[r[0]].append(r)
    counts["runs"] = len(runs)
    counts["events"] = len(events)
    counts["effects"] = len(effects)

    _journal(resources, events, v, gapless=store.db.backend == "sqlite")
    per_resource: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        per_resource[event["resource"]].append(event)
    terminal_seq = _runs(runs, per_resource, history, v, counts)
    effect_run = {e["resource"]: e["run_id"] for e in effects.values()}
    _fencing(runs, events, effect_run, terminal_seq, v, counts)
    _rejections(history, v, counts)
    _effects(effects, effect_attempts, per_resource, runs, terminal_seq, history, v, counts)
    _outputs(store, history, v, counts)
    _fan_outs(store, runs, history, v, counts)
    _secrets(store, history, v)
    return Verdict(dict(counts), v)


# -- storage -----------------------------------------------------------------------------------
def _storage(store: Store, v: list[str]) -> None:
    if store.db.backend != "sqlite":
        return
    integrity = rows(store, "PRAGMA integrity_check")
    if integrity != [("ok",)]:
        v.append(f"PRAGMA integrity_check: {integrity[:5]}")
    dangling = rows(store, "PRAGMA foreign_key_check")
    if dangling:
        v.append(f"dangling foreign keys: {dangling[:5]}")


# -- journal -----------------------------------------------------------------------------------
def _journal(resources: dict[str, int], events: list[dict[str, Any]], v: list[str], *, gapless: bool) -> None:
    """``gapless``: the sequence counts 1, 2, 3, ... (SQLite); PostgreSQL numbers entries by the
    writing transaction, with gaps."""
    seqs = [e["seq"] for e in events]
    if len(set(seqs)) != len(seqs):
        v.append("the global event sequence repeats a number")
    if gapless and seqs and sorted(seqs) != list(range(1, max(seqs) + 1)):
        missing = sorted(set(range(1, max(seqs) + 1)) - set(seqs))[:10]
        v.append(f"the global event sequence skips numbers: {missing}")
    per: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        per[e["resource"]].append((e["revision"], e["seq"]))
    for resource, revision in resources.items():
        found = sorted(per.pop(resource, []))
        revisions = [r for r, _ in found]
        if revisions != list(range(1, revision + 1)):
            v.append(f"{resource}: event revisions {_short(revisions)} are not exactly 1..{revision}")
        in_seq = [s for _, s in found]
        if in_seq != sorted(in_seq):
            v.append(f"{resource}: the sequence does not rise with the revision")
    for resource in per:
        v.append(f"events name a resource that does not exist: {resource}")


# -- runs ---------------------------------------------------------------------------------------
def _runs(
    runs: dict[str, dict[str, Any]],
    per_resource: dict[str, list[dict[str, Any]]],
    history: History,
    v: list[str],
    counts: Counter[str],
) -> dict[str, int]:
    terminal_seq: dict[str, int] = {}
    lost = sorted(history.reserved - set(runs))
    if lost:
        v.append(f"{len(lost)} reserved run(s) lost: {lost[:10]}")
    if history.exact_reservations:
        phantom = sorted(set(runs) - history.reserved)
        if phantom:
            v.append(f"{len(phantom)} run(s) exist that no accepted reserve wrote: {phantom[:10]}")
    for run_id, count in history.accepted_terminals.items():
        if count > 1:
            v.append(f"{run_id}: {count} terminal transitions were accepted")
    for run_id, run in runs.items():
        queue, state = run["queue"], run["run_status"]
        terminal = queue in QUEUE_TERMINAL
        counts[f"queue_{queue}"] += 1
        if history.drained and not terminal:
            v.append(f"{run_id}: not terminal after the drain ({queue}/{state})")
        if terminal or state in RUN_TERMINAL:
            if (QueueStatus(queue), RunStatus(state)) not in CONSISTENT_PAIRS:
                v.append(f"{run_id}: inconsistent terminal pair {queue}/{state}")
            if run["owner"] is not None:
                v.append(f"{run_id}: finished run still has a lease owner")
        journal = per_resource.get(run["resource"], [])
        endings = [e for e in journal if e["type"] in TERMINAL_EVENTS]
        if len(endings) > 1:
            v.append(f"{run_id}: {len(endings)} terminal transitions in the journal")
        if terminal and len(endings) != 1:
            v.append(f"{run_id}: terminal ({queue}) with {len(endings)} terminal events")
        if not terminal and endings:
            v.append(f"{run_id}: a terminal event but queue status {queue}")
        if endings:
            terminal_seq[run_id] = endings[0]["seq"]
            after = [e["type"] for e in journal if e["seq"] > endings[0]["seq"]]
            if after:
                v.append(f"{run_id}: events after its terminal event: {after[:5]}")
        held = False
        for event in journal:
            if event["type"] == "lease.claimed":
                counts["claims"] += 1
                if held:
                    counts["takeovers"] += 1
                held = True
            elif event["type"] in RELEASE_EVENTS:
                held = False
            elif event["type"] == "node.interrupted":
                counts["interrupted_takeovers"] += 1
    return terminal_seq


# -- fencing ------------------------------------------------------------------------------------
def _fencing(
    runs: dict[str, dict[str, Any]],
    events: list[dict[str, Any]],
    effect_run: dict[str, str | None],
    terminal_seq: dict[str, int],
    v: list[str],
    counts: Counter[str],
) -> None:
    resource_run = {run["resource"]: run_id for run_id, run in runs.items()}
    current: dict[str, int] = defaultdict(int)
    for event in events:
        own = resource_run.get(event["resource"])
        run_id = own or effect_run.get(event["resource"])
        generation = event["generation"]
        if run_id is None or generation is None:
            continue
        if own is not None and event["type"] in CLAIM_EVENTS and generation == current[run_id] + 1:
            current[run_id] = generation
            continue
        if generation != current[run_id]:
            counts["stale_accepted"] += 1
            v.append(
                f"{run_id}: {event['type']} (seq {event['seq']}) accepted from generation {generation} "
                f"while generation {current[run_id]} was current"
            )
        if run_id in terminal_seq and event["seq"] > terminal_seq[run_id]:
            v.append(f"{run_id}: {event['type']} written under a claim after the terminal commit")
    for run_id, run in runs.items():
        if current[run_id] != run["generation"]:
            v.append(
                f"{run_id}: lease generation {run['generation']} but the journal's claims reach "
                f"{current[run_id]}"
            )


def _rejections(history: History, v: list[str], counts: Counter[str]) -> None:
    stale = 0
    for r in history.rejections:
        latest = r.get("latest_generation", r.get("current_generation"))
        superseded = latest is not None and latest > r["generation"]
        released = r.get("current_status") in QUEUE_TERMINAL or r.get("current_generation") is None
        if r.get("accepted_stale"):
            v.append(
                f"{r['run_id']}: {r['op']} with a stale token of generation {r['generation']} was accepted"
            )
        elif r.get("still_live"):
            v.append(f"{r['run_id']}: {r['op']} refused a live claim of generation {r['generation']}")
        elif superseded or released or r.get("expired"):
            stale += 1
            counts["rejected_superseded" if superseded else "rejected_expired_or_released"] += 1
        else:
            v.append(f"unexplained refusal: {r}")
    counts["rejected_stale"] = stale
    if stale < history.min_rejections:
        v.append(
            f"only {stale} refused stale attempt(s) (at least {history.min_rejections} expected): "
            "the run did not exercise fencing"
        )


def probe_stale_tokens(store: Store, issued: Iterable[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """Write with every issued token that no longer holds its run, as a zombie holder would:
    each write must be refused. Returns the attempts as rejection records (an accepted one is
    marked ``accepted_stale``, which the oracle reports)."""
    attempts: list[dict[str, Any]] = []
    for run_id, token, generation in issued:
        if store.verify_claim(run_id=run_id, claim_token=token):
            continue
        accepted = store.mark_running(run_id=run_id, claim_token=token)
        current = store.get_run(run_id)
        row = store.db.one("run_row", run_id=run_id)
        attempts.append(
            {
                "op": "mark_running (probe)",
                "run_id": run_id,
                "generation": generation,
                "current_generation": None if current is None else current.claim_generation,
                "latest_generation": None if row is None else row["generation"],
                "current_status": None if current is None else current.status,
                "expired": True,
                "still_live": False,
                "accepted_stale": accepted,
            }
        )
    return attempts


# -- effects ------------------------------------------------------------------------------------
def _effects(
    effects: dict[str, dict[str, Any]],
    attempts: dict[str, list[tuple[Any, ...]]],
    per_resource: dict[str, list[dict[str, Any]]],
    runs: dict[str, dict[str, Any]],
    terminal_seq: dict[str, int],
    history: History,
    v: list[str],
    counts: Counter[str],
) -> None:
    begins: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    for record in history.sink or ():
        if record.get("phase") == "begin":
            begins[record["key"]] += 1
        elif record.get("phase") == "end":
            ends[record["key"]] += 1
    for effect_id, effect in effects.items():
        status, run_id = effect["status"], effect["run_id"]
        counts[f"effect_{status}"] += 1
        finished = run_id is not None and runs[run_id]["queue"] in QUEUE_TERMINAL
        journal = per_resource.get(effect["resource"], [])
        types = [e["type"] for e in journal]
        ever_ambiguous = "effect.ambiguous" in types
        if status == "applying" and (finished or history.drained):
            v.append(f"effect {effect_id} of {run_id}: still applying, never classified")
        if types and types[-1] != f"effect.{status}":
            v.append(f"effect {effect_id}: status {status} but its last event is {types[-1]}")
        tries = attempts.get(effect_id, [])
        if [t[1] for t in tries] != list(range(1, effect["attempt_count"] + 1)):
            v.append(
                f"effect {effect_id}: attempts {[t[1] for t in tries]} vs count {effect['attempt_count']}"
            )
        if status != "applying" and any(t[3] is None for t in tries):
            v.append(f"effect {effect_id}: settled ({status}) with an unfinished attempt")
        for event in journal:
            if event["type"] == "effect.applying" and event["seq"] > terminal_seq.get(run_id, event["seq"]):
                v.append(f"effect {effect_id}: began applying after its run's terminal commit")
        if history.sink is None:
            continue
        key = effect["key"]
        if (begins[key] > 1 or ends[key] > 1) and not ever_ambiguous:
            v.append(
                f"effect {effect_id}: applied {begins[key]} time(s) (finished {ends[key]}) "
                "but it was never ambiguous"
            )
        if begins[key] and status == "cancelled":
            v.append(f"effect {effect_id}: cancelled, but it began in the world (silently applied)")
        if begins[key] and status == "pending" and not ever_ambiguous:
            v.append(f"effect {effect_id}: began in the world but is recorded as never applied")
        if status == "applied" and not ends[key]:
            v.append(f"effect {effect_id}: recorded applied but it never finished in the world")
        if ever_ambiguous:
            counts["effects_ever_ambiguous"] += 1
        if begins[key] > 1:
            counts["effects_repeated"] += 1


# -- outputs against the sink -------------------------------------------------------------------
def _outputs(store: Store, history: History, v: list[str], counts: Counter[str]) -> None:
    if history.sink is None:
        return
    executed = {
        (r["run_id"], r.get("generation"), r["node_id"])
        for r in history.sink
        if r.get("phase") in ("step", "end")
    }
    completed: Counter[tuple[str, str]] = Counter()
    for run_id, node_id, generation, content in rows(
        store,
        "SELECT a.run_id, a.node_id, a.lease_generation, b.content FROM node_attempts a "
        "LEFT JOIN blobs b ON b.blob_hash = a.output_hash WHERE a.status = 'completed'",
    ):
        completed[(run_id, node_id)] += 1
        output = json.loads(bytes(content).decode("utf-8")) if content is not None else None
        if not isinstance(output, dict) or "generation" not in output:
            continue
        counts["outputs_checked"] += 1
        if output["generation"] != generation:
            v.append(
                f"{run_id}/{node_id}: output produced under generation {output['generation']} "
                f"recorded under generation {generation}"
            )
        if (run_id, output["generation"], node_id) not in executed:
            v.append(f"{run_id}/{node_id}: recorded output has no execution in the sink")
    twice = [key for key, n in completed.items() if n > 1]
    if twice:
        v.append(f"{len(twice)} node(s) completed more than once: {twice[:5]}")


# -- fan-outs and parallel nodes --------------------------------------------------------------
def _fan_outs(
    store: Store, runs: dict[str, dict[str, Any]], history: History, v: list[str], counts: Counter[str]
) -> None:
    """The items of every fan-out and the branches of every parallel node, against their node's
    completed output and the journal."""
    # Per definition: its workflow's name and its fan-out and parallel nodes.
    kinds: dict[bytes, tuple[str, dict[str, dict[str, Any]]]] = {}
    for digest, name, content in rows(
        store,
        "SELECT d.definition_digest, d.workflow_name, b.content FROM workflow_definitions d "
        "JOIN blobs b ON b.blob_hash = d.definition_hash",
    ):
        definition = json.loads(bytes(content).decode("utf-8"))
        # Any JSON a caller gave as a definition (the bad-input harness gives odd ones).
        nodes = definition.get("nodes", {}) if isinstance(definition, dict) else {}
        kinds[bytes(digest)] = (
            name,
            {
                node_id: node
                for node_id, node in (nodes.items() if isinstance(nodes, dict) else ())
                if isinstance(node, dict) and node.get("kind") in ("fan_out", "parallel")
            },
        )
    fanned = {
        run_id: kinds.get(bytes(digest), ("", {}))
        for run_id, digest in rows(store, "SELECT run_id, definition_digest FROM runs")
    }
    fanned = {run_id: pair for run_id, pair in fanned.items() if pair[1]}
    if not fanned:
        return
    # Completed attempts of the fan-out runs: run -> node id -> [(attempt id, generation, output)].
    completed: dict[str, dict[str, list[tuple[str, int | None, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for run_id, attempt_id, node_id, generation, content in rows(
        store,
        "SELECT a.run_id, a.attempt_id, a.node_id, a.lease_generation, b.content FROM node_attempts a "
        "LEFT JOIN blobs b ON b.blob_hash = a.output_hash WHERE a.status = 'completed'",
    ):
        if run_id in fanned:
            output = json.loads(bytes(content).decode("utf-8")) if content is not None else None
            completed[run_id][node_id].append((attempt_id, generation, output))
    # The journal entry of every completed attempt: attempt id -> (event seq, lease generation).
    entries: dict[str, tuple[int, int | None]] = {}
    for seq, generation, inline, content in rows(
        store,
        "SELECT e.event_seq, e.lease_generation, e.payload, b.content FROM events e "
        "LEFT JOIN blobs b ON b.blob_hash = e.payload_hash WHERE e.event_type = 'node.completed'",
    ):
        # A small payload is kept in the entry, a larger one as a blob.
        payload = json.loads(inline if inline is not None else bytes(content).decode("utf-8"))
        if isinstance(payload, dict) and isinstance(payload.get("attemptId"), str):
            entries[payload["attemptId"]] = (seq, generation)
    for run_id, (name, nodes) in fanned.items():
        for node_id, node in nodes.items():
            prefix = f"{node_id}["
            items = {
                attempted[len(prefix) : -1]: tries
                for attempted, tries in completed[run_id].items()
                if attempted.startswith(prefix) and attempted.endswith("]")
            }
            where = f"{run_id}/{node_id}"
            own = completed[run_id].get(node_id, [])
            if len(own) > 1:
                # A node in a cycle completes once per visit, with items per visit: these checks
                # are for a node visited once (a node completed twice in a run without a cycle is
                # what the outputs check reports).
                counts["fan_outs_revisited"] += 1
                continue
            for key, tries in sorted(items.items()):
                counts["items_completed"] += len(tries)
                if len(tries) > 1:
                    v.append(f"{where}[{key}]: the item completed {len(tries)} times")
                for attempt_id, generation, output in tries:
                    _item_accepted(f"{where}[{key}]", attempt_id, generation, output, entries, v)
            expected = history.fan_out_items.get((name, node_id))
            if not own:
                if expected is not None and runs[run_id]["queue"] == "done":
                    v.append(f"{where}: the run is done but its fan-out never completed")
                continue
            attempt_id, _, output = own[-1]
            ended = entries.get(attempt_id, (None, None))[0]
            if ended is not None:
                late = [
                    key
                    for key, tries in items.items()
                    if any(entries.get(t[0], (0, None))[0] > ended for t in tries)
                ]
                if late:
                    v.append(f"{where}: item(s) {sorted(late)[:5]} recorded after the node completed")
            if node["kind"] == "fan_out":
                _fan_out_output(where, output, items, expected, v, counts)
            else:
                _parallel_output(where, node, output, items, v, counts)


def _item_accepted(
    where: str,
    attempt_id: str,
    generation: int | None,
    output: Any,
    entries: dict[str, tuple[int, int | None]],
    v: list[str],
) -> None:
    """A completed item was accepted under the claim it ran under: its journal entry carries the
    attempt's generation (the fencing check proves that one was current at the commit), and the
    output's (what the item saw while it ran) is the same."""
    entry = entries.get(attempt_id)
    if entry is None:
        v.append(f"{where}: completed attempt {attempt_id} has no node.completed journal entry")
        return
    if entry[1] is None or entry[1] != generation:
        v.append(f"{where}: completed under generation {generation}, journal entry under {entry[1]}")
    ran = output.get("generation") if isinstance(output, dict) else None
    if ran is not None and ran != generation:
        v.append(f"{where}: the item ran under generation {ran} and was accepted under {generation}")


def _fan_out_output(
    where: str,
    output: Any,
    items: dict[str, list[tuple[str, int | None, Any]]],
    expected: int | None,
    v: list[str],
    counts: Counter[str],
) -> None:
    if not isinstance(output, list):
        v.append(f"{where}: the fan-out's output is not a list: {str(output)[:80]}")
        return
    counts["fan_outs_checked"] += 1
    if expected is not None and len(output) != expected:
        v.append(f"{where}: the output lists {len(output)} item(s), the node maps over {expected}")
    for n, value in enumerate(output):
        tries = items.get(str(n), [])
        if not tries:
            v.append(f"{where}: item {n} is in the output but never completed (lost)")
        elif value != tries[0][2]:
            v.append(f"{where}: output entry {n} is not item {n}'s output: {str(value)[:80]}")
    beyond = sorted(set(items) - {str(n) for n in range(len(output))})
    if beyond:
        v.append(f"{where}: completed item(s) {beyond[:5]} missing from the node's output")


def _parallel_output(
    where: str,
    node: dict[str, Any],
    output: Any,
    items: dict[str, list[tuple[str, int | None, Any]]],
    v: list[str],
    counts: Counter[str],
) -> None:
    branches = [b.get("id") for b in node.get("branches", []) if isinstance(b, dict)]
    if not isinstance(output, dict):
        v.append(f"{where}: the parallel node's output is not an object: {str(output)[:80]}")
        return
    counts["parallels_checked"] += 1
    if len(output) != node.get("join") or not set(output) <= set(branches):
        v.append(
            f"{where}: the output joins branches {sorted(output)} (join {node.get('join')} of {branches})"
        )
    for branch, value in output.items():
        tries = items.get(branch, [])
        if not tries:
            v.append(f"{where}: branch {branch} is in the output but never completed (lost)")
        elif value != tries[0][2]:
            v.append(f"{where}: the output of branch {branch} is not its completed attempt's")
    unjoined = sorted(set(items) - set(output))
    if unjoined:
        v.append(f"{where}: branch(es) {unjoined} recorded completed but not joined")


# -- secrets --------------------------------------------------------------------------------------
def _secrets(store: Store, history: History, v: list[str]) -> None:
    if not history.tokens:
        return
    blobs: list[tuple[str, bytes]] = []
    if store.db.backend == "sqlite":
        path = Path(store.db.path)  # type: ignore[attr-defined]
        for suffix in ("", "-wal", "-journal"):
            candidate = Path(f"{path}{suffix}")
            if candidate.exists():
                blobs.append((candidate.name, candidate.read_bytes()))
    else:
        blobs.append(("tables", repr(snapshot(store)).encode("utf-8", "surrogatepass")))
    for log in history.logs:
        if log.exists():
            blobs.append((log.name, log.read_bytes()))
    for name, data in blobs:
        found = _tokens_in(data, history.tokens)
        if found:
            v.append(f"{len(found)} raw claim token(s) in {name}")


def _tokens_in(data: bytes, tokens: set[str]) -> set[str]:
    if all(UUID.fullmatch(t.encode()) for t in tokens):
        return {m.decode() for m in UUID.findall(data)} & tokens
    return {t for t in tokens if t.encode("utf-8", "surrogatepass") in data}


def _short(values: Iterable[int]) -> str:
    listed = list(values)
    return str(listed) if len(listed) <= 12 else f"[{listed[0]}..{listed[-1]}] ({len(listed)} values)"
