"""Sim-Bimanual sessions over HTTP: `POST /cosmos3/v1/sessions/ticks` and `DELETE /cosmos3/v1/sessions/{session_id}`.

A tick follows vLLM-Omni's typed tick (`ar_diffusion_tick`, at the body's top level or in `extra_args` as vLLM-Omni's
clients send it): {session_id, request_id, chunk_index, applied_event_ids, prompt, controls: [{track: "robot_action",
schema: "robot_action.v1", data: {values: [16 x width]}}], reset, close_session}. Tick 0 (and a reset) opens the
session: it also carries the prompt and the first image (`image`: base64, a data: URL, pixels, a multipart upload),
and may set width, height, fps, seed, domain and causal_window; later ticks must keep them (a change needs a reset).
The answer: {"ar_diffusion": {session_id, request_id, chunk_index, applied_event_ids}, "frame_index" (vLLM-Omni's:
the tick's first latent frame, 0 or 1 + 4 k), "first_frame", "num_frames", "fps", "frames"} with the frames as
base64 PNGs in JSON, or one uint8 array [F, H, W, 3] in msgpack.

Each tick is one queued prompt of the pack's loader and `Cosmos3APISessionTick`, so it takes its turn on the GPU
with every other workflow. The open sessions are `session_registry`'s (one per checkpoint, in order, retries, idle
timeout, close); this module holds vLLM-Omni's format: a tick is read off the event loop (`read_tick`), then claimed
in one step on it (`claim`), the registry's refusals answered by the tick's field, before anything is queued.
"""

import asyncio
import base64
import io
import os
from dataclasses import dataclass

import numpy as np
import torch

from ...cosmos3_runtime import InputError, Request
from ...cosmos3_runtime.action import ActionRequest
from ...cosmos3_runtime.checkpoint import detect_variant
from .. import services
from . import session_registry
from .checkpoints import Checkpoints, installed, named_in_url
from .fields import FieldError, decode_image
from .http import answer, read_request, wants_msgpack
from .jobs import Job, Refused, RunError

ROUTE = "/cosmos3/v1/sessions/ticks"
SESSION_MODEL_ENV = "COSMOS3_SESSION_MODEL"
TRACK, SCHEMA = "robot_action", "robot_action.v1"
TICK = "ar_diffusion_tick"
HISTORY = "media K/V cache"  # the estimate's part a session holds between ticks (`budget`)
OPENING = {"width": int, "height": int, "fps": float, "seed": int, "domain": str, "causal_window": int}
FIELDS = {"session": f"{TICK}.session_id", "chunk": f"{TICK}.chunk_index"}  # the registry's words in the tick's


def session_checkpoints(url_choice: str | None = None) -> Checkpoints:
    """The installed checkpoints, with those that run sessions (causal, conditioned on actions)."""
    return installed(lambda variant: variant.causal is not None and variant.causal.takes_actions, url_choice,
                     env=SESSION_MODEL_ENV, capability="a causal action rollout (Cosmos3-Nano-Sim-Bimanual)")


@dataclass
class Parsed:
    """A tick's fields, read off the event loop: its checkpoint, the typed tick, the opening fields, the values."""

    model: str
    causal: object  # the checkpoint's CausalConfig
    tick: dict
    options: dict
    prompt: str | None
    frame: torch.Tensor | None  # the first image, decoded (an opening tick's)
    late_image: bool  # a later tick carried an image


@dataclass
class TickCall:
    """A tick claimed against its checkpoint's open session (`claim`): the typed tick and its actions."""

    claim: session_registry.Claim
    tick: dict
    values: torch.Tensor | None


def _tick(body: dict) -> dict:
    tick = body.get(TICK, (body.get("extra_args") or {}).get(TICK) if isinstance(body.get("extra_args"), dict) else None)
    if not isinstance(tick, dict):
        raise FieldError(TICK, "is missing: send the typed tick {session_id, request_id, chunk_index, controls, ...} "
                               "at the body's top level or in extra_args")
    session_id, request_id, chunk = tick.get("session_id"), tick.get("request_id", ""), tick.get("chunk_index")
    if not isinstance(session_id, str) or not session_id:
        raise FieldError(f"{TICK}.session_id", "must be a non-empty string")
    if not isinstance(request_id, str):
        raise FieldError(f"{TICK}.request_id", "must be a string")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0:
        raise FieldError(f"{TICK}.chunk_index", "must be an integer >= 0")
    events = tick.get("applied_event_ids") or []
    if not isinstance(events, list) or not all(isinstance(e, int) and e >= 0 for e in events) or \
            any(b <= a for a, b in zip(events, events[1:])):
        raise FieldError(f"{TICK}.applied_event_ids", "must be strictly increasing integers >= 0")
    for flag in ("reset", "close_session"):
        if not isinstance(tick.get(flag, False), bool):
            raise FieldError(f"{TICK}.{flag}", "must be true or false")
    return {**tick, "request_id": request_id, "applied_event_ids": events}


