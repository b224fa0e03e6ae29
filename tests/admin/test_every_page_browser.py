"""Every admin page fits the screen (issue 47 point 7): each registered ModelAdmin's changelist and change
page, and each operator page (Upstreams with every Routing panel open, Spend), in a real browser (Debian's
Chromium through Playwright) at 1280 and 375 px, as a superuser and as a pool operator. On none does the
page scroll sideways, nor does any box hide part of its content behind a scroll bar or a clip (a table
cut off inside its box is how the lists used to lose their last columns), nor does any visible element
reach past the viewport's right edge; a page that does not fit leaves its screenshot in tests/artifacts/.
At 375 px a changelist's rows read as cards: each cell on its own line, labelled with its column's name.

The pages are not a hand list: they are read from `admin.site`'s registry and its operator pages, so a
model registered tomorrow is checked here too. The data is the widest an operator meets: a 32-hex request
id, the longest outcome code, a cross-model fallback, long model names and base URLs."""

import itertools
import uuid
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone

from catalog.models import CapabilityEvidence, CatalogEntry, Provenance
from pools.models import Assignment, GatewayKey, GatewaySettings, ModelAlias, ModelFallback, Pool
from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Affinity, Circuit, Demotion
from tests.admin.conftest import PASSWORD, make_user
from tests.admin.test_upstreams_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    WIDTHS,
    chromium,  # noqa: F401 - the fixture
    in_browser_thread,
)

# What does not fit, on the page as the browser laid it out: the document's sideways scroll, every box
# whose content is wider than the box (scrolled or clipped), every visible element past the right edge.
# Form controls scroll their own text by design and are left out; so is what is hidden on purpose
# (visually-hidden captions, a select replaced by the admin's two-list widget).
FIT_JS = """() => {
    document.querySelectorAll('details').forEach((d) => { d.open = true; });
    const width = window.innerWidth;
    const own = new Set(['INPUT', 'TEXTAREA', 'SELECT', 'OPTION', 'svg']);
    const classes = (e) => typeof e.className === 'string' && e.className
        ? '.' + e.className.trim().split(/\\s+/).join('.') : '';
    const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + classes(e);
    // Clipped to nothing on purpose: a header row kept for screen readers, a visually-hidden caption.
    const clippedAway = (e) => {
        for (let a = e; a && a !== document.body; a = a.parentElement) {
            if (getComputedStyle(a).clip !== 'auto') return true;
        }
        return false;
    };
    const shown = (e) => e.checkVisibility({visibilityProperty: true}) && !clippedAway(e);
    const clipped = [], beyond = [];
    for (const e of document.body.querySelectorAll('*')) {
        if (own.has(e.tagName) || e.closest('svg, select') || !shown(e)) continue;
        const style = getComputedStyle(e);
        // Shortened on purpose, its whole text in the DOM (for a copy) and in its title (on hover).
        const shortened = style.textOverflow === 'ellipsis' && e.title;
        const scrolls = e.scrollWidth - e.clientWidth > 1;
        if (style.overflowX !== 'visible' && style.textIndent === '0px' && !shortened && scrolls) {
            clipped.push(name(e) + ' hides ' + (e.scrollWidth - e.clientWidth) + 'px');
        }
        const r = e.getBoundingClientRect();
        if (r.width > 0 && r.height > 0 && r.right > width + 1) {
            beyond.push(name(e) + ' ends at ' + Math.round(r.right) + 'px');
        }
    }
    return {
        scroll: document.documentElement.scrollWidth - width,
        clipped: clipped.slice(0, 5),
        beyond: beyond.slice(0, 5),
    };
}"""
# A changelist's first row as the browser shows it: each cell's box, and the label drawn before it.
CARD_JS = """() => {
    const row = document.querySelector('#result_list tbody tr');
    if (!row) return null;
    return [...row.children].map((cell) => {
        const r = cell.getBoundingClientRect();
        return {cls: cell.className, left: r.left, top: r.top, width: r.width,
                label: getComputedStyle(cell, '::before').content};
    });
}"""


def _long_world(name: str, now) -> dict:
    """One pool's rows of every kind, with the widest values they hold in practice."""
    pool = Pool.objects.create(name=f"{name}-pool", auto_models=["claude-sonnet-4-5-20250929", "gpt-5-mini"])
    assignment = Assignment.objects.create(
        pool=pool,
        name=f"{name}-openrouter-account-eu-west",
        adapter="openrouter",
        base_url="https://openrouter.ai/api/v1",
        router="third_party",
        region="eu-west",
    )
    key = GatewayKey(
        name=f"{name}-ci-pipeline-key",
        allowed_models=["claude-sonnet-4-5-20250929", "gpt-5-mini", "anthropic/claude-opus-4-8"],
        regions=["eu-west", "us-east"],
        budget_micros=50_000_000,
        budget_period="month",
    )
    key.set_key(f"sk-gw-{name}-{uuid.uuid4().hex}")
    key.save()
    key.pools.set([pool])
    model = "anthropic/claude-opus-4-8-20261101"
    entry = CatalogEntry.objects.create(
        assignment=assignment, model=model, provenance=Provenance.OBSERVED, context_window=1_000_000
    )
    circuit = Circuit.objects.create(
        pool=pool,
        assignment=assignment,
        model=model,
        route_class="websocket",
        state="open",
        reason="upstream_model_unavailable",
        consecutive_failures=3,
        cooldown_seconds=600,
        open_until=now + timedelta(minutes=10),
    )
    demotion = Demotion.objects.create(
        assignment=assignment,
        model=model,
        reason="upstream_model_unavailable",
        until=now + timedelta(minutes=5),
    )
    record = RequestRecord.objects.create(
        request_id=uuid.uuid4().hex,
        key=key,
        route="/v1/chat/completions",
        transport="http",
        requested_model="claude-opus-5-20261201",
        served_model=model,
        outcome="upstream_dispatch_unknown",
        started_at=now,
        finished_at=now + timedelta(milliseconds=1450),
    )
    attempt = Attempt.objects.create(
        request=record,
        ordinal=1,
        assignment=assignment,
        model=model,
        route_class="http",
        status="succeeded",
        dispatch_state="completed",
        upstream_status=200,
        elapsed_ms=1400,
        input_tokens=123_456,
        output_tokens=7_890,
        cached_read_tokens=100_000,
        cost_micros=1_234_567,
    )
    affinity = Affinity.objects.create(
        gateway_key=key,
        kind="response",
        key=f"resp_{uuid.uuid4().hex}{uuid.uuid4().hex}",
        assignment=assignment,
        model=model,
        expires_at=now + timedelta(hours=1),
    )
    evidence = CapabilityEvidence.objects.create(
        assignment=assignment,
        model=model,
        capability="write_tools",
        qualified=True,
        detail="tool_call",
        qualified_at=now,
        expires_at=now + timedelta(days=30),
        corpus_version="2026-12-01",
        config_hash="0123456789abcdef",
    )
    rows = (pool, assignment, key, entry, circuit, demotion, record, attempt, affinity, evidence)
    return {type(row): row for row in rows}


