from django.apps import AppConfig


class ProxyConfig(AppConfig):
    name = "proxy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from proxy.ledger import tracing

        tracing.configure()