def _values(tick: dict, rows: int, width: int) -> torch.Tensor:
    where = f"{TICK}.controls"
    controls = tick.get("controls")
    if not isinstance(controls, list) or len(controls) != 1 or not isinstance(controls[0], dict):
        raise FieldError(where, f'must hold one control {{"track": "{TRACK}", "schema": "{SCHEMA}", "data": '
                                '{"values": [...]}}')
    control = controls[0]
    if control.get("track") != TRACK or control.get("schema") != SCHEMA:
        raise FieldError(f"{where}[0]", f"track {control.get('track')!r} / schema {control.get('schema')!r}: this "
                                        f"model takes track {TRACK!r}, schema {SCHEMA!r}")
    data = control.get("data")
    if not isinstance(data, dict) or set(data) - {"values", "measure_tick_latency"}:
        raise FieldError(f"{where}[0].data", 'must be {"values": [...]} (and optionally "measure_tick_latency")')
    try:
        values = torch.as_tensor(np.asarray(data.get("values"), dtype=np.float32))
    except (TypeError, ValueError):
        values = None
    if values is None or values.shape != (rows, width):
        raise FieldError(f"{where}[0].data.values", f"must be {rows} rows of {width} numbers (one action per frame)")
    if not torch.isfinite(values).all():
        raise FieldError(f"{where}[0].data.values", "holds NaN or infinite values")
    return values


def read_tick(body: dict, uploads: dict, checkpoints: Checkpoints) -> Parsed:
    """A tick's fields checked and its image decoded (off the event loop); 4xx by field otherwise. The checkpoint is
    the one the body or URL names, else the one whose open session this is, else the one installed that can."""
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object")
    tick = _tick(body)
    named = body.get("model") or checkpoints.url_choice or os.environ.get(checkpoints.env)
    holding = session_registry.holding(tick["session_id"])
    model = checkpoints.choose(body.get("model") if named or holding is None else holding)
    if model not in checkpoints.capable:
        raise FieldError("model", f"{model!r} does not run sessions: it needs {checkpoints.capability}")
    options = {}
    for name, kind in OPENING.items():
        if body.get(name) is not None:
            try:
                options[name] = kind(body[name])
            except (TypeError, ValueError):
                raise FieldError(name, f"must be {kind.__name__}") from None
    image = uploads.get("image", body.get("image"))
    opens = tick["chunk_index"] == 0 or tick.get("reset", False)
    prompt = tick.get("prompt") if tick.get("prompt") is not None else body.get("prompt")
    return Parsed(model, detect_variant(_path(model)).causal, tick, options, prompt,
                  decode_image(image, "image") if opens and image is not None else None,
                  image is not None and not opens)


def claim(p: Parsed) -> TickCall:
    """The tick claimed against its checkpoint's open session (`session_registry.claim`), on the event loop; what the
    registry or the tick's own fields refuse, refused by the tick's field."""
    tick, causal = p.tick, p.causal
    opens = tick["chunk_index"] == 0 or tick.get("reset", False)

    def read(binding: dict) -> torch.Tensor:
        if opens and (not isinstance(p.prompt, str) or not p.prompt.strip()):
            raise FieldError("prompt", "tick 0 opens the session: give its prompt")
        if opens and p.frame is None:
            raise FieldError("image", "tick 0 opens the session: give the first image (base64, a data: URL, pixels "
                                      "or a multipart upload)")
        try:
            width = causal.embodiment(binding["domain"]).width
        except InputError as exc:
            raise FieldError("domain", str(exc)) from None
        return _values(tick, causal.chunk_size * 4, width)

    given = {"prompt": p.prompt, **p.options}
    binding = {**given, "domain": p.options.get("domain", causal.default_embodiment), "image": p.frame} if opens \
        else given
    try:
        claimed = session_registry.claim(p.model, tick["session_id"], tick["request_id"], tick["chunk_index"], opens,
                                         binding, read, late="image" if p.late_image else None,
                                         chunk_field="chunk_index")
    except session_registry.Refusal as refused:
        raise FieldError(FIELDS.get(refused.about, refused.about), refused.message, refused.status) from None
    return TickCall(claimed, tick, claimed.payload)


def finish(call: TickCall, result: tuple | None) -> None:
    """After a claimed tick, its (uint8 frames, fps) or None (`session_registry.finish`; `close_session` closes)."""
    session_registry.finish(call.claim, result, close=call.tick.get("close_session", False))


def _path(model: str) -> str:
    from ..loader import checkpoint_path

    return checkpoint_path(model)


