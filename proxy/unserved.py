"""How a request ends that no attempt served (SPEC §4, §5.6): its outcome, status and typed answer.

The words are the gateway's own, never the provider's text: what happened, in the wording the
client's API documents where agents react to it (a context overflow reads as Anthropic or OpenAI
words it). The envelope is the transport's (`Dispatch.error_final`, `error_event`).
"""

import json
from dataclasses import dataclass, replace

from proxy.ledger.exchange import Failure, Final
from proxy.transport import Dispatch
from proxy.wire.providers.base import COUNT_TOKENS
from proxy.wire.sse import Dialect
from proxy.wire.translations.token_estimate import estimate_input_tokens
from routing.policy.errors import CODES, ErrorCode
from routing.policy.failures import Disposition, FailureClass
from routing.policy.plan import Plan
from routing.policy.types import IneligibleReason
from routing.policy.vocabulary import Outcome


@dataclass(frozen=True, slots=True)
class Unserved:
    """What the attempt loop saw of a request nothing served."""

    last: Failure | None  # the last attempt's failure; None: nothing was sent
    window: int | None  # the context window of the candidate that failed last
    excluded: IneligibleReason | None  # why the last candidate was passed over at its turn
    untranslatable: str | None  # the param a translation refused (the last candidate passed over)
    budget_unreachable: bool  # a reservation could not reach the database
    budget_refusal: str | None = None  # the key's budget refused it: why, with its amounts (SPEC §7.4)


def exclusion(unserved: Unserved, plan: Plan) -> IneligibleReason:
    """Why nothing was sent, when nothing was: the condition that excluded the last candidate."""
    return unserved.excluded or plan.exclusion_reason or IneligibleReason.CIRCUIT_OPEN


def _typed(
    framing: Dispatch, status: int, *, code: str, type: str, message: str, param: str | None, retry: bool
):
    final = framing.error_final(status, message=message, type=type, code=code, param=param)
    return code, status, replace(final, should_retry=retry)


def unserved_answer(
    unserved: Unserved,
    *,
    plan: Plan,
    path: str,
    body: dict,
    tokens: int,
    dialect: Dialect | None,
    framing: Dispatch,
) -> tuple[str, int, Final]:
    """(the exchange's outcome, its status, the client's answer). `tokens`: the request's estimate,
    `dialect`: the client's stream dialect (None: a plain request)."""
    last = unserved.last
    if last is None:
        return _nothing_sent(unserved, plan=plan, path=path, body=body, tokens=tokens, framing=framing)
    if last.disposition is Disposition.DISPATCH_UNKNOWN:
        code = ErrorCode.UPSTREAM_DISPATCH_UNKNOWN
        return _typed(
            framing,
            code.status,
            code=code,
            type="upstream_error",
            message=code.message,
            param=None,
            retry=False,
        )
    anthropic = path.startswith("/messages")
    message = failure_message(last, window=unserved.window, tokens=tokens, anthropic=anthropic)
    outcome = last.code or str(last.failure)
    if last.withheld and dialect is not None:
        # A stream that failed before any output: the withheld lifecycle once, then the failure.
        error = framing.error_event(
            dialect,
            type=last.error_type or "upstream_error",
            code=last.code,
            param=last.param,
            message=message,
            status=last.status if last.status and last.status >= 400 else None,
        )
        return outcome, 200, framing.events_final([*last.withheld, error])
    status = last.status if last.status and last.status >= 400 else 502
    final = framing.error_final(
        status, message=message, type=last.error_type or "upstream_error", code=last.code, param=last.param
    )
    # An identical retry may succeed only after a rate limit or a server-side failure (SPEC §4).
    retry = not last.final and (status == 429 or status >= 500)
    return (
        outcome,
        status,
        replace(final, should_retry=retry, retry_after=last.retry_after if status == 429 else None),
    )


