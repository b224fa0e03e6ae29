from django.contrib import admin
from django.urls import path

from gatewaysite import health
from proxy import files, views

urlpatterns = [
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("metrics", views.metrics),
    # The proxied POST routes (chat completions, responses, messages, embeddings) are answered at the
    # ASGI edge (gatewaysite.asgi, proxy.views.PROXIED), without Django's request and response.
    path("v1/models", views.models),
    # A model id may hold slashes (OpenRouter's `openai/gpt-5`).
    path("v1/models/<path:model_id>", views.model),
    # POST v1/files (the upload) is served at the ASGI edge before its body is read (gatewaysite.asgi).
    path("v1/files/<str:file_id>", files.file_object),
    path("v1/files/<str:file_id>/content", files.file_content),
    path("admin/", admin.site.urls),
]
