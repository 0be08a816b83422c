"""The action request and its answer, shared by every transport (HTTP, realtime websocket, openpi).

A request is SGLang's `/v1/actions/generations` request: {"input": {"task", "observation": {...}}, "parameters":
{...}} or a flat observation, with observation images as uploads, base64, pixel lists, tensor payloads or
numpy arrays (msgpack). One image gives one input; a list of images or a [B, H, W, C] array is a batch, with one
prompt for all or one each. `candidate_count` > 1 samples that many chunks from seeds seed, seed + 1, ... and
answers their mean (`candidate_reducer` "mean"), listing each one too with `return_candidates`. The answer is
SGLang's `action.generation` envelope, `data[i]` for input i.

Defaults are SGLang's (the `sglang` action preset, seed 42); `parameters.preset` picks another preset.
"""

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import torch

from ...cosmos3_runtime import InputError
from ...cosmos3_runtime.action import DEFAULT_CHUNK, DOMAIN_IDS, JOINT_WIDTH, PRESETS, TIERS, VIEW_POINTS, WIDTHS, ActionRequest
from ...cosmos3_runtime.request import CACHES
from .checkpoints import action_checkpoints
from .fields import FieldError, decode_image, decode_video

ENDPOINT_MODES = ("policy", "inverse_dynamics")  # the modes that return actions; forward dynamics returns a video
DEFAULT_PRESET = "sglang"
DEFAULT_SEED = 42  # SGLang's
MAX_UPLOAD_MB = 64  # a whole request body; COSMOS3_API_MAX_UPLOAD_MB overrides it
MAX_BATCH = 4  # observations in one request (each is its own sampler run, one queue item for all)
MAX_CANDIDATES = 4  # chunks sampled for one observation
REDUCERS = ("mean",)
IMAGE_FIELDS = ("image", "image_path", "input_reference")  # where SGLang clients put the observation image
VIDEO_FIELDS = ("video", "video_path")
UPLOAD_FIELDS = {"image": "image", "input_reference": "image", "video": "video"}  # multipart file part -> kind
OPTIONS = {  # request option -> its type (JSON values or multipart text fields)
    "action_mode": str, "action_horizon": int, "num_frames": int, "domain_name": str, "domain_id": int,
    "raw_action_dim": int, "action_view_point": str, "fps": float, "height": int, "width": int,
    "num_inference_steps": int, "guidance_scale": float, "flow_shift": float, "seed": int, "negative_prompt": str,
    "preset": str, "candidate_count": int, "candidate_reducer": str, "return_candidates": bool, "cache": str,
}


def max_upload_bytes() -> int:
    try:
        return int(float(os.environ.get("COSMOS3_API_MAX_UPLOAD_MB", MAX_UPLOAD_MB)) * 2**20)
    except ValueError:
        return MAX_UPLOAD_MB * 2**20


# --- reading a request -----------------------------------------------------------------------------------------


@dataclass
class ActionCall:
    """A checked request: what the graph runs and what the answer reports."""

    model: str
    inputs: list[tuple[str, ActionRequest]]  # (instruction, resolved action with its observation) per input
    seed: int = DEFAULT_SEED
    steps: int | None = None
    guidance: float | None = None
    flow_shift: float | None = None
    fps: float | None = None
    negative_prompt: str = ""
    candidates: int = 1
    return_candidates: bool = False
    cache: str = "seacache"  # the step cache (Request.cache)
    request_id: str = field(default_factory=lambda: f"act_{uuid.uuid4().hex}")

    @property
    def action(self) -> ActionRequest:
        """The first input's action (every input shares mode, domain, chunk and preset)."""
        return self.inputs[0][1]


class Options:
    """Request values by name, each with the field it came from (the field an error names)."""

    def __init__(self, values: dict[str, tuple[object, str]]):
        self.values = values

    def where(self, name: str) -> str:
        return self.values[name][1] if name in self.values else name

    def get(self, name: str, default=None):
        if name not in self.values or self.values[name][0] is None:
            return default
        value, where = self.values[name]
        kind = OPTIONS.get(name)
        if kind is bool:
            if isinstance(value, bool) or isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value if isinstance(value, bool) else value.strip().lower() == "true"
            raise FieldError(where, f"must be true or false, got {value!r}")
        if kind is None or isinstance(value, kind) and not isinstance(value, bool):
            return value
        try:
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            if kind is int and isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str) and kind is not str:
                return kind(value.strip())
        except ValueError:
            pass
        raise FieldError(where, f"must be {'an integer' if kind is int else 'a number' if kind is float else 'a string'}, "
                                f"got {value!r}")

    def positive(self, name: str, default=None):
        value = self.get(name, default)
        if value is not None and value <= 0:
            raise FieldError(self.where(name), f"must be positive, got {value}")
        return value


