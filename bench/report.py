"""The results as Markdown tables and PNG charts (matplotlib), from the results dictionary only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import summary

#: The en dash and the multiplication sign of the tables.
DASH, TIMES = "\u2013", "\u00d7"
METRICS = (
    ("enqueue", "enqueue runs/s"),
    ("1", "end-to-end runs/s, 1 worker"),
    ("2", "end-to-end runs/s, 2 workers"),
)


#: How a follower learns of a new event on each backend.
NOTICE_PATHS = {"sqlite": "woken by a PRAGMA data_version poll", "postgres": "woken by LISTEN/NOTIFY"}


def _metric(entry: dict[str, Any], metric: str) -> dict[str, Any] | None:
    found = entry.get("enqueue") if metric == "enqueue" else entry.get("drain", {}).get(metric)
    if not isinstance(found, dict) or found.get("median") is None:
        return None
    return found


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return DASH
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _cell(stats: dict[str, Any] | None, digits: int = 1) -> str:
    if stats is None:
        return DASH
    return f"{_fmt(stats['median'], digits)} ({_fmt(stats['min'], digits)}{DASH}{_fmt(stats['max'], digits)})"


def _ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}{TIMES}"


def fastest_peer(systems: dict[str, Any], metric: str) -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for label, entry in systems.items():
        stats = _metric(entry, metric)
        if entry["role"] == "peer" and stats is not None and (best is None or stats["median"] > best[1]):
            best = (label, stats["median"])
    return best


def limit_for(systems: dict[str, Any], entry: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The physical-limit row with the same backend and durability as a Tether row."""
    for label, other in systems.items():
        if other["role"] != "limit" or other["backend"] != entry["backend"]:
            continue
        if entry["backend"] == "postgres" or other["settings"].get("synchronous") == entry["settings"].get(
            "synchronous"
        ):
            return label, other
    return None


def throughput_tables(group: str, data: dict[str, Any]) -> list[str]:
    systems = data["systems"]
    lines = [
        f"### Throughput on {'SQLite' if group == 'sqlite' else 'PostgreSQL'} ({data['runs']:,} runs)",
        "",
    ]
    if "skipped" in data:
        return [*lines, f"Skipped: {data['skipped']}", ""]
    if "server" in data:
        lines += [
            f"Server setting in force: `synchronous_commit={data['server']['synchronous_commit']}`.",
            "",
        ]
    lines += [
        f"Median (min{DASH}max) over the repetitions; {TIMES}fastest is the median divided by the fastest "
        f"peer's median for the same figure (1.00{TIMES} is the fastest peer; above 1 is faster than it).",
        "",
        f"| System | Durability | Enqueue runs/s | {TIMES}fastest | Drain, 1 worker | {TIMES}fastest | "
        f"Drain, 2 workers | {TIMES}fastest | Notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    best = {metric: fastest_peer(systems, metric) for metric, _ in METRICS}
    for label, entry in systems.items():
        if entry["role"] in ("limit", "contract", "rows"):
            continue
        cells = [f"**{label}**" if entry["role"] == "tether" else label, entry.get("durability") or DASH]
        for metric, _ in METRICS:
            stats = _metric(entry, metric)
            top = best[metric]
            cells += [_cell(stats), _ratio(stats["median"] / top[1] if stats and top else None)]
        notes = []
        if entry.get("duplicates"):
            notes.append(f"ran up to {entry['duplicates']} task(s) twice with 2 workers")
        if "unavailable" in entry:
            notes.append(f"not run: {entry['unavailable']}")
        if "error" in entry:
            notes.append(f"failed: {entry['error'][:160]}")
        cells.append("; ".join(notes).replace("|", "/") or "")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Tether against each peer (Tether's median divided by the peer's; above 1: Tether is faster):",
        "",
    ]
    tethers = [(label, e) for label, e in systems.items() if e["role"] == "tether"]
    peers = [
        (label, e)
        for label, e in systems.items()
        if e["role"] == "peer" and any(_metric(e, metric) for metric, _ in METRICS)
    ]
    header = "| Tether | Figure | " + " | ".join(label for label, _ in peers) + " |"
    lines += [header, "| --- | --- |" + " --- |" * len(peers)]
    for label, entry in tethers:
        for metric, name in METRICS:
            mine = _metric(entry, metric)
            cells = []
            for _, peer in peers:
                theirs = _metric(peer, metric)
                cells.append(_ratio(mine["median"] / theirs["median"] if mine and theirs else None))
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The physical limit: a plain-SQL claim transaction then a done transaction per run on the same kind "
        "of storage with the same durability setting; Tether's end-to-end rate as a fraction of it:",
        "",
        "| Limit | Durability | Drain, 1 worker | Drain, 2 workers | Tether | Tether / limit, 1 worker | "
        "Tether / limit, 2 workers |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, entry in tethers:
        found = limit_for(systems, entry)
        if found is None:
            continue
        limit_label, limit = found
        fractions = []
        for metric in ("1", "2"):
            mine, theirs = _metric(entry, metric), _metric(limit, metric)
            fractions.append(
                f"{mine['median'] / theirs['median']:.1%}" if mine and theirs and theirs["median"] else DASH
            )
        lines.append(
            f"| {limit_label} | {limit.get('durability') or DASH} | {_cell(_metric(limit, '1'))} | "
            f"{_cell(_metric(limit, '2'))} | {label} | {fractions[0]} | {fractions[1]} |"
        )
    return [*lines, "", *limit_tables(systems, tethers)]


