"""OpenTelemetry traces of finished requests (issue 20), following the GenAI semantic conventions.

Contract:
- Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set (`configure()` at startup); then each finished
  request becomes one span (kind SERVER, named `{operation} {model}`) with one child span (kind
  CLIENT) per attempt that reached a candidate's turn, exported in batches over OTLP/HTTP by the SDK's
  own processor. The exporter reads the standard `OTEL_*` variables (endpoint, headers, timeout).
- Spans are built after the request finished, from the ledger's Exchange: nothing on the request path
  waits for tracing, and a span holds exactly what the ledger may hold: ids, names, models, statuses,
  token counts. Never a prompt, a completion, a key, a credential or a provider's message.
- Attempt spans start at the offset the relay recorded and last their elapsed time.
"""

import os
from datetime import datetime, timedelta

from django.core.exceptions import ImproperlyConfigured

from proxy.ledger.exchange import Exchange
from routing.policy.vocabulary import AttemptStatus, ClientRoute, Outcome

# The GenAI operation each client route performs (gen_ai.operation.name); other routes get a plain span.
OPERATIONS = {
    ClientRoute.CHAT_COMPLETIONS: "chat",
    ClientRoute.RESPONSES: "chat",
    ClientRoute.RESPONSES_COMPACT: "chat",
    ClientRoute.MESSAGES: "chat",
    ClientRoute.EMBEDDINGS: "embeddings",
}

_tracer = None  # set by configure(): None means tracing is off and `record` costs one comparison
_provider = None


def configure(*, exporter=None) -> None:
    """Start exporting when OTEL_EXPORTER_OTLP_ENDPOINT is set (or with the given exporter: tests
    pass the SDK's in-memory one and a synchronous processor)."""
    global _tracer, _provider
    if exporter is None and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        raise ImproperlyConfigured(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
            "pip install 'gateway[otel]'"
        ) from None

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "gateway")})
    )
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracer, _provider = provider.get_tracer("gateway"), provider


def flush() -> None:
    """Export what is batched now (the SDK also does at exit)."""
    if _provider is not None:
        _provider.force_flush()


def disable() -> None:
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _known(values: dict[str, str | int | None]) -> dict[str, str | int]:
    """Span attributes may not be None: only the values that are known (an empty name is not)."""
    return {name: value for name, value in values.items() if value is not None and value != ""}


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def record(exchange: Exchange) -> None:
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    operation = OPERATIONS.get(exchange.route)
    model = exchange.requested_model
    served = [a for a in exchange.attempts if a.status == AttemptStatus.SUCCEEDED]
    attributes = _known(
        {
            "gateway.request_id": exchange.request_id,
            "gateway.operation_id": exchange.operation_id or exchange.request_id,
            "gateway.route": exchange.route,
            "gateway.transport": exchange.transport,
            "gateway.outcome": exchange.outcome,
            "gateway.attempts": exchange.attempts_made,
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "gen_ai.response.model": exchange.served_model,
            "http.response.status_code": exchange.status_code,
            "gen_ai.usage.input_tokens": served[-1].input_tokens if served else None,
            "gen_ai.usage.output_tokens": served[-1].output_tokens if served else None,
        }
    )
    finished = exchange.finished_at or exchange.started_at
    root = _tracer.start_span(
        f"{operation} {model}" if operation and model else exchange.route,
        kind=SpanKind.SERVER,
        start_time=_ns(exchange.started_at),
        attributes=attributes,
    )
    if exchange.outcome != Outcome.OK:
        root.set_attribute("error.type", exchange.outcome or "unknown")
        root.set_status(Status(StatusCode.ERROR))
    context = trace.set_span_in_context(root)
    for a in exchange.attempts:
        if a.status == AttemptStatus.INELIGIBLE:
            root.add_event(
                "candidate_ineligible",
                {"gateway.assignment": a.assignment, "gateway.reason": a.ineligible_reason},
            )
            continue
        start = exchange.started_at + timedelta(milliseconds=a.offset_ms)
        child_attributes = _known(
            {
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": a.adapter,
                "gen_ai.request.model": a.model,
                "gen_ai.usage.input_tokens": a.input_tokens,
                "gen_ai.usage.output_tokens": a.output_tokens,
                "http.response.status_code": a.upstream_status,
                "gateway.assignment": a.assignment,
                "gateway.pool": a.pool,
                "gateway.attempt.ordinal": a.ordinal,
                "gateway.attempt.status": a.status,
                "gateway.dispatch_state": a.dispatch_state,
                "gateway.route_class": a.route_class,
            }
        )
        child = _tracer.start_span(
            f"{operation} {a.model}" if operation else f"attempt {a.ordinal}",
            context=context,
            kind=SpanKind.CLIENT,
            start_time=_ns(start),
            attributes=child_attributes,
        )
        if a.status != AttemptStatus.SUCCEEDED:
            child.set_attribute("error.type", a.failure_class or a.status)
            child.set_status(Status(StatusCode.ERROR))
        child.end(end_time=_ns(start + timedelta(milliseconds=a.elapsed_ms)))
    root.end(end_time=_ns(finished))
