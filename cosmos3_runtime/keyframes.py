"""Keyframes: images or clips held at chosen frames of a generated video (first-last frame to video, and any frame).

`keyframes` maps a pixel frame to an image (a still) or a clip; negative frames count from the end (-1 is the last
frame, and a clip placed at a negative frame ends there). The run is a video-to-video run over a reference clip
assembled in pixels, with the latent frames the keyframes cover held to it (NVIDIA's V2V conditioning, as vLLM-Omni's
FL2V recipe drives it, without its round trip through a video file):

- a still at frame f locks the latent frame that holds f (latent 0 holds frame 0, latent j >= 1 frames 4j-3..4j),
  and fills all of that latent's frames, so it holds for those (up to) 4 frames;
- a clip locks every latent frame it touches;
- the other frames of the reference are filler, never locked (their latents start as noise): each takes the first
  frame of the next keyframe, so every locked latent is encoded after frames like its own (the VAE is causal),
  and frames after the last keyframe are not encoded at all.

189 frames with a first and a last still lock latents [0, 47]; 9-frame clips at both ends lock [0, 1, 2] and
[45, 46, 47].
"""

from dataclasses import dataclass
from typing import Any

import torch

from .conditioning import frame_count, preprocess_image, preprocess_video
from .errors import InputError
from .geometry import TEMPORAL_FACTOR, latent_of, latent_span


@dataclass(frozen=True)
class Keyframe:
    start: int  # first pixel frame it covers
    source: Any  # an image, or a clip (anything `video` takes)
    clip: bool
    frames: int  # pixel frames it covers (a still: 1)

    @property
    def latents(self) -> range:
        return range(latent_of(self.start), latent_of(self.start + self.frames - 1) + 1)

    def describe(self) -> str:
        what = f"a {self.frames}-frame clip at frames {self.start}-{self.start + self.frames - 1}" if self.clip else \
            f"a still at frame {self.start}"
        first, last = self.latents[0], self.latents[-1]
        return f"{what}: latent {first}" if first == last else f"{what}: latents {first}-{last}"


def is_clip(source) -> bool:
    """A clip is a list of frames or a 4-D array / tensor of more than one frame; anything else is one image."""
    if isinstance(source, (list, tuple)):
        return len(source) > 1
    shape = getattr(source, "shape", None)
    return shape is not None and len(shape) == 4 and shape[0] > 1


def check_frames(num_frames: int) -> None:
    """Keyframes need the exact frame count (1 + 4k): it is not rounded under them."""
    if (num_frames - 1) % TEMPORAL_FACTOR:
        low = num_frames - (num_frames - 1) % TEMPORAL_FACTOR
        raise InputError(f"keyframes need the exact frame count, 1 + 4k, so that -1 is the last frame; {num_frames} "
                         f"is not: use {low} or {low + TEMPORAL_FACTOR}")


def place(keyframes, num_frames: int) -> list[Keyframe]:
    """The keyframes of a request of `num_frames` frames, checked and in order."""
    if not isinstance(keyframes, dict) or not keyframes:
        raise InputError("keyframes must be a non-empty dict {frame: image or clip} (frame -1: the last one)")
    check_frames(num_frames)
    placed = []
    for at, source in keyframes.items():
        if isinstance(at, bool) or not isinstance(at, int):
            raise InputError(f"keyframe position {at!r} must be a whole frame number (negative counts from the end)")
        clip = is_clip(source)
        frames = frame_count(source) if clip else 1
        start = at if at >= 0 else num_frames + at - (frames - 1)
        if start < 0 or start + frames > num_frames:
            raise InputError(f"the keyframe at frame {at} ({frames} frame{'s' * (frames > 1)}) does not fit in "
                             f"{num_frames} frames; move it, shorten the clip or raise the frame count")
        placed.append(Keyframe(start, source, clip, frames))
    placed.sort(key=lambda k: k.start)
    for a, b in zip(placed, placed[1:]):
        if b.latents[0] <= a.latents[-1]:
            raise InputError(f"keyframes {a.describe()} and {b.describe()} share latent frame {b.latents[0]} (frames "
                             f"{latent_span(b.latents[0])[0]}-{latent_span(b.latents[0])[-1]}); keep them at least one "
                             "latent frame (4 frames) apart")
    return placed


def locked(placed: list[Keyframe]) -> tuple[int, ...]:
    """The latent frames the keyframes hold."""
    return tuple(j for k in placed for j in k.latents)


def reference(placed: list[Keyframe], height: int, width: int) -> torch.Tensor:
    """The reference clip [1, 3, T, H, W] in [-1, 1], up to the last locked latent's last frame: each keyframe
    resized as image- and video-to-video resize theirs and spread over its latents' frames (a still over all of
    them, a clip's first and last frames over what it leaves of its first and last latent), the gaps between
    keyframes filled with the next keyframe's first frame."""
    frames, at = [], 0
    for k in placed:
        if k.clip:
            pixels = preprocess_video(k.source, height, width)[:, :, : k.frames]
        else:
            pixels = preprocess_image(k.source, height, width).unsqueeze(2)
        end = latent_span(k.latents[-1])[-1] + 1
        tail = end - k.start - pixels.shape[2]
        frames += [pixels[:, :, :1].expand(-1, -1, k.start - at, -1, -1), pixels,  # gap and lead: the first frame
                   pixels[:, :, -1:].expand(-1, -1, tail, -1, -1)]
        at = end
    return torch.cat(frames, dim=2)
