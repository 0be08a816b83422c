"""Tracks: what a run denoises beside the video, each on the video's timesteps with its own stepper: sound latents, and
a robot's actions. A track kind is listed once in `TRACKS`; it makes itself from a request (`for_request(parts,
settings, request, generator)`, None when not asked, its noise drawn after the video's in `TRACKS` order), gives the
transformer its tokens (`tokens()`), steps on its combined velocity (`step`) and hands the run its outputs
(`finish(parts, settings, request)`: fields of the `runs.Generation`).
"""

from dataclasses import dataclass

import torch

from .action import DOMAIN_IDS, ActionRequest, denormalize
from .codec import Codec
from .conditioning import Held
from .denoiser import Denoiser
from .errors import InputError
from .geometry import TEMPORAL_FACTOR
from .request import Request
from .schedulers import Schedule, stepper_for
from .settings import Settings
from .sound import samples_for
from .transformer import TrackTokens


@dataclass(frozen=True)
class Parts:
    """What runs and tracks work with: the denoiser (transformer, text K/V, sampling) and the codec (VAE, sound)."""

    denoiser: Denoiser
    codec: Codec

    @property
    def device(self) -> torch.device:
        return self.codec.device


class SoundTrack:
    """Sound latents [sound_dim, T_s], all noisy, denoised on the video's timesteps by their own stepper."""

    def __init__(self, noise: torch.Tensor, latent_fps: float, schedule: Schedule):
        self.latents, self.latent_fps = noise, latent_fps
        self.stepper = stepper_for(schedule)

    @classmethod
    def for_request(cls, parts: Parts, s: Settings, r: Request, generator: torch.Generator) -> "SoundTrack | None":
        """The track a request with `sound` asks for: noise for the clip's duration, drawn from the generator right
        after the video's."""
        if not r.sound:
            return None
        tokenizer = parts.codec.sound_for("sound")
        config = parts.denoiser.transformer.config
        frames = -(-samples_for(s.num_frames, s.fps, tokenizer.config.sampling_rate) // tokenizer.config.hop)
        noise = torch.randn((config.sound_dim, frames), generator=generator, dtype=torch.float32).to(parts.device)
        return cls(noise, float(config.sound_latent_fps), parts.denoiser.schedule_for(s))

    def tokens(self) -> TrackTokens:
        """One token per latent frame, at the sound latents' own rate."""
        return TrackTokens("sound", self.latents.t(), fps=self.latent_fps)

    def step(self, velocity: torch.Tensor, generator) -> None:
        self.latents = self.stepper.step(velocity.t(), self.latents, generator)

    def finish(self, parts: Parts, s: Settings, r: Request) -> dict:
        """The run's sound: its latents, and with frames its waveform (trimmed to the video with `sound_trim`)."""
        latents = self.latents.cpu()
        out = dict(sound_latents=latents, sample_rate=parts.codec.sound_tokenizer.config.sampling_rate)
        if r.output == "frames":
            out["sound"] = parts.codec.decode_sound(latents, s.num_frames / s.fps if r.sound_trim else None)
        return out


class ActionTrack:
    """Action latents [chunk, action_dim]: clean (forward dynamics) or noisy, zero beyond the domain's width."""

    def __init__(self, req: ActionRequest, action_dim: int, generator, device, schedule: Schedule):
        if req.width > action_dim:
            raise InputError(f"domain {req.domain!r} has {req.width}-wide actions; this checkpoint's action head "
                             f"has {action_dim}")
        self.req, self.width = req, req.width
        self.with_state = req.settings.joint_state  # a clean robot-state row first, at temporal position 0
        chunk = req.chunk_size + self.with_state
        clean = torch.zeros(chunk, action_dim)
        self.clean_rows: list[int] = []
        if self.with_state:
            clean[0, : self.width] = req.state
            self.clean_rows = [0]
        if req.mode == "forward_dynamics":
            actions = req.actions
            if actions.shape[0] < chunk:  # short: repeat the last action
                actions = torch.cat([actions, actions[-1:].expand(chunk - actions.shape[0], -1)])
            clean[self.with_state :, : self.width] = actions[: req.chunk_size]
            self.clean_rows = list(range(chunk))
        noise = torch.randn((chunk, action_dim), generator=generator, dtype=torch.float32)
        mask = torch.zeros(chunk, 1)
        mask[self.clean_rows] = 1.0
        self.held = Held(clean.to(device), mask.to(device))
        self.latents = self.held.hold(noise.to(device))
        self.latents[:, self.width :] = 0
        self.noisy = [i for i in range(chunk) if i not in self.clean_rows]
        self.stepper = stepper_for(schedule)

    @classmethod
    def for_request(cls, parts: Parts, s: Settings, r: Request, generator: torch.Generator) -> "ActionTrack | None":
        """The track a request with an action asks for, its noise drawn after the video's (and the sound's)."""
        if s.action is None:
            return None
        return cls(s.action, parts.denoiser.transformer.config.action_dim, generator, parts.device,
                   parts.denoiser.schedule_for(s))

    def tokens(self) -> TrackTokens:
        """One token per action, at the video's frame rate (4 per latent frame), from the frame after the
        observation; the state row sits at the observation's time."""
        start = 0 if self.with_state else 1
        return TrackTokens("action", self.latents, self.noisy, base_temporal_factor=TEMPORAL_FACTOR,
                           start_frame=start, domain=DOMAIN_IDS[self.req.domain])

    def step(self, velocity: torch.Tensor, generator) -> None:
        if not self.noisy:  # every action clean: nothing to denoise
            return
        velocity = velocity * (1.0 - self.held.mask)
        velocity[:, self.width :] = 0
        self.latents = self.stepper.step(velocity, self.latents, generator)
        self.latents = self.held.hold(self.latents)  # the robot state stays exactly clean, as held frames do
        self.latents[:, self.width :] = 0

    def finish(self, parts: Parts, s: Settings, r: Request) -> dict:
        return dict(actions=self.actions())

    def actions(self) -> torch.Tensor | None:
        """The predicted actions [chunk, width] (policy, inverse dynamics), float32 on the CPU; None otherwise."""
        if self.req.mode == "forward_dynamics":
            return None
        actions = self.latents[:, : self.width].float().cpu()
        if self.with_state:  # the server's contract: predicted rows only, gripper as 1 - g
            actions = actions[1:].clone()
            actions[:, -1] = 1.0 - actions[:, -1]
        return denormalize(actions, self.req.stats) if self.req.stats is not None else actions


TRACKS = (SoundTrack, ActionTrack)
