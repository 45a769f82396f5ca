"""Run every benchmark workload and write the results.

    python -m bench.run                 # full sizes, results in bench/results/
    python -m bench.run --smoke         # tiny sizes, results in a temporary folder

Workloads: throughput (with the physical limit; the contract limit, Tether's own recorded
statements replayed in plain SQL; and the rows limit, the rows a Tether drain left written, written
again in bulk), queue depth, event latency, crash recovery, memory, a profile of Tether's drain,
and fan-out (one run mapping a no-op step over many items). Results: ``latest.json``,
``YYYY-MM-DD.json``, ``latest.md`` and PNG charts (``python -m bench.merge`` adds a workload
measured in a separate run). Exits non-zero when a workload crashed or a system that could run
failed (a system that is not installed, or PostgreSQL being unreachable, is recorded, not failed).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench import report
from bench.common import ROOT, pg_available, pg_create, pg_drop, pg_setting, run_child
from bench.workloads import (
    Config,
    depth,
    error_text,
    events,
    fanout,
    memory,
    profile,
    recovery,
    throughput,
)

WORKLOADS = ("throughput", "depth", "events", "recovery", "memory", "profile", "fanout")
PACKAGES = (
    "tether",
    "huey",
    "litequeue",
    "persist-queue",
    "dbos",
    "procrastinate",
    "pgqueuer",
    "psycopg",
    "matplotlib",
)
FULL = Config(workdir=Path("."))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tether's benchmark harness")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; results go to a temporary folder")
    parser.add_argument(
        "--out", help="results folder (default bench/results, or a temporary one with --smoke)"
    )
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, help="run only these workloads")
    parser.add_argument("--peers", nargs="+", help="run only these peers (Tether and the limit always run)")
    parser.add_argument("--reps", type=int, help="repetitions of every figure (3)")
    parser.add_argument("--runs", type=int, help="runs per throughput measurement on SQLite (5000)")
    parser.add_argument("--pg-runs", type=int, help="runs per throughput measurement on PostgreSQL (5000)")
    parser.add_argument(
        "--depth-max",
        type=int,
        help="largest store the depth workload builds (1000000; populating 1,000,000 queued and "
        "1,000,000 finished runs through the public API takes well over 15 minutes)",
    )
    parser.add_argument(
        "--depth-sizes",
        type=int,
        nargs="+",
        help="queued runs in each depth case (1000 100000 1000000; the first is the baseline of the ratios)",
    )
    parser.add_argument(
        "--depth-finished",
        type=int,
        help="finished runs beside 1,000 queued ones in the depth workload (1000000; at most --depth-max)",
    )
    parser.add_argument("--memory-runs", type=int, help="runs the memory workload drains (100000)")
    parser.add_argument("--memory-reps", type=int, help="repetitions of the memory drain (--reps)")
    parser.add_argument(
        "--concurrency", type=int, help="Tether RunnerConfig.concurrency in the drains (4, its default)"
    )
    parser.add_argument("--poll-ms", type=int, help="Tether RunnerConfig.poll_ms in the drains (10)")
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL parts")
    parser.add_argument(
        "--report-only",
        metavar="RESULTS_JSON",
        help="measure nothing: write latest.md and the charts again from a results file, beside it",
    )
    return parser.parse_args(argv)


def configure(args: argparse.Namespace, workdir: Path) -> Config:
    if args.smoke:
        config = Config(
            workdir=workdir,
            smoke=True,
            reps=1,
            workers=(2,),
            runs=20,
            pg_runs=20,
            depth_sizes=(100, 300, 1000),
            depth_finished=4000,  # 1,000 finished through the API, copied twice
            depth_max=4000,
            depth_samples=20,
            event_samples=10,
            recovery_runs=10,
            recovery_lease_ms=600,
            memory_runs=200,
            profile_runs=30,
            profile_backlog=300,
            fanout_items=50,
        )
    else:
        config = Config(workdir=workdir)
    for name in ("reps", "runs", "pg_runs", "depth_max", "depth_finished", "memory_runs"):
        value = getattr(args, name)
        if value is not None:
            setattr(config, name, value)
    if args.depth_sizes:
        config.depth_sizes = tuple(args.depth_sizes)
    if args.concurrency is not None:
        config.runner["concurrency"] = args.concurrency
    if args.poll_ms is not None:
        config.runner["poll_ms"] = args.poll_ms
    config.peers = tuple(args.peers or ())
    return config


def reduced(config: Config) -> str:
    """What this run measured below the full sizes (empty for a full run)."""
    notes = []
    checks = (
        ("runs", "throughput runs (SQLite)"),
        ("pg_runs", "throughput runs (PostgreSQL)"),
        ("memory_runs", "memory runs"),
        ("fanout_items", "fan-out items"),
        ("depth_finished", "finished runs beside the queue (depth)"),
        ("reps", "repetitions"),
    )
    for name, what in checks:
        if getattr(config, name) < getattr(FULL, name):
            notes.append(f"{what} {getattr(config, name):,} instead of {getattr(FULL, name):,}")
    if config.depth_max < FULL.depth_max:
        notes.append(
            f"queue depth capped at {config.depth_max:,} runs (--depth-max) instead of {FULL.depth_max:,}"
        )
    return "; ".join(notes)


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        ).stdout
        return head + (" with uncommitted changes" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def probe_tether_postgres() -> str | None:
    """None when Tether's PostgreSQL store works here, else why not (its parts are then skipped)."""
    database = pg_create("probe")
    try:
        run_child(
            ["call", "bench.workloads:probe_tether_postgres", json.dumps({"database": database})], timeout=120
        )
    except Exception as error:
        return f"Tether's PostgreSQL store does not work here: {error_text(error)[:500]}"
    finally:
        pg_drop(database)
    return None


