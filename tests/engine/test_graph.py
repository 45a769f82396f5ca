"""Workflow graphs: validation errors, routing on ``node`` and ``node.exit``, include flattening,
mounts in the snapshot and on the run, and the definition digest."""

from __future__ import annotations

import ast
import hashlib
import inspect

import pytest

from tether.engine.graph import (
    Workflow,
    agent,
    compute,
    decision,
    effect,
    include,
    input,
    notify,
    shell,
    sleep,
)
from tether.engine.providers import ScriptedProvider
from tether.engine.registry import Registry
from tether.errors import InvalidInput, TetherError

from .conftest import Engine


def step(ctx):  # type: ignore[no-untyped-def]
    return {"node": ctx.node_id}


def other_step(ctx):  # type: ignore[no-untyped-def]
    return {"other": True}


def linear(name: str = "linear", **kwargs) -> Workflow:  # type: ignore[no-untyped-def]
    return Workflow(
        name,
        start="a",
        nodes=[compute("a", step), compute("b", step)],
        edges={"a": "b"},
        **kwargs,
    )


# -- validation ------------------------------------------------------------------------------
def test_workflow__unknown_start_is_refused() -> None:
    with pytest.raises(InvalidInput, match="starts at unknown node nowhere"):
        Workflow("w", start="nowhere", nodes=[compute("a", step)])


def test_workflow__edge_to_unknown_node_is_refused() -> None:
    with pytest.raises(InvalidInput, match="edge to unknown node ghost"):
        Workflow("w", start="a", nodes=[compute("a", step)], edges={"a.ok": "ghost"})


def test_workflow__edge_from_unknown_node_is_refused() -> None:
    with pytest.raises(InvalidInput, match="edge from unknown node ghost"):
        Workflow("w", start="a", nodes=[compute("a", step)], edges={"ghost.ok": "a"})


def test_workflow__duplicate_node_is_refused() -> None:
    with pytest.raises(InvalidInput, match="two nodes named a"):
        Workflow("w", start="a", nodes=[compute("a", step), compute("a", other_step)])


@pytest.mark.parametrize("bad", ["", "1abc", "a.b", "a/b", "has space", "x" * 65, "é"])
def test_node__bad_id_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="Invalid node id"):
        compute(bad, step)


@pytest.mark.parametrize("bad", ["", "9lives", "dotted.name", "a/b"])
def test_workflow__bad_name_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="Invalid workflow name"):
        Workflow(bad, start="a", nodes=[compute("a", step)])


def test_errors__are_tether_errors_with_a_code() -> None:
    with pytest.raises(TetherError) as caught:
        Workflow("w", start="zz", nodes=[compute("a", step)])
    assert caught.value.code == "invalid_input"
    assert "zz" in caught.value.message


def test_decision__needs_options_xor_schema() -> None:
    with pytest.raises(InvalidInput, match="either options or a schema"):
        decision("d", "Which?")
    with pytest.raises(InvalidInput, match="either options or a schema"):
        decision("d", "Which?", options=["a"], schema={"type": "string"})
    assert decision("d", "Which?", options=["a", "b"]).spec["options"] == ["a", "b"]
    assert decision("d", "Which?", schema={"type": "string"}).spec["schema"] == {"type": "string"}


def test_decision__options_must_be_exit_names_and_default_one_of_them() -> None:
    with pytest.raises(InvalidInput, match="options must be exit names"):
        decision("d", "Which?", options=["not valid"])
    with pytest.raises(InvalidInput, match="options must be exit names"):
        decision("d", "Which?", options=[])
    with pytest.raises(InvalidInput, match="default must be one of the options"):
        decision("d", "Which?", options=["yes", "no"], default="maybe")


def test_decision__deadline_must_be_positive() -> None:
    with pytest.raises(InvalidInput, match="deadline_s must be a positive number"):
        decision("d", "Which?", options=["yes"], deadline_s=0)


def test_schema__unknown_keywords_and_invalid_schemas_are_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown keywords: minLenght"):
        decision("d", "Name?", schema={"type": "string", "minLenght": 2})
    with pytest.raises(InvalidInput, match=r"Schema at \$\.name uses unknown keywords: fromat"):
        input("i", "Name?", schema={"type": "object", "properties": {"name": {"fromat": "email"}}})
    with pytest.raises(InvalidInput, match=r"Schema at \$\.items\.type is not valid JSON Schema"):
        agent("m", ScriptedProvider([]), "hi", schema={"type": "array", "items": {"type": "text"}})
    # The whole draft is there: patterns and formats are checked.
    node = decision("d", "Email?", schema={"type": "string", "pattern": "^a", "format": "email"})
    assert node.spec["schema"] == {"type": "string", "pattern": "^a", "format": "email"}


