"""A runner process for the multi-process harnesses (``python -m tests.reliability.chaos_worker``).

It runs a TracingRunner on a RecordingStore over the store URL, with the suite's workflows; its
records go to the folder named by RELIABILITY_DIR. SIGTERM hands its runs off and exits 0;
SIGUSR1 writes the stack of every thread to its log (for a runner that does not stop).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path

from tests.reliability.support import DIR_ENV, RecordingStore, TracingRunner
from tests.reliability.workflows import ALL
from tether import open_store
from tether.engine.registry import Registry
from tether.engine.runner import RunnerConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos_worker")
    parser.add_argument("--store", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--runner-id", required=True)
    parser.add_argument("--lease-ms", type=int, default=1500)
    parser.add_argument("--renew-ms", type=int, default=None)
    parser.add_argument("--poll-ms", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-takeovers", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    os.environ[DIR_ENV] = args.dir
    store = open_store(args.store)
    runner = TracingRunner(
        RecordingStore(store, Path(args.dir)),  # type: ignore[arg-type]
        Registry(ALL),
        runner_id=args.runner_id,
        config=RunnerConfig(
            lease_ms=args.lease_ms,
            renew_ms=args.renew_ms,
            poll_ms=args.poll_ms,
            concurrency=args.concurrency,
            max_takeovers=args.max_takeovers,
        ),
    )
    runner.install_signal_handlers()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    print(f"worker {args.runner_id} pid {os.getpid()}", flush=True)
    runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
