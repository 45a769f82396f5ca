"""Workload 6: memory. Peak RSS of one worker process draining ``memory_runs`` runs, sampled with
the runs finished so far, so that growth with the number of runs shows (it must stay flat).

The runs are started through the public client API in big transactions; the worker is the same
Runner worker process as in the throughput workload (SQLite, ``synchronous=NORMAL``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import BenchError, Counter, rss_kib, start_workers, summary
from bench.peers.tether_peer import TetherPeer, workflow
from bench.workloads import Config, error_text, fill_runs


def _once(config: Config, rep: int) -> dict[str, Any]:
    from tether.client import Tether

    n = config.memory_runs
    peer = TetherPeer(
        Path(config.workdir) / f"memory-{rep}",
        {"backend": "sqlite", "synchronous": "NORMAL", **config.runner},
    )
    peer.prepare()
    try:
        client = Tether(peer.url(), workflows=[workflow()])
        fill_runs(client, "noop", n, f"mem{rep}")
        client.store.close()
        counter_path = peer.workdir / "counter.bin"
        counter = Counter(counter_path, create=True)
        (worker,) = start_workers([["work", peer.spec(), "0", str(counter_path)]])
        curve: list[tuple[int, int]] = []
        try:
            idle_rss, _ = rss_kib(worker.pid)
            worker.go()
            started = time.perf_counter()
            deadline = started + max(300.0, n / 2)
            while True:
                rss, _ = rss_kib(worker.pid)
                finished = counter.total()
                curve.append((finished, rss))
                if finished >= n and peer.done_count(counter, n) >= n:
                    break
                if not worker.alive() or time.perf_counter() > deadline:
                    raise BenchError(f"memory drain stopped at {finished} of {n}: {worker.stderr_tail()}")
                time.sleep(0.25)
            seconds = time.perf_counter() - started
            _, peak = rss_kib(worker.pid)
        finally:
            worker.stop()
            counter.close()
    finally:
        peer.cleanup()

    def at(fraction: float) -> int:
        return next(rss for done, rss in curve if done >= fraction * n)

    step = max(1, len(curve) // 200)
    return {
        "seconds": seconds,
        "idle_rss_kib": idle_rss,
        "peak_rss_kib": peak,
        "rss_at_10pct_kib": at(0.1),
        "rss_at_50pct_kib": at(0.5),
        "rss_at_end_kib": curve[-1][1],
        "growth_10pct_to_end": curve[-1][1] / at(0.1),
        "curve": [*curve[::step], curve[-1]],
    }


def run(config: Config, reps: int) -> dict[str, Any]:
    rounds = []
    try:
        for rep in range(max(1, reps)):
            rounds.append(_once(config, rep))
            last = rounds[-1]
            print(
                f"  memory rep {rep + 1}: {config.memory_runs} runs in {last['seconds']:.0f} s, peak RSS "
                f"{last['peak_rss_kib'] / 1024:.1f} MiB, "
                f"RSS at 10% {last['rss_at_10pct_kib'] / 1024:.1f} MiB, "
                f"at end {last['rss_at_end_kib'] / 1024:.1f} MiB",
                flush=True,
            )
    except Exception as error:
        print(f"  memory: ERROR {error_text(error)[:300]}", flush=True)
        return {"runs": config.memory_runs, "error": error_text(error)}
    return {
        "runs": config.memory_runs,
        "store": "sqlite synchronous=NORMAL",
        "runner": config.runner,
        "peak_rss_mib": summary([r["peak_rss_kib"] / 1024 for r in rounds]),
        "rss_at_10pct_mib": summary([r["rss_at_10pct_kib"] / 1024 for r in rounds]),
        "rss_at_end_mib": summary([r["rss_at_end_kib"] / 1024 for r in rounds]),
        "growth_10pct_to_end": summary([r["growth_10pct_to_end"] for r in rounds]),
        "drain_runs_per_s": summary([config.memory_runs / r["seconds"] for r in rounds]),
        "curve": rounds[-1]["curve"],
        "rounds": [{k: v for k, v in r.items() if k != "curve"} for r in rounds],
    }
