"""OpenTelemetry traces (issue 20): one span per request, one child per attempt, GenAI attribute
names, nothing of the content. Driven through a live gateway; read with the SDK's in-memory exporter."""

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from devkit.behaviours import model_not_found, serve
from proxy.ledger import recorder as ledger
from proxy.ledger import tracing
from tests.gateway_fixtures import GATEWAY_KEY

PROMPT_CANARY = "prompt-canary-5b1d-never-in-a-span"
ANSWER_CANARY = "answer-canary-77ae-never-in-a-span"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    yield exporter
    tracing.disable()


def test_a_failover_is_one_request_span_with_a_child_per_attempt(gateway, two_assignments, spans):
    a, b, _ = two_assignments
    a.script("gpt-5", model_not_found())
    b.script("gpt-5", serve(ANSWER_CANARY, input_tokens=12, output_tokens=3))

    response = httpx.post(
        f"{gateway}/v1/chat/completions",
        headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        json={"model": "gpt-5", "messages": [{"role": "user", "content": PROMPT_CANARY}]},
    )
    assert response.status_code == 200
    ledger.writer.flush()

    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.kind is SpanKind.SERVER]
    children = sorted((s for s in finished if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time)
    assert root.name == "chat gpt-5"
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.request.model"] == "gpt-5"
    assert root.attributes["gen_ai.response.model"] == "gpt-5"
    assert root.attributes["gen_ai.usage.input_tokens"] == 12
    assert root.attributes["gen_ai.usage.output_tokens"] == 3
    assert root.attributes["gateway.request_id"] == response.headers["x-gateway-request-id"]
    assert root.status.status_code is not StatusCode.ERROR

    assert [c.attributes["gateway.assignment"] for c in children] == ["acct-a", "acct-b"]
    assert all(c.parent.span_id == root.context.span_id for c in children)
    assert all(c.context.trace_id == root.context.trace_id for c in children)
    first, second = children
    assert first.attributes["gateway.attempt.status"] == "retryable_failed"
    assert first.attributes["error.type"] == "model_unavailable"
    assert first.status.status_code is StatusCode.ERROR
    assert second.attributes["gateway.attempt.status"] == "succeeded"
    assert second.attributes["gen_ai.provider.name"] == "openai"
    assert second.attributes["gen_ai.usage.output_tokens"] == 3
    # The attempts sit inside the request, one after the other.
    assert root.start_time <= first.start_time <= first.end_time <= second.start_time
    assert second.end_time <= root.end_time

    everything = repr([(s.name, dict(s.attributes), [e.attributes for e in s.events]) for s in finished])
    assert PROMPT_CANARY not in everything and ANSWER_CANARY not in everything
    assert GATEWAY_KEY not in everything and "sk-upstream-credential-canary" not in everything


def test_a_typed_failure_marks_the_request_span_as_an_error(gateway, two_assignments, spans):
    response = httpx.post(
        f"{gateway}/v1/chat/completions",
        headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 404
    ledger.writer.flush()

    (root,) = spans.get_finished_spans()
    assert root.attributes["error.type"] == "model_not_found"
    assert root.status.status_code is StatusCode.ERROR


def test_without_an_endpoint_nothing_is_traced(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    tracing.disable()
    tracing.configure()
    assert tracing._tracer is None


def test_spans_reach_an_otlp_collector_over_http(monkeypatch):
    """The real exporter, over a real socket: a collector on loopback receives the protobuf request."""
    import threading
    from datetime import UTC, datetime, timedelta
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from proxy.ledger.exchange import AttemptLog, Exchange

    received: list[tuple[str, str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            received.append((self.path, self.headers["content-type"], body))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    try:
        tracing.configure()
        start = datetime.now(UTC)
        tracing.record(
            Exchange(
                request_id="req-otlp-1",
                key_id=1,
                route="/v1/messages",
                transport="sse",
                requested_model="claude-x",
                started_at=start,
                finished_at=start + timedelta(milliseconds=40),
                served_model="claude-x",
                outcome="ok",
                status_code=200,
                attempts=[AttemptLog(1, 3, "claude-x", "sse", "succeeded", "completed", elapsed_ms=30)],
            )
        )
        tracing.flush()
    finally:
        tracing.disable()
        server.shutdown()

    ((path, content_type, body),) = received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    request = ExportTraceServiceRequest.FromString(body)
    names = sorted(s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
    assert names == ["chat claude-x", "chat claude-x"]