def test_node_builders__refuse_bad_parameters() -> None:
    with pytest.raises(InvalidInput, match="retries must be a whole number"):
        compute("c", step, retries=-1)
    with pytest.raises(InvalidInput, match="backoff_s must be a positive number"):
        compute("c", step, backoff_s=0)
    with pytest.raises(InvalidInput, match="command must be a non-empty list"):
        shell("s", [])
    with pytest.raises(InvalidInput, match="timeout_s must be a positive number"):
        shell("s", ["true"], timeout_s=-1)
    with pytest.raises(InvalidInput, match="max_output must be a whole number"):
        shell("s", ["true"], max_output=0)
    with pytest.raises(InvalidInput, match="seconds must be a positive number"):
        sleep("z", 0)
    with pytest.raises(InvalidInput, match="prompt must be a non-empty string"):
        input("i", "")
    with pytest.raises(InvalidInput, match="include needs a Workflow"):
        include("inc", "not-a-workflow")  # type: ignore[arg-type]


# -- routing ---------------------------------------------------------------------------------
def test_route__exit_edge_wins_over_node_edge() -> None:
    wf = Workflow(
        "router",
        start="a",
        nodes=[compute("a", step, exits=["yes"]), compute("yes", step), compute("other", step)],
        edges={"a.yes": "yes", "a": "other"},
    )
    assert wf.route("a", "yes") == "yes"
    assert wf.route("a", "no") == "other"
    assert wf.route("a", "ok") == "other"
    assert wf.route("yes", "ok") is None


def test_route__no_edge_ends_the_run() -> None:
    wf = Workflow("w", start="a", nodes=[compute("a", step), compute("b", step)], edges={"a.ok": "b"})
    assert wf.route("a", "ok") == "b"
    assert wf.route("a", "error") is None
    assert wf.route("b", "ok") is None


# -- include ---------------------------------------------------------------------------------
def _fetch() -> Workflow:
    return Workflow(
        "fetch",
        start="get",
        nodes=[compute("get", step), compute("check", step, exits=["empty"])],
        edges={"get": "check"},
    )


def test_include__flattens_the_sub_graph_under_the_mount() -> None:
    parent = Workflow(
        "parent",
        start="fetch",
        nodes=[include("fetch", _fetch()), compute("done", step), compute("empty", step)],
        edges={"fetch.ok": "done", "fetch.empty": "empty"},
    )
    assert {"fetch/get", "fetch/check"} <= set(parent.nodes)
    assert parent.entry("fetch") == "fetch/get"
    assert parent.entry("done") == "done"
    assert parent.route("fetch/get", "ok") == "fetch/check"
    # A terminal exit of the sub-graph becomes the include node's exit.
    assert parent.route("fetch/check", "ok") == "done"
    assert parent.route("fetch/check", "empty") == "empty"
    assert parent.route("fetch/check", "other") is None


def test_include__nested_mounts_are_recorded_in_the_snapshot() -> None:
    middle = Workflow(
        "middle", start="inner", nodes=[include("inner", _fetch()), compute("m", step)], edges={"inner": "m"}
    )
    outer = Workflow("outer", start="mid", nodes=[include("mid", middle)])
    assert outer.mounts == [
        {"mountPath": ["mid"], "workflowName": "middle", "revision": "1"},
        {"mountPath": ["mid", "inner"], "workflowName": "fetch", "revision": "1"},
    ]
    assert outer.snapshot()["composition"] == {"mounts": outer.mounts}
    assert outer.entry("mid") == "mid/inner/get"
    assert "mid/inner/check" in outer.snapshot()["nodes"]
    assert outer.route("mid/inner/check", "ok") == "mid/m"
    assert outer.route("mid/m", "ok") is None


def test_registry__source_lists_mounted_workflows() -> None:
    fetch = _fetch()
    parent = Workflow("parent", start="fetch", nodes=[include("fetch", fetch)])
    registry = Registry([parent, fetch])
    assert registry.source("parent") == {
        "root": {"kind": "builtin", "id": "parent", "revision": "1"},
        "mounted": [
            {
                "mountPath": ["fetch"],
                "workflowName": "fetch",
                "source": {"kind": "builtin", "id": "fetch", "revision": "1"},
            }
        ],
    }


def test_include__run_records_its_mounted_sources(engine: Engine) -> None:
    fetch = _fetch()
    parent = Workflow(
        "parent",
        start="fetch",
        nodes=[include("fetch", fetch), compute("done", step)],
        edges={"fetch": "done"},
    )
    engine.register(parent, fetch)
    run = engine.client.start("parent")
    source = engine.store.get_run(run.run_id).workflow_source  # type: ignore[union-attr]
    assert source["root"] == {"kind": "builtin", "id": "parent", "revision": "1"}
    assert source["mounted"] == [
        {
            "mountPath": ["fetch"],
            "workflowName": "fetch",
            "source": {"kind": "builtin", "id": "fetch", "revision": "1"},
        }
    ]
    assert engine.sql(
        "SELECT mount_path, source_ref FROM run_sources WHERE run_id = ? ORDER BY mount_path", run.run_id
    ) == [("", "parent"), ("fetch", "fetch")]
    # And the runner walks the mounted nodes in order.
    engine.runner()
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert [a.node_id for a in engine.attempts(run.run_id)] == ["fetch/get", "fetch/check", "done"]


