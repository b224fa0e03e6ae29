"""Liveness and readiness probes."""

import asyncio

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection
from django.http import JsonResponse


async def healthz(request):
    return JsonResponse({"status": "ok"})


READYZ_TIMEOUT_S = 3.0


def _database_reachable() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError:
        connection.close()
        return False
    return True


async def readyz(request):
    try:
        # A silent database (no TCP error, no answer) must not hang the probe.
        reachable = await asyncio.wait_for(sync_to_async(_database_reachable)(), READYZ_TIMEOUT_S)
    except TimeoutError:
        reachable = False
    if reachable:
        return JsonResponse({"status": "ready"})
    return JsonResponse({"status": "unavailable", "reason": "database unreachable"}, status=503)
