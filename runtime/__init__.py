"""Where the gateway steps around Django, Channels and httpx (STYLE.md, healthchecks: "when we step
around Django, it lives in one package with a test that fails on the upgrade that breaks it").

Each module here relies on internals of a library, not on its documented API, because the documented
way was measured to cost more than the gateway's own work or could not do what the gateway needs. Each
says which internals it relies on, and tests/runtime/ holds a contract test per module that checks them
(they exist, with the signatures used, and behave as relied on), so an upgrade that breaks one fails
there, by name, rather than as a slow or wrong request somewhere else:

- `handler`: Django's ASGI handler without middleware, request signals or a per-request thread context
  (the `/v1/` API; gatewaysite.asgi).
- `consumer`: a Channels websocket consumer without the per-message database thread hop and with no
  channel layer (the Responses websocket; proxy.consumers).
- `db`: the request path's way into the database, two small pools of long-lived threads that keep
  their connections (instead of Django's thread per request and its connection).
- `loopdb`: on PostgreSQL, the request path's read before dispatch on the event loop (psycopg_pool's
  async pool, built from Django's connection parameters) instead of `db`'s threads.
- `httpx_backend`: an httpx transport whose connections go through a given httpcore network backend
  (catalog discovery's checked destinations).
- `rawsql`: hand-written SQL for the few statements every request or hand-off runs, on the documented
  cursor API but around the ORM (measured: the ORM's query building cost more than the statement).

This package imports no app of the project, only the pure folders below it (`sigv4` signs a
`proxy.wire` provider's `SigV4`): every app may build on it (README "Layout", tests/test_layers.py).

One more step around the ORM lives where Django puts schema, in migrations: the configuration version
every node compares before reusing its routing cache is moved by database triggers on every write to
the configuration's tables (pools/migrations/0004, catalog/migrations/0002), so no write path can forget
it; tests/test_config_version_triggers.py holds every table's trigger through every migration and
tests/routing/test_selectors.py every kind of write moving the version.
"""
