"""Azure OpenAI's credential headers (pure): a resource key in `api-key`, an Entra ID token as a bearer."""

import pytest

from proxy.wire.providers.azure_openai import PROVIDER


@pytest.mark.parametrize(
    ("credential", "headers"),
    [
        ("0123456789abcdef0123456789abcdef", {"api-key": "0123456789abcdef0123456789abcdef"}),
        ("Bearer eyJ0eXAi.token", {"authorization": "Bearer eyJ0eXAi.token"}),
        ("Bearer  eyJ0eXAi.token ", {"authorization": "Bearer eyJ0eXAi.token"}),
        ("Bearer ", {}),  # a scheme without a token sends nothing rather than an empty bearer
        ("", {}),
    ],
)
def test_the_credential_travels_in_the_header_its_form_declares(credential, headers):
    assert PROVIDER.auth_headers(credential) == headers
