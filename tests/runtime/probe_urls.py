"""A URL configuration of probe views for the runtime contract tests (no database, no gateway)."""

import asyncio

from django.http import HttpResponse
from django.urls import path

closed: list[str] = []
cancelled: list[str] = []


async def answer(request):
    response = HttpResponse(b"answered", content_type="text/plain")
    response._resource_closers.append(lambda: closed.append(request.path))
    return response


async def hang(request):
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        cancelled.append(request.path)
        raise
    return HttpResponse(b"never")


async def fail(request):
    raise RuntimeError("probe")


urlpatterns = [path("answer", answer), path("hang", hang), path("fail", fail)]
