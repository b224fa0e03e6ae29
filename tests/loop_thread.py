"""Stopping a test server that runs on an event loop of its own, in a thread."""

import asyncio
import threading
from collections.abc import Callable


def stop_loop_thread(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, close_server: Callable[[], None]
) -> None:
    """Close the server (`close_server`, called on its loop), cancel every task still running there
    (the connections it serves) and wait for them, then stop the loop, join the thread and close the
    loop. A connection's coroutine left suspended on a stopped loop runs its `finally` at garbage
    collection, on a closed loop, and a close scheduled but never run is a coroutine never awaited:
    either is a warning in whichever later test the collection happens to fall."""

    async def close() -> None:
        close_server()
        rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
