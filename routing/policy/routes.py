"""Which upstream adapters can carry each client route (SPEC §4, §5.3).

PURE. Each provider declares the client routes it carries, as sent or translated (`proxy.wire.providers`);
`carrier_table` turns those declarations into the table eligibility reads as `Requirements.adapters`, so
the router, `auto` and `routing_explain` agree on it.
"""

from collections.abc import Mapping


def carrier_table(carried: Mapping[str, frozenset[str]]) -> Mapping[str, frozenset[str]]:
    """adapter -> the routes it carries, turned into route -> the adapters that carry it."""
    table: dict[str, set[str]] = {}
    for adapter, routes in carried.items():
        for route in routes:
            table.setdefault(route, set()).add(adapter)
    return {route: frozenset(adapters) for route, adapters in table.items()}
