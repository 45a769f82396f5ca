"""Workflows as explicit graphs: nodes, edges routed on ``node`` or ``node.exit``, a start node.

A run completes when no edge leaves the node that just finished. Nothing is hidden: retries are
declared on the node, waits are nodes, and an included workflow is mounted as a visible sub-graph
whose terminal exits become the including node's exits.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.engine.limits import Limit
from tether.engine.providers import takes_turns
from tether.engine.schedules import Schedule, check_declared
from tether.engine.schema import check_schema, conform, model_of, schema_of
from tether.engine.schema import errors as schema_errors
from tether.engine.tools import tools_of
from tether.errors import InvalidInput
from tether.values import Json, canonical_json, definition_digest

NODE_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
EXIT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: The most steps a run completes unless its workflow says otherwise (``Workflow(max_steps=...)``).
DEFAULT_MAX_STEPS = 1000
NODE_KINDS = (
    "compute",
    "shell",
    "effect",
    "decision",
    "input",
    "agent",
    "notify",
    "sleep",
    "include",
    "event",
    "fan_out",
    "parallel",
    "child",
)
#: An agent node's deadline when it declares none: a model call that hangs must not hold its run
#: (and its runner's slot) for ever.
AGENT_TIMEOUT_S = 600.0
#: The most items (or branches) one fan-out node runs at once.
MAX_PARALLELISM = 256
#: The most model responses an agent conversation takes unless it says otherwise.
DEFAULT_MAX_TURNS = 10
#: A child node's key: part of the child run's id (see ``child``).
CHILD_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def _callable_name(fn: Callable[..., Any]) -> str:
    """A node function's identity in the definition: its qualified name and a digest of its
    source's syntax tree. Not its module: a workflow file's module name depends on how it was
    loaded. The syntax tree leaves out comments and layout, so editing a comment changes no
    definition; a change to the code does. A callable whose source cannot be read (a builtin,
    an object with ``__call__``) is known by its name alone."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    try:
        source = textwrap.dedent(inspect.getsource(fn)).strip()
    except (OSError, TypeError):
        return name
    try:
        tree = ast.parse(source)
    except SyntaxError:
        # A lambda's source is the lines it sits on, which may not parse alone (a trailing
        # comma, an open bracket): the text without its comments stands in.
        code = "\n".join(line.split("#", 1)[0].rstrip() for line in source.splitlines())
        return f"{name}@{hashlib.sha256(code.encode('utf-8')).hexdigest()[:16]}"
    return f"{name}@{hashlib.sha256(ast.dump(tree).encode('utf-8')).hexdigest()[:16]}"


@dataclass(frozen=True)
class Node:
    """One step of a workflow. Build nodes with the functions below, not directly."""

    id: str
    kind: str
    #: The declarative part, recorded in the definition snapshot (and so in its digest).
    spec: Mapping[str, Json] = field(default_factory=dict)
    #: The Python callable a compute, effect, notify or sleep node runs (not in the snapshot).
    fn: Callable[..., Any] | None = None
    #: An agent node's model provider.
    provider: Any = None
    #: An agent node's tools (``tether.engine.tools.Tool``).
    tools: Sequence[Any] = ()
    #: An include node's workflow.
    workflow: Workflow | None = None
    #: Parts of the spec given as functions of the step's context, by spec key (a shell
    #: command, a question or prompt built from earlier outputs): called when the step runs.
    hooks: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    #: A parallel node's branches (compute or effect nodes, never part of the graph themselves).
    branches: tuple[Node, ...] = ()

    def snapshot(self) -> dict[str, Json]:
        body: dict[str, Json] = {"kind": self.kind, **self.spec}
        if self.fn is not None:
            body["function"] = _callable_name(self.fn)
        if self.hooks:
            body["hooks"] = {key: _callable_name(fn) for key, fn in sorted(self.hooks.items())}
        return body


def _node_id(value: str) -> str:
    if not isinstance(value, str) or NODE_ID.fullmatch(value) is None:
        raise InvalidInput(
            f"Invalid node id {value!r}: use a letter, then letters, digits, _ or - (64 at most)"
        )
    return value


def _positive(name: str, value: float | None) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
        raise InvalidInput(f"{name} must be a positive number of seconds")
    return value


