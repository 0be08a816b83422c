"""HTTP: `POST /cosmos3/v1/actions/generations` and `GET /cosmos3/v1/actions/metadata`, as SGLang serves them.

Bodies are JSON, msgpack (`Content-Type: application/msgpack`, numpy arrays as images) or multipart/form-data
(the observation uploaded as a file). The answer is msgpack, with the actions as float32 arrays, when the
request is msgpack or its `Accept` names msgpack; JSON otherwise.
"""

import json

from .checkpoints import for_request, named_in_url
from .fields import FieldError
from .graph import run
from .jobs import RunError
from .msgpack_numpy import packb, unpackb
from .requests import UPLOAD_FIELDS, envelope, max_upload_bytes, metadata, parse_off_loop

ROUTE = "/cosmos3/v1/actions/generations"
METADATA_ROUTE = "/cosmos3/v1/actions/metadata"
MSGPACK = "application/msgpack"


async def _read(next_chunk, limit: int, where: str) -> bytes:
    """A body or multipart part read chunk by chunk, refused (413) as soon as it passes `limit` bytes."""
    chunks, size = [], 0
    while chunk := await next_chunk():
        size += len(chunk)
        if size > limit:
            raise FieldError(where, f"is over the upload limit of {limit // 2**20} MiB (COSMOS3_API_MAX_UPLOAD_MB)", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _json(data: bytes, where: str):
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FieldError(where, f"is not valid JSON ({exc})") from None


def _msgpack(data: bytes, where: str):
    try:
        return unpackb(data)
    except ValueError as exc:
        raise FieldError(where, str(exc)) from None


def wants_msgpack(request) -> bool:
    """SGLang's rule: a msgpack answer when the request is msgpack or its Accept header names msgpack."""
    return "msgpack" in request.content_type or "msgpack" in request.headers.get("Accept", "")


async def read_request(request) -> tuple[dict, dict, dict]:
    """(body, uploads {field: bytes}, multipart text fields) of an aiohttp request (JSON, msgpack with numpy arrays,
    or multipart), within the size limit. Uploaded file names are ignored: nothing is written under a name a
    client chose."""
    limit = max_upload_bytes()
    if (request.content_length or 0) > limit:
        raise FieldError("body", f"is {request.content_length} bytes, over the upload limit of {limit // 2**20} MiB "
                                 "(COSMOS3_API_MAX_UPLOAD_MB)", 413)
    if request.content_type == "multipart/form-data":
        body, uploads, form, left = {}, {}, {}, limit
        async for part in await request.multipart():
            name = part.name or ""
            data = await _read(lambda: part.read_chunk(2**20), left, name or "body")
            left -= len(data)
            if part.filename is not None:
                if name not in UPLOAD_FIELDS:
                    raise FieldError(name or "file", f"is not an upload field; files go in {', '.join(UPLOAD_FIELDS)}")
                uploads[name] = data
            elif name in ("request", "payload"):
                body = _json(data, name)
            else:
                form[name] = data.decode("utf-8", "replace")
        return body, uploads, form
    if "msgpack" in request.content_type:
        return _msgpack(await _read(lambda: request.content.read(2**20), limit, "body"), "body"), {}, {}
    if request.content_type in ("application/json", "application/octet-stream", "") or request.content_type.endswith("+json"):
        return _json(await _read(lambda: request.content.read(2**20), limit, "body"), "body"), {}, {}
    raise FieldError("Content-Type", f"{request.content_type!r} is not served: send application/json, "
                                     "application/msgpack or multipart/form-data", 415)


def answer(request, document: dict, status: int = 200):
    """A JSON or (when the request asks for it) msgpack response."""
    from aiohttp import web

    if wants_msgpack(request):
        return web.Response(body=packb(document), status=status, content_type=MSGPACK)
    return web.json_response(document, status=status)


async def generations(request):
    try:
        call = await parse_off_loop(*await read_request(request), url_choice=named_in_url(request))
        prompt_id, results = await run(call)
    except FieldError as exc:
        return answer(request, exc.body(), exc.status)
    except RunError as exc:
        return answer(request, exc.body, exc.status)
    return answer(request, envelope(call, results, prompt_id, numpy=wants_msgpack(request)))


async def metadata_route(request):
    return answer(request, metadata(await for_request(request)))
