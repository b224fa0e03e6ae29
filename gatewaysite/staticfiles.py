"""WhiteNoise's middleware, its files read asynchronously under ASGI (issue 47 point 4).

WhiteNoise answers with a `FileResponse` over the file, a synchronous iterator: Django's ASGI handler
then reads it whole in a thread, warning "StreamingHttpResponse must consume synchronous iterators"
on every static file. Here the same blocks are read one at a time in a worker thread, so the event
loop never waits on the disk and nothing is warned. Under WSGI (the test client) it is unchanged.
"""

import asyncio
from collections.abc import AsyncIterator, Iterator

from django.core.handlers.asgi import ASGIRequest
from whitenoise import middleware


class WhiteNoiseMiddleware(middleware.WhiteNoiseMiddleware):
    @staticmethod
    def serve(static_file, request):
        response = middleware.WhiteNoiseMiddleware.serve(static_file, request)
        if isinstance(request, ASGIRequest):
            # The file stays among the response's closers: it is closed when the answer is sent.
            response.streaming_content = read_in_thread(iter(response.streaming_content))
        return response


async def read_in_thread(blocks: Iterator[bytes]) -> AsyncIterator[bytes]:
    while (block := await asyncio.to_thread(next, blocks, None)) is not None:
        yield block