ENVELOPE_KEYS = ("input", "parameters", "runtime", "model", "request_id", "id")
INSTRUCTION = ("task", "prompt")  # SGLang reads the instruction from either ("task" first at the input level)
INPUT_KEYS = (*INSTRUCTION, "images", "state", *IMAGE_FIELDS, *VIDEO_FIELDS)  # at the input level, they win


def _observation(body: dict, form: dict) -> dict[str, tuple[object, str]]:
    """The observation by name, each value with its field, from either of SGLang's request forms,
    {"input": {"task", "observation": {...}, ...}, "parameters": {...}} or a flat observation, and from
    multipart text fields."""
    if "input" not in body:
        observed = {k: (v, k) for k, v in body.items() if k not in ENVELOPE_KEYS}
    else:
        given = body["input"]
        if not isinstance(given, dict):
            raise FieldError("input", "must be an object")
        observation = given.get("observation") or {}
        if not isinstance(observation, dict):
            raise FieldError("input.observation", "must be an object")
        observed = {k: (v, f"input.observation.{k}") for k, v in observation.items()}
        observed.update({k: (v, f"input.{k}") for k, v in given.items() if k in INPUT_KEYS})
    observed.update({k: (v, k) for k, v in form.items() if k in ("state", *INSTRUCTION)})
    return observed


def parse_request(body, checkpoints, uploads: dict | None = None, form: dict | None = None) -> ActionCall:
    """An SGLang action request (the JSON body; multipart uploads and text fields) -> a checked ActionCall.
    `checkpoints` (a `checkpoints.Checkpoints`) picks the checkpoint. Every refusal is a FieldError naming the field."""
    uploads, form = uploads or {}, form or {}
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object")
    model = checkpoints.choose(body.get("model") or form.get("model"))
    observed = _observation(body, form)
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise FieldError("parameters", "must be an object")
    options = Options({**{k: v for k, v in observed.items() if k in OPTIONS},  # later layers win
                       **{k: (v, f"parameters.{k}") for k, v in parameters.items()},
                       **{k: (v, k) for k, v in form.items() if k in OPTIONS}})
    runtime = body.get("runtime") or {}
    if isinstance(runtime, dict) and str(runtime.get("response_format", "envelope")).lower() != "envelope":
        raise FieldError("runtime.response_format", "only the 'envelope' response is served")
    candidates = options.get("candidate_count", 1)
    if not 1 <= candidates <= MAX_CANDIDATES:
        raise FieldError(options.where("candidate_count"), f"must be 1 to {MAX_CANDIDATES}, got {candidates}")
    reducer = (options.get("candidate_reducer") or "mean").strip().lower()
    if reducer not in REDUCERS:
        raise FieldError(options.where("candidate_reducer"), f"must be one of {', '.join(REDUCERS)}, got {reducer!r}")

    mode = (options.get("action_mode") or "policy").strip().lower()
    if mode == "forward_dynamics":
        raise FieldError(options.where("action_mode"), "forward_dynamics produces a video, not actions: run it as a "
                                                       "workflow with the Cosmos3 Action node")
    if mode not in ENDPOINT_MODES:
        raise FieldError(options.where("action_mode"), f"must be one of {', '.join(ENDPOINT_MODES)}, got {mode!r}")
    preset = options.get("preset") or DEFAULT_PRESET
    if preset not in PRESETS:
        raise FieldError(options.where("preset"), f"must be one of {', '.join(PRESETS)}, got {preset!r}")
    chunk = _chunk(options, PRESETS[preset].chunk_size)
    domain = _domain(options, preset)

    frames = _observation_frames(mode, observed, uploads, chunk + 1)
    if len(frames) > 1 and candidates > 1:
        raise FieldError(options.where("candidate_count"), "several candidates need exactly one observation image, "
                                                           f"this request has {len(frames)}")
    prompts = _prompts(observed, len(frames))
    # only the droid-server layout takes a state; SGLang ignores the state its clients often send
    states = _states(observed, len(frames)) if PRESETS[preset].joint_state else [None] * len(frames)
    if PRESETS[preset].joint_state and states[0] is None:
        raise FieldError("input.observation.state", f"the {preset} preset needs the robot state: {JOINT_WIDTH} numbers "
                                                    "(7 joint positions and the gripper)")
    tier = options.get("height")
    if tier is not None and tier not in TIERS:
        raise FieldError(options.where("height"), f"picks the resolution tier: one of {', '.join(map(str, TIERS))}, "
                                                  f"got {tier}")
    view_point = options.get("action_view_point")
    if view_point is not None and view_point not in VIEW_POINTS:
        raise FieldError(options.where("action_view_point"), f"must be one of {', '.join(VIEW_POINTS)}")
    inputs = []
    for observation, prompt, state in zip(frames, prompts, states):
        try:
            action = ActionRequest(mode=mode, chunk_size=chunk, domain=domain, resolution_tier=tier,
                                   **({"video": observation} if mode == "inverse_dynamics" else {"image": observation}),
                                   view_point=view_point, preset=preset, state=state).resolved(preset)
        except InputError as exc:
            raise FieldError("input", str(exc)) from None
        inputs.append((prompt, action))
    action = inputs[0][1]
    width = options.get("raw_action_dim")
    if width is not None and width != action.width:
        raise FieldError(options.where("raw_action_dim"), f"{domain} actions are {action.width} wide with the {preset} "
                                                          f"preset, got {width}")
    seed = options.get("seed", DEFAULT_SEED)
    if not 0 <= seed <= 2**64 - candidates:
        raise FieldError(options.where("seed"), f"must be in [0, 2^64 - candidate_count], got {seed}")
    negative = options.get("negative_prompt", "")
    cache = options.get("cache", "seacache")
    if cache not in CACHES:
        raise FieldError(options.where("cache"), f"must be one of {', '.join(CACHES)}, got {cache!r}")
    request_id = body.get("request_id") or body.get("id") or form.get("request_id")
    return ActionCall(
        model=model, inputs=inputs,
        seed=seed, steps=options.positive("num_inference_steps"), guidance=options.positive("guidance_scale"),
        flow_shift=options.positive("flow_shift"), fps=options.positive("fps"), negative_prompt=negative,
        candidates=candidates, return_candidates=options.get("return_candidates", False), cache=cache,
        **({"request_id": str(request_id)} if request_id else {}),
    )


