"""/admin/upstreams/ in a real browser: Debian's headless Chromium driven by Playwright (no browser
download), against pytest-django's live server. An operator logs in, opens the page at phone and desktop
widths, opens a Routing panel with the keyboard only, checks that the states shown are the database's,
and runs axe-core (from the npm registry, injected into the page). Screenshots go to tests/artifacts/.

`.ci/run` installs Chromium and axe-core. Elsewhere these tests skip, saying what is missing; under CI
(CI=true) a missing piece fails instead, so they can never silently not run there."""

import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
from django.apps import apps
from django.utils import timezone

from routing.models import Circuit, Demotion
from tests.admin.conftest import PASSWORD, build_routing_state, make_user

CHROMIUM = Path("/usr/bin/chromium")
AXE = Path(__file__).resolve().parent / ".axe" / "node_modules" / "axe-core" / "axe.min.js"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDTHS = {"phone": 375, "desktop": 1280}
MAX_TABS = 200


def _missing(what: str, how: str) -> None:
    reason = f"{what} is missing: {how} (`.ci/run` installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; browser tests may not be skipped in CI")
    pytest.skip(reason)


@pytest.fixture
def chromium():
    """What the browser tests need on this machine, checked before any database work."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the playwright Python package", "pip install -e '.[dev]'")
    if not CHROMIUM.exists():
        _missing(str(CHROMIUM), "apt-get install -y chromium")
    if not AXE.exists():
        _missing(str(AXE), "npm --prefix tests/admin/.axe install --no-save axe-core@4")
    return CHROMIUM


def in_browser_thread(fn, *args):
    """Playwright's sync API keeps an event loop running in the thread that drives it, where Django
    refuses ORM calls; so the browser gets a thread of its own and hands back plain data."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args).result()


def _rows() -> dict[str, list[dict]]:
    """Every row of every table, to prove that browsing changed nothing. Logging in writes a session
    and the user's last_login, which is the login's doing, not the panel's."""
    rows = {}
    for model in apps.get_models():
        if model._meta.label == "sessions.Session":
            continue
        values = list(model.objects.order_by("pk").values())
        for row in values:
            row.pop("last_login", None)
        rows[model._meta.label] = values
    return rows


def _tab_to(page, selector: str) -> None:
    """Move the focus with Tab only, the way a keyboard user would, until `selector` has it."""
    for _ in range(MAX_TABS):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement === document.querySelector(s)", selector):
            return
    raise AssertionError(f"{selector} never received keyboard focus in {MAX_TABS} tabs")


SIGNALS_JS = """(root) => [...root.querySelectorAll('.signal')].map((e) => ({
    assignment: e.closest('article').dataset.assignment,
    model: e.closest('tr').dataset.model,
    route_class: e.dataset.routeClass,
    state: e.dataset.state,
    until: e.dataset.until || null,
    reason: e.querySelector('.signal-reason')?.dataset.reason || null,
    text: e.innerText,
    visible: e.checkVisibility(),
}))"""
DEMOTIONS_JS = """(root) => [...root.querySelectorAll('[data-demoted]')].map((e) => ({
    assignment: e.closest('article').dataset.assignment,
    model: e.closest('tr').dataset.model,
    demoted: e.dataset.demoted,
    text: e.innerText,
}))"""
UNKNOWN_JS = """(root) => [...root.querySelectorAll('.value-unknown')].map((e) => ({
    text: e.innerText.trim(),
    visible: e.checkVisibility(),
    style: getComputedStyle(e).fontStyle + ' ' + getComputedStyle(e).borderStyle,
}))"""
AXE_JS = "async () => await axe.run(document, {resultTypes: ['violations']})"


