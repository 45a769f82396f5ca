"""Put workloads measured in a separate run into a results file, then rewrite its report.

    python -m bench.merge bench/results/latest.json /tmp/depth/latest.json depth

The target's ``meta["merged"]`` records, per workload taken over, the commit, start time and
sizes of the run it came from, and the report names them under its header: figures from separate
runs are not ratios measured in the same run, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from bench import report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="results file to update (its latest.md and charts are rewritten)")
    parser.add_argument("source", help="results file of the separate run")
    parser.add_argument("workloads", nargs="+", help="workloads to take from the source")
    args = parser.parse_args(argv)
    target_path = Path(args.target)
    target = json.loads(target_path.read_text())
    source = json.loads(Path(args.source).read_text())
    merged = target["meta"].setdefault("merged", {})
    for workload in args.workloads:
        if workload not in source:
            parser.error(f"{args.source} holds no {workload} results")
        target[workload] = source[workload]
        meta = source["meta"]
        merged[workload] = {
            "commit": meta["commit"],
            "started": meta["started"],
            "sizes": meta["sizes"],
            "tether_runner": meta["tether_runner"],
        }
    target_path.write_text(json.dumps(target, indent=1))
    dated = target_path.with_name(f"{target['meta']['started'][:10]}.json")
    if dated.exists():
        shutil.copy(target_path, dated)
    charts = report.charts(target, target_path.parent)
    (target_path.parent / "latest.md").write_text(report.markdown(target, charts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
