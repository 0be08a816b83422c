"""The Reasoner for programs: OpenAI-style `POST /cosmos3/v1/chat/completions` and `GET /cosmos3/v1/models`.

A request becomes a queued graph like the action routes' (the loader and one Cosmos3 API Chat node per choice), so
it waits its turn for the GPU and shares the checkpoint a workflow has loaded. Media parts are `image_url` /
`video_url` with a `data:` URL or the name of a file in ComfyUI's input folder; the server never fetches a URL.
With `stream: true` the answer goes out as server-sent `chat.completion.chunk` events while it is written, ending
with `data: [DONE]`. Thinking is asked for as vLLM and NIM do (`chat_template_kwargs: {"enable_thinking": true}`)
and comes back as `reasoning_content`. A client that goes away takes its work off the queue, or stops it.
"""

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...cosmos3_runtime import Cosmos3Error, InputError
from ...cosmos3_runtime.reasoner import MAX_NEW_TOKENS, Clip, Sampling, check_stop, split_thinking
from .. import services
from .checkpoints import Checkpoints, named_in_url
from .fields import FieldError, decode_image, decoded, encoded
from .graph import _widget_defaults
from .jobs import POLL_S, Job, Refused, RunError
from .requests import max_connections

ROUTE = "/cosmos3/v1/chat/completions"
MODELS_ROUTE = "/cosmos3/v1/models"
CHAT_MODEL_ENV = "COSMOS3_CHAT_MODEL"
MAX_CHOICES = 4
DEFAULT_MAX_TOKENS = 1024
# Fields of OpenAI's request that change nothing here (when left at their neutral values).
NEUTRAL = {"user": None, "logprobs": False, "top_logprobs": None, "frequency_penalty": 0, "repetition_penalty": 1,
           "parallel_tool_calls": None, "store": False, "metadata": None, "service_tier": None}
FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "presence_penalty", "seed", "stop", "n", "stream", "stream_options", "chat_template_kwargs",
          "mm_processor_kwargs", "media_io_kwargs", *NEUTRAL}
_active = 0  # chat requests being served now


def reasoning_checkpoints(url_choice: str | None = None) -> Checkpoints:
    """The installed checkpoints, with those whose folder has the Reasoner's root config.json."""
    from ..loader import checkpoint_names, checkpoint_path

    names = checkpoint_names()
    capable = tuple(n for n in names if (Path(checkpoint_path(n)) / "config.json").is_file())
    return Checkpoints(tuple(names), capable, url_choice or None, CHAT_MODEL_ENV,
                       "the Reasoner's root files (config.json beside model_index.json)", unknown_status=404)


@dataclass
class ChatCall:
    model: str
    messages: list[dict]  # the runtime's turns: content a string, or parts text / image / video
    images: list = field(default_factory=list)
    videos: list[Clip] = field(default_factory=list)
    options: dict = field(default_factory=dict)  # max_new_tokens, sampling, seed, stop, thinking
    choices: int = 1
    stream: bool = False
    include_usage: bool = False


def _number(body: dict, name: str, kind, low, high):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise FieldError(name, f"must be {'a number' if kind is float else 'a whole number'}, got {value!r}")
    if not low <= value <= high:
        raise FieldError(name, f"{value} is out of range {low}..{high}")
    return kind(value)


def _media_file(url: str, where: str) -> Path:
    """A file named in ComfyUI's input folder; nothing outside it."""
    folder = Path(services.files.input_directory()).resolve()
    path = (folder / url).resolve()
    if os.path.isabs(url) or ".." in Path(url).parts or folder not in path.parents or not path.is_file():
        raise FieldError(where, f"{url!r} is not a file in ComfyUI's input folder; send a data: URL or the name of a "
                                "file in the input folder")
    return path


def _url(part: dict, kind: str, where: str) -> tuple[str, dict]:
    holder = part.get(kind)
    url = holder.get("url") if isinstance(holder, dict) else holder
    if not isinstance(url, str) or not url:
        raise FieldError(where, f"needs {kind}.url: a data: URL or the name of a file in ComfyUI's input folder")
    if url.lower().startswith(("http://", "https://", "ftp://", "file:")):
        raise FieldError(where, "the server never fetches URLs; send the media as a data: URL or put the file in "
                                "ComfyUI's input folder and name it")
    return url, holder if isinstance(holder, dict) else {}


