"""An httpx transport whose connections go through a given httpcore network backend (httpx 0.28,
httpcore 1).

httpx's `HTTPTransport` takes no network backend, so its connection pool is replaced by an equal one
that has it: the same TLS context httpx would build, with `trust_env=False` (no proxy, no SSL_CERT_FILE
from the environment). Everything else stays httpx's: request and response mapping, and httpcore's
exceptions mapped to httpx's.

Internals relied on (tests/runtime/test_transport.py): `HTTPTransport._pool` is the httpcore pool that
`handle_request` sends through; `httpcore.ConnectionPool(ssl_context=, network_backend=)`.
"""

import httpcore
import httpx


def transport_through(backend: httpcore.NetworkBackend) -> httpx.HTTPTransport:
    transport = httpx.HTTPTransport(trust_env=False)
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=backend
    )
    return transport
