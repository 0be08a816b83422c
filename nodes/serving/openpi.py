"""`WS /cosmos3/openpi/policy`: the openpi policy protocol, for DROID robots running `openpi-client`.

The first frame is the policy's metadata (cameras, image layout, action space, chunk). Each request frame is a
DROID observation; it becomes an action request with the `droid-server` preset (the model authors' DROID policy
server): the cameras composed into one 540x640 view, wrist camera on top (360x640), the two exterior cameras
side by side below (180x320 each; the second one black when the client sends none), each image fitted into
its slot with its aspect ratio kept (black bars); the robot state is the 7 joint positions then the gripper.
The answer is {"actions": float32 [chunk, 8], "prompt_id"}: absolute joint positions (7) and the gripper position, one row
per control step at 15 Hz, plus `server_timing`. A velocity-controlled client differences consecutive rows
(the first against the observed joints) and multiplies by 15 for rad/s. Errors are a text frame naming the
key (openpi clients raise on text frames only), then close 1011.
"""

import asyncio

import numpy as np
from PIL import Image

from ...cosmos3_runtime.action import JOINT_WIDTH, PRESETS
from .checkpoints import for_request, named_in_url
from .fields import FieldError, rgb_array
from .graph import run
from .requests import DEFAULT_SEED, model_choice, parse_off_loop
from .sessions import serve

ROUTE = "/cosmos3/openpi/policy"
PRESET = "droid-server"
EXTERIOR_1, EXTERIOR_2 = "observation/exterior_image_1_left", "observation/exterior_image_2_left"
WRIST = "observation/wrist_image_left"
JOINTS, GRIPPER = "observation/joint_position", "observation/gripper_position"
CANVAS = (540, 640)  # height, width of the composed view
SLOTS = {WRIST: (0, 0, 360, 640), EXTERIOR_1: (360, 0, 180, 320), EXTERIOR_2: (360, 320, 180, 320)}  # top, left, h, w
TUNABLE = ("seed", "num_inference_steps", "action_horizon")  # optional keys, named as the HTTP parameters
CONTROL_FPS = PRESETS[PRESET].fps


def fitted(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """`image` scaled to fit `height` x `width` with its aspect ratio kept, centred on black."""
    scale = min(height / image.shape[0], width / image.shape[1])
    size = (max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale)))
    resized = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR))
    out = np.zeros((height, width, 3), dtype=np.uint8)
    top, left = (height - size[1]) // 2, (width - size[0]) // 2
    out[top : top + size[1], left : left + size[0]] = resized
    return out


def composed(observation: dict) -> np.ndarray:
    """The DROID cameras in the droid-server preset's concatenated view [540, 640, 3]."""
    canvas = np.zeros((*CANVAS, 3), dtype=np.uint8)
    for key, (top, left, height, width) in SLOTS.items():
        if key in observation:
            canvas[top : top + height, left : left + width] = fitted(rgb_array(np.asarray(observation[key]), key),
                                                                     height, width)
    return canvas


def _numbers(observation: dict, key: str, count: int) -> list[float]:
    try:
        values = np.asarray(observation[key], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise FieldError(key, f"must be {count} numbers, got {observation[key]!r}") from None
    if values.size != count or not np.isfinite(values).all():
        raise FieldError(key, f"must be {count} finite numbers, got {values.size}")
    return [float(v) for v in values]


def action_request(observation: dict) -> dict:
    """A DROID observation -> the action request it stands for (the HTTP route's flat form)."""
    for key in (EXTERIOR_1, WRIST, JOINTS, GRIPPER, "prompt"):
        if key not in observation:
            raise FieldError(key, "is missing from the observation; a DROID observation has "
                                  f"{', '.join((EXTERIOR_1, WRIST, JOINTS, GRIPPER))} and prompt "
                                  f"({EXTERIOR_2} optional)")
    if not isinstance(observation["prompt"], str):
        raise FieldError("prompt", f"must be the instruction (a string), got {type(observation['prompt']).__name__}")
    state = _numbers(observation, JOINTS, JOINT_WIDTH - 1) + _numbers(observation, GRIPPER, 1)
    request = {"image": composed(observation), "state": state, "prompt": observation["prompt"], "preset": PRESET,
               "domain_name": "droid_lerobot", **{k: observation[k] for k in TUNABLE if k in observation}}
    if "model" in observation:
        request["model"] = observation["model"]
    return request


def policy_metadata(checkpoints) -> dict:
    preset = PRESETS[PRESET]
    return {
        "policy": "cosmos3", "preset": PRESET, **model_choice(checkpoints),
        "observation": {"required": [EXTERIOR_1, WRIST, JOINTS, GRIPPER, "prompt"], "optional": [EXTERIOR_2, *TUNABLE]},
        "image_layout": {"size": list(CANVAS), "slots": {k: {"top": t, "left": l, "height": h, "width": w}
                                                         for k, (t, l, h, w) in SLOTS.items()},
                         "fit": "aspect kept, black bars", "missing": "black"},
        "n_external_cameras": 2, "needs_wrist_camera": True, "state": f"{JOINTS} (7) then {GRIPPER} (1)",
        "action_space": "joint_position", "action_dim": JOINT_WIDTH,
        "actions": "absolute joint positions (7) and the gripper position; velocity = difference of consecutive "
                   f"rows (the first against the observed joints) x {CONTROL_FPS:g}",
        "action_horizon": preset.chunk_size, "control_fps": CONTROL_FPS,
        "defaults": {"seed": DEFAULT_SEED, "num_inference_steps": preset.steps, "action_horizon": preset.chunk_size},
    }


async def policy(request):
    async def handle(observation: dict) -> dict:
        # composing the cameras resizes images: off the event loop, like parsing
        flat = await asyncio.get_running_loop().run_in_executor(None, action_request, observation)
        call = await parse_off_loop(flat, url_choice=named_in_url(request))
        prompt_id, results = await run(call)
        return {"actions": np.asarray(results[0, 0]["actions"], dtype=np.float32), "prompt_id": prompt_id}

    async def send_error(ws, message: str) -> None:
        await ws.send_str(message)

    return await serve(request, policy_metadata(await for_request(request)), handle, send_error)
