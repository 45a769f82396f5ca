"""The Python API an application embeds: graphs checked when built, one identity for workflow
objects, folders and modules, and the client's surface (context manager, run listing, whether a
start adopted, the declared result, status enums, errors in one module)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import tether
import tether.errors
from tests.integration.support import TETHER, clean_env
from tether.client import RunResult, Started, Tether
from tether.engine.graph import Exit, Workflow, agent, compute, decision, include, input, shell
from tether.engine.providers import ScriptedProvider
from tether.engine.registry import Registry, load_folder, load_module
from tether.errors import Conflict, InvalidInput, NotFound, TetherError, WorkflowLoadError
from tether.store import QueueStatus, RunStatus

from .conftest import Engine, wait_until


def step(ctx: Any) -> Any:
    return {"node": ctx.node_id}


def _approval() -> Workflow:
    return Workflow(
        "expense",
        start="manager",
        nodes=[decision("manager", "Approve?", options=["approve", "reject"]), compute("pay", step)],
        edges={"manager.aprove": "pay"},
    )


# -- graphs checked when built ---------------------------------------------------------------
def test_graph__a_misspelt_exit_is_refused_naming_the_node_and_its_exits() -> None:
    with pytest.raises(InvalidInput) as refused:
        _approval()
    assert "'manager.aprove'" in refused.value.message
    assert "node manager" in refused.value.message
    assert "its exits: approve, reject" in refused.value.message


@pytest.mark.parametrize(
    ("nodes", "edge", "exits"),
    [
        ([compute("a", step), compute("b", step)], "a.done", "error, ok"),
        ([compute("a", step, exits=["done"]), compute("b", step)], "a.dnoe", "done, error, ok"),
        ([shell("a", ["true"]), compute("b", step)], "a.failed", "error, ok, timeout"),
        ([input("a", "Name?"), compute("b", step)], "a.answered", "error, ok"),
    ],
)
def test_graph__every_node_kind_knows_its_exits(nodes: list[Any], edge: str, exits: str) -> None:
    with pytest.raises(InvalidInput, match=f"its exits: {exits}"):
        Workflow("kinds", start="a", nodes=nodes, edges={edge: "b"})


def test_graph__an_include_exits_by_its_workflows_terminal_exits() -> None:
    child = Workflow("child", start="check", nodes=[compute("check", step, exits=["empty"])])
    parent = Workflow(
        "parent",
        start="sub",
        nodes=[include("sub", child), compute("next", step)],
        edges={"sub.empty": "next"},
    )
    assert parent.route("sub/check", "empty") == "next"
    with pytest.raises(InvalidInput, match=r"'sub.full'.*its exits: empty, error, ok"):
        Workflow(
            "parent", start="sub", nodes=[include("sub", child), compute("n", step)], edges={"sub.full": "n"}
        )


def test_graph__unreachable_nodes_and_missing_starts_are_refused_by_name() -> None:
    with pytest.raises(InvalidInput, match="nodes no edge from a reaches: orphan"):
        Workflow("islands", start="a", nodes=[compute("a", step), compute("orphan", step)])
    with pytest.raises(InvalidInput, match=r"starts at unknown node nope \(nodes: a\)"):
        Workflow("lost", start="nope", nodes=[compute("a", step)])
    with pytest.raises(InvalidInput, match="needs a start node"):
        Workflow("lost", start="", nodes=[compute("a", step)])


def test_graph__shell_given_a_string_says_what_it_takes_with_the_node_name() -> None:
    with pytest.raises(
        InvalidInput, match=r"shell node build: command must be a non-empty list of strings.*or a function"
    ):
        shell("build", "make all")
    # A function of the context is a command built when the step runs (tests/engine/test_step_data.py).
    assert shell("build", step).hooks == {"command": step}


def test_graph__declared_output_must_name_nodes() -> None:
    with pytest.raises(InvalidInput, match="output names unknown node total"):
        Workflow("sum", start="a", nodes=[compute("a", step)], output="total")
    with pytest.raises(InvalidInput, match="output names unknown node nope"):
        Workflow("sum", start="a", nodes=[compute("a", step)], output={"x": "nope"})
    plain = Workflow("sum", start="a", nodes=[compute("a", step)])
    declared = Workflow("sum", start="a", nodes=[compute("a", step)], output="a")
    assert "output" not in plain.snapshot(), "a workflow without a declared output keeps its digest"
    assert declared.digest != plain.digest


# -- registering -----------------------------------------------------------------------------
def test_registry__a_different_definition_under_a_registered_name_needs_replace() -> None:
    first = Workflow("flow", start="a", nodes=[compute("a", step)])
    same = Workflow("flow", start="a", nodes=[compute("a", step)])
    other = Workflow("flow", start="a", nodes=[compute("a", lambda ctx: 2)])
    registry = Registry([first])
    registry.add(same)
    assert registry.get("flow") is first, "the same definition again changes nothing"
    with pytest.raises(Conflict, match="A different definition of workflow flow is already registered"):
        registry.add(other)
    assert registry.get("flow") is first
    registry.add(other, replace=True)
    assert registry.get("flow") is other


def test_start__empty_ids_are_refused_and_write_nothing(engine: Engine) -> None:
    engine.register(Workflow("flow", start="a", nodes=[compute("a", step)]))
    with pytest.raises(InvalidInput, match="run id"):
        engine.client.start("flow", run_id="")
    with pytest.raises(InvalidInput, match="session_id must be a non-empty string"):
        engine.client.start("flow", session_id="")
    with pytest.raises(InvalidInput, match="workflow must be a workflow name"):
        engine.client.start("")
    assert engine.store.list_runs() == []


# -- folders and modules ---------------------------------------------------------------------
RULES = """
LIMIT = 100


