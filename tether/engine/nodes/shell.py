"""``shell``: run a command in a process group of its own, bounded by its timeout, with its
worker's environment."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

from tether.engine.context import Context
from tether.engine.failures import summary
from tether.engine.graph import Node, Workflow
from tether.engine.nodes.base import StepHost, computed
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
    missing = [name for name in spec.get("envFrom") or () if name not in os.environ]
    if missing:
        # A worker set up without the variable: a retry on it would fail the same way, so the
        # run fails at once, naming what to set.
        host.fail_node(
            active,
            node,
            attempt,
            f"the worker's environment lacks {', '.join(missing)} (named in env_from): set "
            f"{'it' if len(missing) == 1 else 'them'} where the worker runs, then restart the run",
            failures,
            0,
            float(spec["backoffS"]),
        )
        return
    try:
        # Inside the try: a broken command or stdin function fails the attempt, not the runner.
        command, stdin = _command(node, ctx), _stdin(node, ctx)
    except BaseException as error:
        host.fail_node(
            active,
            node,
            attempt,
            summary(error),
            failures,
            int(spec["retries"]),
            float(spec["backoffS"]),
            raised=error,
        )
        return
    # The worker's environment: the values of the variables env_from names are read here, at
    # execution, and never stored (inline env values are refused when the node is built).
    env = dict(os.environ)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as given:
        if stdin is not None:
            given.write(stdin)
            given.seek(0)
        try:
            # A session of its own: a cancel or a stop kills the command's whole process group.
            process = subprocess.Popen(
                command,
                cwd=spec["cwd"],
                env=env,
                stdin=given if stdin is not None else None,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except OSError as error:
            host.fail_node(
                active,
                node,
                attempt,
                f"cannot start {command}: {error}",
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
        if active.cancelled.is_set() or active.lost.is_set():
            # Killed from outside between two polls (a cancel or a lost lease kills the group):
            # its exit status is the kill's, not the command's, and the run is no longer ours.
            raise Parked("command interrupted")
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


def _command(node: Node, ctx: Context) -> list[str]:
    """The program and its arguments: the node's list, or what its command function returns."""
    command = computed(node, "command", ctx)
    if isinstance(command, str) or not isinstance(command, list | tuple) or not command:
        raise TypeError(f"the command function of node {node.id} returned {command!r}, not a list of strings")
    if not all(isinstance(part, str) for part in command):
        raise TypeError(f"the command function of node {node.id} returned {command!r}, not a list of strings")
    return list(command)


def _stdin(node: Node, ctx: Context) -> bytes | None:
    """The bytes for the command's standard input: text as UTF-8, any other JSON value encoded
    as JSON; None when the node gives none (the command inherits the worker's)."""
    value = computed(node, "stdin", ctx)
    if value is None and "stdin" not in node.hooks:
        return None
    return (value if isinstance(value, str) else json.dumps(value)).encode("utf-8")
