"""Database errors in the log (issue 45 finding 9). Threat (SECURITY.md, Assets): a database error's
message carries row data (PostgreSQL's `DETAIL: Failing row contains (...)` with a `gatewaykey` row's
hash and prefix) and the log prints it. The process's logging as Django configures it from the settings
(`LOGGING_CONFIG`, `gatewaysite.logsafe`): every record is formatted by the gateway's own handler."""

from __future__ import annotations

import logging

import pytest
from django.db import connection, transaction

from pools.models import GatewayKey
from tests.factories import GatewayKeyFactory

pytestmark = [pytest.mark.attack, pytest.mark.django_db]
CANARY = "canary7f3a9c"


def _printed(caplog) -> str:
    """What the gateway's console handler prints for each captured record."""
    handlers = logging.getLogger("gateway").handlers
    (handler,) = [h for h in handlers if type(h) is logging.StreamHandler]  # not caplog's own
    return "\n".join(handler.format(record) for record in caplog.records)


def _log_every_way(exc: BaseException) -> None:
    log = logging.getLogger("gateway")
    log.exception("the ledger could not save a batch")
    log.error("a statement failed: %s", exc)
    log.warning(exc)
    try:
        raise RuntimeError("a caller's own error") from exc
    except RuntimeError:
        log.exception("wrapped")


def test_a_database_error_is_logged_as_its_class_and_sqlstate_never_its_message(caplog):
    with caplog.at_level(logging.INFO, logger="gateway"):
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT * FROM no_such_table_{CANARY}")
        except Exception as exc:
            _log_every_way(exc)
    printed = _printed(caplog)
    assert CANARY not in printed
    assert printed.count("(sqlstate ") >= 4
    assert "Traceback (most recent call last)" in printed  # the stack stays: only the message goes
    assert "RuntimeError: a caller's own error" in printed


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite's messages carry no row")
def test_a_failing_gatewaykey_row_never_reaches_the_log(caplog):
    """PostgreSQL puts the whole row, hash and prefix, into the error's DETAIL."""
    key = GatewayKeyFactory(name=f"client-{CANARY}", raw_key="sk-gw-canary-row-secret-0000000000")
    with caplog.at_level(logging.INFO, logger="gateway"):
        try:
            with transaction.atomic():
                GatewayKey.objects.filter(pk=key.pk).update(spent_micros=-1)
        except Exception as exc:
            assert key.key_hash in str(exc) or CANARY in str(exc)  # the attack: the row is in the message
            _log_every_way(exc)
    printed = _printed(caplog)
    assert CANARY not in printed and key.key_hash not in printed and key.prefix not in printed
    assert "IntegrityError (sqlstate 23514)" in printed
