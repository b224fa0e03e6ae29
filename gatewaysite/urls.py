from django.contrib import admin
from django.urls import path

from gatewaysite import health

urlpatterns = [
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("admin/", admin.site.urls),
]
