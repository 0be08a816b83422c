"""Transfer: a new clip from a caption and spatial control clips, generated in chunks.

A request with `control_videos` ({hint: clip}, hints edge, blur, depth, seg and wsm) is a transfer. Every
control is resized to the output size (exactly, as the reference does: PIL frames bilinear, tensor frames
nearest) and reflect-padded in time. The clip is made in chunks of `chunk_frames` pixel frames; each chunk after
the first starts from the last `chunk_overlap_frames` frames of the previous one, decoded, so clips can be far
longer than one forward pass holds. Per chunk the transformer sees

    [text | control 1 | ... | control N | target]

where every control is a clean latent item (no time embedding, no output) at exactly the target's positions, and
only the target is denoised. Three forward passes make the velocity: with controls, without them (control
guidance, when its scale is not 1) and the negative prompt with controls (text guidance, when its scale is
above 1), nested as

    v = u + g * ((n + cg * (c - n)) - u)

The scheduler restarts every chunk; one noise generator runs through all of them (`runs.Controlled` is the run). The
prompt is read verbatim under the transfer system prompt: no templates, no caption metadata.
"""

from dataclasses import dataclass

import torch

from . import chunks
from .conditioning import frame_count, frame_size, pad_with_last_frame, preprocess_video
from .errors import InputError
from .schedulers import in_interval

HINTS = ("edge", "blur", "depth", "seg", "wsm")  # also the order the controls take in the sequence
HINT_NAMES = {"edge": "edges (Canny)", "blur": "a blurred copy of the clip", "depth": "depth",
              "seg": "segmentation", "wsm": "a world-scenario map"}
SYSTEM_PROMPT = ("You are a helpful assistant that generates images or videos following the user's instructions and "
                 "control signals (edge maps, blur, depth, or segmentation).")  # the trained text, as the reference has it

# The model authors' recommended values per hint (guidance, control guidance, fps); several hints take the
# "mixed" row. Chunks: 93 frames, 101 for a world-scenario map alone (NVIDIA's servers' defaults).
RECOMMENDED = {"edge": (3.0, 1.5, 30.0), "blur": (3.0, 1.5, 30.0), "depth": (3.0, 1.5, 30.0),
               "seg": (3.0, 2.0, 30.0), "wsm": (1.0, 3.0, 10.0), "mixed": (3.0, 1.5, 30.0)}
DEFAULT_CHUNK = 93
WSM_CHUNK = 101
DEFAULT_OVERLAP = 1
DEFAULT_STEPS = 50
DEFAULT_SHIFT = 10.0


def recommended(hints: tuple[str, ...]) -> tuple[float, float, float]:
    """The authors' (guidance, control guidance, fps) for these hints: a single hint's row, or the mixed one."""
    return RECOMMENDED[hints[0] if len(hints) == 1 else "mixed"]


def check_hints(hints) -> None:
    unknown = [str(k) for k in hints if k not in HINTS]
    if unknown:
        raise InputError(f"unknown control hint(s) {', '.join(map(repr, unknown))}; hints are {', '.join(HINTS)}")


def canonical(control_videos) -> dict:
    """The controls checked (a non-empty dict of known hints to readable clips) and in the sequence's order."""
    if not isinstance(control_videos, dict):
        raise InputError(f"control_videos must be a dict from hint ({', '.join(HINTS)}) to a clip, got "
                         f"{type(control_videos).__name__}")
    if not control_videos:
        raise InputError(f"control_videos is empty: give at least one control clip ({', '.join(HINTS)})")
    check_hints(control_videos)
    for hint, clip in control_videos.items():
        if clip is None:
            raise InputError(f"control {hint!r} has no clip")
        try:
            count, size = frame_count(clip), frame_size(clip)
        except InputError as exc:
            raise InputError(f"control {hint!r}: {exc}") from None
        if count == 0 or 0 in size:
            raise InputError(f"control {hint!r} has no frames")
    return {hint: control_videos[hint] for hint in HINTS if hint in control_videos}


@dataclass(frozen=True)
class Controls(chunks.Chunks):
    """A transfer's controls (their hints in sequence order) and their guidance, over its chunks."""

    hints: tuple[str, ...] = ()
    control_guidance: float = 1.0
    control_interval: tuple[float, float] | None = None