def _build(now) -> dict[str, User]:
    alpha = _long_world("alpha", now)
    _long_world("bravo", now)
    GatewaySettings.objects.create(pk=1)
    ModelAlias.objects.create(alias="opus", canonical="anthropic/claude-opus-4-8-20261101")
    ModelFallback.objects.create(
        requested="claude-opus-5-20261201", served="anthropic/claude-opus-4-8-20261101"
    )
    operator_perms = tuple(
        Permission.objects.filter(codename__regex=r"^(view|change)_")
        .exclude(content_type__app_label="auth")  # users and groups are a superuser's (SECURITY.md)
        .values_list("codename", flat=True)
    )
    users = {
        "superuser": make_user("root", superuser=True),
        "operator": make_user("pool-operator", perms=operator_perms, pools=(alpha[Pool],)),
    }
    return {"users": users, "alpha": alpha}


def _pages(user: User, alpha: dict) -> list[str]:
    """Every page of the site `user` may open: each registered ModelAdmin's changelist and the change
    page of one of its rows (the alpha pool's, which both users may see), and each operator page."""
    request = RequestFactory().get("/admin/")
    request.user = user
    pages = []
    for model, model_admin in sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label):
        if not model_admin.has_view_or_change_permission(request):
            continue
        info = (model._meta.app_label, model._meta.model_name)
        pages.append(reverse("admin:{}_{}_changelist".format(*info)))
        row = alpha.get(model) or model_admin.get_queryset(request).order_by("pk").first()
        if row is not None:
            pages.append(reverse("admin:{}_{}_change".format(*info), args=[row.pk]))
    for page in admin.site._pages:
        if admin.site._registry[page.model].has_view_permission(request):
            pages.append(reverse(f"admin:{page.url_name}"))
    return pages


def visit(base_url: str, username: str, width: int, pages: list[str]) -> dict:
    from playwright.sync_api import sync_playwright

    seen: dict = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(f"{base_url}/admin/login/?next=/admin/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base_url}/admin/")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for path in pages:
            response = page.goto(f"{base_url}{path}")
            fit = page.evaluate(FIT_JS)
            seen[path] = {"status": response.status, **fit, "cards": page.evaluate(CARD_JS)}
            if fit["scroll"] > 0 or fit["clipped"] or fit["beyond"]:  # a picture of what does not fit
                shot = "-".join(part for part in path.split("/") if part and part != "admin")
                page.screenshot(path=str(ARTIFACTS / f"page-{username}-{width}-{shot}.png"), full_page=True)
        browser.close()
    return seen


@pytest.mark.parametrize("width", WIDTHS.values(), ids=WIDTHS.keys())
@pytest.mark.parametrize("role", ["superuser", "operator"])
def test_every_admin_page_fits_the_screen(chromium, live_server, role, width):  # noqa: F811
    world = _build(timezone.now())
    user = world["users"][role]
    pages = _pages(user, world["alpha"])
    # The operator reaches every page of its pools' data: each pool-scoped changelist and change page.
    assert len(pages) >= (2 * 10 + 2 if role == "operator" else 2 * len(admin.site._registry) + 2), pages

    seen = in_browser_thread(visit, live_server.url, user.username, width, pages)

    assert {path: s["status"] for path, s in seen.items() if s["status"] != 200} == {}
    misfits = {
        path: {k: s[k] for k in ("scroll", "clipped", "beyond") if s[k]}
        for path, s in seen.items()
        if s["scroll"] > 0 or s["clipped"] or s["beyond"]
    }
    assert misfits == {}, f"{len(misfits)} of {len(seen)} pages do not fit {width} px as {role}"
    if width == WIDTHS["phone"]:
        for path, s in seen.items():
            cells = [c for c in s["cards"] or () if "action-checkbox" not in c["cls"]]
            if len(cells) < 2:
                continue
            # A card: one cell under the other, each as wide as the card, each labelled.
            assert len({round(c["left"]) for c in cells}) == 1, (path, cells)
            assert all(b["top"] > a["top"] for a, b in itertools.pairwise(cells)), (path, cells)
            unlabelled = [c["cls"] for c in cells[1:] if c["label"] in ("none", "normal", "")]
            assert unlabelled == [], (path, unlabelled)
