"""Kinds of run, and the one window loop that runs them all.

A plan's kind (`Settings.kind`, `kinds`) is run by its run (`RUNS`, `for_plan`):
- `Single`: the request in one window, its tracks (sound, actions) beside the video;
- `Continued`: a video longer than one window (a long video), chunk by chunk, each chunk after the first continuing
  from the decoded last frames of the one before;
- `Controlled`: a transfer, each chunk denoised beside its control latents and continuing like a long video;
- `causal_run.CausalRun`: a causal checkpoint's rollout (`kinds.Causal`), chunk by chunk over one K/V history.

A kind says what its windows are (`window(k)`: the window's settings, held frames and guidance) and keeps what each
made (`keep`); `execute` is the loop: one noise generator through every window, each window's first latents, its
prompts' text K/V, the denoiser's sampling loop. Runs work with the denoiser and the codec (`Parts`), never with the
pipeline. Beside them plug in the conditioning sources (`sources.SOURCES`) and the tracks (`tracks.TRACKS`).
"""

from dataclasses import replace

import torch

from . import chunks, kinds, transfer
from .causal_run import CausalRun
from .conditioning import Held
from .errors import InputError
from .geometry import latent_frames
from .parallel import Parallel
from .request import Request
from .settings import Settings
from .sound import Audio, fit_soundtrack, samples_for
from .sources import held_for
from .step_cache import StepCache
from .tracks import TRACKS, Parts
from .transformer import VIDEO, Segment
from .vae import StageCallback, stage
from .windows import CFG, Generation, Run, StepCallback, Window


class Single(Run):
    """The request in one window, its tracks beside the video."""

    def __init__(self, parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int],
                 parallel: Parallel | None):
        self.parts, self.s, self.r = parts, s, r
        self.guidance = CFG(cond_ids, uncond_ids, s.guidance_scale, s.guidance_interval)
        self.result: Generation | None = None
        self.fast = parts.codec.fast_decoder(r.fast_decoder, r.fast_decoder_latents)  # loaded (or refused) first

    def window(self, k: int) -> Window:
        held = held_for(self.parts.codec, self.s, self.r, self.parts.denoiser.latent_shape(self.s))
        return Window(self.s, held, self.guidance)

    def tracks(self, w: Window, generator: torch.Generator) -> list:
        return tracks_for(self.parts, self.s, self.r, generator)

    def keep(self, k: int, latents: torch.Tensor, tracks: list, progress: StageCallback | None) -> None:
        frames = None
        if self.r.output == "frames":
            frames = self.parts.codec.decode(latents, tile=self.r.vae_tile, progress=stage(progress, "decode"),
                                             fast=self.fast)
        self.result = Generation(latents.cpu(), frames, self.s)
        for track in tracks:
            self.result = replace(self.result, **track.finish(self.parts, self.s, self.r))


class Chunked(Run):
    """A run of `chunks.count` windows, each after the first seeded by the decoded last frames of the one before
    (`chunks.seed`); every chunk is decoded as it finishes, its own frames stitched into the clip (`chunks.keep`)."""

    def __init__(self, parts: Parts, s: Settings, r: Request, p: chunks.Chunks, what: str, frames_out: bool):
        parts.codec.vae_for(what)
        if r.fast_decoder is not None:
            raise InputError("the fast decoder decodes one-window runs and causal rollouts; a long video or a "
                             "transfer starts each chunk from the last one's frames, encoded again, which the VAE "
                             "decodes: leave fast_decoder unset")
        self.parts, self.s, self.r, self.chunks, self.count, self.chunked = parts, s, r, p, p.count, True
        self.frames = chunks.Stitched(p, s.height, s.width) if frames_out else None
        self.previous: torch.Tensor | None = None  # the decoded frames the next chunk starts from

    def seeded(self, k: int, s: Settings) -> Held | None:
        """Chunk k's first latent frames held at the previous chunk's last frames, encoded again (None for the
        first)."""
        seed = self.chunks.seed_frames(k)
        return chunks.seed(self.parts.codec, self.previous, seed, self.parts.denoiser.latent_shape(s)) if seed else None

    def decode(self, k: int, latents: torch.Tensor, progress: StageCallback | None) -> None:
        if k + 1 < self.count or self.frames is not None:  # the next chunk starts from these frames
            pixels = self.parts.codec.decode_pixels(latents, self.r.vae_tile, stage(progress, "decode"))
            self.previous = chunks.keep(pixels, self.chunks, k, self.frames)