async def parse_off_loop(body, uploads=None, form=None, url_choice: str | None = None):
    """`parse_request` against the installed checkpoints (`url_choice`: the URL's ?model=), off the event loop
    (reading their configs and decoding an observation take a while; the server keeps answering meanwhile)."""

    def parse():
        return parse_request(body, action_checkpoints(url_choice), uploads, form)

    return await asyncio.get_running_loop().run_in_executor(None, parse)


def _chunk(options: Options, preset_chunk: int | None) -> int:
    """SGLang's rule: num_frames = action_horizon + 1, with the horizon a multiple of 4 (the VAE's time stride)."""
    horizon, frames = options.get("action_horizon"), options.get("num_frames")
    if horizon is not None and frames is not None and frames != horizon + 1:
        raise FieldError(options.where("num_frames"), f"must be action_horizon + 1 = {horizon + 1}, got {frames}")
    if horizon is None and frames is not None:
        horizon = frames - 1
    where = options.where("action_horizon" if "action_horizon" in options.values else "num_frames")
    horizon = horizon if horizon is not None else preset_chunk or DEFAULT_CHUNK
    if horizon < 1 or horizon % 4:
        raise FieldError(where, f"the action horizon must be a positive multiple of 4, got {horizon}")
    return horizon


def _domain(options: Options, preset: str) -> str:
    name, number = options.get("domain_name"), options.get("domain_id")
    if name is not None:
        if name not in WIDTHS:
            reason = "has no fixed action width" if name in DOMAIN_IDS else "is not a known domain"
            raise FieldError(options.where("domain_name"), f"{name!r} {reason}; domains: {', '.join(sorted(WIDTHS))}")
        if number is not None and DOMAIN_IDS[name] != number:
            raise FieldError(options.where("domain_id"), f"{name} is domain {DOMAIN_IDS[name]}, got {number}")
        return name
    if number is None:
        raise FieldError("input.observation.domain_name", "an action request needs domain_name (or domain_id with "
                                                          "raw_action_dim)")
    width = options.get("raw_action_dim")
    if width is None:
        raise FieldError(options.where("domain_id"), "raw_action_dim is required when only domain_id is given")
    if PRESETS[preset].joint_state and number == DOMAIN_IDS["droid_lerobot"] and width == JOINT_WIDTH:
        return "droid_lerobot"
    names = [n for n in sorted(WIDTHS) if DOMAIN_IDS[n] == number and WIDTHS[n] == width]
    if not names:  # same id and width: the model cannot tell such domains apart
        raise FieldError(options.where("domain_id"), f"no domain has id {number} and {width}-wide actions")
    return names[0]