def browse(base_url: str, width: int) -> dict:
    """The operator's visit, in the browser thread. Returns what the page showed."""
    from playwright.sync_api import sync_playwright

    seen: dict = {}
    with sync_playwright() as playwright:
        # Playwright gives every launch a fresh temporary profile (user-data-dir).
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(f"{base_url}/admin/upstreams/")
        seen["anonymous_url"] = page.url
        page.fill("#id_username", "operator")
        page.fill("#id_password", PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base_url}/admin/upstreams/")

        methods: list[tuple[str, str]] = []
        page.on("request", lambda request: methods.append((request.method, request.url)))
        page.reload()
        seen["h1"] = page.locator("h1").inner_text()
        seen["breadcrumbs"] = page.locator(".breadcrumbs").inner_text()
        seen["html"] = page.content()

        summary = 'details[data-pool="alpha"] > summary'
        _tab_to(page, summary)
        seen["focus_outline"] = page.evaluate(
            "() => { const s = getComputedStyle(document.activeElement);"
            " return [s.outlineStyle, parseFloat(s.outlineWidth)]; }"
        )
        seen["open_before"] = page.locator('details[data-pool="alpha"]').get_attribute("open")
        page.keyboard.press("Enter")
        details = page.locator('details[data-pool="alpha"]')
        seen["open_after"] = details.get_attribute("open")
        seen["signals"] = details.evaluate(SIGNALS_JS)
        seen["demotions"] = details.evaluate(DEMOTIONS_JS)
        seen["unknown"] = details.evaluate(UNKNOWN_JS)
        usage = page.locator('.usage-table tr[data-model="gpt-5"] td')
        seen["usage_gpt5"] = [usage.nth(i).inner_text().strip() for i in range(4)]
        seen["overflow"] = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        seen["screenshot"] = ARTIFACTS / f"upstreams-{width}.png"
        page.screenshot(path=str(seen["screenshot"]), full_page=True)

        page.add_script_tag(path=str(AXE))
        seen["axe"] = page.evaluate(AXE_JS)["violations"]
        seen["methods"] = methods
        browser.close()
    return seen


@pytest.mark.parametrize("width", WIDTHS.values(), ids=WIDTHS.keys())
def test_operator_reads_the_routing_panel_with_the_keyboard(chromium, live_server, width):
    state = build_routing_state(timezone.now())
    make_user("operator", pools=(state.alpha,))
    before = _rows()

    seen = in_browser_thread(browse, live_server.url, width)

    assert "/admin/login/" in seen["anonymous_url"]
    assert seen["h1"] == "Upstreams"
    assert seen["breadcrumbs"].split() == ["Home", "\u203a", "Upstreams"]
    assert "zeta" not in seen["html"]  # the pool not granted to this operator

    assert seen["focus_outline"][0] != "none" and seen["focus_outline"][1] >= 2, seen["focus_outline"]
    assert seen["open_before"] is None
    assert seen["open_after"] is not None

    signals = {(s["assignment"], s["model"], s["route_class"]): s for s in seen["signals"]}
    assert all(s["visible"] for s in seen["signals"])
    rows = Circuit.objects.filter(pool=state.alpha).select_related("assignment")
    assert len(rows) == 5
    for circuit in rows:
        shown = signals.pop((circuit.assignment.name, circuit.model, circuit.route_class))
        assert shown["state"] == circuit.state
        words = {"closed": "closed", "open": "open until", "half_open": "half-open"}[circuit.state]
        assert words in shown["text"]
        assert shown["reason"] == (circuit.reason or None)
        assert f"reason: {circuit.reason.replace('_', ' ')}" in shown["text"]
        if circuit.state != "open":
            assert shown["until"] is None
        else:
            assert datetime.fromisoformat(shown["until"]) == circuit.open_until
            assert f"{circuit.open_until:%H:%M:%S} UTC" in shown["text"]
    # Every other (assignment, model, route class) has no row: closed.
    assert signals
    assert {s["state"] for s in signals.values()} == {"closed"}

    demotions = {(d["assignment"], d["model"]): d for d in seen["demotions"]}
    for demotion in Demotion.objects.filter(assignment__pool=state.alpha).select_related("assignment"):
        shown = demotions[(demotion.assignment.name, demotion.model)]
        live = demotion.until > state.now
        assert shown["demoted"] == ("true" if live else "false")
        if live:
            assert f"demoted until {demotion.until:%H:%M:%S} UTC" in shown["text"]

    assert seen["unknown"], "no unknown capability shown"
    for unknown in seen["unknown"]:
        assert unknown["visible"] and unknown["text"] == "? unknown"
        assert unknown["style"] == "italic dashed"

    assert seen["usage_gpt5"] == ["3", "2", "1", "30"]
    assert seen["overflow"] <= 0, f"the page scrolls sideways by {seen['overflow']}px at {width}px"
    assert seen["screenshot"].stat().st_size > 0

    serious = [v for v in seen["axe"] if v["impact"] in ("serious", "critical")]
    assert serious == [], [(v["id"], v["help"], [n["target"] for n in v["nodes"]][:5]) for v in serious]

    assert seen["methods"], "the page made no request"
    assert {method for method, _ in seen["methods"]} == {"GET"}, seen["methods"]
    assert _rows() == before
