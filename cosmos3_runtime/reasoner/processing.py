"""Images and videos -> the vision towers' patch vectors, and the prompt text that stands for them.

Pictures are resized as uint8 with torch's antialiased bicubic `interpolate` (what the reference
processors do through torchvision on CPU; resizing a float copy differs by up to 4 grey levels), then
normalised in fp32 as (x - 255 mean) / (255 std). Sizes follow the "smart resize" rule: both sides a
multiple of patch x merge, the pixel count inside the processor's bounds, rounding with Python's
`round` (half to even, as the reference does).

Patch vectors are laid out as each tower reads them: Nano/Super (C, t, py, px) with an image repeated
over the temporal patch; Edge (py, px, C). Patches come in 2x2 merge-block order.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..conditioning import _channels_last_to_batch, _is_pil, is_pil_clip
from ..errors import InputError
from .config import EDGE, ProcessorConfig

MAX_ASPECT = 200


@dataclass
class VisionInput:
    """One image or video, ready for a vision tower."""

    kind: str  # "image" or "video"
    pixels: torch.Tensor  # [t*h*w, patch_dim] float32
    grid: tuple[int, int, int]  # (t, h, w) in patches
    timestamps: list[float] | None = None  # video: seconds of each temporal slice

    @property
    def tokens(self) -> int:
        """Language-model tokens it becomes (one per 2x2 block)."""
        t, h, w = self.grid
        return t * h * w // 4


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int, frames: int = 1,
                 temporal: int = 1, upscale_small: bool = True) -> tuple[int, int]:
    """The size pictures are resized to: both sides the nearest multiple of `factor`, scaled so frames x height x
    width lies in [min_pixels, max_pixels]. Clips (and Edge's images) first scale a side under `factor` up to it;
    Nano/Super images do not (`upscale_small=False`)."""
    if upscale_small and (height < factor or width < factor):
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    _check_aspect(height, width)
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / temporal) * temporal
    if t * h * w > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h, w = (max(factor, math.floor(side / beta / factor) * factor) for side in (height, width))
    elif t * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h, w = (math.ceil(side * beta / factor) * factor for side in (height, width))
    return h, w


def _check_aspect(height: int, width: int) -> None:
    if max(height, width) / max(min(height, width), 1) > MAX_ASPECT:
        raise InputError(f"a {width}x{height} picture is too narrow: the Reasoner takes aspect ratios up to "
                         f"{MAX_ASPECT}:1; crop it")


def uint8_frames(value, what: str) -> torch.Tensor:
    """A PIL image or clip, a uint8 array / tensor [H, W, 3] or [N, H, W, 3], or floats in 0..1 (ComfyUI IMAGE)
    -> uint8 [N, 3, H, W] on the CPU."""
    if _is_pil(value):
        value = [value]
    if is_pil_clip(value):
        return torch.stack([torch.from_numpy(np.array(f.convert("RGB"), copy=True)) for f in value]).permute(0, 3, 1, 2)
    frames = _channels_last_to_batch(value, what)
    if frames.is_floating_point():
        if frames.numel() and (frames.min() < 0 or frames.max() > 1):
            raise InputError(f"{what} floats must be in 0..1 (ComfyUI IMAGE); pass uint8 for 0..255")
        frames = (frames * 255).round().to(torch.uint8)
    elif frames.dtype != torch.uint8:
        raise InputError(f"{what} must be uint8 or floats in 0..1, got {frames.dtype}")
    if frames.shape[0] == 0 or frames.shape[-1] == 0 or frames.shape[-2] == 0:
        raise InputError(f"{what} is empty")
    return frames.contiguous()


def resize_normalize(frames: torch.Tensor, height: int, width: int, p: ProcessorConfig) -> torch.Tensor:
    """uint8 [N, 3, H, W] -> float32 [N, 3, height, width], resized then normalised."""
    if tuple(frames.shape[-2:]) != (height, width):
        frames = F.interpolate(frames, size=(height, width), mode="bicubic", antialias=True)
    mean = torch.tensor(p.mean) * (1.0 / p.rescale_factor)
    std = torch.tensor(p.std) * (1.0 / p.rescale_factor)
    return (frames.float() - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)


def patchify(frames: torch.Tensor, family: str, p: ProcessorConfig) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Normalised frames [N, 3, H, W] (one image, or a clip) -> patch vectors [t*h*w, dim] and the grid (t, h, w)."""
    tp, ps, m = p.temporal_patch_size, p.patch_size, p.merge_size
    if pad := -frames.shape[0] % tp:  # an odd clip repeats its last frame
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    n, c, height, width = frames.shape
    t, h, w = n // tp, height // ps, width // ps
    x = frames.reshape(t, tp, c, h // m, m, ps, w // m, m, ps)
    if family == EDGE:  # (py, px, c, tp) inside a patch
        x = x.permute(0, 3, 6, 4, 7, 5, 8, 2, 1)
    else:  # (c, tp, py, px)
        x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(t * h * w, -1), (t, h, w)


def prepare_image(image, family: str, p: ProcessorConfig) -> VisionInput:
    frames = uint8_frames(image, "image")
    if frames.shape[0] != 1:
        raise InputError(f"an image must be one picture, got {frames.shape[0]}; pass a batch as a video, or each "
                         "picture as its own image")
    height, width = frames.shape[-2:]
    size = smart_resize(height, width, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels,
                        upscale_small=family == EDGE)
    normalized = resize_normalize(frames, *size, p)
    if family != EDGE:  # an image fills the temporal patch with copies of itself
        normalized = normalized.expand(p.temporal_patch_size, -1, -1, -1)
    pixels, grid = patchify(normalized, family, p)
    return VisionInput("image", pixels, grid)


def sample_indices(total: int, source_fps: float, fps: float, p: ProcessorConfig) -> list[int]:
    """Frames kept from a clip of `total` frames at `source_fps` when sampling `fps` per second."""
    count = int(total / source_fps * fps)
    count = min(max(count, p.min_frames), p.max_frames, total)
    return np.linspace(0, total - 1, count).round().astype(int).tolist()


def check_video_frames(sampled: int, p: ProcessorConfig) -> None:
    if sampled < p.temporal_patch_size:
        raise InputError(f"a video needs at least {p.temporal_patch_size} frames after sampling, got {sampled}; give a "
                         "longer clip (or a higher sample fps), or pass a single frame as an image")


def slice_timestamps(indices: list[int], source_fps: float, temporal: int) -> list[float]:
    """Seconds of each temporal slice: the mean time of its first and last frame."""
    indices = indices + [indices[-1]] * (-len(indices) % temporal)
    times = [i / source_fps for i in indices]
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]


def prepare_video(video, source_fps: float, fps: float | None, family: str, p: ProcessorConfig,
                  indices: list[int] | None = None) -> VisionInput:
    """A clip at `source_fps`, sampled at `fps` (None: the processor's own rate), or already sampled: `indices` are
    its frames' places in the source."""
    frames = uint8_frames(video, "video")
    fps = p.fps if fps is None else fps
    if source_fps <= 0 or fps <= 0:
        raise InputError(f"video fps must be positive, got video_fps {source_fps} and sample fps {fps}")
    if indices is None:
        indices = sample_indices(frames.shape[0], source_fps, fps, p)
        frames = frames[indices]
    elif len(indices) != frames.shape[0]:
        raise InputError(f"{len(indices)} frame indices for {frames.shape[0]} sampled frames")
    check_video_frames(frames.shape[0], p)
    size = smart_resize(*frames.shape[-2:], p.patch_size * p.merge_size, p.min_pixels, p.max_pixels, frames.shape[0],
                        p.temporal_patch_size)
    pixels, grid = patchify(resize_normalize(frames, *size, p), family, p)
    return VisionInput("video", pixels, grid, slice_timestamps(indices, source_fps, p.temporal_patch_size))
