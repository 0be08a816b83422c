"""Writing generated frames to files (the CLI's outputs; ComfyUI saves through its own nodes)."""

from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from .errors import InputError


def to_uint8(frames: torch.Tensor) -> np.ndarray:
    """[F, H, W, 3] floats in 0..1 -> uint8 array, rounding like PIL conversions do."""
    return (frames.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()


def save(frames: torch.Tensor, path: str | Path, fps: float) -> list[Path]:
    """Save one frame as an image (.png/.jpg/.webp) or a clip as video (.mp4/.mkv/.webm). Returns the written files."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".png", ".jpg", ".jpeg", ".webp"):
        return save_images(frames, path)
    if suffix in (".mp4", ".mkv", ".webm"):
        return [save_video(frames, path, fps)]
    raise InputError(f"unsupported output file type {suffix!r}; use .png, .jpg, .webp, .mp4, .mkv or .webm")


def save_images(frames: torch.Tensor, path: Path) -> list[Path]:
    """One image per frame; several frames get numbered names (out_00000.png, ...)."""
    from PIL import Image

    pixels = to_uint8(frames)
    if len(pixels) == 1:
        paths = [path]
    else:
        paths = [path.with_name(f"{path.stem}_{i:05d}{path.suffix}") for i in range(len(pixels))]
    for frame, target in zip(pixels, paths):
        Image.fromarray(frame).save(target)
    return paths


def save_video(frames: torch.Tensor, path: Path, fps: float) -> Path:
    try:
        import av
    except ImportError as exc:
        raise InputError("writing video needs PyAV (pip install av); or save frames as .png") from exc
    codec = {".mp4": "libx264", ".mkv": "libx264", ".webm": "libvpx-vp9"}[path.suffix.lower()]
    pixels = to_uint8(frames)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = pixels.shape[2], pixels.shape[1]
        stream.pix_fmt = "yuv420p"
        for frame in pixels:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path