class Continued(Chunked):
    """A long video: the first chunk as a one-window run of its length (its conditioning from the request), each later
    one a video-to-video window on the last frames of the one before; each chunk's own prompt where one per chunk was
    given. Its latents are the chunks' latents without those the overlap held (decoding them at once gives the same
    length); both they and the frames fill host tensors of the clip's size (`budget.output` counts them).

    With a soundtrack (audio conditioning) each chunk holds its slice of it, cut at the chunk's own frames (so the
    frames a chunk takes from the one before hold the same sound there), and the run's sound is the soundtrack fitted
    to the clip."""

    def __init__(self, parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int],
                 parallel: Parallel | None):
        super().__init__(parts, s, r, s.kind.chunks, "a long video (it decodes each chunk to start the next from its "
                         "last frames)", r.output == "frames")
        self.prompts = s.kind.prompt_ids or [cond_ids] * self.count
        self.uncond_ids = uncond_ids
        self.latents, self.filled = torch.empty(parts.denoiser.latent_shape(s)), 0
        self.soundtrack = None  # [channels, samples] at the sound tokenizer's rate, as far as the last chunk reaches
        if r.audio is not None:
            config = parts.codec.sound_for(r.sound_use).config
            p, self.rate = self.chunks, config.sampling_rate
            reach = (p.count - 1) * p.stride + p.chunk  # the last chunk is generated whole, past the clip's end
            self.soundtrack = fit_soundtrack(r.audio, config, samples_for(reach, s.fps, self.rate)).clamp(-1.0, 1.0)

    def window(self, k: int) -> Window:
        s, p = self.s, self.chunks
        frames = s.condition_frames if k == 0 else tuple(range(latent_frames(p.seed_frames(k))))
        chunk = replace(s, kind=kinds.SINGLE, num_frames=p.chunk, condition_frames=frames)
        held = held_for(self.parts.codec, chunk, self.r, self.parts.denoiser.latent_shape(chunk)) if k == 0 else \
            self.seeded(k, chunk)
        return Window(chunk, held, CFG(self.prompts[k], self.uncond_ids, s.guidance_scale, s.guidance_interval), k=k)

    def tracks(self, w: Window, generator: torch.Generator) -> list:
        """A chunk's soundtrack: the slice of the run's from the chunk's first frame, as long as one window holds."""
        if self.soundtrack is None:
            return []
        start = samples_for(w.k * self.chunks.stride, self.s.fps, self.rate)
        piece = self.soundtrack[:, start : start + samples_for(self.chunks.chunk, self.s.fps, self.rate)]
        return tracks_for(self.parts, w.settings, replace(self.r, audio=Audio(piece, self.rate)), generator)

    def keep(self, k: int, latents: torch.Tensor, tracks: list, progress: StageCallback | None) -> None:
        carried = latent_frames(self.chunks.seed_frames(k))
        own = latents[:, :, carried:][:, :, : self.latents.shape[2] - self.filled]
        self.latents[:, :, self.filled : self.filled + own.shape[2]] = own
        self.filled += own.shape[2]
        self.decode(k, latents, progress)

    @property
    def result(self) -> Generation:
        frames = None if self.frames is None else self.frames.frames
        if self.soundtrack is None:
            return Generation(self.latents, frames, self.s)
        sound = self.soundtrack[:, : samples_for(self.s.num_frames, self.s.fps, self.rate)]
        return Generation(self.latents, frames, self.s, sound=sound, sample_rate=self.rate)


