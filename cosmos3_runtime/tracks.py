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
from .sound import fit_soundtrack, samples_for
from .transformer import Segment


@dataclass(frozen=True)
class Parts:
    """What runs and tracks work with: the denoiser (transformer, text K/V, sampling) and the codec (VAE, sound)."""

    denoiser: Denoiser
    codec: Codec

    @property
    def device(self) -> torch.device:
        return self.codec.device


class SoundTrack:
    """Sound latents [sound_dim, T_s] denoised on the video's timesteps by their own stepper. With a soundtrack (audio
    conditioning) its latents are held clean instead, every whole latent frame of it (NVIDIA's framework plans
    samples // hop of the encoder's ceil(samples / hop): a last partial frame is generated), and the run's sound is
    that soundtrack."""

    def __init__(self, noise: torch.Tensor, latent_fps: float, schedule: Schedule, held: Held | None = None,
                 soundtrack: torch.Tensor | None = None):
        self.latent_fps, self.held, self.soundtrack = latent_fps, held, soundtrack
        self.latents = noise if held is None else held.hold(noise)
        # the rows denoised (None: all)
        self.noisy = None if held is None else (held.mask[0] == 0).nonzero()[:, 0].tolist()
        self.stepper = stepper_for(schedule)

    @classmethod
    def for_request(cls, parts: Parts, s: Settings, r: Request, generator: torch.Generator) -> "SoundTrack | None":
        """The track a request with `sound` or `audio` asks for: noise for the clip's duration, drawn from the
        generator right after the video's (for every latent frame, held or not, as the framework draws it)."""
        if not r.sound_use:
            return None
        tokenizer = parts.codec.sound_for(r.sound_use)
        config = parts.denoiser.transformer.config
        samples = samples_for(s.num_frames, s.fps, tokenizer.config.sampling_rate)
        frames = -(-samples // tokenizer.config.hop)
        noise = torch.randn((config.sound_dim, frames), generator=generator, dtype=torch.float32).to(parts.device)
        schedule = parts.denoiser.schedule_for(s)
        if r.audio is None:
            return cls(noise, float(config.sound_latent_fps), schedule)
        soundtrack = fit_soundtrack(r.audio, tokenizer.config, samples)
        mask = torch.zeros(1, frames, device=parts.device)
        mask[:, : samples // tokenizer.config.hop] = 1.0
        held = Held(parts.codec.encode_sound(soundtrack), mask)
        return cls(noise, float(config.sound_latent_fps), schedule, held, soundtrack.clamp(-1.0, 1.0))

    def tokens(self) -> Segment:
        """One token per latent frame, at the sound latents' own rate."""
        return Segment("sound", self.latents.t(), self.noisy, fps=self.latent_fps)

    def step(self, velocity: torch.Tensor, generator) -> None:
        if self.noisy == []:  # the whole soundtrack held: nothing to denoise
            return
        self.latents = self.stepper.step(velocity.t(), self.latents, generator)
        if self.held is not None:
            self.latents = self.held.hold(self.latents)

    def finish(self, parts: Parts, s: Settings, r: Request) -> dict:
        """The run's sound: its latents, and its waveform: the soundtrack it held, or with frames the decoded latents
        (trimmed to the video with `sound_trim`)."""
        latents = self.latents.cpu()
        out = dict(sound_latents=latents, sample_rate=parts.codec.sound_tokenizer.config.sampling_rate)
        if self.soundtrack is not None:
            out["sound"] = self.soundtrack
        elif r.output == "frames":
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

    def tokens(self) -> Segment:
        """One token per action, at the video's frame rate (4 per latent frame), from the frame after the
        observation; the state row sits at the observation's time."""
        start = 0 if self.with_state else 1
        return Segment("action", self.latents, self.noisy, base_temporal_factor=TEMPORAL_FACTOR, start_frame=start,
                       domain=DOMAIN_IDS[self.req.domain])

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