def controls_for(controls: dict, num_frames, chunk_frames, overlap, control_guidance, control_interval,
                 notes: list) -> Controls:
    """The chunk geometry of checked controls (`canonical`); None values take the defaults."""
    first = frame_count(next(iter(controls.values())))
    total = max(1, min(first, num_frames) if num_frames is not None else first)
    if num_frames is not None and num_frames > first:
        notes.append(f"transfer: num_frames {num_frames} capped at the control clip's {first} frames")
    default_chunk = WSM_CHUNK if tuple(controls) == ("wsm",) else DEFAULT_CHUNK  # short clips: one chunk of their own
    geometry = chunks.split(total, chunk_frames, overlap, default_chunk, DEFAULT_OVERLAP, notes, "transfer")
    for hint, clip in controls.items():
        frames = frame_count(clip)
        if frames < geometry.padded:
            notes.append(f"transfer: control {hint!r} has {frames} frames, reflect-padded to {geometry.padded}")
    scale = recommended(tuple(controls))[1] if control_guidance is None else float(control_guidance)
    return Controls(**vars(geometry), hints=tuple(controls), control_guidance=scale, control_interval=control_interval)


def summary(p: Controls) -> str:
    """The controls in a few words, for reports: ", control guidance 1.5 (edge, depth), 2 chunks of 93 frames"."""
    chunks = f"{p.count} chunks of {p.chunk} frames, overlap {p.overlap}" if p.count > 1 else f"one chunk of {p.chunk} frames"
    return f", control guidance {p.control_guidance:g} ({', '.join(p.hints)}), {chunks}"


def resize_notes(controls: dict, height: int, width: int) -> list[str]:
    """What the resize does to controls of another size (an exact resize: the aspect ratio may change)."""
    notes = []
    for hint, clip in controls.items():
        h, w = frame_size(clip)
        if (h, w) != (height, width):
            changed = abs(h * width - w * height) > max(h, w)  # more than a pixel's worth
            notes.append(f"transfer: control {hint!r} is {w}x{h}, resized to {width}x{height}"
                         + (" (its aspect ratio changes)" if changed else ""))
    return notes


def reflect_pad(frames: torch.Tensor, length: int) -> torch.Tensor:
    """[1, 3, T, H, W] -> `length` frames: mirrored back and forth; a single frame is repeated."""
    while frames.shape[2] < length:
        extra = min(frames.shape[2] - 1, length - frames.shape[2])
        if extra <= 0:
            return pad_with_last_frame(frames, length)
        frames = torch.cat([frames, frames.flip(2)[:, :, :extra]], dim=2)
    return frames


def control_pixels(controls: dict, p: Controls, height: int, width: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every control as pixels [1, 3, padded, H, W] in [-1, 1], rounded to `dtype` (the transformer's), in order."""
    return [reflect_pad(preprocess_video(controls[h], height, width).to(dtype), p.padded) for h in p.hints]


@dataclass(frozen=True)
class Guidance:
    """The forward passes of a transfer step and how their velocities combine."""

    cond: list[int]  # token ids
    uncond: list[int]
    controls: list  # this chunk's control latents as clean video segments (`transformer.Segment`), in sequence order
    scale: float
    interval: tuple[float, float] | None
    control_scale: float
    control_interval: tuple[float, float] | None

    def _scales(self, t: float) -> tuple[float, float]:
        return (self.scale if in_interval(self.interval, t) else 1.0,
                self.control_scale if in_interval(self.control_interval, t) else 1.0)

    def passes(self, t: float) -> list[tuple[list[int], list]]:
        """(token ids, clean segments before the target) of each forward: with controls, then without them when
        control guidance applies (its scale is not 1), then the negative prompt when text guidance does (above 1)."""
        g, cg = self._scales(t)
        return ([(self.cond, self.controls)] + ([(self.cond, [])] if cg != 1.0 else [])
                + ([(self.uncond, self.controls)] if g > 1.0 else []))

    def combine(self, t: float, outputs: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        g, cg = self._scales(t)
        c, rest = outputs[0][0], [o[0] for o in outputs[1:]]
        if cg != 1.0:
            n, rest = rest[0], rest[1:]
            c = n + cg * (c - n)
        if g > 1.0:
            u = rest[0]
            c = u + g * (c - u)
        return [c]

