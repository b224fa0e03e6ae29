"""Any change to what routing caches bumps the config version (see `ConfigVersion`). Bulk writes,
which send no signals, bump it themselves (catalog sync, load_gateway_config)."""

from django.db.models.signals import post_delete, post_save

from catalog.models import CatalogEntry
from pools.models import Assignment, ConfigVersion, GatewaySettings, ModelAlias, ModelFallback, Pool

CACHED = (Pool, Assignment, CatalogEntry, GatewaySettings, ModelAlias, ModelFallback)


def _bump(sender, **kwargs) -> None:
    ConfigVersion.bump()


def connect() -> None:
    for model in CACHED:
        post_save.connect(_bump, sender=model, dispatch_uid=f"config-version-save-{model.__name__}")
        post_delete.connect(_bump, sender=model, dispatch_uid=f"config-version-delete-{model.__name__}")
