"""`WS /cosmos3/v1/actions/realtime`: SGLang's realtime action websocket.

The first frame is the metadata document (`GET /cosmos3/v1/actions/metadata`). Each request frame is the HTTP
route's request as msgpack (numpy arrays as images); each answer is its `action.generation` envelope with the
actions as float32 arrays, plus `server_timing`. Errors are a binary {"error": message} frame naming the field,
then close 1011, as SGLang sends them.
"""

from .checkpoints import for_request, named_in_url
from .graph import run
from .msgpack_numpy import packb
from .requests import envelope, metadata, parse_off_loop
from .sessions import serve

ROUTE = "/cosmos3/v1/actions/realtime"


async def realtime(request):
    async def handle(document: dict) -> dict:
        call = await parse_off_loop(document, url_choice=named_in_url(request))
        prompt_id, results = await run(call)
        return envelope(call, results, prompt_id, numpy=True)

    async def send_error(ws, message: str) -> None:
        await ws.send_bytes(packb({"error": message}))

    return await serve(request, metadata(await for_request(request)), handle, send_error)