def _observation_frames(mode: str, observed: dict, uploads: dict, num_frames: int) -> list[torch.Tensor]:
    """The observations as IMAGE batches: one per input (a policy batch), or inverse dynamics' one clip."""
    images = [(v, w) for n, (v, w) in observed.items() if n in IMAGE_FIELDS]
    if "images" in observed:
        value, where = observed["images"]
        if not isinstance(value, dict) or len(value) > 1:
            raise FieldError(where, "takes one named image ({\"<camera>\": image}); multi-camera observations are "
                                    "served on the openpi websocket")
        images += [(v, f"{where}.{k}") for k, v in value.items()]
    images += [(v, k) for k, v in uploads.items() if UPLOAD_FIELDS[k] == "image"]
    videos = [(v, w) for n, (v, w) in observed.items() if n in VIDEO_FIELDS]
    videos += [(v, k) for k, v in uploads.items() if UPLOAD_FIELDS[k] == "video"]
    if images and videos:
        raise FieldError(videos[0][1], f"give either an image or a video, not both (the image is in {images[0][1]})")
    if len(images) > 1 or len(videos) > 1:
        raise FieldError((images or videos)[1][1], f"one observation field per request (another is in "
                                                   f"{(images or videos)[0][1]}); a batch is a list in one field")
    if mode == "inverse_dynamics":
        if not videos:
            raise FieldError("input.observation.video", "inverse_dynamics needs a video: the actions between its "
                                                        "frames are what it infers")
        return [decode_video(*videos[0], num_frames)]
    if not images:
        raise FieldError("input.observation.image", "a policy request needs the observation image")
    value, where = images[0]
    batch = [(v, f"{where}[{i}]") for i, v in enumerate(value)] if _is_batch(value) else [(value, where)]
    if len(batch) > MAX_BATCH:
        raise FieldError(where, f"holds {len(batch)} observations; at most {MAX_BATCH} are served per request")
    return [decode_image(v, w) for v, w in batch]


def _is_batch(value) -> bool:
    """A list of images or an array [B, H, W, C] (not one image as pixel lists [H][W][C])."""
    if isinstance(value, np.ndarray):
        return value.ndim == 4
    if not isinstance(value, list) or not value:
        return False
    return isinstance(value[0], (dict, str, bytes, np.ndarray)) or np.ndim(value[0]) >= 3


def _prompts(observed: dict, count: int) -> list[str]:
    """One instruction per input: a string for all, or a list with one each."""
    prompt, where = next((observed[n] for n in INSTRUCTION if n in observed), ("", "input.task"))
    prompts = prompt if isinstance(prompt, list) else [prompt] * count
    if len(prompts) == 1 and count > 1:
        prompts = prompts * count
    if len(prompts) != count or not all(isinstance(p, str) for p in prompts):
        raise FieldError(where, f"must be one instruction (a string) or one per observation image ({count}), got "
                                f"{len(prompts) if isinstance(prompt, list) else type(prompt).__name__}")
    return prompts


def _states(observed: dict, count: int) -> list:
    """The robot state per input: one [8] for all, or [count, 8]."""
    value, where = observed.get("state", (None, "state"))
    rows = np.asarray(value.get("values", value.get("data")) if isinstance(value, dict) else value, dtype=object)
    if count > 1 and rows.ndim == 2 and len(rows) == count:
        return [_state({"state": (list(row), f"{where}[{i}]")}) for i, row in enumerate(rows)]
    return [_state(observed)] * count


def _state(observed: dict) -> list[float] | None:
    value, where = observed.get("state", (None, "state"))
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip().startswith("[") else [float(v) for v in value.split(",")]
        except ValueError:
            raise FieldError(where, f"must be numbers, got {value!r}") from None
    if isinstance(value, dict):
        value = value.get("values", value.get("data"))
    try:
        state = [float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1)]
    except (TypeError, ValueError):
        raise FieldError(where, f"must be a list of numbers, got {value!r}") from None
    if len(state) != JOINT_WIDTH or not all(np.isfinite(state)):
        raise FieldError(where, f"the robot state is {JOINT_WIDTH} finite numbers (7 joints and the gripper), got "
                                f"{len(state)}")
    return state


# --- the answer ------------------------------------------------------------------------------------------------


