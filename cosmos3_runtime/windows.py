"""What every kind of run shares (`runs`, `causal_run`): its windows (`Window`: one pass of the sampling loop), the
classifier-free guidance most of them run (`CFG`), the base of a kind (`Run`) and what a run returns (`Generation`).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import transfer
from .conditioning import Held
from .denoiser import WINDOW, WindowInputs
from .schedulers import in_interval
from .settings import Settings

# (step done, total steps, the step's estimate of the clean latents, for previews); raise to cancel
StepCallback = Callable[[int, int, torch.Tensor], None]


@dataclass
class Generation:
    latents: torch.Tensor | None  # normalized latents [1, 48, T, h, w], float32, CPU (None for a transfer)
    frames: torch.Tensor | None  # [F, H, W, 3] float32 in 0..1, CPU (ComfyUI IMAGE); None for output="latents"
    settings: Settings
    sound: torch.Tensor | None = None  # [channels, samples] float32 in [-1, 1], CPU (sound=True, output="frames"; or
    # the soundtrack an audio-conditioned run held)
    sample_rate: int | None = None  # of `sound`
    sound_latents: torch.Tensor | None = None  # [sound_dim, T_s] float32, CPU (None: a long video, its soundtrack held
    # chunk by chunk)
    actions: torch.Tensor | None = None  # [chunk, width] float32, CPU (policy and inverse dynamics)
    cache: str | None = None  # what the step cache did ("SeaCache: N forwards run, M skipped"); None: off


@dataclass(frozen=True)
class CFG:
    """Classifier-free guidance as separate forwards: the prompt, and the negative prompt where the scale (inside
    its interval of timesteps) is not 1; combined as u + g (c - u) for the video and every track."""

    cond: list[int]  # token ids
    uncond: list[int]
    scale: float
    interval: tuple[float, float] | None

    def _scale(self, t: float) -> float:
        return self.scale if in_interval(self.interval, t) else 1.0

    def passes(self, t: float) -> list[tuple[list[int], list]]:
        """(token ids, clean segments before the video) of each forward pass."""
        return [(self.cond, [])] + ([(self.uncond, [])] if self._scale(t) != 1.0 else [])

    def combine(self, t: float, outputs: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        if len(outputs) == 1:
            return outputs[0]
        g = self._scale(t)
        return [u + g * (c - u) for c, u in zip(*outputs)]


@dataclass(frozen=True)
class Window:
    """One pass of the sampling loop: its settings (its frames, its held frames), what it holds clean, how it is
    guided (`CFG`, `transfer.Guidance`: their `cond` / `uncond` ids are the prompts it encodes); a window of its own
    noise (a causal rollout's chunk) also brings the generator of its first latents and of each step's re-noising,
    and what its forwards take besides (`inputs`: its history and conditions)."""

    settings: Settings
    held: Held | None
    guidance: CFG | transfer.Guidance
    noise: torch.Generator | None = None  # its first latents' (None: the run's one generator)
    first: torch.Tensor | None = None  # its first latents themselves (None: drawn from `noise`)
    step_noise: Callable[[int], torch.Generator] | None = None  # step i's re-noising (None: the run's generator)
    inputs: WindowInputs = WINDOW
    k: int = 0  # its place among the run's windows


class Run:
    """What every kind of run shares: one window unless it says otherwise, no tracks, steps counted over the run."""

    count, chunked = 1, False

    def tracks(self, w: Window, generator: torch.Generator) -> list:
        """The tracks window `w` denoises beside its video, their noise drawn from `generator` after the video's."""
        return []

    def steps(self, callback: StepCallback | None, k: int) -> StepCallback | None:
        """The step callback of window k: its steps counted over the whole run."""
        if callback is None or self.count == 1:
            return callback
        return lambda step, total, denoised: callback(k * total + step, self.count * total, denoised)
