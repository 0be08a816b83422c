"""A websocket session as both robot transports run it: a metadata frame first, then one answer per request frame.

Frames are binary msgpack (numpy arrays kept). Each answer gets `server_timing`: `infer_ms` (this request, from
its frame arriving to its answer being ready) and, from the second request on, `prev_total_ms` (the previous
cycle, frame in to answer sent). A refused or failed request gets an error frame (the transport's kind), then
close code 1011; the server goes on. A client that leaves mid-run takes its prompt off the queue if it has not
started. Connections are capped (`max_connections`), and a frame over the upload limit closes the connection
(1009, message too big) before it is read whole.
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from .. import services
from .fields import FieldError
from .jobs import RunError
from .msgpack_numpy import packb, unpackb
from .requests import max_connections, max_upload_bytes

CLOSE_REASON = "Internal server error. Error included in previous frame."
_open = 0  # websocket connections being served


async def serve(request, hello: dict, handle: Callable[[dict], Awaitable[dict]],
                send_error: Callable[[object, str], Awaitable[None]]):
    """Run one websocket session: `hello` first, then `await handle(request document)` per frame."""
    global _open
    from aiohttp import WSMsgType, web

    if _open >= max_connections():
        return web.Response(status=503, text=f"{_open} websocket connections are open, the most served at once "
                                             "(COSMOS3_API_MAX_CONNECTIONS); retry later")
    ws = web.WebSocketResponse(max_msg_size=max_upload_bytes(), autoping=True)
    await ws.prepare(request)
    _open += 1
    try:
        await ws.send_bytes(packb(hello))
        previous_total = None
        async for message in ws:
            arrived = time.perf_counter()
            try:
                if message.type != WSMsgType.BINARY:
                    raise FieldError("frame", "requests are binary msgpack frames, got a text frame")
                try:
                    document = unpackb(message.data)
                except ValueError as exc:
                    raise FieldError("frame", str(exc)) from None
                if not isinstance(document, dict):
                    raise FieldError("frame", f"must hold a map, got {type(document).__name__}")
                answer = await _unless_closed(ws, handle(document))
                if answer is None:  # the client left mid-run
                    break
            except (FieldError, RunError) as exc:
                await _fail(ws, send_error, str(exc))
                break
            except Exception as exc:  # a fault of ours: the client still gets its error frame, the server goes on
                services.log.exception("Cosmos3 %s websocket request failed", request.path)
                await _fail(ws, send_error, f"internal error ({type(exc).__name__}: {exc}); see the server log")
                break
            answer["server_timing"] = {"infer_ms": (time.perf_counter() - arrived) * 1000}
            if previous_total is not None:
                answer["server_timing"]["prev_total_ms"] = previous_total
            await ws.send_bytes(packb(answer))
            previous_total = (time.perf_counter() - arrived) * 1000
    finally:
        _open -= 1
    return ws


async def _fail(ws, send_error, message: str) -> None:
    await send_error(ws, message)
    await ws.close(code=1011, message=CLOSE_REASON.encode())


async def _unless_closed(ws, work: Awaitable[dict]) -> dict | None:
    """`work`'s result, or None (with `work` cancelled) when the client closes the connection first."""
    from aiohttp import WSMsgType

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(ws.receive())
    done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch  # receive() is one at a time: the session's next read waits for this one to end
        return task.result()
    closing = watch.result().type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)
    if closing:
        task.cancel()
        return None
    return await task  # a frame sent before the answer: this protocol has none, so it is dropped
