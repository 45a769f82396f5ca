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

from tether.engine.schema import check_schema, conform, model_of, schema_of
from tether.engine.schema import errors as schema_errors
from tether.errors import InvalidInput
from tether.values import Json, canonical_json, definition_digest

NODE_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
EXIT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
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
    "child",
)
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
    #: An include node's workflow.
    workflow: Workflow | None = None
    #: Parts of the spec given as functions of the step's context, by spec key (a shell
    #: command, a question or prompt built from earlier outputs): called when the step runs.
    hooks: Mapping[str, Callable[..., Any]] = field(default_factory=dict)

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


def _default_matches(default: Json, schema: Mapping[str, Json] | None) -> None:
    if default is not None and schema is not None:
        problems = schema_errors(default, dict(schema))
        if problems:
            raise InvalidInput("the default does not match the schema: " + "; ".join(problems))


def compute(
    id: str, fn: Callable[..., Json], *, retries: int = 0, backoff_s: float = 1.0, exits: Sequence[str] = ()
) -> Node:
    """Run ``fn(ctx)``; it returns JSON, or ``Exit(name, output)`` to choose an exit (default ``ok``).

    A raised exception fails the attempt; it is retried ``retries`` times, waiting
    ``backoff_s * 2**(n-1)`` seconds durably before try ``n + 1``. An ``async def`` function
    runs on its worker's event loop (so may ``effect``, ``notify`` and ``agent`` functions)."""
    _retries(retries)
    _positive("backoff_s", backoff_s)
    if isinstance(exits, str) or not all(isinstance(e, str) and EXIT_NAME.fullmatch(e) for e in exits):
        raise InvalidInput(f"compute node {id}: exits must be a list of exit names")
    return Node(
        _node_id(id), "compute", {"retries": retries, "backoffS": backoff_s, "exits": list(exits)}, fn=fn
    )


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


def effect(id: str, fn: Callable[..., Json], *, effect_type: str | None = None) -> Node:
    """A side effect through the outbox: ``fn(ctx, idempotency_key)`` is called at most once per
    attempt, recorded ``pending`` before and ``applying`` while it runs. An effect caught mid-apply
    by a crash or a cancel is ``ambiguous`` and waits for an operator."""
    return Node(_node_id(id), "effect", {"effectType": effect_type or f"workflow.{id}"}, fn=fn)


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
) -> Node:
    """A model call through ``provider.complete(prompt, schema)`` whose output must match ``schema``
    (a JSON Schema object or a pydantic model class)."""
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
    return Node(_node_id(id), "agent", spec, fn=fn, provider=provider)


def notify(id: str, message: Callable[..., Json] | str) -> Node:
    """Send a message to the run's origin session. A workflow with a notify node needs one:
    ``Tether.start`` refuses to start it headless (without a ``session_id``)."""
    if callable(message):
        return Node(_node_id(id), "notify", {}, fn=message)
    return Node(_node_id(id), "notify", {"text": message})


def sleep(id: str, seconds: float) -> Node:
    """Wait durably: the run parks and no runner claims it before the time comes."""
    _positive("seconds", seconds)
    return Node(_node_id(id), "sleep", {"seconds": seconds})


def include(id: str, workflow: Workflow) -> Node:
    """Mount another workflow here; its terminal exits become this node's exits."""
    if not isinstance(workflow, Workflow):
        raise InvalidInput("include needs a Workflow")
    return Node(_node_id(id), "include", {"workflow": workflow.name}, workflow=workflow)


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
    shell node or a child node that waits by ``ok`` or ``error``; a decision with options by one
    of them; an include node by its workflow's terminal exits; every other node by ``ok``."""
    if node.kind == "compute":
        return {"ok", *node.spec.get("exits", [])}
    if node.kind == "shell" or (node.kind == "child" and node.spec.get("wait")):
        return {"ok", "error"}
    if node.kind == "decision" and node.spec.get("options"):
        return set(node.spec["options"])
    if node.kind == "include" and node.workflow is not None:
        return node.workflow.terminal_exits()
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
    anything is written (see ``check_input``)."""

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
        #: The pydantic model class the input schema was given as (None for a JSON Schema).
        self.input_model: type | None = None if input_schema is None else model_of(input_schema)
        #: The JSON Schema a run's input must match (``check_input``), when declared.
        self.input_schema: dict[str, Json] | None = None
        if input_schema is not None:
            self.input_schema = schema_of(input_schema)
            check_schema(self.input_schema)
        self._flatten()

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
            for exit_name in node_exits(node):
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
