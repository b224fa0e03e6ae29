"""Websocket routes (SPEC §6.3)."""

from django.urls import path

from proxy.consumers import ResponsesConsumer

websocket_urlpatterns = [path("v1/responses", ResponsesConsumer.as_asgi())]
