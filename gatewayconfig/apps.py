from django.apps import AppConfig


class GatewayConfigConfig(AppConfig):
    """The YAML configuration file (SPEC §3): `manage.py load_gateway_config` and `dump_gateway_config`.
    No models of its own: it reads and writes the pools' and the catalog's, so it sits above both."""

    name = "gatewayconfig"
