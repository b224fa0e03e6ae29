import os

import pytest

from routing.selectors import config_cache_clear

pytest_plugins = ["tests.upstream_fixtures", "tests.gateway_fixtures", "tests.db_flush"]


@pytest.fixture(autouse=True)
def _fresh_routing_config_cache():
    """Each test starts with an empty per-process routing config cache. In production the config
    version only grows; a test database is emptied between tests, so versions (and SQLite ids) can
    repeat and a previous test's cached configuration could otherwise match; so could the figures the
    read before dispatch keeps for a tenth of a second (`routing.request_state.Reader.figures`), and the
    pools it guesses a key it does not know has."""
    from routing.request_state import READER

    config_cache_clear()
    READER.figures.clear()
    READER.last_pools = None


@pytest.fixture(autouse=True)
def _fresh_known_keys():
    """The edge remembers keys it saw valid (proxy.edge); a test database reuses hashes and ids."""
    from proxy.edge import known_keys_clear

    known_keys_clear()


@pytest.fixture(autouse=True)
def _private_ledger_spool(tmp_path_factory, monkeypatch):
    """Each test's own ledger spool (and its gateway subprocesses'), never the repository's
    var/spool: a record spooled by one test's gateway must not be replayed into another's database."""
    from django.conf import settings

    spool = str(tmp_path_factory.mktemp("ledger-spool"))
    monkeypatch.setenv("GATEWAY_LEDGER_SPOOL_DIR", spool)
    monkeypatch.setattr(settings, "GATEWAY_LEDGER_SPOOL_DIR", spool)


@pytest.fixture(autouse=True)
def _no_background_affinity_prune():
    """The process-wide ledger writer prunes expired affinities once a minute (proxy.ledger.recorder). The
    SQLite test database is a shared cache with table locks and no busy timeout, so that background
    DELETE could make a request's own affinity write fail at random; the prune is tested on a writer
    of its own (tests/proxy/test_ledger_writer.py)."""
    import math

    from proxy.ledger import recorder as ledger

    ledger.writer._next_prune = math.inf


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix) -> None:
    """A test database of this run's own (its name ends with the runner's process id): two test runs in
    one checkout at once (two engineers, an editor's runner beside `make test`) would otherwise build,
    flush and drop the same database under each other. Dropped at the end as before."""
    from django.conf import settings

    for database in settings.DATABASES.values():
        test = database.setdefault("TEST", {})
        name = test.get("NAME") or f"test_{database['NAME']}"
        test["NAME"] = f"{name}_p{os.getpid()}"