def tick_graph(call: TickCall, key: str) -> dict:
    from ..loader import Cosmos3ModelLoader
    from .graph import _widget_defaults

    return {"model": {"class_type": "Cosmos3ModelLoader", "inputs": {**_widget_defaults(Cosmos3ModelLoader),
                                                                      "model_name": call.claim.model},
                      "_meta": {"title": "session tick: model"}},
            "tick": {"class_type": "Cosmos3APISessionTick", "inputs": {"model": ["model", 0], "key": key},
                     "_meta": {"title": f"session tick: {call.claim.open.session_id} chunk "
                                         f"{call.tick['chunk_index']}"}}}


def png_b64(frame: torch.Tensor) -> dict:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame.numpy()).save(buffer, format="PNG")
    return {"b64_json": base64.b64encode(buffer.getvalue()).decode("ascii")}


def to_pixels(frames: torch.Tensor) -> torch.Tensor:
    """Frames [F, H, W, 3] in 0..1 -> uint8 (what the answer carries, a quarter of the floats' memory)."""
    return (frames * 255).round().clamp(0, 255).to(torch.uint8)


def reply(call: TickCall, pixels: torch.Tensor, fps: float, numpy: bool) -> dict:
    """The tick's answer: its uint8 frames [F, H, W, 3] and where they sit in the session."""
    k = call.tick["chunk_index"]
    return {
        "ar_diffusion": {name: call.tick[name] for name in ("session_id", "request_id", "chunk_index",
                                                            "applied_event_ids")},
        "frame_index": 0 if k == 0 else 1 + 4 * k, "first_frame": 0 if k == 0 else 1 + 16 * k,
        "num_frames": pixels.shape[0], "fps": fps,
        "frames": pixels.numpy() if numpy else [png_b64(f) for f in pixels],
    }


async def ticks(request):
    try:
        body, uploads, _ = await read_request(request)
        loop = asyncio.get_running_loop()
        checkpoints = await loop.run_in_executor(None, session_checkpoints, named_in_url(request))
        call = claim(await loop.run_in_executor(None, read_tick, body, uploads, checkpoints))
    except FieldError as exc:
        return answer(request, exc.body(), exc.status)
    if call.claim.replay is not None:
        return answer(request, reply(call, *call.claim.replay, wants_msgpack(request)))
    session_registry.keep_reaping()
    result = None
    try:
        with Job({"tick": call}, 1) as job:
            try:
                opening = [call.claim.open.binding["prompt"]] if call.claim.opens else ()  # checked before queueing
                await job.start(tick_graph(call, job.key), opening)
            except Refused as exc:
                raise FieldError("model" if "model" in exc.refusal.get("node_errors", {}) else "body", str(exc)) from None
            frames, fps = (await job.wait())[0]
            result = (to_pixels(frames), fps)
    except FieldError as exc:
        return answer(request, exc.body(), exc.status)
    except RunError as exc:
        return answer(request, exc.body, exc.status)
    finally:
        finish(call, result)
    return answer(request, reply(call, *result, wants_msgpack(request)))


class Cosmos3APISessionTick:
    DESCRIPTION = "Used by the session route: runs one tick of an open Sim-Bimanual session (held in memory)."
    CATEGORY = "cosmos3/api"
    DEV_ONLY = True
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "tick"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("COSMOS3_MODEL",), "key": ("STRING", {"default": ""})},
                "hidden": {"node_id": "UNIQUE_ID"}}

    def tick(self, model, key, node_id=None):
        job = Job.of(key, "session tick")
        call: TickCall = job.payload["tick"]
        s, opens = call.claim.open, call.claim.opens
        progress = services.progress.RunProgress(node_id)
        if not opens and s.session is None:
            raise InputError(f"session {s.session_id!r} was closed: start it again at chunk_index 0")
        if opens:
            b = s.binding
            request = Request.build(action=ActionRequest(mode="forward_dynamics", image=b["image"], domain=b["domain"]),
                                    **{k: b[k] for k in OPENING if k != "domain" and k in b})
            plan = model.plan(b["prompt"], request, session=True)
        else:
            plan = s.session.plan
        # ComfyUI makes room for the tick; a session's history is already held (planned at open)
        needed = model.memory_needed(plan) - (0 if opens else plan.estimate.parts.get(HISTORY, 0))
        with model.use(memory_required=max(needed, 0)) as pipe:
            if opens:
                s.close()
                # the prompt was checked by the server-wide guardrail before the tick was queued (`Job.start`)
                s.session = pipe.session(plan, guardrails=services.guardrails.server_wide())
            elif s.session.parts is not pipe.parts:
                raise InputError(f"the model was loaded again since session {s.session_id!r} opened (another "
                                 "checkpoint's workflow ran between its ticks): start the session again at "
                                 "chunk_index 0")
            frames = s.session.tick(call.values, callback=progress.step, progress=progress.stage,
                                    interrupt=services.progress.check_interrupt)
        job.results[0] = (frames, plan.settings.fps)
        return {"ui": {"text": [f"session {s.session_id}: chunk {call.tick['chunk_index']}, {frames.shape[0]} frames"]}}
