"""The routing rules, PURE: what a request requires (`types`), which model it resolves to (`resolution`),
which accounts may serve it (`eligibility`, `capabilities`, `budget`, `routes`), in what order
(`preference`, `plan`, `route`), what an upstream's failure means (`failures`) and what it does to the
account's health (`breaker`, `headroom`, `latency`). Standard library and each other only; `now` is
always passed in."""
