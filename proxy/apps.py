from django.apps import AppConfig


class ProxyConfig(AppConfig):
    name = "proxy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from proxy import tracing

        tracing.configure()