CONTRACT_INTRO = (
    "The contract limit: every statement Tether sent to the database for the same runs (the same rows, "
    "reads, transactions and commits, recorded from a real drain) replayed in order in plain SQL with "
    "nothing around them: the fastest Tether's statements could go on this schema from Python. "
    "Tether / contract is what Tether's own code costs; contract / a peer shows how far a target over "
    "that peer is reachable at all while sending what Tether sends (1-worker drains). A row with several "
    "transactions per commit replays the same statements with that many recorded transactions merged "
    "into each commit: a perfect group commit, the most that committing several runs together could "
    "gain. On PostgreSQL every recorded transaction is sent pipelined, in one round trip, as if it were "
    "one call into the server:"
)
ROWS_INTRO = (
    "The rows limit: the rows a real Tether drain left written (the difference between the database "
    "before and after it, table by table: new rows, changed columns, removed rows), written again on "
    "the same schema with the same durability, one executemany per table and statement shape, the "
    "runs' rows in transactions of 64 runs (on PostgreSQL pipelined in one round trip each, or "
    "through COPY, the server's bulk path): no reads, no intermediate states, no locks or claims to "
    "check. An implementation that leaves these rows has this writing to do and more (reads, claim "
    "checks, a claim committed before its node runs), however its statements are shaped, so rows "
    "limit / a peer bounds, in practice, every target over that peer:"
)
PAIRED_NOTE = (
    "Same, by repetition (in the tables above): the median (min\u2013max) of the ratios of each "
    "repetition's two drains, Tether's and the limit's, which leaves out the host's drift between "
    "repetitions."
)
#: (role, introduction, (observed key, column name) per run) of the tables that bound Tether.
LIMIT_TABLES = (
    (
        "contract",
        CONTRACT_INTRO,
        (("statements_per_run", "Statements per run"), ("commits_per_run", "Commits per run")),
    ),
    (
        "rows",
        ROWS_INTRO,
        (
            ("rows_per_run", "Rows per run"),
            ("statements_per_run", "Statements per run"),
            ("commits_per_run", "Commits per run"),
        ),
    ),
)


def _table_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def limit_tables(systems: dict[str, Any], tethers: list[tuple[str, Any]]) -> list[str]:
    lines: list[str] = []
    for role, intro, columns in LIMIT_TABLES:
        lines += limit_table(systems, tethers, role, intro, columns)
    return [*lines, PAIRED_NOTE, ""] if lines else lines


def limit_table(
    systems: dict[str, Any],
    tethers: list[tuple[str, Any]],
    role: str,
    intro: str,
    columns: tuple[tuple[str, str], ...],
) -> list[str]:
    """Rows of one role that bound Tether's drain: each against Tether and against every peer."""
    rows = [(label, e) for label, e in systems.items() if e["role"] == role]
    if not rows:
        return []
    peers = [(label, e) for label, e in systems.items() if e["role"] == "peer" and _metric(e, "1")]
    name = {"contract": "Contract", "rows": "Rows limit"}[role]
    header = [
        name,
        *(title for _, title in columns),
        "Drain, 1 worker",
        "Tether",
        f"Tether / {name.lower()}",
        "Same, by repetition",
        *(f"{name} / {label}" for label, _ in peers),
    ]
    lines = [intro, "", _table_row(header), _table_row(["---"] * len(header))]
    for limit_label, limit in rows:
        theirs = _metric(limit, "1")
        observed = limit.get("observed", {})
        per_run = [
            DASH if k not in observed else f"{observed[k]:.0f}" if observed[k] >= 1 else f"{observed[k]:.2f}"
            for k, _ in columns
        ]
        reach = [
            _ratio(theirs["median"] / _metric(peer, "1")["median"] if theirs else None) for _, peer in peers
        ]
        for label, entry in tethers:
            if entry["settings"].get("synchronous") != limit["settings"].get("synchronous"):
                continue
            mine = _metric(entry, "1")
            share = f"{mine['median'] / theirs['median']:.1%}" if mine and theirs else DASH
            paired = _paired(mine, theirs)
            lines.append(_table_row([limit_label, *per_run, _cell(theirs), label, share, paired, *reach]))
    return [*lines, ""]