def _image(part: dict, where: str):
    url, _ = _url(part, "image_url", where)
    return decode_image(url if url.startswith("data:") else _media_file(url, where).read_bytes(), where)[0]


def _video(part: dict, where: str, sample_fps: float | None, root: str) -> Clip:
    from ...cosmos3_runtime.reasoner import read_clip

    url, holder = _url(part, "video_url", where)
    fps = holder.get("fps", sample_fps)
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 60):
        raise FieldError(f"{where}.video_url.fps", f"must be a number in (0, 60], got {fps!r}")
    source = encoded(url, where, "video") if url.startswith("data:") else _media_file(url, where)
    return decoded(lambda: read_clip(source, None if fps is None else float(fps), root), where)


def _turns(messages, sample_fps: float | None, root: str) -> tuple[list[dict], list, list[Clip]]:
    if not isinstance(messages, list) or not messages:
        raise FieldError("messages", "must be a non-empty list of {role, content} turns")
    turns, images, videos = [], [], []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise FieldError(f"{where}.role", "must be system, user or assistant")
        content = message.get("content")
        if isinstance(content, str):
            turns.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise FieldError(f"{where}.content", "must be a string or a list of parts")
        parts = []
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                images.append(_image(part, at))
                parts.append({"type": "image"})
            elif kind == "video_url":
                videos.append(_video(part, at, sample_fps, root))
                parts.append({"type": "video"})
            else:
                raise FieldError(f"{at}.type", f"{kind!r} is not served; use text, image_url or video_url")
        turns.append({"role": message["role"], "content": parts})
    return turns, images, videos


def parse_chat(body, checkpoints: Checkpoints) -> ChatCall:
    """A chat completions request -> a ChatCall; FieldError names the field at fault."""
    from ..loader import checkpoint_path

    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise FieldError(unknown[0], f"is not a field this server takes (it takes {', '.join(sorted(FIELDS))})")
    for name, neutral in NEUTRAL.items():
        if body.get(name, neutral) not in (neutral, None):
            raise FieldError(name, f"is not supported; leave it at {neutral!r}")
    model = checkpoints.choose(body.get("model"))
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise FieldError("max_tokens", "give max_tokens or max_completion_tokens, not both")
    limit = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    kwargs = {k: body.get(k) for k in ("chat_template_kwargs", "mm_processor_kwargs", "media_io_kwargs")}
    for name, value in kwargs.items():
        if value is not None and not isinstance(value, dict):
            raise FieldError(name, "must be an object")
    thinking = (kwargs["chat_template_kwargs"] or {}).get("enable_thinking", False)
    if not isinstance(thinking, bool):
        raise FieldError("chat_template_kwargs.enable_thinking", "must be true or false")
    sample_fps = ((kwargs["media_io_kwargs"] or {}).get("video") or {}).get("fps") or \
        (kwargs["mm_processor_kwargs"] or {}).get("fps")
    stream_options = body.get("stream_options") or {}
    if not isinstance(body.get("stream", False), bool) or not isinstance(stream_options, dict):
        raise FieldError("stream", "stream must be true or false and stream_options an object")
    sampling = {"temperature": _number(body, "temperature", float, 0.0, 2.0),
                "top_p": _number(body, "top_p", float, 0.0, 1.0), "top_k": _number(body, "top_k", int, -1, 1000),
                "presence_penalty": _number(body, "presence_penalty", float, -2.0, 2.0)}
    if sampling["top_k"] == -1:  # vLLM's "no limit"
        sampling["top_k"] = 0
    try:
        Sampling.resolve(thinking, **sampling)
        stop = check_stop(body.get("stop"))
    except InputError as exc:
        raise FieldError(str(exc).split(" ", 1)[0], str(exc)) from None
    options = {"max_new_tokens": _number(body, limit, int, 1, MAX_NEW_TOKENS) or DEFAULT_MAX_TOKENS,
               "seed": _number(body, "seed", int, 0, 2**63 - 1) or 0, "stop": stop, "thinking": thinking,
               **sampling}
    turns, images, videos = _turns(body.get("messages"), sample_fps, checkpoint_path(model))
    return ChatCall(model, turns, images, videos, options, _number(body, "n", int, 1, MAX_CHOICES) or 1,
                    body.get("stream", False), bool(stream_options.get("include_usage")))


