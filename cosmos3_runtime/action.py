"""Action generation: policy, forward dynamics and inverse dynamics on checkpoints with an action head.

An `ActionRequest` (given to `generate(prompt, action=...)`) says what to do:
- policy: an observation (image, or a clip's first frame) and an instruction -> the next `chunk_size`
  actions, with the video they imagine;
- forward_dynamics: an observation and `chunk_size` actions -> the video they cause;
- inverse_dynamics: a clip of `chunk_size + 1` frames -> the actions between its frames.

The video is `chunk_size + 1` frames on an action canvas: every frame rounded to multiples of 16, then
the resolution tier's bin closest in aspect ratio, content downscaled (never up) and padded
right/bottom; the latents are cropped back to the content. The prompt is the structured action JSON
the model was trained on. `ActionTrack` is the action segment of the sampling loop: latents
[chunk, action_dim] (zero beyond the domain's width), which of them are clean, their own stepper.
"""

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .conditioning import frame_size, preprocess_video
from .errors import InputError
from .schedulers import FlowEuler, Schedule, UniPC
from .transformer import ActionTokens

log = logging.getLogger(__name__)

MODES = ("policy", "forward_dynamics", "inverse_dynamics")
DOMAIN_IDS = {
    "no_action": 0, "av": 1, "camera_pose": 2, "hand_pose": 3, "pusht": 4, "libero": 5, "umi": 6,
    "bridge_orig_lerobot": 7, "droid_lerobot": 8, "robomind-franka": 8, "galbot": 9, "robomind-franka-dual": 12,
    "robomind-ur": 13, "agibotworld": 15, "agibot_gear_gripper": 15, "agibot_gear_gripper_ext": 15, "fractal": 20,
}  # fmt: skip
WIDTHS = {  # each embodiment's action width (domains without a fixed one, libero and no_action, are refused)
    "av": 9, "camera_pose": 9, "pusht": 2, "umi": 10, "bridge_orig_lerobot": 10, "droid_lerobot": 10,
    "robomind-franka": 10, "robomind-franka-dual": 20, "robomind-ur": 10, "galbot": 30, "agibotworld": 29,
    "agibot_gear_gripper": 29, "agibot_gear_gripper_ext": 29, "fractal": 10, "hand_pose": 57,
}  # fmt: skip
TIERS = {  # resolution tier -> canvases (height, width) the model was trained on
    256: ((256, 256), (256, 320), (320, 256), (192, 320), (320, 192)),
    480: ((640, 640), (544, 736), (736, 544), (480, 832), (832, 480)),
    704: ((960, 960), (832, 1088), (1088, 832), (704, 1280), (1280, 704)),
    720: ((960, 960), (832, 1104), (1104, 832), (720, 1280), (1280, 720)),
}
VIEW_POINTS = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": "This video is captured from a third-person perspective looking towards the agent from the front.",
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}  # fmt: skip
ASPECT_RATIOS = ("1,1", "4,3", "3,4", "16,9", "9,16")


@dataclass
class ActionRequest:
    mode: str = "policy"
    chunk_size: int = 16
    domain: str = "droid_lerobot"
    resolution_tier: int = 480
    actions: Any = None  # forward_dynamics: [T, width] (padded by repeating the last row, or truncated)
    image: Any = None  # the observation (policy, forward dynamics)
    video: Any = None  # inverse dynamics: the clip; otherwise its first frame is the observation
    view_point: str = "ego_view"
    preset: str | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise InputError(f"action mode {self.mode!r} is not one of {', '.join(MODES)}")
        if int(self.chunk_size) < 1:
            raise InputError(f"chunk_size must be at least 1, got {self.chunk_size}")
        if self.domain not in DOMAIN_IDS:
            raise InputError(f"unknown action domain {self.domain!r}; domains: {', '.join(sorted(WIDTHS))}")
        if self.domain not in WIDTHS:
            raise InputError(f"domain {self.domain!r} has no fixed action width, so it cannot be generated; "
                             f"domains: {', '.join(sorted(WIDTHS))}")  # fmt: skip
        if self.resolution_tier not in TIERS:
            raise InputError(f"resolution_tier {self.resolution_tier} is not one of {', '.join(map(str, TIERS))}")
        if self.image is not None and self.video is not None:
            raise InputError("give the action request either an image or a video, not both")
        if self.image is None and self.video is None:
            raise InputError("an action request needs an observation: an image or a video")
        if self.mode == "inverse_dynamics" and self.video is None:
            raise InputError("inverse_dynamics needs a video: the actions between its frames are what it infers")
        if self.mode == "forward_dynamics":
            if self.actions is None:
                raise InputError("forward_dynamics needs actions [T, width] to roll out")
            actions = torch.as_tensor(self.actions, dtype=torch.float32)
            if actions.ndim != 2 or actions.shape[0] < 1 or actions.shape[1] != self.width:
                raise InputError(f"actions for domain {self.domain!r} must be [T, {self.width}] with T >= 1, got "
                                 f"{list(actions.shape)}")  # fmt: skip
            self.actions = actions

    @property
    def width(self) -> int:
        return WIDTHS[self.domain]

    @property
    def num_frames(self) -> int:
        return self.chunk_size + 1

    def clip(self):
        """The conditioning frames as a clip (a PIL image becomes a one-frame list; arrays are [1, H, W, 3])."""
        if self.image is None:
            return self.video
        return [self.image] if type(self.image).__module__.startswith("PIL.") else self.image


