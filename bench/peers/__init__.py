"""The systems under test, one adapter module each, loaded by key (a peer's imports happen only
when it is used, so a peer that is not installed does not stop the others)."""

from __future__ import annotations

import importlib
import signal
import threading
from pathlib import Path
from typing import Any

from bench.peers.base import Peer

PEERS = {
    "tether": "bench.peers.tether_peer:TetherPeer",
    "limit": "bench.peers.limit_peer:LimitPeer",
    "replay": "bench.peers.replay_peer:ReplayPeer",
    "replay-pg": "bench.peers.replay_pg_peer:ReplayPgPeer",
    "rows": "bench.peers.rows_peer:RowsPeer",
    "rows-pg": "bench.peers.rows_pg_peer:RowsPgPeer",
    "huey": "bench.peers.huey_peer:HueyPeer",
    "litequeue": "bench.peers.litequeue_peer:LiteQueuePeer",
    "persist-queue": "bench.peers.persistqueue_peer:PersistQueuePeer",
    "dbos": "bench.peers.dbos_peer:DbosPeer",
    "procrastinate": "bench.peers.procrastinate_peer:ProcrastinatePeer",
    "pgqueuer": "bench.peers.pgqueuer_peer:PgQueuerPeer",
}


def peer_class(key: str) -> type[Peer]:
    module_name, _, name = PEERS[key].partition(":")
    cls: type[Peer] = getattr(importlib.import_module(module_name), name)
    return cls


def load_peer(key: str, workdir: Path, options: dict[str, Any] | None = None) -> Peer:
    return peer_class(key)(workdir, options)


def sigterm_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT, for worker loops the harness writes itself."""
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop
