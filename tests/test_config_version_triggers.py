"""Every table whose rows routing caches per process keeps the triggers that move ConfigVersion
(pools/0004, catalog/0002). A guard, because SQLite loses a table's triggers whenever a migration
rebuilds that table (AddField with a constraint, AlterField...): such a migration must create them again
(see pools/0005 and catalog/0003), or every node keeps serving its stale cached configuration."""

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

TABLES = (
    "pools_pool",
    "pools_assignment",
    "pools_gatewaysettings",
    "pools_modelalias",
    "pools_modelfallback",
    "catalog_catalogentry",
    "catalog_capabilityevidence",
)


def _triggers(table: str) -> set[str]:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [table])
        else:
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", [table]
            )
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.parametrize("table", TABLES)
def test_the_config_version_triggers_survive_every_migration(table):
    expected = (
        {f"{table}_config_version_{event}" for event in ("insert", "update", "delete")}
        if connection.vendor == "sqlite"
        else {f"{table}_config_version"}
    )
    missing = expected - _triggers(table)
    assert not missing, (
        f"{table} lost {sorted(missing)}: a migration rebuilt the table (SQLite does for most column "
        "changes) without creating its ConfigVersion triggers again"
    )