def _action(table: np.ndarray, a: ActionRequest, numpy: bool) -> dict:
    return {"type": "continuous", "dtype": "float32", "shape": list(table.shape),
            "values": table if numpy else table.tolist(), "action_mode": a.mode, "domain_id": DOMAIN_IDS[a.domain],
            "raw_action_dim": int(table.shape[1])}


def envelope(call: ActionCall, results: dict, prompt_id: str, numpy: bool = False) -> dict:
    """SGLang's `action.generation` answer, plus what ComfyUI did under "cosmos3". `results`: {(input, candidate):
    COSMOS3_ACTIONS}. `data[i]` is input i: its one chunk, or the mean of its candidates (each listed under
    "candidates" with `return_candidates`). `numpy`: values as float32 arrays (msgpack answers) instead of lists."""
    data = []
    for i, (_, a) in enumerate(call.inputs):
        tables = [np.asarray(results[i, c]["actions"], dtype=np.float32) for c in range(call.candidates)]
        item = {"index": i, "input_index": i, "candidate_index": 0, "action": _action(np.mean(tables, axis=0), a, numpy)}
        if call.candidates > 1:
            item.update(candidate_count=call.candidates, candidate_reducer="mean")
        if call.return_candidates:
            item["candidates"] = [{"candidate_index": c, "seed": call.seed + c, "action": _action(t, a, numpy)}
                                  for c, t in enumerate(tables)]
        data.append(item)
    first = results[0, 0]
    horizon, width = first["actions"].shape
    a = call.action
    return {
        "id": call.request_id,
        "object": "action.generation",
        "created": int(time.time()),
        "model": call.model,
        "data": data,
        "usage": {"batch_size": len(call.inputs), "action_horizon": int(horizon), "action_dim": int(width),
                  "candidate_count": call.candidates, "denoise_steps": call.steps or PRESETS[a.preset].steps,
                  "prefix_cache_hit": False},
        "cosmos3": {"prompt_id": prompt_id, "preset": a.preset, "domain": a.domain, "fps": first.get("fps"),
                    "units": first.get("units"), "seeds": [call.seed + c for c in range(call.candidates)]},
    }


def model_choice(checkpoints) -> dict:
    """The metadata's account of the checkpoints: every installed one, the one a request naming none gets, and how
    to choose."""
    return {"models": list(checkpoints.names), "action_models": list(checkpoints.capable),
            "default_model": checkpoints.default(), "choosing_the_model": checkpoints.ways}


def max_connections() -> int:
    """Websocket connections served at once (COSMOS3_API_MAX_CONNECTIONS overrides the default 8)."""
    try:
        return max(1, int(os.environ.get("COSMOS3_API_MAX_CONNECTIONS", 8)))
    except ValueError:
        return 8


def metadata(checkpoints) -> dict:
    """What the endpoint serves, in the shape of SGLang's `action.metadata` (also the realtime websocket's first
    frame); `checkpoints` a `checkpoints.Checkpoints`."""
    preset = PRESETS[DEFAULT_PRESET]
    return {
        "object": "action.metadata",
        **model_choice(checkpoints),
        "policy_family": "cosmos3",
        "input": {"modalities": ["image", "video"], "resolution_tiers": list(TIERS), "state_dim": JOINT_WIDTH,
                  "domains": {name: {"domain_id": DOMAIN_IDS[name], "raw_action_dim": w} for name, w in sorted(WIDTHS.items())},
                  "max_upload_bytes": max_upload_bytes(), "encodings": ["json", "msgpack", "multipart"]},
        "output": {"action_type": "continuous", "action_horizon": preset.chunk_size, "dtype": "float32"},
        "defaults": {"action_mode": "policy", "action_horizon": preset.chunk_size, "num_inference_steps": preset.steps,
                     "guidance_scale": preset.guidance_scale, "flow_shift": preset.flow_shift, "fps": preset.fps,
                     "height": preset.resolution_tier, "seed": DEFAULT_SEED, "preset": DEFAULT_PRESET,
                     "candidate_reducer": "mean"},
        "capabilities": {"action_modes": list(ENDPOINT_MODES), "presets": list(PRESETS), "batch_inputs": True,
                         "max_batch_size": MAX_BATCH, "batched_action_modes": ["policy"], "multiple_candidates": True,
                         "max_candidates": MAX_CANDIDATES, "candidate_reducers": list(REDUCERS),
                         "realtime_websocket": True, "openpi_websocket": True, "multipart_uploads": True,
                         "max_websocket_connections": max_connections()},
    }
