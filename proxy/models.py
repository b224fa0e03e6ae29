"""The proxy app's models, as Django loads them: the request ledger's records live in
`proxy.ledger.models`."""

from proxy.ledger.models import Attempt, DailySpend, RequestRecord, cost_is_unknown

__all__ = ["Attempt", "DailySpend", "RequestRecord", "cost_is_unknown"]
