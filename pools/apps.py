from django.apps import AppConfig


class PoolsConfig(AppConfig):
    name = "pools"
    default_auto_field = "django.db.models.BigAutoField"
