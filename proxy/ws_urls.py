"""Websocket routes (SPEC §6.3); any other path is refused at the handshake."""

from django.urls import path, re_path

from proxy.consumers import NoSuchRoute, ResponsesConsumer

websocket_urlpatterns = [
    path("v1/responses", ResponsesConsumer.as_asgi()),
    re_path(r"", NoSuchRoute.as_asgi()),
]
