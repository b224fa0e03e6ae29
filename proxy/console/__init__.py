"""The operator pages of the admin (SPEC §9): the routing panel (`upstreams`), spend (`spend`) and the
request ledger (`requests`). They read the ledger and the routing state; `proxy.admin` registers them."""