def _nothing_sent(
    unserved: Unserved, *, plan: Plan, path: str, body: dict, tokens: int, framing: Dispatch
) -> tuple[str, int, Final]:
    """The answer when no attempt reached an upstream: why the plan sent nothing, or, for a token
    count, the gateway's own estimate."""
    if unserved.untranslatable is not None:
        # Nothing was sent: the last candidate could not be sent this request in its API.
        message = UNTRANSLATABLE_MESSAGE.format(unserved.untranslatable)
        code = ErrorCode.INVALID_REQUEST
        return _typed(
            framing,
            code.status,
            code=code,
            type=code,
            message=message,
            param=unserved.untranslatable,
            retry=False,
        )
    if path == COUNT_TOKENS:
        # No Anthropic-shaped account could count them: the gateway's own estimate, labelled as
        # such, rather than a 503 that stops a coding agent before every turn (SPEC §4).
        estimate = json.dumps({"input_tokens": estimate_input_tokens(body)}).encode()
        return Outcome.OK, 200, Final(200, estimate, headers=(("x-gateway-token-count", "estimated"),))
    if unserved.budget_unreachable:
        # Nothing was sent because the budget could not be reserved: the database, not the budget.
        code = ErrorCode.GATEWAY_UNAVAILABLE
        return _typed(
            framing, code.status, code=code, type=code, message=code.message, param=None, retry=True
        )
    reason = exclusion(unserved, plan)
    if reason is IneligibleReason.BUDGET:
        # The key's own condition, not an outage: a 429 the SDKs do not retry (SPEC §7.4); Anthropic
        # clients read its 429 as a rate_limit_error.
        code = ErrorCode.BUDGET_EXCEEDED
        message = unserved.budget_refusal or code.message
        return _typed(
            framing,
            code.status,
            code=code,
            type="insufficient_quota",
            message=message,
            param=None,
            retry=False,
        )
    anthropic = path.startswith("/messages")
    return _typed(
        framing,
        ErrorCode.NO_ELIGIBLE_BACKEND.status,
        code=ErrorCode.NO_ELIGIBLE_BACKEND,
        type="service_unavailable",
        message=no_eligible_message(reason, plan, tokens=tokens, anthropic=anthropic),
        param=str(reason),
        retry=ErrorCode.NO_ELIGIBLE_BACKEND.should_retry(str(reason)),
    )


UNTRANSLATABLE_MESSAGE = "The request uses a feature the API of the routes able to serve it cannot carry: {}."


def too_long(tokens: int, window: int | None) -> str | None:
    """Anthropic's documented wording for a context overflow, with both integers when known."""
    if window is not None and tokens > window:
        return f"prompt is too long: {tokens} tokens > {window} maximum"
    return None


def no_eligible_message(reason: IneligibleReason, plan: Plan, *, tokens: int, anthropic: bool) -> str:
    message = f"no eligible backend: {reason}"
    if reason is IneligibleReason.CONTEXT_WINDOW:
        windows = [
            v.candidate.context_window
            for v in plan.ineligible
            if IneligibleReason.CONTEXT_WINDOW in v.reasons and v.candidate.context_window is not None
        ]
        message_too_long = too_long(tokens, max(windows)) if windows else None
        if message_too_long is not None and anthropic:
            message = f"{message} ({message_too_long})"
    return message


def failure_message(last: Failure, *, window: int | None, tokens: int, anthropic: bool) -> str:
    """A relayed failure in the gateway's words; `window`: the context window of the candidate that
    failed last, `tokens`: the request's estimate, `anthropic`: the client speaks Anthropic Messages."""
    if last.final and last.code in CODES:
        return ErrorCode(last.code).message
    if last.failure is FailureClass.CONTEXT_OVERFLOW:
        # The upstream's own integers when it said them in its documented words, else the estimate.
        tokens, window = last.overflow or (tokens, window)
        if anthropic:
            return too_long(tokens, window) or "prompt is too long for the model's context window"
        if window is not None and tokens > window:
            return (
                f"This model's maximum context length is {window} tokens. "
                f"However, your messages resulted in {tokens} tokens."
            )
        return "This model's maximum context length was exceeded by the request."
    if last.failure is FailureClass.RATE_LIMITED:
        return "The upstream rate limit was reached; retry after the indicated time."
    if last.failure is FailureClass.QUOTA:
        return "The upstream account's quota is exhausted."
    if last.failure is FailureClass.UNAVAILABLE:
        return "The upstream is unavailable."
    if last.failure in (FailureClass.MODEL_UNAVAILABLE, FailureClass.MODEL_NOT_FOUND_CROSS):
        return "The upstream does not serve this model."
    return "The upstream rejected the request."