def _paired(mine: dict[str, Any] | None, theirs: dict[str, Any] | None) -> str:
    """The ratio of two systems' drains repetition by repetition (each repetition measures both, one
    after the other): median (min-max), as a percentage. Less of the host's drift between
    repetitions is in it than in the ratio of the medians."""
    if not mine or not theirs or len(mine["samples"]) != len(theirs["samples"]):
        return DASH
    ratios = summary([a / b for a, b in zip(mine["samples"], theirs["samples"], strict=True)])
    return f"{ratios['median']:.1%} ({ratios['min']:.1%}{DASH}{ratios['max']:.1%})"


def depth_table(depth: dict[str, Any]) -> list[str]:
    lines = [
        f"### Queue depth: claim_next latency ({depth.get('store', '')})",
        "",
        "| Case | Queued | Finished beside | p50 ms | p99 ms | p99 / smallest |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, case in depth.get("cases", {}).items():
        if "error" in case:
            lines.append(f"| {name} | {DASH} | {DASH} | failed: {case['error'][:120]} | {DASH} | {DASH} |")
            continue
        lines.append(
            f"| {name} | {case['queued']:,} | {case['finished']:,} | {_cell(case['p50_ms'], 3)} | "
            f"{_cell(case['p99_ms'], 3)} | {_ratio(case.get('p99_ratio_to_smallest'))} |"
        )
    for skipped in depth.get("skipped", []):
        lines.append(f"\nNot measured in this run: {skipped}.")
    return [*lines, ""]


def events_table(events: dict[str, Any]) -> list[str]:
    lines = [
        "### Event latency: commit to a follower of events_after seeing it",
        "",
        f"Follower: {events.get('follower', '')}. Writer: {events.get('writer', '')}.",
        "",
        "| Store | p50 ms | p99 ms | Note |",
        "| --- | --- | --- | --- |",
    ]
    for backend in ("sqlite", "postgres"):
        data = events.get(backend)
        if data is None:
            continue
        if "p50_ms" not in data:
            reason = data.get("skipped") or data.get("error", "")
            lines.append(f"| {backend} | {DASH} | {DASH} | {reason[:160]} |")
            continue
        lines.append(
            f"| {backend} | {_cell(data['p50_ms'])} | {_cell(data['p99_ms'])} | "
            f"{data.get('note') or NOTICE_PATHS.get(backend, '')} |"
        )
    return [*lines, ""]


def recovery_table(recovery: dict[str, Any]) -> list[str]:
    poll = recovery.get("runner", {}).get("poll_ms")
    lines = [
        f"### Crash recovery: {recovery.get('runs')} runs held by a worker killed with kill -9 "
        f"(lease {recovery.get('lease_ms')} ms)",
        "",
        f"Claimed after expiry: for each run, from its own lease's expiry to the rescuer's claim of it "
        f"(the rescuer polls every {poll} ms).",
        "",
        "| Store | Kill to all done, s | \u00f7 lease | Lease left at the kill, ms | "
        "Last expiry to all done, ms | Claimed after expiry, p50 ms | Claimed after expiry, max ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend in ("sqlite", "postgres"):
        data = recovery.get(backend)
        if data is None:
            continue
        if "seconds" not in data:
            reason = data.get("skipped") or data.get("error", "")
            lines.append(f"| {backend} | {DASH} | {DASH} | {DASH} | {DASH} | {DASH} | {reason[:160]} |")
            continue
        late = [data.get(f"claimed_after_expiry_{k}_ms") for k in ("p50", "max")]
        lines.append(
            f"| {backend} | {_cell(data['seconds'], 2)} | {_cell(data['ratio_to_lease'], 2)} | "
            f"{_cell(data['lease_left_at_kill_ms'], 0)} | {_cell(data['after_last_expiry_ms'], 0)} | "
            + " | ".join(_cell(value, 0) if value else DASH for value in late)
            + " |"
        )
    return [*lines, ""]


def fanout_table(fanout: dict[str, Any]) -> list[str]:
    lines = [
        f"### Fan-out: one run mapping a no-op step over {fanout.get('items')} items, "
        f"{fanout.get('parallelism')} at once",
        "",
        f"Step: {fanout.get('step', '')}.",
        "",
        "DBOS's nearest equivalent: one workflow enqueuing a no-op workflow per item on a queue "
        "with that worker concurrency (0.1 s polling), then waiting for every result in order.",
        "",
        f"| System | Store | Items/s | {TIMES}DBOS | Note |",
        "| --- | --- | --- | --- | --- |",
    ]
    for backend in ("sqlite", "postgres"):
        peer = fanout.get(f"dbos-{backend}") or {}
        for system, data in (("tether", fanout.get(backend)), ("dbos", fanout.get(f"dbos-{backend}"))):
            if data is None:
                continue
            if "items_per_s" not in data:
                reason = data.get("skipped") or data.get("error", "")
                lines.append(f"| {system} | {backend} | {DASH} | {DASH} | {reason[:160]} |")
                continue
            ratio = DASH
            if system == "tether" and "items_per_s" in peer:
                ratio = _ratio(data["items_per_s"]["median"] / peer["items_per_s"]["median"])
            lines.append(f"| {system} | {backend} | {_cell(data['items_per_s'], 0)} | {ratio} | |")
    return [*lines, ""]


def memory_table(memory: dict[str, Any]) -> list[str]:
    reps = len(memory.get("rounds", []))
    lines = [
        f"### Memory: one worker draining {memory.get('runs', 0):,} runs"
        + (f" ({reps} repetitions)" if reps else ""),
        "",
    ]
    if "error" in memory:
        return [*lines, f"Failed: {memory['error']}", ""]
    if "peak_rss_mib" not in memory:
        return [*lines, "Not measured in this run.", ""]
    lines += [
        "| Peak RSS MiB | RSS at 10% done | RSS at 50% done | RSS at the end | End \u00f7 10% | "
        "Drain runs/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rss_50 = [r["rss_at_50pct_kib"] / 1024 for r in memory.get("rounds", [])]
    middle = (
        {"median": sorted(rss_50)[len(rss_50) // 2], "min": min(rss_50), "max": max(rss_50)}
        if rss_50
        else None
    )
    lines.append(
        f"| {_cell(memory['peak_rss_mib'])} | {_cell(memory['rss_at_10pct_mib'])} | {_cell(middle)} | "
        f"{_cell(memory['rss_at_end_mib'])} | {_cell(memory['growth_10pct_to_end'], 2)} | "
        f"{_cell(memory['drain_runs_per_s'])} |"
    )
    return [*lines, ""]


def profile_section(profile: dict[str, Any]) -> list[str]:
    lines = ["### Where Tether's drain time goes", ""]
    cases = {k: v for k, v in profile.items() if isinstance(v, dict) and k != "runner"}
    usable = {k: v for k, v in cases.items() if "per_run" in v}
    if usable:
        lines += [
            "| Case | Runs | Commits per run | Read transactions per run | Statements per run | "
            "Server round trips per run | ms per run inside write transactions |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, case in usable.items():
            per_run, inside = case["per_run"], case["ms_per_run_in_transactions"]
            trips = f"{per_run['round trips']:.1f}" if "round trips" in per_run else DASH
            lines.append(
                f"| {name} | {case['runs']} | {per_run.get('write transactions (commits)', 0):.1f} | "
                f"{per_run.get('read transactions', 0):.1f} | {per_run.get('statements', 0):.0f} | "
                f"{trips} | {inside.get('write transactions', 0):.2f} |"
            )
        lines += ["", "The statements that take the most time, in ms per run (calls per run):", ""]
        names = list(usable)
        slow: dict[str, dict[str, Any]] = {}
        for name, case in usable.items():
            for query, figures in case.get("slowest_queries_ms_per_run", {}).items():
                slow.setdefault(query, {})[name] = figures
        lines += ["| Statement | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
        for query, by_case in slow.items():
            cells = [
                f"{by_case[n]['ms_per_run']:.2f} ({by_case[n]['calls_per_run']:.1f})"
                if n in by_case
                else DASH
                for n in names
            ]
            lines.append(f"| `{query}` | " + " | ".join(cells) + " |")
        for name, case in usable.items():
            lines += [
                "",
                f"{name}: where the working time goes (cProfile own time over all runner threads, "
                "waits left out):",
                "",
            ]
            lines += [f"- {area}: {share:.0%}" for area, share in case["own_time_share_by_area"].items()]
            if case.get("sqlite_connections_opened_per_run"):
                lines.append(
                    f"- SQLite connections opened per run: {case['sqlite_connections_opened_per_run']:.2f} "
                    "(connections are pooled across the runner's threads)"
                )
            lines += ["", f"{name}: the most frequent statements per run:", ""]
            lines += [f"- `{query}`: {count:.1f}" for query, count in case["top_queries_per_run"].items()]
            lines += ["", f"{name}: top functions by own time:", ""]
            lines += [
                f"- {row['function']}: {row['share']:.1%} ({row['calls_per_run']:.1f} calls per run)"
                for row in case["top_functions_by_own_time"][:10]
            ]
    for name, case in cases.items():
        if "per_run" not in case:
            lines.append(f"\n{name}: {case.get('skipped') or case.get('error')}")
    return [*lines, ""]


def markdown(results: dict[str, Any], charts: list[str]) -> str:
    meta = results["meta"]
    lines = [
        "# Tether benchmark results",
        "",
        f"Run {meta['started']} ({meta['duration_s'] / 60:.1f} min) on {meta['machine']}; commit "
        f"`{meta['commit']}`. Every figure is the median of {meta['sizes']['reps']} repetitions with min "
        "and max; the machine is shared and noisy, so compare systems by the ratios, all measured in this "
        "run.",
        "",
    ]
    if meta.get("reduced"):
        lines += [f"**Reduced sizes:** {meta['reduced']}", ""]
    for workload, origin in meta.get("merged", {}).items():
        lines += [
            f"**Measured in a separate run:** {workload} (started {origin['started']}, commit "
            f"`{origin['commit']}`, sizes `{origin['sizes']}`"
            + (f", Tether's workers: {origin['tether_runner']}" if "tether_runner" in origin else "")
            + ").",
            "",
        ]
    lines += [f"Sizes: `{meta['sizes']}`.", "", f"Tether's workers: {meta['tether_runner']}.", ""]
    lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".", ""]
    unavailable = results.get("unavailable", {})
    if unavailable:
        lines += ["Systems that could not run here:", ""]
        lines += [f"- {name}: {why}" for name, why in unavailable.items()]
        lines.append("")
    throughput = results.get("throughput", {})
    for group in ("sqlite", "postgres"):
        if group in throughput:
            lines += throughput_tables(group, throughput[group])
    lines += ["How each system's drain runs:", ""]
    for group in throughput.values():
        for label, entry in group.get("systems", {}).items():
            lines.append(f"- {label}: {entry['settings'].get('worker', '')}")
    lines.append("")
    if "depth" in results:
        lines += depth_table(results["depth"])
    if "events" in results:
        lines += events_table(results["events"])
    if "recovery" in results:
        lines += recovery_table(results["recovery"])
    if "memory" in results:
        lines += memory_table(results["memory"])
    if "profile" in results:
        lines += profile_section(results["profile"])
    if "fanout" in results:
        lines += fanout_table(results["fanout"])
    if charts:
        lines += ["### Charts", ""] + [f"![{Path(c).stem}]({Path(c).name})" for c in charts] + [""]
    return "\n".join(lines)


# -- charts ----------------------------------------------------------------------------------
#: Bar colours by role (a peer's is the default blue).
ROLE_COLOURS = {"tether": "#d62728", "limit": "#7f7f7f", "contract": "#bcbd22", "rows": "#17becf"}


def charts(results: dict[str, Any], folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    written: list[str] = []

    def save(figure: Any, name: str) -> None:
        path = folder / name
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(str(path))

    for group, data in results.get("throughput", {}).items():
        systems = {
            k: v for k, v in data.get("systems", {}).items() if _metric(v, "1") or _metric(v, "enqueue")
        }
        if not systems:
            continue
        labels = list(systems)
        shown = [(m, t) for m, t in METRICS if any(_metric(e, m) for e in systems.values())]
        figure, axes = plt.subplots(
            1, len(shown), figsize=(5 * len(shown), 0.45 * len(labels) + 1.8), sharey=True
        )
        axes = list(axes) if len(shown) > 1 else [axes]
        for axis, (metric, title) in zip(axes, shown, strict=True):
            values, lows, highs, colours = [], [], [], []
            for label in labels:
                stats = _metric(systems[label], metric)
                role = systems[label]["role"]
                median = stats["median"] if stats else 0
                values.append(median)
                lows.append(median - stats["min"] if stats else 0)
                highs.append(stats["max"] - median if stats else 0)
                colours.append(ROLE_COLOURS.get(role, "#1f77b4"))
            axis.barh(labels, values, xerr=[lows, highs], color=colours, capsize=3)
            axis.set_xscale("log")
            axis.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on short ranges
            axis.set_title(title)
            axis.invert_yaxis()
            axis.grid(axis="x", alpha=0.3)
        figure.suptitle(
            f"Throughput on {'SQLite' if group == 'sqlite' else 'PostgreSQL'}, {data['runs']:,} no-op runs "
            "(median, min-max; red Tether, grey the physical limit, olive the contract limit, cyan the rows "
            "limit; log scale)"
        )
        save(figure, f"throughput_{group}.png")

    depth = results.get("depth", {}).get("cases", {})
    queued = [(c["queued"], c) for c in depth.values() if "p50_ms" in c and c["finished"] == 0]
    if queued:
        figure, axis = plt.subplots(figsize=(7, 4))
        xs = [q for q, _ in queued]
        for key, style in (("p50_ms", "o-"), ("p99_ms", "s-")):
            axis.plot(
                xs, [c[key]["median"] for _, c in queued], style, label=key.replace("_ms", "") + " queued"
            )
        for case in depth.values():
            if "p50_ms" in case and case["finished"]:
                for key, marker in (("p50_ms", "^"), ("p99_ms", "v")):
                    axis.plot(
                        [case["finished"]],
                        [case[key]["median"]],
                        marker,
                        markersize=9,
                        label=f"{key.replace('_ms', '')}: 1,000 queued beside {case['finished']:,} finished",
                    )
        axis.set_xscale("log")
        axis.set_xlabel("runs in the store")
        axis.set_ylabel("claim_next latency, ms")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        axis.set_title("claim_next latency against queue depth")
        save(figure, "depth.png")

    memory = results.get("memory", {})
    if memory.get("curve"):
        figure, axis = plt.subplots(figsize=(7, 4))
        curve = memory["curve"]
        axis.plot([c[0] for c in curve], [c[1] / 1024 for c in curve])
        axis.set_xlabel("runs finished")
        axis.set_ylabel("worker RSS, MiB")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.set_title(f"One worker draining {memory['runs']:,} runs: RSS as it goes")
        save(figure, "memory.png")

    events, recovery = results.get("events", {}), results.get("recovery", {})
    rows = [(b, events[b]) for b in ("sqlite", "postgres") if "p50_ms" in events.get(b, {})]
    rec = [(b, recovery[b]) for b in ("sqlite", "postgres") if "seconds" in recovery.get(b, {})]
    if rows or rec:
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for index, (_, data) in enumerate(rows):
            for offset, key in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
                stats = data[key]
                axes[0].bar(
                    index + offset,
                    stats["median"],
                    width=0.4,
                    yerr=[[stats["median"] - stats["min"]], [stats["max"] - stats["median"]]],
                    capsize=3,
                    color="#1f77b4" if key == "p50_ms" else "#ff7f0e",
                    label=key.replace("_ms", "") if index == 0 else None,
                )
        axes[0].set_xticks(range(len(rows)), [b for b, _ in rows])
        axes[0].set_ylabel("ms")
        axes[0].set_title("Event latency: commit to follower")
        axes[0].legend()
        for index, (_, data) in enumerate(rec):
            stats = data["seconds"]
            axes[1].bar(
                index,
                stats["median"],
                yerr=[[stats["median"] - stats["min"]], [stats["max"] - stats["median"]]],
                capsize=3,
                color="#d62728",
            )
        if rec:
            axes[1].axhline(
                recovery["lease_ms"] / 1000, color="grey", linestyle="--", label="configured lease"
            )
            axes[1].legend()
        axes[1].set_xticks(range(len(rec)), [b for b, _ in rec])
        axes[1].set_ylabel("seconds from kill -9 to all done")
        axes[1].set_title(f"Crash recovery, {recovery.get('runs')} runs")
        save(figure, "latency_recovery.png")
    return written
