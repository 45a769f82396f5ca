"""``shell``: run a command in a process group of its own, bounded by its timeout."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

from tether.engine.context import Context
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost
from tether.engine.worker.deadlines import routes
from tether.engine.worker.state import ActiveRun, Parked, kill_group
from tether.store import Attempt


def run(
    host: StepHost,
    active: ActiveRun,
    wf: Workflow,
    node: Node,
    ctx: Context,
    failures: int,
    waiting: Attempt | None,
) -> None:
    spec = node.spec
    attempt = host.begin_node(active, ctx.node_id)
    limit = int(spec["maxOutput"])
    env = {**os.environ, **dict(spec["env"] or {})}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            # A session of its own: a cancel or a stop kills the command's whole process group.
            process = subprocess.Popen(
                list(spec["command"]),
                cwd=spec["cwd"],
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except OSError as error:
            host.fail_node(
                active,
                node,
                attempt,
                f"cannot start {spec['command']}: {error}",
                failures,
                int(spec["retries"]),
                float(spec["backoffS"]),
            )
            return
        active.process = process
        deadline = host.clock.monotonic() + float(spec["timeoutS"])
        if active.run_deadline is not None and active.run_deadline < deadline:
            deadline = active.run_deadline
        timed_out = False
        while process.poll() is None:
            if host.stopping or active.cancelled.is_set() or active.lost.is_set():
                kill_group(process)
                process.wait()
                active.process = None
                if host.stopping and not (active.cancelled.is_set() or active.lost.is_set()):
                    with host.store.transaction():
                        host.store.attempt_finish(
                            run_id=active.run_id,
                            claim_token=active.token,
                            attempt_id=attempt.attempt_id,
                            status="interrupted",
                            error_message="interrupted by runner shutdown",
                        )
                        host.ensure(host.store.park(run_id=active.run_id, claim_token=active.token))
                raise Parked("command interrupted")
            if host.clock.monotonic() > deadline:
                kill_group(process)
                process.wait()
                timed_out = True
                break
            time.sleep(0.02)  # polling the process (real time): the deadline reads the clock
        active.process = None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(limit + 1), err.read(limit + 1)
    output = {
        "exitCode": process.returncode,
        "stdout": stdout[:limit].decode("utf-8", "replace"),
        "stderr": stderr[:limit].decode("utf-8", "replace"),
        "truncated": len(stdout) > limit or len(stderr) > limit,
    }
    retries, backoff = int(spec["retries"]), float(spec["backoffS"])
    if timed_out and deadline == active.run_deadline:
        host.time_out_run(active)
    elif timed_out:
        host.time_out_node(
            active, node, attempt, f"timed out after {spec['timeoutS']:g} s", failures, retries, backoff
        )
    elif process.returncode == 0:
        host.complete_node(active, attempt, output, "ok")
    elif routes(wf, ctx.node_id, "error"):
        host.complete_node(active, attempt, output, "error")
    else:
        tail = output["stderr"][-500:] if isinstance(output["stderr"], str) else ""
        host.fail_node(
            active, node, attempt, f"exit status {process.returncode}: {tail}", failures, retries, backoff
        )
