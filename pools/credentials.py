"""Upstream credentials at rest (SPEC §3): encrypted with `GATEWAY_CREDENTIALS_KEY`.

The key is a comma list of Fernet keys (`cryptography`'s MultiFernet): the first encrypts, every one
decrypts, so a key is rotated by putting the new one first, running `manage.py rotate_credentials`
(which re-encrypts every stored credential under it), then dropping the old one. A stored value is a
Fernet token (AES-128-CBC + HMAC-SHA256, authenticated): nothing of the credential is readable
without a key, and a token altered in the database does not decrypt.

A credential is never returned to a page, a dump or a log: only `credential_hint` (set or not, and
its last 4 characters) is shown. `api_key_env` names an environment variable read at each use; only
names starting with `GATEWAY_UPSTREAM_` may be named, so neither an operator nor a row written by
anything else can make the gateway send another of its variables (DJANGO_SECRET_KEY, DATABASE_URL)
to an upstream.
"""

import functools
import logging
import os
from typing import Protocol

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

ENV_PREFIX = "GATEWAY_UPSTREAM_"
HINT_LENGTH = 4

logger = logging.getLogger("gateway")


class CredentialKeyMissing(Exception):
    """GATEWAY_CREDENTIALS_KEY is not set: a credential cannot be stored."""


class CredentialUnreadable(Exception):
    """A stored credential does not decrypt with any key of GATEWAY_CREDENTIALS_KEY."""


def env_name_allowed(name: str) -> bool:
    """Whether `api_key_env` may name this variable."""
    return name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX)


@functools.lru_cache(maxsize=4)
def _multi(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def _fernet() -> MultiFernet:
    keys = tuple(settings.GATEWAY_CREDENTIALS_KEY)
    if not keys:
        raise CredentialKeyMissing
    return _multi(keys)


def can_encrypt() -> bool:
    return bool(settings.GATEWAY_CREDENTIALS_KEY)


def credential_encrypt(plain: str) -> str:
    """The token to store for `plain` (raises CredentialKeyMissing without a key)."""
    return _fernet().encrypt(plain.encode()).decode()


def credential_decrypt(token: str) -> str:
    keys = tuple(settings.GATEWAY_CREDENTIALS_KEY)
    if not keys:
        raise CredentialUnreadable
    try:
        return _decrypted(token, keys)
    except InvalidToken:
        raise CredentialUnreadable from None


# Every request to an account whose credential is stored decrypts it: 12 us of the event loop's CPU (a
# hot loop; more in place) for an HMAC, an AES decryption and two base64 decodings. The plaintext is
# kept per token and key set: a credential changed in admin is a new token, a key dropped from
# GATEWAY_CREDENTIALS_KEY a new key set (under which a token only that key opened does not decrypt),
# and a token that does not decrypt is not kept. Holding it exposes nothing the process does not hold
# already: it sends the credential with each request and holds the keys that decrypt every one.
@functools.lru_cache(maxsize=256)
def _decrypted(token: str, keys: tuple[str, ...]) -> str:
    return _multi(keys).decrypt(token.encode()).decode()


def credential_rotate(token: str) -> str:
    """`token` re-encrypted under the first key (raises CredentialUnreadable)."""
    try:
        return _fernet().rotate(token.encode()).decode()
    except (InvalidToken, CredentialKeyMissing):
        raise CredentialUnreadable from None


def credential_hint(plain: str) -> str:
    """What may be shown of a credential: its last 4 characters (none of a short one)."""
    return plain[-HINT_LENGTH:] if len(plain) >= 4 * HINT_LENGTH else ""


def credential_for(*, stored: str, api_key_env: str, assignment: str) -> str:
    """The credential to send: the stored one, else the allowed variable's value, else "" (nothing
    is sent). An unreadable stored credential or a forbidden variable name sends nothing and is
    logged, naming the assignment only."""
    if stored:
        try:
            return credential_decrypt(stored)
        except CredentialUnreadable:
            logger.error(
                "credential of assignment %r does not decrypt with GATEWAY_CREDENTIALS_KEY", assignment
            )
            return ""
    if not api_key_env:
        return ""
    if not env_name_allowed(api_key_env):
        logger.error("assignment %r names a variable outside %s*: not read", assignment, ENV_PREFIX)
        return ""
    return os.environ.get(api_key_env, "")


class Account(Protocol):
    """An assignment as the ORM has it, or as the router's `Target` carries it."""

    @property
    def name(self) -> str: ...

    @property
    def api_key_env(self) -> str: ...

    @property
    def credential(self) -> str: ...  # encrypted


def credential_of(account: Account) -> str:
    """`credential_for` an assignment or a router `Target`."""
    return credential_for(stored=account.credential, api_key_env=account.api_key_env, assignment=account.name)
