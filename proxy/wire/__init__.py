"""What travels on the wire, PURE: the client APIs the gateway serves (`apis/`), the translations between
them (`translations/`), the upstream providers' requests and answers (`providers/`), SSE framing (`sse`),
and usage read from answers (`payloads`). Standard library and
`routing.policy` only: no Django, no I/O, no clock."""
