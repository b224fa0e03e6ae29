"""Websocket routes (SPEC §6.3). The Responses websocket consumer lands with the websocket relay."""

websocket_urlpatterns: list = []