def prompt_graph(call: ChatCall, key: str) -> dict:
    from ..loader import Cosmos3ModelLoader

    graph = {"model": {"class_type": Cosmos3ModelLoader.__name__,
                       "inputs": {**_widget_defaults(Cosmos3ModelLoader), "model_name": call.model}}}
    for c in range(call.choices):
        graph[f"chat_{c}"] = {"class_type": Cosmos3APIChat.__name__,
                              "inputs": {"model": ["model", 0], "key": key, "choice": c}}
    for node_id, node in graph.items():
        node["_meta"] = {"title": f"chat endpoint: {node_id}"}
    return graph


class Cosmos3APIChat:
    DESCRIPTION = "Used by the chat completions route: answers its request's conversation (held in memory)."
    CATEGORY = "cosmos3/api"
    DEV_ONLY = True
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "answer"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("COSMOS3_MODEL",), "key": ("STRING", {"default": ""}),
                             "choice": ("INT", {"default": 0, "min": 0, "max": MAX_CHOICES})}}

    def answer(self, model, key, choice):
        from ..reasoning import single_pipeline

        job = Job.of(key, "chat")
        call: ChatCall = job.payload["call"]
        options = dict(call.options)
        options["seed"] += choice
        progress = services.progress.Progress(options["max_new_tokens"], previews=False)

        def stream(count, total, text):
            progress.update(count)  # Cancel in ComfyUI stops it here
            if job.cancelled:
                raise InputError("the client disconnected")
            job.payload["loop"].call_soon_threadsafe(job.payload["queue"].put_nowait, (choice, text))

        single_pipeline(model)
        with model.use(reasoner=True) as pipe:
            result = pipe.chat(call.messages, call.images, call.videos, callback=stream, **options)
        job.results[choice] = result
        return {"ui": {"text": [f"{len(result.token_ids)} tokens for chat request {key[:8]} (choice {choice})"]}}


def error_object(status: int, message: str, param=None, kind: str | None = None) -> dict:
    """OpenAI's error object; the type follows from the status unless given."""
    kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def texts_of(messages: list[dict]) -> list[str]:
    """The text of every turn (a string, or its text parts)."""
    texts = []
    for message in messages:
        content = message["content"]
        texts += [content] if isinstance(content, str) else [part["text"] for part in content if part["type"] == "text"]
    return texts


def _error(status: int, message: str, param=None, kind: str | None = None):
    from aiohttp import web

    return web.json_response(error_object(status, message, param, kind), status=status)


def _message(answer, thinking: bool) -> dict:
    message = {"role": "assistant", "content": answer.text}
    if thinking:
        message["reasoning_content"] = answer.thinking
    return message


def completion(call: ChatCall, request_id: str, created: int, answers: dict, prompt_id: str | None = None) -> dict:
    """OpenAI's chat.completion object, and the queued prompt's id (`cosmos3.prompt_id`, for ComfyUI's history)."""
    prompt = len(answers[0].prompt_ids)
    completion_tokens = sum(len(a.token_ids) for a in answers.values())
    return {"id": request_id, "object": "chat.completion", "created": created, "model": call.model,
            "choices": [{"index": c, "message": _message(a, call.options["thinking"]), "finish_reason": a.finish_reason,
                         "logprobs": None} for c, a in sorted(answers.items())],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                      "total_tokens": prompt + completion_tokens}, "cosmos3": {"prompt_id": prompt_id}}


