"""The Responses websocket prewarm (issue 44): Codex opens its websocket with the turn's request marked
`generate: false`, waits for `response.completed`, then sends the turn with `previous_response_id` and
only what is new (often nothing). On a bridged account the gateway answers the prewarm as OpenAI does,
with no upstream call, and keeps its conversation for the next frame; on a native account the frame is
relayed as it is. A raw websocket client -> the gateway under uvicorn -> fakes on loopback."""

from catalog.models import Provenance
from pools.models import Adapter
from proxy.ledger.models import RequestRecord
from tests.factories import AssignmentFactory, CatalogEntryFactory
from tests.gateway_fixtures import UPSTREAM_KEY_ENV
from tests.providers.test_responses_bridge_ws import MODEL, TOOLS, claude, create, open_ws, pool
from tests.proxy.fixtures_e2e import wait_for
from tests.proxy.test_anthropic_ingress import TOOL_READY

__all__ = ["claude", "pool"]  # the fixtures this module uses

# Codex's prewarm carries its developer instructions alone; the turn adds the user's message.
DEVELOPER = {"type": "message", "role": "developer", "content": "Only touch /tmp."}
USER = {"type": "message", "role": "user", "content": "Tidy up"}
TURN = {"input": [DEVELOPER], "tools": TOOLS}


def test_a_prewarm_on_a_bridged_account_is_answered_by_the_gateway_and_continued(gateway, claude):
    with open_ws(gateway) as ws:
        warm = create(ws, **TURN, generate=False)
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert [e["sequence_number"] for e in warm] == [0, 1]
        done = warm[-1]["response"]
        assert (done["status"], done["output"], done["model"]) == ("completed", [], MODEL)
        assert done["id"].startswith("resp_") and warm[0]["response"]["id"] == done["id"]
        assert claude.hits == []  # answered without an upstream call
        turn = create(ws, previous_response_id=done["id"], input=[USER], tools=TOOLS)
    assert turn[-1]["type"] == "response.completed", turn[-1]
    assert turn[-1]["response"]["output"][0]["name"] == "read_file"
    # The turn reached the account whole: the prewarm's input, as if sent with it.
    (hit,) = claude.hits
    assert (hit["system"], hit["messages"]) == ("Only touch /tmp.", [{"role": "user", "content": "Tidy up"}])
    records = RequestRecord.objects.order_by("started_at")
    prewarm_record, turn_record = wait_for(
        lambda: list(records.all()) if records.count() == 2 else None, what="both frames' ledger rows"
    )
    assert (prewarm_record.outcome, prewarm_record.attempts.count()) == ("ok", 0)
    assert (turn_record.outcome, turn_record.attempts.count()) == ("ok", 1)


def test_a_prewarm_on_a_native_account_is_relayed_as_it_is(gateway, pool, claude, fake_upstream_factory):
    native = fake_upstream_factory("native", models=(MODEL,))
    account = AssignmentFactory(
        pool=pool,
        name="native",
        adapter=Adapter.OPENAI,
        base_url=native.base_url,
        tier=0,
        api_key_env=UPSTREAM_KEY_ENV,
        **TOOL_READY,
    )
    CatalogEntryFactory(assignment=account, model=MODEL, provenance=Provenance.CONFIGURED)
    with open_ws(gateway) as ws:
        create(ws, **TURN, generate=False)
    (hit,) = native.hits
    assert hit.body["generate"] is False and hit.body["input"] == TURN["input"]
    assert claude.hits == []