# -- digest ----------------------------------------------------------------------------------
def test_digest__is_stable_for_the_same_graph() -> None:
    assert linear().digest == linear().digest
    assert linear().digest.startswith("sha256:")


def test_digest__changes_when_the_graph_changes() -> None:
    base = linear().digest
    more_edges = Workflow(
        "linear",
        start="a",
        nodes=[compute("a", step), compute("b", step), compute("c", step)],
        edges={"a": "b", "b": "c"},
    )
    other_fn = Workflow(
        "linear", start="a", nodes=[compute("a", other_step), compute("b", step)], edges={"a": "b"}
    )
    retries = Workflow(
        "linear", start="a", nodes=[compute("a", step, retries=2), compute("b", step)], edges={"a": "b"}
    )
    exit_edge = Workflow(
        "linear", start="a", nodes=[compute("a", step), compute("b", step)], edges={"a.ok": "b"}
    )
    digests = {
        base,
        more_edges.digest,
        other_fn.digest,
        retries.digest,
        exit_edge.digest,
        linear(revision="2").digest,
    }
    assert len(digests) == 6


def test_snapshot__records_the_declarative_spec_and_function_names() -> None:
    wf = Workflow(
        "snap",
        start="a",
        nodes=[compute("a", step, retries=1, backoff_s=0.5), notify("n", "hello"), effect("e", step)],
        edges={"a": "n", "n": "e"},
    )
    nodes = wf.snapshot()["nodes"]
    assert nodes["a"] == {
        "kind": "compute",
        "retries": 1,
        "backoffS": 0.5,
        "exits": [],
        # The name and a digest of the function's syntax tree, not the module it was loaded as.
        "function": "step@"
        + hashlib.sha256(ast.dump(ast.parse(inspect.getsource(step))).encode()).hexdigest()[:16],
    }
    assert nodes["n"] == {"kind": "notify", "text": "hello"}
    assert nodes["e"]["effectType"] == "workflow.e"


def test_text_and_mermaid__show_routes_and_mounts() -> None:
    parent = Workflow(
        "parent",
        start="fetch",
        nodes=[include("fetch", _fetch()), compute("done", step)],
        edges={"fetch.ok": "done"},
    )
    text = parent.text()
    assert "fetch [include fetch]: ok -> done" in text
    assert "done [compute]: end" in text
    mermaid = parent.mermaid()
    assert "subgraph fetch" in mermaid
    assert "fetch -->|ok| done" in mermaid


def test_node_builders__refuse_bad_retries_on_every_retrying_kind() -> None:
    for bad in (-1, 101, 1.5, True):
        with pytest.raises(InvalidInput, match="retries must be a whole number"):
            shell("s", ["true"], retries=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="retries must be a whole number"):
            agent("m", ScriptedProvider([]), "hi", schema={"type": "object"}, retries=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="backoff_s must be a positive number"):
        shell("s", ["true"], backoff_s=-1)


def test_shell__inline_env_values_are_refused_naming_env_from() -> None:
    with pytest.raises(
        InvalidInput, match=r"shell node s: env values would be stored .*env_from=\['API_TOKEN'\]"
    ):
        shell("s", ["true"], env={"API_TOKEN": "s3cret"})
    assert shell("s", ["true"], env={}).spec["env"] == {}


def test_shell__env_from_takes_a_list_of_variable_names() -> None:
    for bad in ("API_TOKEN", ["1ST"], ["A-B"], [""], [3]):
        with pytest.raises(InvalidInput, match="env_from must be a list of environment variable names"):
            shell("s", ["true"], env_from=bad)  # type: ignore[arg-type]
    assert shell("s", ["true"], env_from=["B", "A", "B"]).spec["envFrom"] == ["A", "B"]
    assert "envFrom" not in shell("s", ["true"]).spec


def test_defaults__must_match_the_schema() -> None:
    with pytest.raises(InvalidInput, match="default does not match the schema"):
        decision("d", "How many?", schema={"type": "integer"}, default="many")
    with pytest.raises(InvalidInput, match="default does not match the schema"):
        input("i", "Name?", schema={"type": "object", "required": ["name"]}, default={})
    assert decision("d", "How many?", schema={"type": "integer"}, default=3).spec["default"] == 3
    assert input("i", "Name?", schema={"type": "string"}, default="anon").spec["default"] == "anon"
