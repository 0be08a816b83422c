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
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from .conditioning import frame_size, pad_with_last_frame, preprocess_video
from .errors import InputError
from .geometry import SPATIAL_FACTOR


log = logging.getLogger(__name__)

MODES = ("policy", "forward_dynamics", "inverse_dynamics")
DOMAIN_IDS = {
    "no_action": 0, "av": 1, "camera_pose": 2, "hand_pose": 3, "pusht": 4, "libero": 5, "umi": 6,
    "bridge_orig_lerobot": 7, "droid_lerobot": 8, "robomind-franka": 8, "galbot": 9, "robomind-franka-dual": 12,
    "robomind-ur": 13, "agibotworld": 15, "agibot_gear_gripper": 15, "agibot_gear_gripper_ext": 15, "fractal": 20,
}
WIDTHS = {  # each embodiment's action width (domains without a fixed one, libero and no_action, are refused)
    "av": 9, "camera_pose": 9, "pusht": 2, "umi": 10, "bridge_orig_lerobot": 10, "droid_lerobot": 10,
    "robomind-franka": 10, "robomind-franka-dual": 20, "robomind-ur": 10, "galbot": 30, "agibotworld": 29,
    "agibot_gear_gripper": 29, "agibot_gear_gripper_ext": 29, "fractal": 10, "hand_pose": 57,
}
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
}
ASPECT_RATIOS = ("1,1", "4,3", "3,4", "16,9", "9,16")


@dataclass(frozen=True)
class Preset:
    """A complete set of action sampling values; explicit values in the request always win."""

    source: str
    steps: int
    guidance_scale: float
    schedule: str  # "unipc" (with flow_shift) or "checkpoint" (the shipped scheduler)
    flow_shift: float | None
    chunk_size: int | None  # None: the caller's (16 when unset)
    fps: float
    resolution_tier: int
    view_point: str
    use_system_prompt: bool | None  # None: the checkpoint's default
    joint_state: bool = False  # the DROID server's 8-D joint actions after a clean robot-state row


PRESETS = {
    "framework": Preset("the model authors' inference defaults", 30, 1.0, "unipc", 10.0, 16, 24.0, 256, "ego_view",
                        False),
    "droid-server": Preset("the model authors' DROID policy server", 4, 3.0, "unipc", 5.0, 32, 15.0, 480,
                           "concat_view", False, joint_state=True),
    "sglang": Preset("SGLang's action endpoint", 35, 1.0, "unipc", 10.0, 16, 5.0, 480, "ego_view", False),
    "diffusers": Preset("diffusers' Cosmos3OmniPipeline signature", 35, 6.0, "checkpoint", None, None, 24.0, 480,
                        "ego_view", None),
}
FRAMEWORK_FPS = {"av": 10.0, "camera_pose": 30.0, "droid_lerobot": 15.0}  # per embodiment, where the authors give one
JOINT_WIDTH = 8  # DROID joint positions: 7 joints and the gripper
DEFAULT_CHUNK = 16


def default_preset(checkpoint_name: str) -> str:
    """droid-server for Policy-DROID checkpoints (by folder or repo id), framework otherwise."""
    return "droid-server" if "policy-droid" in checkpoint_name.lower() else "framework"


