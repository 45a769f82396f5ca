"""Workloads 1 and 2: throughput, and the physical limit measured in the same run.

For every system: enqueue ``runs`` no-op runs one at a time (enqueue runs/s), then drain them with
one worker process, and again (fresh storage, a fresh enqueue) with two (end-to-end runs/s, timed
from releasing the already started workers until every run is durably finished). Repetitions are
interleaved (each repetition measures every system once) so that noise on the shared machine
spreads over all of them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import pg_setting, summary
from bench.peers import load_peer, peer_class
from bench.peers.base import Peer
from bench.workloads import Config, error_text

#: How many recorded transactions the grouped contract row merges into one commit.
GROUP_COMMITS = 64
#: (label role, peer key, options) in measuring order (the report orders by role); "limit" rows
#: are the physical limit, the "contract" rows Tether's own statements replayed in plain SQL (the
#: limit of what Tether sends), the "rows" rows the rows a Tether drain left written, written again
#: in bulk (the limit of any implementation that leaves those rows). The contract at Tether's own
#: durability is measured right after Tether in every repetition, so that each repetition's ratio
#: compares two drains taken close together on this noisy host.
SQLITE_SYSTEMS: list[tuple[str, str, dict[str, Any]]] = [
    ("tether", "tether", {"backend": "sqlite", "synchronous": "FULL"}),
    ("contract", "replay", {"synchronous": "FULL"}),
    ("tether", "tether", {"backend": "sqlite", "synchronous": "NORMAL"}),
    ("peer", "huey", {}),
    ("peer", "litequeue", {}),
    ("peer", "persist-queue", {}),
    ("peer", "dbos", {"backend": "sqlite"}),
    ("limit", "limit", {"backend": "sqlite", "synchronous": "FULL"}),
    ("limit", "limit", {"backend": "sqlite", "synchronous": "NORMAL"}),
    ("contract", "replay", {"synchronous": "FULL", "group_commits": GROUP_COMMITS}),
    ("rows", "rows", {"synchronous": "FULL", "runs_per_commit": GROUP_COMMITS}),
]
POSTGRES_SYSTEMS: list[tuple[str, str, dict[str, Any]]] = [
    ("tether", "tether", {"backend": "postgres"}),
    ("contract", "replay-pg", {}),
    ("peer", "dbos", {"backend": "postgres"}),
    ("peer", "procrastinate", {}),
    ("peer", "pgqueuer", {}),
    ("limit", "limit", {"backend": "postgres"}),
    ("rows", "rows-pg", {"runs_per_commit": GROUP_COMMITS}),
    ("rows", "rows-pg", {"runs_per_commit": GROUP_COMMITS, "copy": True}),
]


def _peer(config: Config, key: str, options: dict[str, Any], index: int) -> Peer:
    if key in ("tether", "replay", "replay-pg", "rows", "rows-pg"):
        options = {**options, **config.runner}
    return load_peer(key, Path(config.workdir) / f"throughput-{index}", options)


def run(config: Config, pg_reason: str | None, tether_pg_reason: str | None = None) -> dict[str, Any]:
    groups: dict[str, Any] = {}
    plan: list[tuple[str, int, str, str, dict[str, Any]]] = []
    for group, systems, runs in (
        ("sqlite", SQLITE_SYSTEMS, config.runs),
        ("postgres", POSTGRES_SYSTEMS, config.pg_runs),
    ):
        entries: dict[str, Any] = {}
        groups[group] = {"runs": runs, "systems": entries}
        if group == "postgres":
            if pg_reason is not None:
                groups[group]["skipped"] = pg_reason
                continue
            groups[group]["server"] = {"synchronous_commit": pg_setting("synchronous_commit")}
        for role, key, options in systems:
            if config.peers and key not in config.peers and role == "peer":
                continue
            peer = _peer(config, key, options, len(plan))
            entry: dict[str, Any] = {
                "role": role,
                "key": key,
                "backend": peer.backend,
                "settings": peer.settings(),
                "enqueue": [],
                "drain": {str(w): [] for w in config.workers},
                "duplicates": 0,
                "durability": None,
            }
            missing = peer_class(key).missing()
            if key == "tether" and peer.backend == "postgres" and tether_pg_reason is not None:
                missing = tether_pg_reason
            if missing is not None:
                entry["unavailable"] = missing
            entries[peer.label] = entry
            plan.append((group, runs, peer.label, key, options))
    for rep in range(config.reps):
        for index, (group, runs, label, key, options) in enumerate(plan):
            entry = groups[group]["systems"][label]
            if "unavailable" in entry or "error" in entry:
                continue
            for workers in config.workers:
                peer = _peer(config, key, options, index)
                started = time.perf_counter()
                try:
                    peer.prepare()
                    peer.setup()
                    queued = peer.enqueue(runs)
                    drained = peer.drain(workers, runs)
                except Exception as error:
                    entry["error"] = error_text(error)
                    print(f"  {label}: ERROR {entry['error'][:300]}", flush=True)
                    break
                finally:
                    peer.cleanup()
                entry["enqueue"].append(queued["runs_per_s"])
                entry["durability"] = queued.get("durability")
                # What a system reports about its own work (the contract row: statements and
                # commits per run), from the last measurement.
                observed = _observed(queued)
                if observed:
                    entry["observed"] = observed
                entry["drain"][str(workers)].append(drained["runs_per_s"])
                entry["duplicates"] = max(entry["duplicates"], drained["duplicates"])
                print(
                    f"  rep {rep + 1}/{config.reps} {label:<30} enqueue {queued['runs_per_s']:9.1f}/s  "
                    f"drain x{workers} {drained['runs_per_s']:9.1f}/s  "
                    f"({time.perf_counter() - started:.1f} s)",
                    flush=True,
                )
    for group in groups.values():
        for entry in group["systems"].values():
            entry["enqueue"] = summary(entry["enqueue"])
            entry["drain"] = {w: summary(values) for w, values in entry["drain"].items()}
    return groups


def _observed(queued: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in queued.items() if k.endswith("_per_run") and isinstance(v, int | float)}
