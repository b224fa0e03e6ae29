from django.contrib.admin.apps import AdminConfig


class GatewayAdminConfig(AdminConfig):
    """django.contrib.admin with the gateway's site as `admin.site` (see `GatewayAdminSite`)."""

    default_site = "gatewaysite.admin.GatewayAdminSite"
