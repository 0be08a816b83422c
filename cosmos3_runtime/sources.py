"""Conditioning sources: what a window's held frames come from. Each source looks at the resolved settings and the
request and returns the frames it holds clean (`Held`), or None when the request does not use it; the first source
that answers wins (`held_for`), none answering means the window starts from noise alone (text to image or video).

A new source is a function `(codec, settings, request, shape) -> Held | None` added to `SOURCES`.
"""

import torch

from . import keyframes
from .action import canvas_frames
from .codec import Codec
from .conditioning import Held, pad_with_last_frame, preprocess_image, preprocess_video
from .errors import InputError
from .geometry import SPATIAL_FACTOR, TEMPORAL_FACTOR, latent_size
from .request import Request
from .settings import Settings


def held_first(codec: Codec, encoded: torch.Tensor, shape: tuple, s: Settings) -> Held:
    """Latents of `shape` holding `encoded` (normalized latents of the first frames) at the settings' condition
    frames."""
    clean = torch.zeros(shape, dtype=torch.float32, device=codec.device)
    clean[:, :, : encoded.shape[2]] = encoded
    mask = torch.zeros(shape[2], 1, 1, dtype=torch.float32, device=codec.device)
    mask[list(s.condition_frames)] = 1.0
    return Held(clean, mask)


def action_canvas(codec: Codec, s: Settings, r: Request, shape: tuple) -> Held | None:
    """An action run's clip on its canvas, encoded, then cropped back to the content (the window takes its shape)."""
    if s.action is None:
        return None
    vae = codec.vae_for("action generation (it encodes the observation)")
    pixels, _, (content_h, content_w) = canvas_frames(s.action.clip(), s.action.resolution_tier, s.num_frames,
                                                      vae.dtype)
    h, w = latent_size(content_h, content_w)
    encoded = codec.encode_pixels(pixels)[..., : max(h, 1), : max(w, 1)]
    return held_first(codec, encoded, tuple(encoded.shape), s)


def given_latents(codec: Codec, s: Settings, r: Request, shape: tuple) -> Held | None:
    """Raw VAE latents [1, 48, T', h, w] given already encoded (a ComfyUI LATENT): their first or last latent frames,
    normalized."""
    raw = r.condition_latents
    if raw is None:
        return None
    if not isinstance(raw, torch.Tensor) or raw.ndim != 5 or tuple(raw.shape[:2]) != shape[:2]:
        got = list(raw.shape) if isinstance(raw, torch.Tensor) else type(raw).__name__
        raise InputError(f"condition_latents must be raw VAE latents [1, {shape[1]}, T, h, w], got {got}")
    if tuple(raw.shape[3:]) != shape[3:]:
        h, w = raw.shape[3:]
        raise InputError(f"the conditioning latents are {w * SPATIAL_FACTOR}x{h * SPATIAL_FACTOR} (WxH) and the "
                         f"request is {s.width}x{s.height}; set width and height to the clip's size")
    count = s.condition_frames[-1] + 1
    if raw.shape[2] < count:
        raise InputError(f"condition frames {list(s.condition_frames)} need {count} latent frames; the "
                         f"conditioning latents have {raw.shape[2]}")
    raw = raw[:, :, :count] if r.condition_video_keep == "first" else raw[:, :, -count:]
    vae = codec.vae_for("image and video conditioning")
    return held_first(codec, vae.normalize(raw.to(codec.device)).float(), shape, s)


def keyframe_clip(codec: Codec, s: Settings, r: Request, shape: tuple) -> Held | None:
    """Keyframes: the reference clip assembled in pixels, up to the last locked latent."""
    if r.keyframes is None:
        return None
    clip = keyframes.reference(keyframes.place(r.keyframes, s.num_frames), s.height, s.width)
    return held_first(codec, codec.encode_pixels(clip), shape, s)


def image(codec: Codec, s: Settings, r: Request, shape: tuple) -> Held | None:
    """Image to video: the image as the first frame."""
    if r.image is None:
        return None
    return held_first(codec, codec.encode_pixels(preprocess_image(r.image, s.height, s.width).unsqueeze(2)), shape, s)


def clip(codec: Codec, s: Settings, r: Request, shape: tuple) -> Held | None:
    """Video to video: the first or last frames of the clip that the condition frames hold (the causal VAE's latent f
    sees pixel frames up to 4f), the last one repeated where the clip is shorter."""
    if r.video is None:
        return None
    needed = s.condition_frames[-1] * TEMPORAL_FACTOR + 1
    frames = preprocess_video(r.video, s.height, s.width)
    frames = frames[:, :, :needed] if r.condition_video_keep == "first" else frames[:, :, -needed:]
    return held_first(codec, codec.encode_pixels(pad_with_last_frame(frames, needed)), shape, s)


SOURCES = (action_canvas, given_latents, keyframe_clip, image, clip)


def held_for(codec: Codec, s: Settings, r: Request, shape: tuple) -> Held | None:
    """The held frames of a window of latent `shape` (an action canvas brings its own), None to start from noise."""
    if s.condition_frames:
        codec.vae_for("image and video conditioning")
    for source in SOURCES:
        held = source(codec, s, r, shape)
        if held is not None:
            return held
    return None
