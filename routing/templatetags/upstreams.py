"""HTML fragments of /admin/upstreams/ that repeat per model and per route class.

They are built here with plain string formatting rather than in the template: a pool of hundreds of
assignments with dozens of models each is thousands of rows, and the template engine (or
`format_html`, through its lazy-string wrappers) costs tens of microseconds per fragment where this
costs one or two. Every interpolated value goes through `html.escape` (quotes included), and none is a
secret (see `routing.policy.panel`)."""

from datetime import UTC, datetime
from html import escape

from django import template
from django.utils.safestring import SafeString, mark_safe

from routing.policy.capabilities import Effective
from routing.policy.panel import AssignmentRow, Headroom, HeadroomState, ModelRow, Signal
from routing.policy.pricing import price_text

register = template.Library()

STATE_ICONS = {"closed": "●", "open": "■", "half_open": "◐"}
VALUE_ICONS = {"true": "✓", "false": "✗", "unknown": "?"}


def _badge(value: str) -> str:
    word = escape(str(value))
    icon = VALUE_ICONS.get(word)
    if icon is None:
        return f'<span class="value" data-value="{word}">{word}</span>'
    glyph = f'<span aria-hidden="true">{icon}</span>'
    return f'<span class="value value-{word}" data-value="{word}">{glyph} {word}</span>'


@register.filter
def value_badge(value) -> SafeString:
    """true / false / unknown as a glyph and the word; unknown is styled apart (italic, dashed)."""
    return mark_safe(_badge(value))  # noqa: S308 - built from escaped values only


def _time(value: datetime) -> str:
    value = value.astimezone(UTC)
    return f'<time datetime="{value.isoformat()}">{value:%H:%M:%S} UTC</time>'


def _reason(code: str, words: str) -> str:
    return f'<span class="signal-reason" data-reason="{escape(code)}">reason: {escape(words)}</span>'


def _signal(s: Signal) -> str:
    body = f'<span class="signal-state">{escape(s.state_text)}</span>'
    until = ""
    if s.until is not None:
        until = f' data-until="{s.until.isoformat()}"'
        body += f" {_time(s.until)}"
        if s.seconds_left:
            body += f' <span class="muted nowrap">(in {s.seconds_left} s)</span>'
    if s.detail:
        body += f'<span class="signal-detail">{escape(s.detail)}</span>'
    if s.reason:
        body += _reason(s.reason, s.reason_text)
    body += f'<span class="signal-health">router: {escape(s.health)}</span>'
    state, health = escape(s.state), escape(s.health)
    return (
        f'<span class="signal signal-{state} health-{health}" data-route-class="{escape(s.route_class)}"'
        f' data-state="{state}" data-health="{health}"{until}>'
        f'<span class="signal-icon" aria-hidden="true">{STATE_ICONS[s.state]}</span> {body}</span>'
    )


def _demotion(m: ModelRow) -> str:
    if m.demotion is None:
        return '<span class="muted" data-demoted="false">none</span>'
    d = m.demotion
    return (
        f'<span class="demotion" data-demoted="true" data-until="{d.until.isoformat()}">'
        f'<span aria-hidden="true">↓</span> demoted until {_time(d.until)}'
        f"{_reason(d.reason, d.reason_text)}</span>"
    )


def _latency(m: ModelRow) -> str:
    """The route's time-to-first-byte average, as the router orders and draws by it."""
    if m.latency is None:
        return '<span class="muted" data-latency-ms="">none yet</span>'
    return f'<span class="latency" data-latency-ms="{m.latency.ewma_ms:.0f}">{escape(m.latency.text)}</span>'


@register.simple_tag
def headroom(h: Headroom) -> SafeString:
    """low (until its demotion ends), ample, or unknown (muted: nothing says either way)."""
    if h.state is HeadroomState.LOW and h.until is not None:
        return mark_safe(f"low until {_time(h.until)}")  # noqa: S308 - built from escaped values only
    if h.state is HeadroomState.UNKNOWN:
        return mark_safe('<span class="muted">unknown</span>')
    return mark_safe(escape(h.state))  # noqa: S308 - escaped


def _cap(key: str, label: str, value: str) -> str:
    return (
        f'<span class="cap-line" data-capability="{key}"><span class="cap-name">{label}</span>'
        f" {_badge(value)}</span>"
    )


CAPABILITY_LABELS = {
    "tools": "Tools",
    "write_tools": "Write tools",
    "vision": "Vision",
    "role_separation": "Role separation",
    "tool_representation": "Tool representation",
}


def _effective(e: Effective) -> str:
    """One capability as eligibility uses it: the value, where it comes from, and for evidence its expiry."""
    key, source = escape(e.capability), escape(e.provenance)
    note = f'<span class="cap-source cap-source-{source}" data-provenance="{source}">{source}</span>'
    expires = ""
    if e.expires_at is not None:
        value = e.expires_at.astimezone(UTC)
        expires = f' data-expires="{value.isoformat()}"'
        when = f'<time datetime="{value.isoformat()}">{value:%Y-%m-%d %H:%M} UTC</time>'
        note += f' <span class="cap-expiry">until {when}</span>'
    label = CAPABILITY_LABELS.get(e.capability, key)
    return (
        f'<span class="cap-line" data-capability="{key}"{expires}>'
        f'<span class="cap-name">{label}</span> {_badge(e.value)} {note}</span>'
    )


def _capabilities(m: ModelRow) -> str:
    if not m.capabilities:  # not advertised: no route, nothing is eligible
        return (
            f'<span class="caps">{_cap("tools", "Tools", m.tools)}{_cap("vision", "Vision", m.vision)}</span>'
        )
    return f'<span class="caps">{"".join(_effective(e) for e in m.capabilities)}</span>'


def _price(m: ModelRow) -> str:
    """The price the router uses for this route, with where it comes from (never `$0` for unknown)."""
    if not m.advertised:
        return ""
    source = escape(m.price.provenance)
    return (
        f' <span class="price price-{source}" data-price-provenance="{source}">'
        f"price {escape(price_text(m.price))}</span>"
    )


def _model_row(m: ModelRow) -> str:
    model, provenance = escape(m.model), escape(m.provenance)
    signals = "".join(f'<td data-label="{escape(s.label)}">{_signal(s)}</td>' for s in m.signals)
    return (
        f'<tr data-model="{model}"><th scope="row" data-label="Model" class="model-id">'
        f'<span class="model-name">{model}</span> <span class="visually-hidden">provenance: </span>'
        f'<span class="provenance provenance-{provenance.replace(" ", "-")}" data-provenance="{provenance}">'
        f"{provenance}</span>{_price(m)}</th>"
        f'<td data-label="Capabilities">{_capabilities(m)}</td>'
        # Demotion and latency share a cell: a column more made the table wider than a 1280 px screen.
        f'{signals}<td data-label="Demotion, latency">{_demotion(m)}<br>latency {_latency(m)}</td></tr>'
    )


@register.simple_tag
def model_rows(assignment: AssignmentRow) -> SafeString:
    """The <tbody> rows of one assignment's models table."""
    return mark_safe("\n".join(_model_row(m) for m in assignment.models))  # noqa: S308 - escaped above
