"""Edge and blur controls derived from a source clip, the way the model authors' stacks derive them.

NVIDIA's Cosmos3 framework (its transfer control augmentor, in inference mode) and its servers compute both with
OpenCV on uint8 RGB frames, one frame at a time:

- edge: `cv2.Canny(frame, low, high)` with the preset's thresholds, the one-channel map repeated to RGB;
- blur: downscale by the preset's first factor (INTER_AREA), one bilateral filter whose diameter 30 and sigmas
  150 (colour) and 100 (space) are scaled by the longest side over 720 (the diameter made odd), upscale back
  (INTER_LINEAR), then down by the preset's second factor and up again (both INTER_CUBIC). `none` is the clip.

Depth, segmentation and world-scenario maps come from elsewhere (a preprocessor, a simulator).
"""

import numpy as np
import torch

from .conditioning import is_pil_clip
from .errors import InputError

EDGE_PRESETS = {"very_low": (20, 50), "low": (50, 100), "medium": (100, 200), "high": (200, 300),
                "very_high": (300, 400)}  # Canny (low, high) thresholds: higher gives sparser edges
BLUR_PRESETS = {"none": (1, 1), "very_low": (1, 4), "low": (4, 4), "medium": (2, 10), "high": (1, 16),
                "very_high": (4, 16)}  # (downscale before the filter, down-up factor after): higher blurs more
DEFAULT_PRESET = "medium"
BILATERAL = (30, 150.0, 100.0)  # diameter, sigma colour, sigma space, tuned at a longest side of 720
BILATERAL_REFERENCE_SIDE = 720


def opencv():
    """The installed cv2, whichever OpenCV build provides it; a clear error without one."""
    try:
        import cv2
    except ImportError as exc:
        raise InputError("deriving edge and blur controls needs OpenCV, which is not installed: pip install "
                         "opencv-python (any OpenCV build works: -headless or -contrib too, whichever your other "
                         "packs use; install only one); or give the control clip itself") from exc
    return cv2


def uint8_frames(frames) -> np.ndarray:
    """A clip (a list of PIL images, or an IMAGE batch [F, H, W, 3] of floats in 0..1 or uint8) as a contiguous uint8
    array [F, H, W, 3], floats rounded to nearest."""
    if is_pil_clip(frames):
        frames = np.stack([np.asarray(frame.convert("RGB")) for frame in frames])
    frames = torch.as_tensor(frames)
    if frames.ndim == 3:
        frames = frames.unsqueeze(0)
    if frames.ndim != 4 or frames.shape[-1] not in (3, 4) or frames.shape[0] == 0:
        raise InputError(f"a source clip is frames [F, H, W, 3], got shape {list(frames.shape)}")
    frames = frames[..., :3]
    if frames.is_floating_point():
        frames = (frames.float().clamp(0, 1) * 255).round()
    return np.ascontiguousarray(frames.to(torch.uint8).cpu().numpy())


def edge(frames: np.ndarray, preset: str = DEFAULT_PRESET) -> np.ndarray:
    """Canny edges of uint8 frames [F, H, W, 3] -> uint8 [F, H, W, 3] (0 or 255, the same in every channel)."""
    cv2 = opencv()
    low, high = _preset(EDGE_PRESETS, preset, "edge")
    edges = np.stack([cv2.Canny(frame, low, high) for frame in frames])
    return np.repeat(edges[..., None], 3, axis=-1)


def blur(frames: np.ndarray, preset: str = DEFAULT_PRESET) -> np.ndarray:
    """The authors' blurred copy of uint8 frames [F, H, W, 3] -> uint8 [F, H, W, 3]."""
    cv2 = opencv()
    before, downup = _preset(BLUR_PRESETS, preset, "blur")
    if preset == "none":
        return frames.copy()
    _, height, width, _ = frames.shape
    small = (width // before, height // before)  # cv2 sizes are (width, height)
    tiny = (int(width / downup), int(height / downup))
    diameter, sigma_colour, sigma_space = _bilateral(max(small))
    out = np.empty_like(frames)
    for i, frame in enumerate(frames):
        frame = cv2.resize(frame, small, interpolation=cv2.INTER_AREA)
        frame = cv2.bilateralFilter(frame, diameter, sigma_colour, sigma_space)
        frame = cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR)
        frame = cv2.resize(frame, tiny, interpolation=cv2.INTER_CUBIC)
        out[i] = cv2.resize(frame, (width, height), interpolation=cv2.INTER_CUBIC)
    return out


def _bilateral(longest_side: int) -> tuple[int, float, float]:
    scale = longest_side / BILATERAL_REFERENCE_SIDE
    diameter, sigma_colour, sigma_space = BILATERAL
    diameter = max(1, round(diameter * scale))
    return diameter + (diameter % 2 == 0), max(1.0, sigma_colour * scale), max(1.0, sigma_space * scale)


def _preset(presets: dict, name: str, hint: str):
    if name not in presets:
        raise InputError(f"unknown {hint} preset {name!r}; presets are {', '.join(presets)}")
    return presets[name]


def derive(hint: str, frames, preset: str = DEFAULT_PRESET) -> torch.Tensor:
    """The `hint` control (edge or blur) of a source clip (an IMAGE batch or uint8 frames) as an IMAGE batch
    [F, H, W, 3] float32 in 0..1."""
    if hint not in DERIVE:
        raise InputError(f"only edge and blur controls can be derived from a clip, not {hint!r}; give a {hint} clip")
    derived = DERIVE[hint](uint8_frames(frames), preset)
    return torch.from_numpy(derived).float() / 255.0


DERIVE = {"edge": edge, "blur": blur}
