"""Clips longer than one forward pass, made in chunks: the geometry, and how each chunk after the first is seeded.

A chunk is `chunk` pixel frames (1 + 4k); chunk k starts `stride = chunk - overlap` frames after chunk k - 1, so
its first `overlap` frames are the last ones of its predecessor, decoded and encoded again as its conditioning
(the Wan VAE is causal: a chunk's first latent must be its own first frame, alone). Every chunk is generated
whole; the stitched clip keeps the first chunk and each later one without its overlap, cut to `total` frames.
Transfer and long videos share this.
"""

import math
from dataclasses import dataclass

import torch

from .conditioning import Held, pad_with_last_frame
from .errors import InputError
from .geometry import latent_frames, pixel_frames, round_up_frames
from .vae import image_frames


@dataclass(frozen=True)
class Chunks:
    total: int  # output frames
    chunk: int  # pixel frames per chunk (1 + 4k)
    overlap: int  # frames each later chunk takes from the previous one
    stride: int  # frames between chunk starts
    count: int  # chunks

    @property
    def padded(self) -> int:
        """Frames the chunks span (the last one generated whole)."""
        return max(self.total, self.chunk)

    def window(self, k: int) -> tuple[int, int]:
        start = k * self.stride
        return start, min(start + self.chunk, self.total)

    def seed_frames(self, k: int) -> int:
        """Frames chunk k takes from its predecessor (0 for the first)."""
        return 0 if k == 0 else min(self.overlap, self.chunk)


def split(total: int, chunk_frames: int | None, overlap: int | None, default_chunk: int, default_overlap: int,
         notes: list[str], what: str) -> Chunks:
    """The chunks of `total` frames: `chunk_frames` rounded up to 1 + 4k (None: `default_chunk`, or the whole clip when
    it is shorter); `overlap` None: `default_overlap`. `what` names the run in notes ("transfer", "long video")."""
    if chunk_frames is None:
        chunk = min(round_up_frames(total), default_chunk)
    else:
        chunk = round_up_frames(chunk_frames)
        if chunk != chunk_frames:
            notes.append(f"{what}: chunk_frames {chunk_frames} rounded up to {chunk} (chunks are 1 + 4k frames)")
    chunk = 1 if total == 1 else chunk
    overlap = default_overlap if overlap is None else int(overlap)
    if overlap < 0:
        raise InputError(f"chunk_overlap_frames must be 0 or more, got {overlap}")
    if total <= chunk:
        return Chunks(total, chunk, overlap, chunk, 1)
    stride = chunk - overlap
    if stride <= 0:
        raise InputError(f"chunk_overlap_frames {overlap} must be smaller than chunk_frames {chunk}")
    return Chunks(total, chunk, overlap, stride, 1 + math.ceil((total - chunk) / stride))


class Stitched:
    """A chunked run's frames [F, H, W, 3] in 0..1 in host memory, allocated once at the clip's length and filled
    chunk by chunk: a long clip's frames are its largest allocation, never held twice (a list of chunks and their
    concatenation)."""

    def __init__(self, p: Chunks, height: int, width: int):
        self.frames = torch.empty(p.total, height, width, 3)
        self.filled = 0

    def add(self, pixels: torch.Tensor) -> None:
        """A chunk's decoded pixels [1, 3, T, H, W] in [-1, 1] without the frames it took from its predecessor."""
        frames = image_frames(pixels[:, :, : self.frames.shape[0] - self.filled])
        self.frames[self.filled : self.filled + frames.shape[0]] = frames
        self.filled += frames.shape[0]


def keep(decoded: torch.Tensor, p: Chunks, k: int, out: Stitched | None) -> torch.Tensor | None:
    """Chunk k's decoded pixels [1, 3, T, H, W]: its own frames go into `out` (None: the run hands back no frames), and
    the frames the next chunk starts from come back (None after the last). The device keeps only those few frames,
    not the whole float32 chunk through the next chunk's steps."""
    if out is not None:
        out.add(decoded[:, :, p.seed_frames(k):])
    if k + 1 >= p.count:
        return None
    return decoded[:, :, decoded.shape[2] - p.seed_frames(k + 1):].clone()


def seed(codec, previous: torch.Tensor, frames: int, shape: tuple) -> Held:
    """The held first latent frames of a chunk of latent `shape` seeded by the last `frames` frames of the previous
    chunk's decoded pixels [1, 3, T, H, W] in [-1, 1]: they are encoded again, the last frame repeated up to whole
    latent frames (the causal VAE's first latent holds one frame, each next one four)."""
    held = latent_frames(frames)
    target = pad_with_last_frame(previous[:, :, -frames:][:, :, : pixel_frames(held)], pixel_frames(held))
    clean = torch.zeros(shape, dtype=torch.float32, device=codec.device)
    clean[:, :, :held] = codec.encode_pixels(target.to(codec.vae.dtype))
    mask = torch.zeros(shape[2], 1, 1, dtype=torch.float32, device=codec.device)
    mask[:held] = 1.0
    return Held(clean, mask)
