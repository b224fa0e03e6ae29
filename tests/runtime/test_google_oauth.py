"""runtime.google_oauth: a key file is exchanged by google-auth once and its token kept while valid, one
exchange at a time per key file whatever the concurrency; what fails is classified as the credential's or
the token endpoint's. Against the Vertex fake's token endpoint (devkit.vertex), over httpx."""

import json
import threading

import httpx
import pytest
from google.auth import exceptions

from devkit.vertex import VertexFake
from runtime import google_oauth


@pytest.fixture
def fake():
    with VertexFake() as running:
        yield running
        google_oauth.forget(running.key_file())


def test_concurrent_callers_share_one_exchange_and_its_token(fake):
    key_file = fake.key_file()
    tokens: list[str] = []
    with httpx.Client() as client:
        request = google_oauth.HttpxRequest(client)
        threads = [
            threading.Thread(target=lambda: tokens.append(google_oauth.access_token(key_file, request)))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(tokens) == 8 and len(set(tokens)) == 1
    assert fake.exchanges == 1
    assert google_oauth.cached_token(key_file) == tokens[0]
    google_oauth.forget(key_file)
    assert google_oauth.cached_token(key_file) is None


@pytest.mark.parametrize(
    "key_file",
    ["not json", json.dumps({"type": "authorized_user"}), json.dumps({"type": "service_account"})],
    ids=["not json", "not a service account", "no project"],
)
def test_a_file_that_is_not_a_usable_key_file_is_the_credential_s(key_file):
    with pytest.raises(google_oauth.KeyFileError) as refused:
        google_oauth.access_token(key_file, google_oauth.HttpxRequest(httpx.Client()))
    assert google_oauth.refused(refused.value)
    assert "not json" not in str(refused.value)  # the gateway's words, nothing of the file


def test_a_revoked_key_is_refused_and_an_unreachable_endpoint_is_not(fake):
    fake.revoke_key()
    with httpx.Client() as client, pytest.raises(exceptions.RefreshError) as refused:
        google_oauth.access_token(fake.key_file(), google_oauth.HttpxRequest(client))
    assert google_oauth.refused(refused.value)
    moved = json.dumps({**json.loads(fake.key_file()), "token_uri": "http://127.0.0.1:9/token"})
    with httpx.Client() as client, pytest.raises(exceptions.TransportError) as unreachable:
        google_oauth.access_token(moved, google_oauth.HttpxRequest(client))
    assert not google_oauth.refused(unreachable.value)