class Controlled(Chunked):
    """A transfer: each chunk denoised beside its controls' latents (encoded per chunk from the whole control clips,
    reflect-padded), continuing from the one before; its output is the stitched frames."""

    def __init__(self, parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int],
                 parallel: Parallel | None):
        if parallel is not None and parallel.cfg is not None:
            raise InputError("transfer runs up to three forward passes a step, which CFG parallelism cannot split; "
                             "turn cfg-parallel off (sequence parallelism works)")
        super().__init__(parts, s, r, s.kind.controls, "transfer (it encodes the controls and decodes every chunk)",
                         True)
        self.cond_ids, self.uncond_ids = cond_ids, uncond_ids
        dtype = parts.denoiser.transformer.dtype
        self.pixels = transfer.control_pixels(r.control_videos, s.kind.controls, s.height, s.width, dtype)

    def window(self, k: int) -> Window:
        s, p = self.s, self.s.kind.controls
        start, end = p.window(k)
        controls = [Segment(VIDEO, self.parts.codec.encode_pixels(transfer.reflect_pad(c[:, :, start:end], p.chunk)),
                            []) for c in self.pixels]
        frames = tuple(range(latent_frames(p.seed_frames(k))))
        chunk = replace(s, kind=kinds.SINGLE, num_frames=p.chunk, condition_frames=frames)
        guidance = transfer.Guidance(self.cond_ids, self.uncond_ids, controls, s.guidance_scale, s.guidance_interval,
                                     p.control_guidance, p.control_interval)
        return Window(chunk, self.seeded(k, chunk), guidance)

    def keep(self, k: int, latents: torch.Tensor, tracks: list, progress: StageCallback | None) -> None:
        self.decode(k, latents, progress)

    @property
    def result(self) -> Generation:
        return Generation(None, self.frames.frames, self.s)


RUNS: dict[type, type[Run]] = {kinds.Single: Single, kinds.Continued: Continued, kinds.Controlled: Controlled,
                               kinds.Causal: CausalRun}  # the run that executes each kind


def for_plan(parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int],
             parallel: Parallel | None) -> Run:
    """The run that executes resolved settings `s` (`RUNS`, by their kind)."""
    if parallel is not None and (r.sound_use or r.action is not None):
        raise InputError("sound and action generation run on one process; turn sequence and CFG parallelism off")
    return RUNS[type(s.kind)](parts, s, r, cond_ids, uncond_ids, parallel)


def tracks_for(parts: Parts, s: Settings, r: Request, generator: torch.Generator) -> list:
    """Each track a window of settings `s` running request `r` asks for, its noise drawn from `generator` after the
    video's, in TRACKS order."""
    return [t for kind in TRACKS if (t := kind.for_request(parts, s, r, generator)) is not None]


def execute(run: Run, parts: Parts, seed: int, callback: StepCallback | None,
            parallel: Parallel | None, progress: StageCallback | None, cache: StepCache | None) -> Generation:
    """The window loop: each window from noise drawn from one generator (held frames in place), its tracks' noise
    after the video's, its prompts encoded, the denoiser's steps, then what the run keeps of it. `progress` hears of
    each chunk begun ("chunk"), the prompts ("text") and the decode ("decode")."""
    generator = torch.Generator("cpu").manual_seed(seed)
    for k in range(run.count):
        if run.chunked and progress is not None:
            progress("chunk", k + 1, run.count)
        w = run.window(k)
        shape = parts.denoiser.latent_shape(w.settings) if w.held is None else tuple(w.held.clean.shape)
        latents = parts.denoiser.start_latents(shape, w.noise or generator, w.held) if w.first is None else w.first
        tracks = run.tracks(w, generator)
        parts.denoiser.encode_prompts(w.guidance.cond, w.guidance.uncond, w.settings, parallel, progress)
        latents = parts.denoiser.denoise(latents, w.settings, w.guidance, w.held, generator, run.steps(callback, k),
                                         parallel, tracks, cache, w.inputs, w.step_noise)
        run.keep(k, latents, tracks, progress)
    return replace(run.result, cache=cache and cache.report())