def find_errors(value: Any, path: str = "") -> list[str]:
    """Every ``error`` recorded anywhere in the results."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "error":
                found.append(f"{path}: {item}")
            else:
                found.extend(find_errors(item, f"{path}/{key}"))
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.report_only:
        source = Path(args.report_only)
        recorded = json.loads(source.read_text())
        written = report.charts(recorded, source.parent)
        (source.parent / "latest.md").write_text(report.markdown(recorded, written))
        print(f"wrote {source.parent}/latest.md and {len(written)} charts")
        return 0
    started_at = datetime.datetime.now(datetime.UTC)
    started = time.perf_counter()
    if args.out:
        out = Path(args.out)
    elif args.smoke:
        out = Path(tempfile.mkdtemp(prefix="tether-bench-smoke-"))
    else:
        out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-work-"))
    config = configure(args, workdir)
    pg_reason = "--no-pg was given" if args.no_pg else pg_available()
    if pg_reason is None:
        try:
            import tether.store.postgres  # noqa: F401
        except Exception as error:
            pg_reason = f"Tether's PostgreSQL store cannot be imported: {error_text(error)}"
    if pg_reason is not None:
        print(f"note: the PostgreSQL parts are skipped: {pg_reason}", flush=True)
    tether_pg = pg_reason or probe_tether_postgres()
    if tether_pg is not None and pg_reason is None:
        print(f"note: Tether's PostgreSQL parts are skipped: {tether_pg}", flush=True)
    results: dict[str, Any] = {
        "meta": {
            "started": started_at.isoformat(timespec="seconds"),
            "smoke": config.smoke,
            "machine": f"{platform.machine()} Linux, {os.cpu_count()} cores",
            "commit": commit(),
            "versions": versions(),
            "postgres": None
            if pg_reason
            else {
                "version": pg_setting("server_version"),
                "synchronous_commit": pg_setting("synchronous_commit"),
            },
            "postgres_skipped": pg_reason,
            "tether_postgres_skipped": tether_pg,
            "sizes": {
                "reps": config.reps,
                "runs": config.runs,
                "pg_runs": config.pg_runs,
                "workers": list(config.workers),
                "depth_sizes": list(config.depth_sizes),
                "depth_finished": config.depth_finished,
                "depth_max": config.depth_max,
                "depth_samples": config.depth_samples,
                "event_samples": config.event_samples,
                "recovery_runs": config.recovery_runs,
                "recovery_lease_ms": config.recovery_lease_ms,
                "memory_runs": config.memory_runs,
                "profile_runs": config.profile_runs,
                "profile_backlog": config.profile_backlog,
                "fanout_items": config.fanout_items,
                "fanout_parallelism": config.fanout_parallelism,
            },
            "reduced": reduced(config),
            "tether_runner": (
                "one Runner per worker process with "
                f"RunnerConfig(concurrency={config.runner['concurrency']}, "
                f"poll_ms={config.runner['poll_ms']}), other settings default (lease_ms=30000)"
            ),
        },
        "unavailable": {},
    }
    chosen = args.only or WORKLOADS
    try:
        for name in WORKLOADS:
            if name not in chosen:
                continue
            print(f"== {name}", flush=True)
            began = time.perf_counter()
            try:
                if name == "throughput":
                    results[name] = throughput.run(config, pg_reason, tether_pg)
                    for group in results[name].values():
                        for label, entry in group.get("systems", {}).items():
                            if "unavailable" in entry:
                                results["unavailable"][label] = entry["unavailable"]
                        if "skipped" in group:
                            results["unavailable"]["PostgreSQL systems"] = group["skipped"]
                elif name == "depth":
                    results[name] = depth.run(config)
                elif name == "events":
                    results[name] = events.run(config, tether_pg)
                elif name == "recovery":
                    results[name] = recovery.run(config, tether_pg)
                elif name == "memory":
                    results[name] = memory.run(config, args.memory_reps or config.reps)
                elif name == "profile":
                    results[name] = profile.run(config, tether_pg)
                elif name == "fanout":
                    results[name] = fanout.run(config, tether_pg)
            except Exception as error:
                traceback.print_exc()
                results[name] = {"error": error_text(error)}
            results["meta"].setdefault("workload_seconds", {})[name] = time.perf_counter() - began
            print(f"   ({time.perf_counter() - began:.0f} s)", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["meta"]["duration_s"] = time.perf_counter() - started
    written = report.charts(results, out)
    (out / "latest.json").write_text(json.dumps(results, indent=1))
    (out / f"{started_at.date().isoformat()}.json").write_text(json.dumps(results, indent=1))
    (out / "latest.md").write_text(report.markdown(results, written))
    print(
        f"results: {out}/latest.json, latest.md, {len(written)} charts "
        f"({results['meta']['duration_s']:.0f} s)"
    )
    errors = find_errors(results)
    for error in errors:
        print(f"FAILED {error[:500]}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
