"""Liveness and readiness probes."""

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection
from django.http import JsonResponse


async def healthz(request):
    return JsonResponse({"status": "ok"})


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
    if await sync_to_async(_database_reachable)():
        return JsonResponse({"status": "ready"})
    return JsonResponse({"status": "unavailable", "reason": "database unreachable"}, status=503)
