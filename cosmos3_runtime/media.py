"""Writing generated frames to files (the CLI's outputs; ComfyUI saves through its own nodes)."""

import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from .errors import InputError


def to_uint8(frames: torch.Tensor) -> np.ndarray:
    """[F, H, W, 3] floats in 0..1 -> uint8 array, rounding like PIL conversions do."""
    return (frames.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()


IMAGE_TYPES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_CODECS = {".mp4": "libx264", ".mkv": "libx264", ".webm": "libvpx-vp9"}
LATENT_TYPE = ".safetensors"


def check_output(path: str | Path) -> Path:
    """An output path the CLI can write: a known file type in an existing folder (checked before generating)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (*IMAGE_TYPES, *VIDEO_CODECS, LATENT_TYPE):
        raise InputError(f"unsupported output file type {suffix or path.name!r}; use .png, .jpg, .webp (images), "
                         f".mp4, .mkv, .webm (video) or {LATENT_TYPE} (latents)")  # fmt: skip
    folder = path.parent
    if not folder.is_dir():
        raise InputError(f"output folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise InputError(f"output folder {folder} is not writable")
    return path


def save(frames: torch.Tensor, path: str | Path, fps: float) -> list[Path]:
    """Save one frame as an image (.png/.jpg/.webp) or a clip as video (.mp4/.mkv/.webm). Returns the written files."""
    path = check_output(path)
    if path.suffix.lower() in IMAGE_TYPES:
        return save_images(frames, path)
    return [save_video(frames, path, fps)]


def read_image(path: str | Path):
    """A conditioning image from a file, fully decoded (so a broken file fails here, not mid-run)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        raise InputError(f"image file {path} does not exist") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"cannot read image {path}: {exc}") from None


def read_video(path: str | Path) -> list:
    """The frames of a video file as PIL images."""
    import av

    if not Path(path).is_file():
        raise InputError(f"video file {path} does not exist")
    try:
        with av.open(str(path)) as container:
            frames = [frame.to_image() for frame in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError, ValueError) as exc:
        raise InputError(f"cannot read video {path}: {exc}") from None
    if not frames:
        raise InputError(f"video {path} has no frames")
    return frames


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
    codec = VIDEO_CODECS[path.suffix.lower()]
    pixels = to_uint8(frames)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = pixels.shape[2], pixels.shape[1]
        stream.pix_fmt = "yuv420p"
        for frame in pixels:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path