def canvas_size(clip, tier: int) -> tuple[int, int]:
    """The tier's (height, width) closest in aspect ratio to the clip's frames rounded to multiples of 16."""
    height, width = (v // 16 * 16 for v in frame_size(clip))
    ratio = height / width
    return min(TIERS[tier], key=lambda hw: abs(hw[0] / hw[1] - ratio))


def canvas_frames(clip, tier: int, num_frames: int, dtype: torch.dtype):
    """The clip on its action canvas: ([1, 3, num_frames, H, W] in [-1, 1], (H, W), (content_h, content_w))."""
    h16, w16 = (v // 16 * 16 for v in frame_size(clip))
    frames = preprocess_video(clip, h16, w16).to(dtype)
    target_h, target_w = canvas_size(clip, tier)
    if frames.shape[2] < num_frames:
        frames = torch.cat([frames, frames[:, :, -1:].expand(-1, -1, num_frames - frames.shape[2], -1, -1)], dim=2)
    frames = frames[:, :, :num_frames]
    scale = min(target_w / w16, target_h / h16, 1.0)
    content_h, content_w = max(1, int(scale * h16 + 0.5)), max(1, int(scale * w16 + 0.5))
    flat = frames[0].permute(1, 0, 2, 3)  # [F, 3, h, w]
    if (content_h, content_w) != (h16, w16):
        flat = F.interpolate(flat, size=(content_h, content_w), mode="bicubic", align_corners=False, antialias=True)
    pad_right, pad_bottom = target_w - content_w, target_h - content_h
    if pad_right or pad_bottom:
        mode = "replicate" if pad_right >= content_w or pad_bottom >= content_h else "reflect"
        flat = F.pad(flat, (0, pad_right, 0, pad_bottom), mode=mode)
    return flat.permute(1, 0, 2, 3).unsqueeze(0), (target_h, target_w), (content_h, content_w)


def action_prompt(description: str, view_point: str, num_frames: int, fps: float, height: int, width: int) -> str:
    """The structured action caption (keys in the trained order, json.dumps defaults)."""
    seconds = num_frames / fps if fps > 0 else 0.0
    minutes, rest = divmod(round(seconds), 60)
    text = description.strip()
    if text and not text.endswith((".", "!", "?")):
        text += "."
    caption: dict[str, Any] = {}
    if view_point in VIEW_POINTS:
        caption["cinematography"] = {"framing": VIEW_POINTS[view_point]}
    else:
        log.warning("unknown action view_point %r (known: %s); the caption gets no framing", view_point,
                    ", ".join(VIEW_POINTS))  # fmt: skip
    ratio = width / height if height > 0 else 1.0
    aspect = min(ASPECT_RATIOS, key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio))
    caption["actions"] = [{"time": f"0:00-{minutes}:{rest:02d}", "description": text}]
    caption["duration"] = f"{int(seconds)}s"
    caption["fps"] = float(fps)
    caption["resolution"] = {"H": int(height), "W": int(width)}
    caption["aspect_ratio"] = aspect
    return json.dumps(caption)


def vision_condition_frames(req: ActionRequest, latent_frames: int) -> tuple[int, ...]:
    """Clean latent frames: every one for inverse dynamics, else the observation (frame 0)."""
    return tuple(range(latent_frames)) if req.mode == "inverse_dynamics" else (0,)


class ActionTrack:
    """Action latents [chunk, action_dim]: clean (forward dynamics) or noisy, zero beyond the domain's width."""

    segment = "action"

    def __init__(self, req: ActionRequest, action_dim: int, generator, device, schedule: Schedule):
        if req.width > action_dim:
            raise InputError(f"domain {req.domain!r} has {req.width}-wide actions; this checkpoint's action head "
                             f"has {action_dim}")  # fmt: skip
        self.req, self.width = req, req.width
        chunk = req.chunk_size
        clean = torch.zeros(chunk, action_dim)
        self.clean_rows: list[int] = []
        if req.mode == "forward_dynamics":
            actions = req.actions
            if actions.shape[0] < chunk:  # short: repeat the last action
                actions = torch.cat([actions, actions[-1:].expand(chunk - actions.shape[0], -1)])
            clean[:, : self.width] = actions[:chunk]
            self.clean_rows = list(range(chunk))
        noise = torch.randn((chunk, action_dim), generator=generator, dtype=torch.float32)
        mask = torch.zeros(chunk, 1)
        mask[self.clean_rows] = 1.0
        self.mask = mask.to(device)
        self.latents = (mask * clean + (1.0 - mask) * noise).to(device)
        self.latents[:, self.width :] = 0
        self.noisy = [i for i in range(chunk) if i not in self.clean_rows]
        self.stepper = FlowEuler(schedule) if schedule.stepper == "euler" else UniPC(schedule)

    def tokens(self) -> ActionTokens:
        return ActionTokens(self.latents, DOMAIN_IDS[self.req.domain], self.noisy)

    def step(self, velocity: torch.Tensor, generator) -> None:
        if not self.noisy:  # every action clean: nothing to denoise
            return
        velocity = velocity * (1.0 - self.mask)
        velocity[:, self.width :] = 0
        if isinstance(self.stepper, FlowEuler):
            self.latents = self.stepper.step(velocity, self.latents, generator)
        else:
            self.latents = self.stepper.step(velocity, self.latents)
        self.latents[:, self.width :] = 0

    def actions(self) -> torch.Tensor | None:
        """The predicted actions [chunk, width] (policy, inverse dynamics), float32 on the CPU; None otherwise."""
        if self.req.mode == "forward_dynamics":
            return None
        return self.latents[:, : self.width].float().cpu()
