"""OpenTelemetry traces of runs and steps (optional: ``pip install 'tether[otel]'``).

A runner built with ``RunnerConfig(tracing=True)`` opens a ``tether.run`` span for each stretch of
a run it holds (from taking the run up to letting it go) and, inside it, a ``tether.step`` span
for each step it executes, with the run id, workflow, node, node kind and attempt as attributes.
A step that fails ends its span with an error status and the step's error.

A run may park and be taken up again, later and by another worker: every stretch of one run
belongs to one trace, whose id is derived from the run id (the stretches are children of a run
root that no process records, with ids derived the same way), so a tracing back-end shows a run
whole and ``trace_id_of(run_id)`` finds it.

Spans go to the process's tracer provider: an application configures its own (the OpenTelemetry
SDK, an exporter); ``tether worker --trace`` configures one from the standard ``OTEL_*`` variables
(``configure_from_environment``). A runner without ``tracing=True`` never imports OpenTelemetry and
pays one no-op context manager per step.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import Any

from tether.errors import InvalidInput

INSTALL_HINT = "tracing needs the OpenTelemetry packages: pip install 'tether[otel]'"


class NoTracing:
    """The tracer of a runner without tracing: spans that cost nothing."""

    def run(self, run_id: str, workflow: str, runner_id: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def step(
        self, run_id: str, workflow: str, node_id: str, kind: str, attempt: int
    ) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def failed(self, error: str) -> None:
        """Mark the current step's span failed (nothing without tracing)."""


def trace_id_of(run_id: str) -> int:
    """The trace id every span of ``run_id`` carries (128 bits derived from the run id)."""
    return int.from_bytes(hashlib.sha256(run_id.encode("utf-8")).digest()[:16], "big") or 1


def _root_span_id(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode("utf-8")).digest()[16:24], "big") or 1


class OpenTelemetryTracing:
    """Spans through OpenTelemetry's API, to whatever tracer provider the process has."""

    def __init__(self) -> None:
        try:
            from opentelemetry import trace
        except ImportError:
            raise InvalidInput(INSTALL_HINT) from None
        self._trace = trace
        self._tracer = trace.get_tracer("tether")

    def _run_context(self, run_id: str) -> Any:
        trace = self._trace
        root = trace.SpanContext(
            trace_id=trace_id_of(run_id),
            span_id=_root_span_id(run_id),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        return trace.set_span_in_context(trace.NonRecordingSpan(root))

    @contextlib.contextmanager
    def run(self, run_id: str, workflow: str, runner_id: str) -> Iterator[None]:
        attributes = {"tether.run_id": run_id, "tether.workflow": workflow, "tether.runner_id": runner_id}
        # Letting a run go (``Parked``, a lost claim) ends the stretch, not in error.
        with self._tracer.start_as_current_span(
            "tether.run",
            context=self._run_context(run_id),
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ):
            yield

    @contextlib.contextmanager
    def step(self, run_id: str, workflow: str, node_id: str, kind: str, attempt: int) -> Iterator[None]:
        attributes: dict[str, str | int] = {
            "tether.run_id": run_id,
            "tether.workflow": workflow,
            "tether.node_id": node_id,
            "tether.node_kind": kind,
            "tether.attempt": attempt,
        }
        # A run's release (waiting, sleeping, backing off) is not an error of the step: only a
        # failure marked by ``failed`` is.
        with self._tracer.start_as_current_span(
            f"tether.step {node_id}",
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ):
            yield

    def failed(self, error: str) -> None:
        trace = self._trace
        span = trace.get_current_span()
        span.set_attribute("tether.error", error[:2000])
        span.set_status(trace.Status(trace.StatusCode.ERROR, error.splitlines()[0][:200] if error else ""))


Tracing = NoTracing | OpenTelemetryTracing


def tracing(enabled: bool) -> Tracing:
    """The runner's tracer: OpenTelemetry's when ``enabled`` (``InvalidInput`` naming the extra
    when it is not installed), otherwise one that costs nothing."""
    return OpenTelemetryTracing() if enabled else NoTracing()


def configure_from_environment(service_name: str = "tether-worker") -> None:
    """Install an OpenTelemetry SDK tracer provider for this process, exporting as the standard
    variables say: ``OTEL_TRACES_EXPORTER`` ``otlp`` (the default; OTLP over HTTP to
    ``OTEL_EXPORTER_OTLP_ENDPOINT``) or ``console`` (JSON on standard output), and
    ``OTEL_SERVICE_NAME``. Spans are exported in batches, and flushed when the process exits."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        raise InvalidInput(INSTALL_HINT) from None
    choice = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    exporter: SpanExporter
    if choice == "console":
        exporter = ConsoleSpanExporter()
    elif choice == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise InvalidInput(INSTALL_HINT) from None
        exporter = OTLPSpanExporter()
    else:
        raise InvalidInput(f"OTEL_TRACES_EXPORTER={choice!r} is not supported here: use otlp or console")
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