@dataclass(frozen=True)
class ActionRequest:
    """What an action run does. None: the preset's value (`preset` None: the checkpoint's default preset)."""

    mode: str = "policy"
    chunk_size: int | None = None
    domain: str = "droid_lerobot"
    resolution_tier: int | None = None
    actions: Any = None  # forward_dynamics: [T, width] (padded by repeating the last row, or truncated)
    image: Any = None  # the observation (policy, forward dynamics)
    video: Any = None  # inverse dynamics: the clip; otherwise its first frame is the observation
    view_point: str | None = None
    preset: str | None = None
    state: Any = None  # droid-server: the current robot state [8] (7 joint positions and the gripper)
    stats: dict | None = None  # the dataset's action statistics: outputs denormalized, input actions normalized

    def __post_init__(self):
        if self.mode not in MODES:
            raise InputError(f"action mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.chunk_size is not None and int(self.chunk_size) < 1:
            raise InputError(f"chunk_size must be at least 1, got {self.chunk_size}")
        if self.domain not in DOMAIN_IDS:
            raise InputError(f"unknown action domain {self.domain!r}; domains: {', '.join(sorted(WIDTHS))}")
        if self.domain not in WIDTHS:
            raise InputError(f"domain {self.domain!r} has no fixed action width, so it cannot be generated; "
                             f"domains: {', '.join(sorted(WIDTHS))}")
        if self.resolution_tier is not None and self.resolution_tier not in TIERS:
            raise InputError(f"resolution_tier {self.resolution_tier} is not one of {', '.join(map(str, TIERS))}")
        if self.preset is not None and self.preset not in PRESETS:
            raise InputError(f"unknown action preset {self.preset!r}; presets: {', '.join(PRESETS)}")
        if self.image is not None and self.video is not None:
            raise InputError("give the action request either an image or a video, not both")
        if self.image is None and self.video is None:
            raise InputError("an action request needs an observation: an image or a video")
        if self.mode == "inverse_dynamics" and self.video is None:
            raise InputError("inverse_dynamics needs a video: the actions between its frames are what it infers")
        if self.stats is not None:
            normalization(self.stats)  # checked here, before anything runs

    def resolved(self, preset_name: str) -> "ActionRequest":
        """The request with the preset's chunk, tier and view point filled in, fully checked."""
        preset = PRESETS[self.preset or preset_name]
        chunk = self.chunk_size if self.chunk_size is not None else (preset.chunk_size or DEFAULT_CHUNK)
        done = replace(self, chunk_size=int(chunk), preset=self.preset or preset_name,
                       resolution_tier=self.resolution_tier or preset.resolution_tier,
                       view_point=self.view_point or preset.view_point)
        if preset.joint_state:
            if self.domain != "droid_lerobot":
                raise InputError(f"the droid-server preset is for the droid_lerobot domain, not {self.domain!r}")
            state = None if self.state is None else torch.as_tensor(self.state, dtype=torch.float32).reshape(-1)
            if state is None or state.numel() != JOINT_WIDTH:
                raise InputError("the droid-server preset needs the robot state: 7 joint positions and the gripper "
                                 f"({JOINT_WIDTH} values)")
            done = replace(done, state=state)
        if done.mode == "forward_dynamics":
            if done.actions is None:
                raise InputError("forward_dynamics needs actions [T, width] to roll out")
            actions = torch.as_tensor(done.actions, dtype=torch.float32)
            if actions.ndim != 2 or actions.shape[0] < 1 or actions.shape[1] != done.width:
                raise InputError(f"actions for domain {done.domain!r} must be [T, {done.width}] with T >= 1, got "
                                 f"{list(actions.shape)}")
            if done.stats is not None:  # the model works in the normalized space
                actions = normalize(actions, done.stats)
            done = replace(done, actions=actions)
        return done

    @property
    def settings(self) -> Preset:
        return PRESETS[self.preset]

    @property
    def width(self) -> int:
        return JOINT_WIDTH if self.preset and self.settings.joint_state else WIDTHS[self.domain]

    @property
    def num_frames(self) -> int:
        return self.chunk_size + 1

    def clip(self):
        """The conditioning frames as a clip (a PIL image becomes a one-frame list; arrays are [1, H, W, 3])."""
        if self.image is None:
            return self.video
        return [self.image] if type(self.image).__module__.startswith("PIL.") else self.image


NORMALIZATIONS = {"quantile": ("q01", "q99"), "meanstd": ("mean", "std"), "minmax": ("min", "max")}


def normalization(stats: dict) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(method, low, high) of an action statistics dict: q01/q99 (quantile), mean/std, or min/max."""
    for method, (low, high) in NORMALIZATIONS.items():
        if low in stats and high in stats:
            return method, torch.as_tensor(stats[low], dtype=torch.float32), torch.as_tensor(stats[high], dtype=torch.float32)
    raise InputError("action stats need q01 and q99 (quantile), mean and std, or min and max, one value per "
                     f"action dimension; got keys {sorted(stats)}")


def denormalize(actions: torch.Tensor, stats: dict) -> torch.Tensor:
    """Model-space actions (about [-1, 1]) -> the dataset's units."""
    method, low, high = normalization(stats)
    if method == "meanstd":
        return actions * high + low
    return (actions + 1) / 2 * (high - low) + low


def normalize(actions: torch.Tensor, stats: dict) -> torch.Tensor:
    """The dataset's units -> the model's space, clamped to [-1, 1] (the inverse of `denormalize`)."""
    method, low, high = normalization(stats)
    if method == "meanstd":
        return ((actions - low) / high).clamp(-1, 1)
    return (2 * (actions - low) / (high - low) - 1).clamp(-1, 1)


def canvas_size(clip, tier: int) -> tuple[int, int]:
    """The tier's (height, width) closest in aspect ratio to the clip's frames rounded down to whole latents."""
    height, width = _whole_latents(frame_size(clip))
    ratio = height / width
    return min(TIERS[tier], key=lambda hw: abs(hw[0] / hw[1] - ratio))


def _whole_latents(size: tuple[int, int]) -> tuple[int, int]:
    return tuple(v // SPATIAL_FACTOR * SPATIAL_FACTOR for v in size)


def canvas_frames(clip, tier: int, num_frames: int, dtype: torch.dtype):
    """The clip on its action canvas: ([1, 3, num_frames, H, W] in [-1, 1], (H, W), (content_h, content_w))."""
    h16, w16 = _whole_latents(frame_size(clip))
    frames = preprocess_video(clip, h16, w16).to(dtype)
    target_h, target_w = canvas_size(clip, tier)
    frames = pad_with_last_frame(frames, num_frames)[:, :, :num_frames]
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
                    ", ".join(VIEW_POINTS))
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
