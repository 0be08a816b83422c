"""Turning user images and videos into conditioning pixels [1, 3, F, H, W] in [-1, 1].

Accepted inputs, one image: a PIL image, a uint8 array [H, W, 3], or a float tensor/array
[H, W, 3] or [1, H, W, 3] in 0..1 (ComfyUI's IMAGE). One video: a list of PIL images, a uint8 array
[F, H, W, 3], or a float tensor [F, H, W, 3] in 0..1. Processing follows the reference pipeline:
an image is scaled to cover the target size (bilinear, antialiased) and centre-cropped; video frames
are resized to exactly the target size (PIL frames bilinear, tensor frames nearest).
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

from .errors import InputError


class Held:
    """Frames (or rows) held clean while the rest is denoised: `clean` values where `mask` is 1. A run starts from
    noise with them in place and puts them back after every step (`hold`), so they stay exactly clean."""

    def __init__(self, clean: torch.Tensor, mask: torch.Tensor):
        self.clean, self.mask = clean, mask

    def hold(self, latents: torch.Tensor) -> torch.Tensor:
        return self.mask * self.clean + (1.0 - self.mask) * latents


def pad_with_last_frame(frames: torch.Tensor, length: int) -> torch.Tensor:
    """[1, 3, T, H, W] -> at least `length` frames, the last one repeated (as the references fill short clips)."""
    if frames.shape[2] >= length:
        return frames
    return torch.cat([frames, frames[:, :, -1:].expand(-1, -1, length - frames.shape[2], -1, -1)], dim=2)


def _is_pil(value) -> bool:
    return type(value).__module__.startswith("PIL.")


def is_pil_clip(video) -> bool:
    """A clip given as a list of PIL images."""
    return isinstance(video, (list, tuple)) and bool(video) and _is_pil(video[0])


def _channels_last_to_batch(array, what: str) -> torch.Tensor:
    """[H, W, 3] / [N, H, W, 3] (numpy or torch) -> [N, 3, H, W], dtype kept."""
    tensor = torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array
    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{what} must be a PIL image, a numpy array or a torch tensor, got {type(array).__name__}")
    if tensor.ndim == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.ndim != 4 or tensor.shape[-1] not in (3, 4):
        raise InputError(f"{what} must be channels-last [H, W, 3] or [N, H, W, 3], got shape {list(tensor.shape)}")
    return tensor[..., :3].permute(0, 3, 1, 2).cpu()


def preprocess_image(image, height: int, width: int) -> torch.Tensor:
    """One conditioning image -> [1, 3, height, width] in [-1, 1] (cover-resize, centre crop)."""
    if _is_pil(image):
        pixels = torch.from_numpy(np.array(image.convert("RGB"), copy=True)).permute(2, 0, 1).unsqueeze(0)
    else:
        pixels = _channels_last_to_batch(image, "image")
    if pixels.shape[0] != 1:
        raise InputError(f"image must hold one picture, got a batch of {pixels.shape[0]}; pass one frame")
    integer = not pixels.is_floating_point()
    pixels = pixels.to(torch.float32)
    if not integer:  # floats may be in [-1, 1], [0, 1] or [0, 255]; decided once for the whole image
        if pixels.min() < 0:
            pixels = (pixels + 1.0) * 127.5
        elif pixels.max() <= 1.0:
            pixels = pixels * 255.0
    h0, w0 = pixels.shape[-2:]
    scale = max(width / w0, height / h0)
    rh, rw = math.ceil(scale * h0), math.ceil(scale * w0)
    pixels = F.interpolate(pixels, size=(rh, rw), mode="bilinear", align_corners=False, antialias=True)
    top, left = round((rh - height) / 2), round((rw - width) / 2)
    pixels = pixels[:, :, top : top + height, left : left + width]
    return pixels.round().clamp(0, 255) / 127.5 - 1.0


def frame_size(video) -> tuple[int, int]:
    """(height, width) of a clip's frames: a list of PIL images, or an array / tensor [F, H, W, 3]."""
    if is_pil_clip(video):
        return video[0].size[1], video[0].size[0]
    return tuple(_channels_last_to_batch(video, "video").shape[-2:])


def frame_count(video) -> int:
    """Frames of a clip: a list of PIL images, or an array / tensor [F, H, W, 3]."""
    if is_pil_clip(video):
        return len(video)
    return _channels_last_to_batch(video, "video").shape[0]


def preprocess_video(video, height: int, width: int) -> torch.Tensor:
    """Conditioning video frames -> [1, 3, F, height, width] in [-1, 1] (resized, not cropped)."""
    if is_pil_clip(video):
        frames = [np.array(f.convert("RGB").resize((width, height), resample=2), dtype=np.float32) / 255.0 for f in video]
        pixels = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)  # PIL resample 2 = bilinear
    else:
        pixels = _channels_last_to_batch(video, "video")
        pixels = pixels.to(torch.float32) / 255.0 if not pixels.is_floating_point() else pixels.to(torch.float32)
        if pixels.min() < 0 or pixels.max() > 1:
            raise InputError("video frames must be floats in 0..1 (ComfyUI IMAGE) or uint8")
        if pixels.shape[-2:] != (height, width):
            pixels = F.interpolate(pixels, size=(height, width))
    if pixels.shape[0] == 0:
        raise InputError("video has no frames")
    return (pixels * 2.0 - 1.0).permute(1, 0, 2, 3).unsqueeze(0)
