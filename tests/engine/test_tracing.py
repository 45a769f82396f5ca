"""OpenTelemetry traces: a span for each stretch of a run a runner holds and one for each step,
all in the run's own trace (its id derived from the run id), a failed step's span in error."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tether.engine.graph import Workflow, compute
from tether.engine.tracing import NoTracing, trace_id_of

from .conftest import Engine

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished in the test (one SDK provider for the process: OpenTelemetry allows
    the global provider to be set once)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _flaky(ctx):  # type: ignore[no-untyped-def]
    if ctx.attempt == 1:
        raise ConnectionError("first try fails")
    return {"tries": ctx.attempt}


def _of_run(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("tether.run_id") == run_id]


def test_tracing__runs_and_steps_are_spans_of_the_runs_trace(
    engine: Engine, spans: InMemorySpanExporter
) -> None:
    flow = Workflow(
        "traced",
        start="prepare",
        nodes=[compute("prepare", lambda ctx: {"n": 1}), compute("call", _flaky, retries=1, backoff_s=0.05)],
        edges={"prepare": "call"},
    )
    engine.register(flow)
    engine.runner(tracing=True)
    run_id = engine.client.start("traced").run_id
    assert engine.wait(run_id).status == "done"

    found = _of_run(spans, run_id)
    steps = [s for s in found if s.name.startswith("tether.step")]
    stretches = [s for s in found if s.name == "tether.run"]
    assert [(s.name, (s.attributes or {})["tether.attempt"]) for s in steps] == [
        ("tether.step prepare", 1),
        ("tether.step call", 1),
        ("tether.step call", 2),
    ]
    # The retry's backoff let the run go: it was held in two stretches, both in the run's trace.
    assert len(stretches) == 2
    assert {s.context.trace_id for s in found if s.context is not None} == {trace_id_of(run_id)}
    stretch_ids = {s.context.span_id for s in stretches if s.context is not None}
    assert all(s.parent is not None and s.parent.span_id in stretch_ids for s in steps)
    failed, retried = steps[1], steps[2]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert "ConnectionError: first try fails" in str((failed.attributes or {})["tether.error"])
    assert retried.status.status_code != trace.StatusCode.ERROR
    assert (retried.attributes or {})["tether.node_kind"] == "compute"
    assert (stretches[0].attributes or {})["tether.workflow"] == "traced"


def test_tracing__off_by_default_and_then_records_nothing(
    engine: Engine, spans: InMemorySpanExporter
) -> None:
    engine.register(Workflow("untraced", start="a", nodes=[compute("a", lambda ctx: None)]))
    runner = engine.runner()
    run_id = engine.client.start("untraced").run_id
    assert engine.wait(run_id).status == "done"
    assert isinstance(runner.tracing, NoTracing)
    assert _of_run(spans, run_id) == []


def test_trace_ids_differ_by_run_and_are_stable() -> None:
    assert trace_id_of("run-1") == trace_id_of("run-1") != trace_id_of("run-2")
    assert 0 < trace_id_of("run-1") < 2**128