def _retries(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise InvalidInput("retries must be a whole number from 0 to 100")
    return value


def _deadline(spec: dict[str, Json], timeout_s: float | None, default: float | None = None) -> None:
    """Put a step's ``timeout_s`` in its spec as ``timeoutS``, only when it is not the kind's
    default: a workflow built before steps had deadlines keeps its definition digest."""
    _positive("timeout_s", timeout_s)
    if timeout_s != default:
        spec["timeoutS"] = timeout_s


def step_timeout_s(node: Node) -> float | None:
    """A step's deadline in seconds (None: it has none): what it declared, else its kind's
    default (``AGENT_TIMEOUT_S`` for an agent node)."""
    if "timeoutS" in node.spec:
        value = node.spec["timeoutS"]
        return None if value is None else float(value)
    return AGENT_TIMEOUT_S if node.kind == "agent" else None


def _default_matches(default: Json, schema: Mapping[str, Json] | None) -> None:
    if default is not None and schema is not None:
        problems = schema_errors(default, dict(schema))
        if problems:
            raise InvalidInput("the default does not match the schema: " + "; ".join(problems))


def compute(
    id: str,
    fn: Callable[..., Json],
    *,
    retries: int = 0,
    backoff_s: float = 1.0,
    exits: Sequence[str] = (),
    timeout_s: float | None = None,
) -> Node:
    """Run ``fn(ctx)``; it returns JSON, or ``Exit(name, output)`` to choose an exit (default ``ok``).

    A raised exception fails the attempt; it is retried ``retries`` times, waiting
    ``backoff_s * 2**(n-1)`` seconds durably before try ``n + 1``. An ``async def`` function
    runs on its worker's event loop (so may ``effect``, ``notify`` and ``agent`` functions). A
    call still running after ``timeout_s`` seconds is abandoned and its attempt recorded
    ``timed_out``: retried like a failure, or routed on the node's ``timeout`` exit when the
    graph has an edge for it."""
    _retries(retries)
    _positive("backoff_s", backoff_s)
    if isinstance(exits, str) or not all(isinstance(e, str) and EXIT_NAME.fullmatch(e) for e in exits):
        raise InvalidInput(f"compute node {id}: exits must be a list of exit names")
    spec: dict[str, Json] = {"retries": retries, "backoffS": backoff_s, "exits": list(exits)}
    _deadline(spec, timeout_s)
    return Node(_node_id(id), "compute", spec, fn=fn)


def shell(
    id: str,
    command: Sequence[str] | Callable[..., Sequence[str]],
    *,
    stdin: str | Callable[..., Json] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    env_from: Sequence[str] = (),
    timeout_s: float = 300,
    max_output: int = 65536,
    retries: int = 0,
    backoff_s: float = 1.0,
) -> Node:
    """Run a command (no shell): exit ``ok`` on status 0, ``error`` otherwise; output is captured
    up to ``max_output`` bytes per stream.

    ``command`` is the program and its arguments, or a function of the step's context that
    returns them (to pass earlier outputs as arguments). ``stdin`` is text for the command's
    standard input, or a function of the context returning text or JSON (sent JSON-encoded).

    The command inherits its worker's environment. ``env_from`` names the variables it needs
    (``["API_TOKEN"]``): their values are read from the worker's environment when the step runs
    and never stored; only the names are part of the definition. A step whose worker lacks one
    fails at once, without retries. Inline values (``env={...}``) are refused: the definition is
    stored in the database."""
    hooks: dict[str, Callable[..., Any]] = {}
    if callable(command):
        hooks["command"] = command
    elif isinstance(command, str) or not command or not all(isinstance(part, str) for part in command):
        raise InvalidInput(
            f"shell node {id}: command must be a non-empty list of strings (the program and its "
            "arguments), or a function of the context returning one"
        )
    if callable(stdin):
        hooks["stdin"] = stdin
    elif stdin is not None and not isinstance(stdin, str):
        raise InvalidInput(f"shell node {id}: stdin must be text or a function of the context")
    _positive("timeout_s", timeout_s)
    if (
        isinstance(max_output, bool)
        or not isinstance(max_output, int)
        or not 0 < max_output <= 16 * 1024 * 1024
    ):
        raise InvalidInput("max_output must be a whole number of bytes from 1 to 16 MiB")
    if env:
        raise InvalidInput(
            f"shell node {id}: env values would be stored in the database with the workflow's "
            "definition; set the variables in the worker's environment and name them with "
            f"env_from={sorted(map(str, env))!r}"
        )
    names = _env_names(id, env_from)
    _retries(retries)
    _positive("backoff_s", backoff_s)
    spec: dict[str, Json] = {
        "command": None if callable(command) else list(command),
        "cwd": cwd,
        # Always empty (inline values are refused); kept so existing shell nodes' digests stay.
        "env": {},
        # Only when named, for the same reason.
        **({"envFrom": names} if names else {}),
        "timeoutS": timeout_s,
        "maxOutput": max_output,
        "retries": retries,
        "backoffS": backoff_s,
        # Only when given, so the digest of a shell node without one stays what it was.
        **({"stdin": stdin} if isinstance(stdin, str) else {}),
    }
    return Node(_node_id(id), "shell", spec, hooks=hooks)


def _env_names(id: str, names: Sequence[str]) -> list[str]:
    if isinstance(names, str) or not all(isinstance(n, str) and ENV_NAME.fullmatch(n) for n in names):
        raise InvalidInput(
            f"shell node {id}: env_from must be a list of environment variable names "
            "(letters, digits and _, not starting with a digit)"
        )
    return sorted(set(names))


def effect(
    id: str, fn: Callable[..., Json], *, effect_type: str | None = None, timeout_s: float | None = None
) -> Node:
    """A side effect through the outbox: ``fn(ctx, idempotency_key)`` is called at most once per
    attempt, recorded ``pending`` before and ``applying`` while it runs. An effect caught mid-apply
    by a crash, a cancel or its ``timeout_s`` deadline is ``ambiguous`` and waits for an operator
    (it may have happened: it is never retried by itself)."""
    spec: dict[str, Json] = {"effectType": effect_type or f"workflow.{id}"}
    _deadline(spec, timeout_s)
    return Node(_node_id(id), "effect", spec, fn=fn)


def decision(
    id: str,
    question: str | Callable[..., str],
    *,
    options: Sequence[str] | None = None,
    schema: Mapping[str, Json] | type | None = None,
    deadline_s: float | None = None,
    default: Json = None,
) -> Node:
    """Ask a person. With ``options`` the answer is one of them and becomes the exit name; with a
    ``schema`` the answer is validated JSON (exit ``ok``). After ``deadline_s`` the ``default``
    applies (provenance ``timeout_policy``), or the run times out without one. ``question`` may
    be a function of the step's context (to show earlier outputs to the person)."""
    if not callable(question) and (not isinstance(question, str) or not question):
        raise InvalidInput(f"decision node {id}: question must be a non-empty string or a function")
    if (options is None) == (schema is None):
        raise InvalidInput("give a decision either options or a schema")
    if options is not None and (not options or not all(EXIT_NAME.fullmatch(o) for o in options)):
        raise InvalidInput("options must be exit names (a letter, then letters, digits, _ or -)")
    if schema is not None:
        schema = schema_of(schema)
        check_schema(schema)
    _positive("deadline_s", deadline_s)
    if default is not None and options is not None and default not in options:
        raise InvalidInput("the default must be one of the options")
    canonical_json(default)
    _default_matches(default, schema)
    spec: dict[str, Json] = {
        "question": None if callable(question) else question,
        "options": list(options) if options is not None else None,
        "schema": dict(schema) if schema is not None else None,
        "deadlineS": deadline_s,
        "default": default,
    }
    return Node(_node_id(id), "decision", spec, hooks={"question": question} if callable(question) else {})


def input(
    id: str,
    prompt: str | Callable[..., str],
    *,
    schema: Mapping[str, Json] | type | None = None,
    timeout_s: float | None = None,
    default: Json = None,
) -> Node:
    """Ask the run's origin session for a structured answer. The deadline counts active time only:
    a paused run never times out. On expiry the ``default`` applies, or the node fails.
    ``prompt`` may be a function of the step's context."""
    if not callable(prompt) and (not isinstance(prompt, str) or not prompt):
        raise InvalidInput(f"input node {id}: prompt must be a non-empty string or a function")
    if schema is not None:
        schema = schema_of(schema)
        check_schema(schema)
    _positive("timeout_s", timeout_s)
    canonical_json(default)
    _default_matches(default, schema)
    spec: dict[str, Json] = {
        "prompt": None if callable(prompt) else prompt,
        "schema": dict(schema) if schema is not None else None,
        "timeoutS": timeout_s,
        "default": default,
    }
    return Node(_node_id(id), "input", spec, hooks={"prompt": prompt} if callable(prompt) else {})


def agent(
    id: str,
    provider: Any,
    prompt: Callable[..., str] | str,
    *,
    schema: Mapping[str, Json] | type,
    retries: int = 0,
    timeout_s: float | None = AGENT_TIMEOUT_S,
    tools: Sequence[Any] = (),
    max_turns: int | None = None,
    max_invalid: int = 0,
    max_tokens: int | None = None,
) -> Node:
    """A model call through ``provider.complete(prompt, schema)`` whose output must match ``schema``
    (a JSON Schema object or a pydantic model class). A call still running after ``timeout_s``
    seconds (600 unless given; None: no deadline) is abandoned like a compute node's.

    With ``tools`` (functions or ``Tool`` objects), or any of the budgets, the step is a
    conversation through ``provider.turn(messages, tools, schema)``: the model calls tools and
    sees their results until it gives a final answer matching ``schema``; an invalid answer is
    sent back with its errors up to ``max_invalid`` times. ``max_turns`` (default
    ``DEFAULT_MAX_TURNS``) bounds the model's responses, ``max_tokens`` the tokens they used
    (when the provider reports usage); past a budget the step fails. Each message is recorded
    as it comes: a step taken over goes on from the last one (see ``docs/agents.md``)."""
    schema = schema_of(schema)
    check_schema(schema)
    _retries(retries)
    fn = prompt if callable(prompt) else None
    spec: dict[str, Json] = {
        "prompt": prompt if isinstance(prompt, str) else None,
        "schema": dict(schema),
        "provider": type(provider).__name__,
        "retries": retries,
        "backoffS": 1.0,
    }
    _deadline(spec, timeout_s, AGENT_TIMEOUT_S)
    found: list[Any] = []
    if tools or max_turns is not None or max_invalid or max_tokens is not None:
        # Only for a conversation, so the digest of a single-call agent stays what it was.
        found = tools_of(tools)
        for name, value, least in (("max_turns", max_turns, 1), ("max_invalid", max_invalid, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise InvalidInput(f"agent node {id}: {name} must be a whole number of at least {least}")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise InvalidInput(f"agent node {id}: max_tokens must be a whole number of at least 1")
        if not takes_turns(provider):
            raise InvalidInput(
                f"agent node {id}: provider {type(provider).__name__} cannot call tools or take turns "
                "(it has no turn() method)"
            )
        spec["conversation"] = {
            "tools": [{**t.describe(), "function": _callable_name(t.fn)} for t in found],
            "maxTurns": DEFAULT_MAX_TURNS if max_turns is None else max_turns,
            "maxInvalid": max_invalid,
            "maxTokens": max_tokens,
        }
    return Node(_node_id(id), "agent", spec, fn=fn, provider=provider, tools=tuple(found))


def notify(id: str, message: Callable[..., Json] | str, *, timeout_s: float | None = None) -> Node:
    """Send a message to the run's origin session. A workflow with a notify node needs one:
    ``Tether.start`` refuses to start it headless (without a ``session_id``). A message function
    still running after ``timeout_s`` seconds is abandoned and the node fails."""
    spec: dict[str, Json] = {} if callable(message) else {"text": message}
    _deadline(spec, timeout_s)
    return Node(_node_id(id), "notify", spec, fn=message if callable(message) else None)


def sleep(id: str, seconds: float) -> Node:
    """Wait durably: the run parks and no runner claims it before the time comes."""
    _positive("seconds", seconds)
    return Node(_node_id(id), "sleep", {"seconds": seconds})


def wait_for_event(
    id: str,
    name: str,
    *,
    timeout_s: float | None = None,
    schema: Mapping[str, Json] | type | None = None,
) -> Node:
    """Wait durably for an event of that ``name`` sent into the run (``Tether.send_event``,
    ``tether event send``): the node's output is ``{"name", "payload", "sentAt", "sentBy"}``.
    An event sent before the run gets here is kept and taken when it does; each event is taken
    once. A payload breaking ``schema`` is refused when sent. With ``timeout_s`` the node leaves
    by its ``timeout`` exit (output ``{"name", "timedOut": true}``) when no event came in time."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidInput("the event name must be a non-empty string of at most 200 characters")
    if schema is not None:
        schema = schema_of(schema)
        check_schema(schema)
    _positive("timeout_s", timeout_s)
    spec: dict[str, Json] = {
        "name": name,
        "timeoutS": timeout_s,
        "schema": dict(schema) if schema is not None else None,
    }
    return Node(_node_id(id), "event", spec)


def include(id: str, workflow: Workflow) -> Node:
    """Mount another workflow here; its terminal exits become this node's exits."""
    if not isinstance(workflow, Workflow):
        raise InvalidInput("include needs a Workflow")
    return Node(_node_id(id), "include", {"workflow": workflow.name}, workflow=workflow)


def fan_out(
    id: str,
    fn: Callable[..., Json],
    *,
    items: Callable[..., Sequence[Json]],
    parallelism: int = 16,
    retries: int = 0,
    backoff_s: float = 1.0,
    timeout_s: float | None = None,
    effect: bool = False,
    effect_type: str | None = None,
) -> Node:
    """Call ``fn(ctx, item)`` for every item of the list ``items(ctx)`` returns (computed from
    the run's input and earlier outputs), at most ``parallelism`` at once, on threads of the
    worker that holds the run. The node's output is the list of the calls' results, in the
    items' order.

    Each item is durable on its own: every try of item ``n`` is recorded as it ends, as an
    attempt of ``ID[n]``, so a worker that takes the run over after a crash runs only the items
    that have not completed, and never runs a completed item again. A failed item is retried
    ``retries`` times, ``backoff_s * 2**(n-1)`` seconds after try ``n`` (waited in the worker,
    which keeps the run). An item that fails after its retries fails the node: no other item
    starts, and the run fails, or leaves by the ``error`` exit when the workflow routes it
    (output ``{"outputs": [...], "errors": {"<index>": "<error>"}}``). ``fn`` may be
    ``async def``. A call still running ``timeout_s`` seconds after it began is abandoned (its
    ``ctx.cancelled`` set, what it returns dropped), its try recorded ``timed_out`` and retried
    like a failure; the run's own deadline applies to every call.

    With ``effect=True`` each item's call is an effect through the outbox, as an ``effect``
    node's: ``fn(ctx, item, idempotency_key)``, the key ``RUN:ID[n]:VISIT`` the same for every
    worker that calls it, recorded ``pending``, then ``applying`` while it runs, then
    ``applied`` (or ``rejected``) in the transaction that records the item. An item's effect is
    applied at most once: an item caught applying by a crash, a cancel or its ``timeout_s``
    deadline is ``ambiguous``, and the run waits for a person (``tether effects resolve``) once
    the items running ended; no item of a cancelled run begins its effect. An effect item is
    never retried (``retries`` must be 0); one rejected (``fn`` raised) fails the node as an
    item failing for good does. ``effect_type`` names the effects (default ``workflow.ID``)."""
    if not callable(fn):
        raise InvalidInput(f"fan_out node {id}: fn must be a function of the context and an item")
    if not callable(items):
        raise InvalidInput(
            f"fan_out node {id}: items must be a function of the context returning the list to map "
            "over (for example lambda ctx: ctx.outputs['list'])"
        )
    _parallelism(id, parallelism)
    _retries(retries)
    _positive("backoff_s", backoff_s)
    _positive("timeout_s", timeout_s)
    if not isinstance(effect, bool):
        raise InvalidInput(f"fan_out node {id}: effect must be True or False")
    if effect and retries:
        raise InvalidInput(
            f"fan_out node {id}: an effect item is never retried (it may have happened): retries must be 0"
        )
    if effect_type is not None and not effect:
        raise InvalidInput(f"fan_out node {id}: effect_type is for an effect fan-out (effect=True)")
    if effect_type is not None and (not isinstance(effect_type, str) or not effect_type):
        raise InvalidInput(f"fan_out node {id}: effect_type must be a non-empty string")
    spec: dict[str, Json] = {"parallelism": parallelism, "retries": retries, "backoffS": backoff_s}
    if timeout_s is not None:  # only when declared: a fan-out without one keeps its digest
        spec["timeoutS"] = timeout_s
    if effect:  # likewise
        spec["effectType"] = effect_type or f"workflow.{id}"
    return Node(_node_id(id), "fan_out", spec, fn=fn, hooks={"items": items})


def parallel(id: str, branches: Sequence[Node], *, join: str | int = "all") -> Node:
    """Run the branches (``compute`` nodes, each with its function and retries, or ``effect``
    nodes) at once, on
    threads of the worker that holds the run, and join them: ``join="all"`` waits for every
    branch; ``join=n`` (a whole number) completes the node as soon as ``n`` branches completed,
    and the others are told to stop (their ``ctx.cancelled`` is set) and their results are not
    recorded. The output maps each completed branch's id to its output. Each branch is durable
    on its own, as an item of a ``fan_out`` (attempts ``ID[branch]``). A branch that fails
    after its retries fails the node (or leaves by its ``error`` exit, when routed).

    An ``effect`` branch applies its effect through the outbox as an effect node does
    (``fn(ctx, idempotency_key)``, the key ``RUN:ID[branch]:VISIT``), at most once, and as an
    effect item of a ``fan_out`` does when caught applying (ambiguous: the run waits for a
    person) or rejected (the node fails). A node with effect branches joins them all: none is
    left running with its outcome unrecorded."""
    if isinstance(branches, Node) or not isinstance(branches, Sequence) or not branches:
        raise InvalidInput(
            f"parallel node {id}: branches must be a non-empty list of compute or effect nodes"
        )
    seen: set[str] = set()
    for branch in branches:
        if not isinstance(branch, Node) or branch.kind not in ("compute", "effect"):
            raise InvalidInput(f"parallel node {id}: each branch must be a compute or effect node")
        if branch.spec.get("exits"):
            raise InvalidInput(
                f"parallel node {id}: branch {branch.id} declares exits; a branch's output is its value"
            )
        if branch.id in seen:
            raise InvalidInput(f"parallel node {id} has two branches named {branch.id}")
        seen.add(branch.id)
    count = len(branches)
    if join != "all" and (isinstance(join, bool) or not isinstance(join, int) or not 1 <= join <= count):
        raise InvalidInput(
            f'parallel node {id}: join must be "all" or a whole number of branches from 1 to {count}'
        )
    if isinstance(join, int) and join < count and any(branch.kind == "effect" for branch in branches):
        raise InvalidInput(
            f'parallel node {id}: a node with effect branches joins them all (join="all"): '
            "an effect left running would have no recorded outcome"
        )
    if count > MAX_PARALLELISM:
        raise InvalidInput(f"parallel node {id}: at most {MAX_PARALLELISM} branches (it has {count})")
    spec: dict[str, Json] = {
        "join": count if join == "all" else join,
        "branches": [branch.snapshot() | {"id": branch.id} for branch in branches],
    }
    return Node(_node_id(id), "parallel", spec, branches=tuple(branches))


def _parallelism(id: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLELISM:
        raise InvalidInput(
            f"fan_out node {id}: parallelism must be a whole number from 1 to {MAX_PARALLELISM} "
            "(the most items called at once)"
        )
    return value


def item_node_id(node_id: str, key: str | int) -> str:
    """The node id an item of a fan-out (or a branch of a parallel) node records its tries
    under: ``fan[7]``, ``race[fast]``."""
    return f"{node_id}[{key}]"


def is_item(node_id: str) -> bool:
    """Whether an attempt's node id names an item of a fan-out or parallel node (such an
    attempt is not a step of the graph: its node's own attempt is)."""
    return node_id.endswith("]")


#: The kinds of node whose step can fail: after its last try, such a step leaves by its ``error``
#: exit when an edge routes it (else its run fails).
FAILING_KINDS = (
    "compute",
    "shell",
    "effect",
    "decision",
    "input",
    "agent",
    "notify",
    "fan_out",
    "parallel",
)


def child(
    id: str,
    workflow: Workflow,
    *,
    input: Json | Callable[..., Json] = None,
    wait: bool = True,
    key: str | Callable[..., str] | None = None,
) -> Node:
    """Start ``workflow`` as a run of its own, a child of this run (``tether show`` lists it;
    cancelling this run cancels a child it waits for). ``input`` is the child's input: JSON, or a
    function of the step's context returning it.

    The child's run id is this run's id, the node's id and ``key`` (text, or a function of the
    context returning text: to start several children from one node in a loop; the same context
    must give the same key): a retried step or a runner that died after the start adopts the
    child it started, never a second one.

    ``wait=True``: the run parks, releasing its worker, until the child finishes; the node's
    output is then the child's result (exit ``ok``). A child that failed, was cancelled or timed
    out leaves by exit ``error`` (output: the child's run id, status and error) when the
    workflow routes ``<id>.error``, and fails the node otherwise. ``wait=False``: the child is
    started detached and the node completes at once with ``{"child_run_id": ...}``."""
    if not isinstance(workflow, Workflow):
        raise InvalidInput(f"child node {id}: workflow must be a Workflow")
    if not isinstance(wait, bool):
        raise InvalidInput(f"child node {id}: wait must be True or False")
    hooks: dict[str, Callable[..., Any]] = {}
    if callable(input):
        hooks["input"] = input
    else:
        canonical_json(input)
    if callable(key):
        hooks["key"] = key
    elif key is not None and (not isinstance(key, str) or CHILD_KEY.fullmatch(key) is None):
        raise InvalidInput(
            f"child node {id}: key must be a letter or digit, then letters, digits, _ or - (64 at most), "
            "or a function of the context"
        )
    spec: dict[str, Json] = {
        "workflow": workflow.name,
        "wait": wait,
        "input": None if callable(input) else input,
        "key": key if isinstance(key, str) else None,
    }
    return Node(_node_id(id), "child", spec, workflow=workflow, hooks=hooks)


def node_exits(node: Node) -> set[str]:
    """The exits a node can leave by: a compute node by ``ok`` and its declared ``exits``; a
    decision with options by one of them; an include node by its workflow's terminal exits; an
    event wait with a timeout by ``ok`` or ``timeout``; every other node by ``ok``. A step that
    can fail (``FAILING_KINDS``; a shell command's non-zero status too) can also leave by
    ``error``, and one with a deadline (see ``step_timeout_s``; not an effect, whose late outcome
    is unknown) by ``timeout``, when an edge routes them."""
    exits = _exits(node)
    # A decision fails only when its question is a function that fails; a child node by its
    # child's failure, which only a child node that waits sees.
    if node.kind in FAILING_KINDS and (node.kind != "decision" or "question" in node.hooks):
        exits.add("error")
    if node.kind == "child" and node.spec.get("wait"):
        exits.add("error")
    if node.kind == "shell" or (
        node.kind in ("compute", "agent", "notify") and step_timeout_s(node) is not None
    ):
        exits.add("timeout")
    return exits


def _exits(node: Node) -> set[str]:
    if node.kind == "compute":
        return {"ok", *node.spec.get("exits", [])}
    if node.kind == "decision" and node.spec.get("options"):
        return set(node.spec["options"])
    if node.kind == "include" and node.workflow is not None:
        return node.workflow.terminal_exits()
    if node.kind == "event" and node.spec.get("timeoutS") is not None:
        return {"ok", "timeout"}
    return {"ok"}


def _output_spec(
    name: str, output: str | Mapping[str, str] | None, nodes: Mapping[str, Node]
) -> str | dict[str, str] | None:
    if output is None:
        return None
    targets: list[Any] = []
    if isinstance(output, str):
        targets = [output]
    elif isinstance(output, Mapping):
        targets = list(output.values())
    if not targets or not all(isinstance(t, str) for t in targets):
        raise InvalidInput(f"Workflow {name}: output names a node, or maps result keys to node ids")
    for target in targets:
        if target not in nodes:
            raise InvalidInput(f"Workflow {name}: output names unknown node {target}")
    return output if isinstance(output, str) else {str(k): v for k, v in output.items()}


@dataclass(frozen=True)
class Exit:
    """A compute function's chosen exit and output."""

    name: str
    output: Json = None


class Workflow:
    """A named graph. ``edges`` maps ``"node"`` or ``"node.exit"`` to the next node id.

    The graph is checked when built: every node is reachable from ``start``, and every edge
    leaves by an exit its node can produce (see ``node_exits``). ``output`` names the node whose
    output is the run's result, or maps result keys to node ids; without it the run's result is
    the output of the node that ran last. ``input_schema`` (a JSON Schema object or a pydantic
    model class) is what a run's input must match: a start with another input is refused before
    anything is written (see ``check_input``). ``timeout_s`` bounds the whole run, counted on the
    store's clock from when it was started: once it passed, the run ends ``timed_out`` wherever
    it stands (a running step is abandoned, a decision or input waiting for a person closed). An
    included workflow's own ``timeout_s`` does not apply: the including run's does. ``max_steps``
    bounds the steps a run completes (a cycle that never ends fails with ``stepLimit``).
    ``concurrency``: a ``Limit`` on how many of its runs
    execute at once (in all, or per key of the input)."""

    def __init__(
        self,
        name: str,
        *,
        start: str,
        nodes: Sequence[Node],
        edges: Mapping[str, str] | None = None,
        description: str = "",
        revision: str = "1",
        output: str | Mapping[str, str] | None = None,
        input_schema: Mapping[str, Json] | type | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        timeout_s: float | None = None,
        concurrency: Limit | None = None,
        schedules: Sequence[Schedule] = (),
    ) -> None:
        if not isinstance(name, str) or NODE_ID.fullmatch(name) is None:
            raise InvalidInput(f"Invalid workflow name {name!r}: use a letter, then letters, digits, _ or -")
        self.name = name
        #: The module that built this workflow (a folder loads from each file only the
        #: workflows built in it, not those it imports from a sibling).
        self.defined_in: str | None = sys._getframe(1).f_globals.get("__name__")
        self.description = description
        self.revision = revision
        self.edges: dict[str, str] = dict(edges or {})
        self.nodes: dict[str, Node] = {}
        self.mounts: list[dict[str, Json]] = []
        for node in nodes:
            if node.id in self.nodes:
                raise InvalidInput(f"Workflow {name} has two nodes named {node.id}")
            self.nodes[node.id] = node
        if not isinstance(start, str) or not start:
            raise InvalidInput(f"Workflow {name} needs a start node")
        if start not in self.nodes:
            known = ", ".join(self.nodes) or "none"
            raise InvalidInput(f"Workflow {name} starts at unknown node {start} (nodes: {known})")
        self.start = start
        for key, target in self.edges.items():
            if not isinstance(key, str) or not isinstance(target, str):
                raise InvalidInput(f"Workflow {name}: edges map 'node' or 'node.exit' to a node id")
            source, dot, exit_name = key.partition(".")
            if source not in self.nodes:
                raise InvalidInput(f"Workflow {name} has an edge from unknown node {source}")
            if target not in self.nodes:
                raise InvalidInput(f"Workflow {name} has an edge to unknown node {target}")
            if dot:
                exits = node_exits(self.nodes[source])
                if exit_name not in exits:
                    raise InvalidInput(
                        f"Workflow {name} has an edge {key!r} on an exit node {source} cannot produce: "
                        f"{exit_name!r} (its exits: {', '.join(sorted(exits))})"
                    )
        unreachable = [node_id for node_id in self.nodes if node_id not in self._reachable()]
        if unreachable:
            raise InvalidInput(
                f"Workflow {name} has nodes no edge from {start} reaches: {', '.join(unreachable)}"
            )
        self.output = _output_spec(name, output, self.nodes)
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise InvalidInput(f"Workflow {name}: max_steps must be a whole number of at least 1")
        #: The most steps a run may complete: a graph with a cycle stops, failed, at this bound
        #: instead of running without end.
        self.max_steps = max_steps
        #: The pydantic model class the input schema was given as (None for a JSON Schema).
        self.input_model: type | None = None if input_schema is None else model_of(input_schema)
        #: The JSON Schema a run's input must match (``check_input``), when declared.
        self.input_schema: dict[str, Json] | None = None
        if input_schema is not None:
            self.input_schema = schema_of(input_schema)
            check_schema(self.input_schema)
        _positive("timeout_s", timeout_s)
        #: The run's deadline in seconds from its start (None: it has none).
        self.timeout_s: float | None = timeout_s
        if concurrency is not None and not isinstance(concurrency, Limit):
            raise InvalidInput(f"Workflow {name}: concurrency must be a Limit (tether.Limit)")
        #: How many runs may execute at once (see ``tether.engine.limits``).
        self.concurrency = concurrency
        self._flatten()
        #: Cron schedules that start runs of this workflow (not part of its definition digest;
        #: see tether.engine.schedules).
        self.schedules = check_declared(name, schedules)
        for index, schedule in enumerate(self.schedules):
            try:
                self.check_input(schedule.input)
            except InvalidInput as error:
                label = schedule.name if schedule.name is not None else index
                raise InvalidInput(f"Workflow {name}: schedule {label}: {error}") from None
        if self.schedules and self.needs_session:
            raise InvalidInput(
                f"Workflow {name} declares schedules but talks to its run's session (nodes "
                f"{', '.join(self.needs_session)}): a scheduled run has no session"
            )

    def check_input(self, value: Json) -> Json:
        """The input to store for a run of this workflow: ``value`` checked against
        ``input_schema`` (``InvalidInput`` naming each wrong field); with a pydantic model, the
        model's validated ``model_dump(mode="json")``, so steps get JSON with the model's
        defaults filled in. Without a schema, ``value`` as it is."""
        if self.input_schema is None:
            return value
        checked, problems = conform(value, self.input_schema, self.input_model)
        if problems:
            given = " (no input was given)" if value is None else ""
            raise InvalidInput(
                f"Input of workflow {self.name} does not match its input schema{given}: "
                + "; ".join(problems[:10])
            )
        return checked

    def _reachable(self) -> set[str]:
        seen = {self.start}
        todo = [self.start]
        while todo:
            current = todo.pop()
            for key, target in self.edges.items():
                if key.partition(".")[0] == current and target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    @property
    def needs_session(self) -> list[str]:
        """The nodes that talk to the run's origin session (input and notify nodes, included
        workflows' too): a run of this workflow must be started with a session."""
        return [node_id for node_id, node in self.nodes.items() if node.kind in ("input", "notify")]

    def terminal_exits(self) -> set[str]:
        """The exits by which a run of this workflow can end: the exits of its nodes that no
        edge routes (an including node's exits)."""
        found: set[str] = set()
        for node_id, node in self.nodes.items():
            if "/" in node_id or node_id in self.edges:
                continue
            # An unrouted timeout is a failure (retried, or the run fails), never a way out.
            for exit_name in node_exits(node) - {"timeout"}:
                if f"{node_id}.{exit_name}" not in self.edges:
                    found.add(exit_name)
        return found

    def result_of(self, outputs: Mapping[str, Json], last: Json) -> Json:
        """The run's declared result from its nodes' outputs (``last``: the last node's output)."""
        if self.output is None:
            return last
        if isinstance(self.output, str):
            return outputs.get(self.output)
        return {key: outputs.get(node_id) for key, node_id in self.output.items()}

    def _flatten(self) -> None:
        """Expand include nodes into ``<include>/<node>`` nodes with their routes."""
        for node in list(self.nodes.values()):
            if node.kind != "include" or node.workflow is None:
                continue
            child = node.workflow
            # The child's revision too: bumping it changes the including definition's digest.
            self.mounts.append(
                {"mountPath": [node.id], "workflowName": child.name, "revision": child.revision}
            )
            for mount in child.mounts:
                self.mounts.append({**mount, "mountPath": [node.id, *mount["mountPath"]]})
            # Keys, not node ids: a child's own mounted nodes are keyed by their full path.
            for child_id, child_node in child.nodes.items():
                self.nodes[f"{node.id}/{child_id}"] = child_node
            for key, target in child.edges.items():
                self.edges[f"{node.id}/{key}"] = f"{node.id}/{target}"
            self.edges[f"{node.id}.__enter__"] = f"{node.id}/{child.start}"

    def route(self, node_id: str, exit_name: str) -> str | None:
        """The node after ``node_id`` left by ``exit_name``, or None when the run (or the
        included sub-graph) ends there."""
        target = self.edges.get(f"{node_id}.{exit_name}") or self.edges.get(node_id)
        if target is not None:
            return target
        if "/" in node_id:
            mount = node_id.rsplit("/", 1)[0]
            return self.route(mount, exit_name)
        return None

    def entry(self, node_id: str) -> str:
        """Where execution enters a node: an include node enters its sub-graph's start."""
        node = self.nodes[node_id]
        if node.kind == "include":
            return self.entry(self.edges[f"{node_id}.__enter__"])
        return node_id

    def snapshot(self) -> dict[str, Json]:
        """The canonical definition: what the digest covers."""
        return {
            "name": self.name,
            "revision": self.revision,
            "start": self.start,
            "nodes": {node_id: node.snapshot() for node_id, node in self.nodes.items()},
            "edges": dict(sorted(self.edges.items())),
            "composition": {"mounts": self.mounts},
            # Only when declared, so the digest of a workflow without one stays what it was.
            **({"output": self.output} if self.output is not None else {}),
            **({"inputSchema": self.input_schema} if self.input_schema is not None else {}),
            # The model's code too: its own validators check the input beside the schema.
            **({"inputModel": _callable_name(self.input_model)} if self.input_model is not None else {}),
            **({"maxSteps": self.max_steps} if self.max_steps != DEFAULT_MAX_STEPS else {}),
            **({"timeoutS": self.timeout_s} if self.timeout_s is not None else {}),
            **({"concurrency": self.concurrency.snapshot(_callable_name)} if self.concurrency else {}),
        }

    @functools.cached_property
    def digest(self) -> str:
        """The definition's digest, computed once: a workflow is not changed once built (a
        runner compares it with every run's it takes up)."""
        return definition_digest(self.snapshot())

    def mermaid(self) -> str:
        """The graph as a Mermaid flowchart; included workflows are subgraphs."""
        lines = ["flowchart TD", f"    start((start)) --> {self._mermaid_id(self.entry(self.start))}"]
        for node_id, node in self.nodes.items():
            if "/" in node_id:
                continue
            lines.extend(self._mermaid_node(node_id, node, "    "))
        for key, target in sorted(self.edges.items()):
            source, _, exit_name = key.partition(".")
            if exit_name == "__enter__":
                continue
            label = f"|{exit_name}|" if exit_name else ""
            lines.append(f"    {self._mermaid_id(source)} -->{label} {self._mermaid_id(target)}")
        return "\n".join(lines)

    def _mermaid_node(self, node_id: str, node: Node, indent: str) -> list[str]:
        if node.kind != "include":
            return [f'{indent}{self._mermaid_id(node_id)}["{node_id} ({node.kind})"]']
        lines = [
            f'{indent}subgraph {self._mermaid_id(node_id)} ["{node_id} (include {node.spec["workflow"]})"]'
        ]
        for child_id, child in self.nodes.items():
            if "/" in child_id and child_id.rsplit("/", 1)[0] == node_id:
                lines.extend(self._mermaid_node(child_id, child, indent + "    "))
        return [*lines, f"{indent}end"]

    def text(self) -> str:
        """The graph as indented text: each node with its routes (``*`` is any exit)."""
        lines = [f"{self.name} (start: {self.start})"]
        for node_id, node in self.nodes.items():
            routes = [
                f"{k.partition('.')[2] or '*'} -> {v}"
                for k, v in sorted(self.edges.items())
                if k.partition(".")[0] == node_id and not k.endswith("__enter__")
            ]
            kind = f"{node.kind} {node.spec['workflow']}" if node.kind in ("include", "child") else node.kind
            depth = "  " * (node_id.count("/") + 1)
            lines.append(f"{depth}{node_id} [{kind}]" + (f": {', '.join(routes)}" if routes else ": end"))
        return "\n".join(lines)

    @staticmethod
    def _mermaid_id(node_id: str) -> str:
        return node_id.replace("/", "__").replace("-", "_")

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, {len(self.nodes)} nodes)"