def over_limit(amount):
    return amount > LIMIT
"""

EXPENSES = """
from tether.engine.graph import Exit, Workflow, compute

from ._rules import over_limit

LOADS = globals().setdefault("LOADS", 0) + 1


def check(ctx):
    amount = ctx.input["amount"]
    return Exit("review" if over_limit(amount) else "ok", {"amount": amount})


def pay(ctx):
    return {"paid": ctx.outputs["check"]["amount"]}


expenses = Workflow(
    "expenses",
    start="check",
    nodes=[compute("check", check, exits=["review"]), compute("pay", pay), compute("review", pay)],
    edges={"check.ok": "pay", "check.review": "review"},
    output="pay",
)
"""

REEXPORT = """
from .expenses import expenses as borrowed  # imported, not defined here: not this file's workflow

NOTHING_ELSE = 1
"""


def _app_folder(base: Path, name: str = "appflows") -> Path:
    folder = base / name
    folder.mkdir()
    (folder / "_rules.py").write_text(RULES)
    (folder / "expenses.py").write_text(EXPENSES)
    (folder / "reexport.py").write_text(REEXPORT)
    return folder


def test_folder__files_are_modules_of_a_package_with_relative_imports_each_loaded_once(
    tmp_path: Path,
) -> None:
    folder = _app_folder(tmp_path)
    registry = load_folder(folder)
    assert registry.names() == ["expenses"]
    module = sys.modules["appflows.expenses"]
    assert module.LOADS == 1, "imported once, though a sibling imports it too"
    assert registry.get("expenses") is module.expenses
    assert registry.source("expenses")["root"] == {
        "kind": "file",
        "path": "expenses.py",
        "hash": module.expenses.digest,
    }
    again = load_folder(folder)
    assert sys.modules["appflows.expenses"].LOADS == 1, "an unchanged file is not executed again"
    assert again.get("expenses").digest == registry.get("expenses").digest


def test_folder__two_files_defining_one_workflow_name_is_an_error_naming_both(tmp_path: Path) -> None:
    folder = tmp_path / "dupflows"
    folder.mkdir()
    flow = (
        "from tether.engine.graph import Workflow, compute\n\n"
        "flow = Workflow('same', start='a', nodes=[compute('a', lambda c: {N})])\n"
    )
    (folder / "one.py").write_text(flow.replace("{N}", "1"))
    (folder / "two.py").write_text(flow.replace("{N}", "2"))
    with pytest.raises(WorkflowLoadError) as refused:
        load_folder(folder)
    assert str(folder / "one.py") in refused.value.message
    assert str(folder / "two.py") in refused.value.message
    assert "Workflow same is defined twice" in refused.value.message


def test_identity__object_folder_and_module_give_one_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _app_folder(tmp_path, "identflows")
    monkeypatch.syspath_prepend(str(tmp_path))
    from_folder = load_folder(folder).get("expenses").digest
    from_module = load_module("identflows.expenses").get("expenses").digest
    # The same functions put together in the application's own code.
    as_object = Workflow(
        "expenses",
        start="check",
        nodes=[
            compute("check", sys.modules["identflows.expenses"].check, exits=["review"]),
            compute("pay", sys.modules["identflows.expenses"].pay),
            compute("review", sys.modules["identflows.expenses"].pay),
        ],
        edges={"check.ok": "pay", "check.review": "review"},
        output="pay",
    )
    assert from_folder == from_module == as_object.digest
    with pytest.raises(InvalidInput, match="Invalid module name"):
        load_module("not a module")
    with pytest.raises(WorkflowLoadError, match="Cannot import workflows from module nosuch_tether_module"):
        load_module("nosuch_tether_module")


def test_identity__an_object_registered_run_is_executed_by_a_tether_worker_process(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _app_folder(tmp_path, "workerflows")
    # The application imports the workflow module and starts runs with the object; a worker
    # process loads the folder.
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("workerflows.expenses")
    with Tether(store_url, workflows=[module.expenses]) as client:
        small = client.start(module.expenses, {"amount": 40}, run_id="exp-small")
        large = client.start("expenses", {"amount": 400}, run_id="exp-large")
        worker = subprocess.run(
            [
                str(TETHER),
                "--store",
                store_url,
                "--folder",
                str(folder),
                "worker",
                "--until-idle",
                "--poll-ms",
                "50",
            ],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stderr
        done = client.result(small.run_id)
        assert (done.status, done.result) == (QueueStatus.DONE, {"paid": 40})
        reviewed = client.result(large.run_id)
        assert reviewed.status == "done"
        assert reviewed.outputs["check"] == {"amount": 400}
        assert set(reviewed.outputs) == {"check", "review"}
        assert reviewed.result is None, "the declared output node did not run"


def test_identity__tether_worker_loads_an_importable_module(store_url: str, tmp_path: Path) -> None:
    _app_folder(tmp_path, "modflows")
    with _module_client(store_url, tmp_path) as client:
        run = client.start("expenses", {"amount": 5}, run_id="exp-module")
        worker = subprocess.run(
            [
                str(TETHER),
                "--store",
                store_url,
                "worker",  # no ./workflows folder in tmp_path: only the module is loaded
                "--module",
                "modflows.expenses",
                "--until-idle",
                "--poll-ms",
                "50",
            ],
            cwd=tmp_path,
            env=clean_env(PYTHONPATH=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stderr
        assert client.result(run.run_id).result == {"paid": 5}


def _module_client(store_url: str, base: Path) -> Tether:
    sys.path.insert(0, str(base))
    try:
        return Tether(store_url, modules=["modflows.expenses"])
    finally:
        sys.path.remove(str(base))


# -- the client's surface --------------------------------------------------------------------
def test_client__start_tells_reserved_from_adopted(engine: Engine) -> None:
    engine.register(Workflow("flow", start="a", nodes=[compute("a", step)]))
    first = engine.client.start("flow", run_id="run-once")
    again = engine.client.start("flow", run_id="run-once")
    assert isinstance(first, Started) and isinstance(again, Started)
    assert (first.adopted, first.reserved) == (False, True)
    assert (again.adopted, again.reserved) == (True, False)
    assert first.run_id == again.run_id == "run-once"
    assert first == again, "the record compares by the run, not by how it was reached"


def test_client__runs_lists_and_filters(engine: Engine) -> None:
    engine.register(
        Workflow("alpha", start="a", nodes=[compute("a", step)]),
        Workflow("beta", start="a", nodes=[compute("a", step)]),
    )
    for run_id in ("a1", "a2"):
        engine.client.start("alpha", run_id=run_id)
    engine.client.start("beta", run_id="b1")
    engine.client.cancel("a1")
    assert sorted(r.run_id for r in engine.client.runs()) == ["a1", "a2", "b1"]
    assert [r.run_id for r in engine.client.runs(workflow="alpha", status="queued")] == ["a2"]
    assert [r.run_id for r in engine.client.runs(status=["cancelled"])] == ["a1"]
    assert len(engine.client.runs(limit=2)) == 2
    assert len(engine.client.runs(workflow="alpha", limit=1)) == 1
    with pytest.raises(InvalidInput, match="Unknown queue status: finished"):
        engine.client.runs(status="finished")
    with pytest.raises(InvalidInput, match="limit"):
        engine.client.runs(limit=-1)


def test_client__result_holds_the_declared_result_each_output_and_enums(engine: Engine) -> None:
    def total(ctx: Any) -> Any:
        return {"sum": ctx.outputs["a"]["node"] + "+b"}

    wf = Workflow(
        "mapped",
        start="a",
        nodes=[compute("a", step), compute("b", total), compute("c", lambda ctx: Exit("ok", "tail"))],
        edges={"a": "b", "b": "c"},
        output={"total": "b", "first": "a"},
    )
    engine.register(wf)
    engine.runner()
    result = engine.wait(engine.client.start("mapped").run_id)
    assert isinstance(result, RunResult)
    assert result.status is QueueStatus.DONE and result.status == "done"
    assert result.run_state_status is RunStatus.COMPLETED
    assert result.output == "tail", "output stays the last node's"
    assert result.outputs == {"a": {"node": "a"}, "b": {"sum": "a+b"}, "c": "tail"}
    assert result.result == {"total": {"sum": "a+b"}, "first": {"node": "a"}}


def test_client__is_a_context_manager_that_closes_the_store_it_opened(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ctx.db'}"
    with Tether(url, workflows=[Workflow("flow", start="a", nodes=[compute("a", step)])]) as client:
        client.start("flow", run_id="run-ctx")
    with pytest.raises(TetherError):
        client.store.get_run("run-ctx")
    with Tether(url) as reopened:
        assert reopened.store.get_run("run-ctx") is not None


def test_client__a_store_passed_in_stays_open(engine: Engine) -> None:
    with Tether(engine.store) as client:
        client.runs()
    assert engine.store.list_runs() == []


# -- errors ----------------------------------------------------------------------------------
def test_errors__every_error_class_lives_in_tether_errors_and_the_old_names_are_the_same() -> None:
    from tether.client import WaitTimeout as client_wait_timeout
    from tether.engine.providers import ProviderError as providers_error
    from tether.engine.registry import WorkflowLoadError as registry_error
    from tether.engine.runner import LeaseUnproven as runner_lease

    assert client_wait_timeout is tether.errors.WaitTimeout
    assert providers_error is tether.errors.ProviderError
    assert registry_error is tether.errors.WorkflowLoadError
    assert runner_lease is tether.errors.LeaseUnproven
    for package in (tether.client, tether.engine.graph, tether.engine.registry, tether.engine.providers):
        for name, value in vars(package).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith("tether")
            ):
                assert value.__module__ == "tether.errors", (
                    f"{package.__name__}.{name} is defined outside tether.errors"
                )
    exported = {name for name in tether.__all__ if inspect.isclass(getattr(tether, name))}
    assert {"WaitTimeout", "ProviderError", "WorkflowLoadError", "NotFound", "Started"} <= exported
    assert issubclass(NotFound, TetherError)


def test_errors__a_misspelt_exit_in_a_folder_file_is_a_load_error(tmp_path: Path) -> None:
    folder = tmp_path / "typoflows"
    folder.mkdir()
    (folder / "flow.py").write_text(
        textwrap.dedent(
            """
            from tether.engine.graph import Workflow, compute, decision

            flow = Workflow(
                "expense",
                start="manager",
                nodes=[
                    decision("manager", "Approve?", options=["approve", "reject"]),
                    compute("pay", lambda c: 1),
                ],
                edges={"manager.aprove": "pay"},
            )
            """
        )
    )
    with pytest.raises(WorkflowLoadError, match=r"flow.py: .*'manager.aprove'.*its exits: approve, reject"):
        load_folder(folder)


# -- schemas ---------------------------------------------------------------------------------
def test_schema__a_pydantic_model_is_a_schema_and_answers_are_checked_at_once(engine: Engine) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Expense(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        amount: int
        reason: str = pydantic.Field(min_length=3)

    node = decision("approve", "Amount?", schema=Expense)
    assert node.spec["schema"] == Expense.model_json_schema()
    engine.register(Workflow("claim", start="approve", nodes=[node]))
    engine.runner()
    run = engine.client.start("claim")
    [asked] = wait_until(lambda: engine.client.decisions(run.run_id), what="the decision")
    with pytest.raises(InvalidInput, match=r"\$\.reason: shorter than 3 characters") as refused:
        engine.client.answer(asked.decision_id, {"amount": 5, "reason": "x"})
    assert "$.amount" not in refused.value.message
    with pytest.raises(InvalidInput, match=r"\$\.amount: expected integer, got str"):
        engine.client.answer(asked.decision_id, {"amount": "5", "reason": "taxi"})
    assert engine.client.decisions(run.run_id)[0].outcome is None, "a refused answer writes nothing"
    engine.client.answer(asked.decision_id, {"amount": 5, "reason": "taxi"})
    assert engine.wait(run.run_id).result == {
        "response": {"amount": 5, "reason": "taxi"},
        "provenance": "human",
    }


def test_schema__a_pydantic_model_checks_input_submissions_and_agent_outputs(engine: Engine) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Contact(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        email: str = pydantic.Field(pattern="@")
        age: int

    model = ScriptedProvider([{"email": "bot@example.com", "age": "old"}])
    engine.register(
        Workflow(
            "contact",
            start="ask",
            nodes=[input("ask", "Details?", schema=Contact), agent("guess", model, "Guess", schema=Contact)],
            edges={"ask": "guess"},
        )
    )
    engine.runner()
    session = engine.client.session("session-contact")
    run = session.start("contact")
    [request] = wait_until(session.pending_inputs, what="the input request")
    with pytest.raises(InvalidInput, match=r"\$\.age: required; \$\.email: 'nobody' does not match '@'"):
        session.submit(request.request_id, {"email": "nobody"})
    session.submit(request.request_id, {"email": "ada@example.com", "age": 36})
    result = engine.wait(run.run_id)
    assert result.outputs["ask"] == {"value": {"email": "ada@example.com", "age": 36}, "provenance": "human"}
    assert result.error_code == "nodeFailed"
    assert "$.age: expected integer, got str" in (result.error_message or "")


def test_schema__session_submit_names_the_wrong_field_at_once(engine: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {"email": {"type": "string", "format": "email"}, "age": {"type": "integer"}},
        "required": ["email", "age"],
    }
    engine.register(Workflow("signup", start="ask", nodes=[input("ask", "Details?", schema=schema)]))
    engine.runner()
    session = engine.client.session("session-signup")
    run = session.start("signup")
    [request] = wait_until(session.pending_inputs, what="the input request")
    with pytest.raises(InvalidInput, match=r"\$\.age: required; \$\.email: 'nobody' is not a 'email'"):
        session.submit(request.request_id, {"email": "nobody"})
    assert engine.store.submissions(request.request_id) == []
    assert session.submit(request.request_id, {"email": "a@example.com", "age": 40}).outcome == "validating"
    assert engine.wait(run.run_id).outputs["ask"]["value"] == {"email": "a@example.com", "age": 40}


def test_folder__named_like_an_imported_module_is_refused_not_evicted(tmp_path: Path) -> None:
    folder = tmp_path / "json"
    folder.mkdir()
    (folder / "flow.py").write_text("X = 1\n")
    import json

    with pytest.raises(WorkflowLoadError, match="a module named json is imported already"):
        load_folder(folder)
    assert sys.modules["json"] is json


def test_client__a_workflow_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    with pytest.raises(NotFound, match=r"Workflow folder not found: .*typo"):
        Tether(url, folder=tmp_path / "typo")
    with pytest.raises(NotFound, match="Workflow folder not found"):
        load_folder(tmp_path / "typo")


def test_cli__the_default_folder_may_be_absent_but_a_named_one_may_not(tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 't.db'}"]
    listed = subprocess.run(
        [str(TETHER), *store, "runs"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    typo = subprocess.run(
        [str(TETHER), *store, "--folder", "typo", "start", "x"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert typo.returncode != 0
    assert "Workflow folder not found" in typo.stderr and "Traceback" not in typo.stderr


def test_client__logs_its_actions_at_info_and_refusals_at_debug(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.register(Workflow("quiet", start="a", nodes=[compute("a", step)]))
    with caplog.at_level("DEBUG", logger="tether.client"):
        engine.client.start("quiet", run_id="logged-1")
        engine.client.start("quiet", run_id="logged-1")
        assert engine.client.cancel("logged-1") == "cancelled"
        with pytest.raises(TetherError):
            engine.client.cancel("logged-1")
    records = [r for r in caplog.records if r.name == "tether.client"]
    assert [(r.levelname, r.getMessage()) for r in records[:3]] == [
        ("INFO", "run logged-1 reserved (workflow quiet)"),
        ("INFO", "run logged-1 adopted (workflow quiet)"),
        ("INFO", "run logged-1 cancel cancelled by operator"),
    ]
    assert all(getattr(r, "run_id", None) == "logged-1" for r in records)
    assert records[3].levelname == "DEBUG" and "refused" in records[3].getMessage()


def test_client__input_that_is_not_json_is_refused_naming_where(engine: Engine) -> None:
    import datetime

    engine.register(Workflow("typed", start="a", nodes=[compute("a", step)]))
    when = datetime.datetime(2026, 1, 1)
    with pytest.raises(InvalidInput, match=r"^input at \$\.order\.items\[1\]\.when: Unsupported JSON"):
        engine.client.start("typed", {"order": {"items": [1, {"when": when}]}}, run_id="bad-json")
    with pytest.raises(InvalidInput, match=r"^launch_options: JSON numbers must be finite"):
        engine.client.start("typed", {}, run_id="bad-json", launch_options=float("inf"))
    with pytest.raises(InvalidInput, match="timeout_s"):
        engine.client.wait("bad-json", timeout_s="soon")  # type: ignore[arg-type]
    assert engine.store.get_run("bad-json") is None
