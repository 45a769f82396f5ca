"""The child-process side of the harness: ``python -m bench.worker MODE ...``.

- ``setup SPEC``: the system's one-time schema work.
- ``enqueue SPEC N``: enqueue N runs one at a time; prints a JSON line with the seconds taken.
- ``work SPEC SLOT COUNTER``: set the system's worker up, print ``ready``, wait for ``go`` on stdin,
  then run the worker until SIGTERM, bumping slot SLOT of the COUNTER file per finished task.
- ``call MODULE:FUNCTION JSON``: a workload's own child (event writer, follower, crash victim...);
  prints the function's JSON result.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from bench.common import Counter
from bench.peers import load_peer


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "call":
        module_name, _, function = argv[1].partition(":")
        module = importlib.import_module(module_name)
        result: Any = getattr(module, function)(**json.loads(argv[2]))
        print(json.dumps(result), flush=True)
        return 0
    spec = json.loads(argv[1])
    peer = load_peer(spec["key"], Path(spec["workdir"]), spec["options"])
    if mode == "setup":
        print(json.dumps(peer.setup_here()), flush=True)
    elif mode == "enqueue":
        print(json.dumps(peer.enqueue_here(int(argv[2]))), flush=True)
    elif mode == "work":
        counter = Counter(Path(argv[3]), int(argv[2]))
        loop = peer.worker_here(counter)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 0
        loop()
    else:
        raise SystemExit(f"unknown mode {mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