def _gone(request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _parse(request) -> ChatCall:
    from .http import read_request

    body, uploads, _ = await read_request(request)
    if uploads:
        raise FieldError("body", "send a JSON body; media go in the messages as data: URLs")
    loop = asyncio.get_running_loop()
    checkpoints = await loop.run_in_executor(None, reasoning_checkpoints, named_in_url(request))
    return await loop.run_in_executor(None, parse_chat, body, checkpoints)


async def completions(request):
    global _active
    if _active >= max_connections():
        return _error(503, f"the server is answering {_active} chat requests, its limit (COSMOS3_API_MAX_CONNECTIONS); "
                           "retry later", kind="server_busy")
    _active += 1
    try:
        return await _complete(request)
    finally:
        _active -= 1


async def _complete(request):
    from aiohttp import web

    try:
        call = await _parse(request)
    except FieldError as exc:
        return _error(exc.status, str(exc), exc.field)
    except Cosmos3Error as exc:
        return _error(400, str(exc))
    payload = {"call": call, "loop": asyncio.get_running_loop(), "queue": asyncio.Queue()}
    with Job(payload, call.choices) as job:
        request_id, created = f"chatcmpl-{job.key}", int(time.time())
        try:
            await job.start(prompt_graph(call, job.key), texts_of(call.messages))
        except Refused as exc:
            return _error(400, str(exc), "model")
        except RunError as exc:  # the server-wide guardrail refused it
            return _error(exc.status, str(exc), kind=exc.body["error"]["type"])
        try:
            if call.stream:
                return await _stream(request, call, job, request_id, created)
            answers = await job.wait(gone=lambda: _gone(request))
        except (ConnectionResetError, asyncio.CancelledError) as exc:  # the client went away: its work goes too
            job.cancel()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return web.Response(status=499)  # nobody is there to read it
        except RunError as exc:
            return _error(exc.status, str(exc))
        return web.json_response(completion(call, request_id, created, answers, job.prompt_id))


def _chunk(call: ChatCall, request_id: str, created: int, choices: list, usage=None) -> bytes:
    document = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": call.model,
                "choices": choices}
    if usage is not None:
        document["usage"] = usage
    return f"data: {json.dumps(document, ensure_ascii=False)}\n\n".encode()


async def _stream(request, call: ChatCall, job: Job, request_id: str, created: int):
    """Server-sent events: the role, then each choice's new text as it is written, its finish reason, [DONE]."""
    from aiohttp import web

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    thinking = call.options["thinking"]
    sent = {c: ("", "") for c in range(call.choices)}  # (reasoning, content) sent so far

    async def send(choice: int, text: str, final: bool = False):
        parts = split_thinking(text, final) if thinking else ("", text)
        delta = {}
        for name, new, old in zip(("reasoning_content", "content"), parts, sent[choice]):
            if len(new) > len(old):
                delta[name] = new[len(old) :]
        if delta:
            sent[choice] = tuple(max(n, o, key=len) for n, o in zip(parts, sent[choice]))
            await response.write(_chunk(call, request_id, created, [{"index": choice, "delta": delta,
                                                                     "finish_reason": None}]))

    queue = job.payload["queue"]
    for c in range(call.choices):
        await response.write(_chunk(call, request_id, created, [{"index": c, "delta": {"role": "assistant"},
                                                                 "finish_reason": None}]))
    while not (job.done.done() and queue.empty()):
        if _gone(request):
            raise ConnectionResetError
        try:
            await send(*await asyncio.wait_for(queue.get(), POLL_S))
        except asyncio.TimeoutError:
            pass
    try:
        answers = job.outcome()
    except RunError as exc:
        await response.write(f"data: {json.dumps(error_object(exc.status, str(exc)))}\n\n".encode())
    else:
        for c, answer in sorted(answers.items()):
            await send(c, _full_text(answer, thinking), final=True)
            await response.write(_chunk(call, request_id, created, [{"index": c, "delta": {},
                                                                     "finish_reason": answer.finish_reason}]))
        if call.include_usage:
            usage = completion(call, request_id, created, answers)["usage"]
            await response.write(_chunk(call, request_id, created, [], usage))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _full_text(answer, thinking: bool) -> str:
    """The reply as the stream saw it, for its last delta (the answer's own parts, already split)."""
    return f"{answer.thinking}\n</think>\n\n{answer.text}" if thinking else answer.text


async def models_route(request):
    from aiohttp import web

    checkpoints = await asyncio.get_running_loop().run_in_executor(None, reasoning_checkpoints, None)
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "cosmos3"} for name in checkpoints.capable]
    return web.json_response({"object": "list", "data": data})
