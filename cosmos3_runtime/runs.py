"""Kinds of run, and the one window loop that runs them all.

A plan is one kind of run (`for_plan`):
- `Single`: the request in one window, its tracks (sound, actions) beside the video;
- `Continued`: a video longer than one window (a long video), chunk by chunk, each chunk after the first continuing
  from the decoded last frames of the one before;
- `Controlled`: a transfer, each chunk denoised beside its control latents and continuing like a long video.

A kind says what its windows are (`window(k)`: the window's settings, held frames and guidance) and keeps what each
made (`keep`); `execute` is the loop: one noise generator through every window, each window's first latents, its
prompts' text K/V, the denoiser's sampling loop. Runs work with the denoiser and the codec (`Parts`), never with the
pipeline. Beside them plug in the conditioning sources (`sources.SOURCES`) and the tracks (`tracks.TRACKS`).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from . import causal, chunks, transfer
from .conditioning import Held, preprocess_image, preprocess_video
from .errors import InputError
from .geometry import TEMPORAL_FACTOR, latent_frames, latent_size, pixel_frames
from .parallel import Parallel
from .request import Request
from .schedulers import in_interval
from .settings import Settings
from .sound import Audio, fit_soundtrack, samples_for
from .sources import held_for
from .step_cache import StepCache
from .tracks import TRACKS, Parts
from .transformer import MediaKV, TrackTokens, masked_media_attention
from .vae import StageCallback, stage

RECOMPUTE_MASK = 2**30  # bool entries of the largest attention mask a recompute builds (1 GiB)

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
        """(token ids, clean items before the video) of each forward pass."""
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
    noise (a causal rollout's) also brings the generator of its first latents and of each step's re-noising, and the
    forward it runs (over its history)."""

    settings: Settings
    held: Held | None
    guidance: CFG | transfer.Guidance
    noise: torch.Generator | None = None  # its first latents' (None: the run's one generator)
    step_noise: Callable[[int], torch.Generator] | None = None  # step i's re-noising (None: the run's generator)
    forward: Callable | None = None  # the transformer's call (None: the transformer itself)
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


class Single(Run):
    """The request in one window, its tracks beside the video."""

    def __init__(self, parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int]):
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

    def __init__(self, parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int]):
        super().__init__(parts, s, r, s.chunks, "a long video (it decodes each chunk to start the next from its last "
                         "frames)", r.output == "frames")
        self.prompts = s.chunk_ids or [cond_ids] * self.count
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
        chunk = replace(s, num_frames=p.chunk, chunks=None, chunk_ids=None, condition_frames=frames)
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
        super().__init__(parts, s, r, s.transfer, "transfer (it encodes the controls and decodes every chunk)", True)
        self.cond_ids, self.uncond_ids = cond_ids, uncond_ids
        dtype = parts.denoiser.transformer.dtype
        self.pixels = transfer.control_pixels(r.control_videos, s.transfer, s.height, s.width, dtype)

    def window(self, k: int) -> Window:
        s, p = self.s, self.s.transfer
        start, end = p.window(k)
        controls = [self.parts.codec.encode_pixels(transfer.reflect_pad(c[:, :, start:end], p.chunk))
                    for c in self.pixels]
        frames = tuple(range(latent_frames(p.seed_frames(k))))
        chunk = replace(s, num_frames=p.chunk, chunks=None, transfer=None, condition_frames=frames)
        guidance = transfer.Guidance(self.cond_ids, self.uncond_ids, controls, s.guidance_scale, s.guidance_interval,
                                     p.control_guidance, p.control_interval)
        return Window(chunk, self.seeded(k, chunk), guidance)

    def keep(self, k: int, latents: torch.Tensor, tracks: list, progress: StageCallback | None) -> None:
        self.decode(k, latents, progress)

    @property
    def result(self) -> Generation:
        return Generation(None, self.frames.frames, self.s)


class Rollout(Run):
    """A causal rollout (`causal`): chunk by chunk, each denoised in the checkpoint's fixed steps against the K/V of
    the frames committed before it (its control chunk committed first, its RGB frames after it is denoised), with its
    own noise seeds; or, in "recompute" mode, every forward over the whole clip so far under the matching mask. The
    clip is decoded once, at the end.

    Conditioned on actions (Sim-Bimanual), latent frame 0 is the first image, committed clean with null actions
    before the first chunk; each chunk after it is denoised and committed beside its frames' actions. A session
    (`open`) rolls on tick by tick: `extend` adds the next actions (`extend_controls` the next control frames) and
    the chunks they make, and each call of `execute` runs the chunks not run yet, its latents only those of the
    chunks it ran."""

    chunked = True

    def __init__(self, parts: Parts, s: Settings, r: Request, cond_ids: list[int], parallel: Parallel | None,
                 open: bool = False):
        if parallel is not None:
            raise InputError("a causal rollout runs on one process; turn sequence and CFG parallelism off")
        vae = parts.codec.vae_for("a causal rollout (it encodes its first frame or control clip and decodes the clip)")
        self.parts, self.s, self.r, self.cond_ids, self.open = parts, s, r, cond_ids, open
        self.fast = parts.codec.fast_decoder(r.fast_decoder, r.fast_decoder_latents)  # loaded (or refused) first
        self.plan: causal.Rollout = s.rollout
        self.model = parts.denoiser.transformer
        self.controls = None  # the control latents from latent frame `control_start` on: a batch's whole clip, encoded
        self.control_start = 0  # once; a session's as its ticks bring them, those of chunks run dropped
        if self.plan.hint is not None:
            self.encoder = vae.encode_stream()  # a session's ticks go on where the last left off
            if open:
                shape = parts.denoiser.latent_shape(s)
                self.controls = torch.zeros(*shape[:2], 0, *shape[3:], device=parts.device)
            else:
                clip = preprocess_video(r.control_videos[self.plan.hint], s.height, s.width)[:, :, : s.num_frames]
                self.controls = self.encode(clip)
        self.actions = None  # Sim-Bimanual: the normalized action rows [n, width], the first image's latents
        if self.plan.embodiment is not None:
            self.actions = torch.zeros(0, self.model.config.action_dim, device=parts.device)  # read every forward
            first = preprocess_image(r.action.image, s.height, s.width).unsqueeze(2)  # cover-resized, centre-cropped
            self.first_latents = parts.codec.encode_pixels(first.to(self.model.dtype))
            if not open:  # (a batch without actions is refused with its plan: `Planner.check`)
                self.extend(torch.as_tensor(r.action.actions, dtype=torch.float32)[: s.num_frames - 1])
        self.cache = None
        self.tokens = math.prod(-(-n // self.model.config.latent_patch_size) for n in latent_size(s.height, s.width))
        if self.plan.mode == "kv":
            home = torch.device("cpu") if self.plan.history == "cpu" else parts.device
            rows = self.plan.history_frames() * (self.tokens + self.plan.action_tokens)
            self.cache = MediaKV(self.model.config, rows, self.model.dtype, home,
                                 pinned=home.type == "cpu" and parts.device.type == "cuda",
                                 fp8=self.plan.history == "fp8")
        self.seed, self.seeds = int(r.seed), causal.SEEDS[self.plan.seeds]
        if self.plan.mode == "recompute":
            rows = (1 + (self.controls is not None)) * self.plan.latent_frames * self.tokens
            if rows * rows > RECOMPUTE_MASK:
                raise InputError(f"causal_cache 'recompute' is a reference for short clips: {self.plan.latent_frames} "
                                 f"latent frames need a {rows}x{rows} attention mask; use causal_cache 'kv' (the same "
                                 "result) or fewer frames")
        self.first = 1 if self.actions is not None else 0  # the first chunk denoised (latent 0 is the image)
        if open:  # the cache is sized for the planned run's history; the session's chunks come with its ticks
            self.plan = replace(self.plan, chunks=self.plan.chunks[: self.first])
        self.done = self.first  # chunks run so far
        self.dropped = 0  # action rows a session dropped once their chunks had run
        self.count = len(self.plan.chunks) - self.done
        self.latents = self.buffer()
        self.frames: torch.Tensor | None = None

    def buffer(self) -> torch.Tensor:
        """The latents of the chunks the next `execute` runs (with latent 0 when it starts the clip)."""
        start = self.plan.chunks[self.done][0] if self.done < len(self.plan.chunks) else self.plan.latent_frames
        self.origin = 0 if self.done == self.first else start
        shape = self.parts.denoiser.latent_shape(self.s)
        return torch.zeros(*shape[:2], self.plan.latent_frames - self.origin, *shape[3:], device=self.parts.device)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Control pixels [1, 3, F, H, W] in [-1, 1], the clip's frames after those encoded so far -> their latents."""
        return self.parts.codec.encode_pixels(pixels.to(self.model.dtype), self.encoder)

    def grow(self, latents: int) -> None:
        """A session's plan grown to `latents` latent frames, in whole chunks (its latents: of the chunks not run)."""
        chunks = causal.chunk_ranges(latents, self.plan.config.chunk_size)
        self.plan = replace(self.plan, chunks=tuple(chunks))
        self.count = len(chunks) - self.done
        self.latents = self.buffer()

    def extend_controls(self, pixels: torch.Tensor) -> None:
        """Append a session's next control frames [1, 3, F, H, W] in [-1, 1] (its first frame alone, then 4 for each
        latent frame) and the chunks they make; the control latents of chunks already run go (memory stays flat)."""
        ran = self.plan.chunks[self.done - 1][1] if self.done else 0
        self.controls = torch.cat([self.controls[:, :, ran - self.control_start :], self.encode(pixels)], dim=2)
        self.control_start = ran
        self.grow(ran + self.controls.shape[2])

    def extend(self, actions) -> None:
        """Append raw actions [n, width] (n a multiple of 4: one latent frame each 4) and the chunks they make."""
        rows = self.plan.embodiment.normalize(actions, self.model.config.action_dim).to(self.parts.device)
        if rows.shape[0] % causal.ACTION_TOKENS:
            raise InputError(f"actions come {causal.ACTION_TOKENS} rows to a latent frame: {rows.shape[0]} rows are "
                             f"not a multiple of {causal.ACTION_TOKENS}")
        if self.open:  # rows of chunks already run go: a session's memory stays flat
            ran = causal.action_rows(1, self.plan.chunks[self.done - 1][1])[1] if self.done > self.first else 0
            self.actions, self.dropped = self.actions[ran - self.dropped :], ran
        self.actions = torch.cat([self.actions, rows])
        if self.open:
            self.grow(1 + (self.dropped + self.actions.shape[0]) // causal.ACTION_TOKENS)

    def window(self, k: int) -> Window:
        k += self.done
        start, end = self.plan.chunks[k]
        frames = pixel_frames(end) if start == 0 else TEMPORAL_FACTOR * (end - start)  # latent frame 0 holds one
        chunk = replace(self.s, num_frames=frames, rollout=None)
        if self.cache is not None:
            if self.actions is not None and k == self.first and self.done == self.first:
                self.commit(self.first_latents, 0)  # the first image, with null actions
            if self.plan.window_frames is not None:
                self.cache.evict(self.plan.sink_frames, self.plan.recent(start))
            if self.controls is not None:  # the control chunk, committed clean in one forward before the RGB frames
                self.commit(self.controls[:, :, start - self.control_start : end - self.control_start], start)
            forward = self.cached_forward(start, end)
        else:
            forward = self.recompute_forward(start, end)
        noise = torch.Generator("cpu").manual_seed(self.seeds(self.seed, start, None))
        guidance = CFG(self.cond_ids, self.cond_ids, 1.0, None)
        return Window(chunk, None, guidance, noise, lambda i: torch.Generator("cpu").manual_seed(
            self.seeds(self.seed, start, i)), forward)

    def conditions(self, start: int, end: int) -> list[TrackTokens]:
        """The action tokens of latent frames [start, end): null ones for frame 0, else their rows of the table."""
        if self.actions is None:
            return []
        e = self.plan.embodiment
        if start == 0:
            null = self.actions.new_zeros(causal.ACTION_TOKENS, self.actions.shape[1])
            return [TrackTokens("action", null, [], self.s.fps, causal.ACTION_TOKENS, 0, e.domain_id, null=True)]
        first, last = causal.action_rows(start, end)
        return [TrackTokens("action", self.actions[first - self.dropped : last - self.dropped], [], self.s.fps,
                            causal.ACTION_TOKENS, first + 1, e.domain_id)]

    def commit(self, latents: torch.Tensor, start: int) -> None:
        """Append the K/V of clean frames at latent frame `start` (no time embedding: no frame is noisy)."""
        self.cache.start_frame = start
        clean = torch.zeros((), device=latents.device)  # (made there: no copy to the device per commit)
        self.model(latents, clean, self.parts.denoiser.text_kv(self.cond_ids), [], self.s.fps,
                   self.conditions(start, start + latents.shape[2]),
                   hooks=replace(self.parts.denoiser.hooks, cache=self.cache))
        self.cache.append(torch.arange(start, start + latents.shape[2]).repeat_interleave(
            self.cache.written // latents.shape[2]))

    def cached_forward(self, start: int, end: int) -> Callable:
        conditions = self.conditions(start, end)

        def forward(latents, t, text, noisy, fps, tracks, sp=None, context=(), hooks=None):
            self.cache.start_frame = start  # read, never appended: the history stays as committed
            return self.model(latents, t, text, noisy, fps, [*tracks, *conditions], sp=sp, context=context,
                              hooks=replace(hooks or self.model.hooks, cache=self.cache))

        return forward

    def recompute_forward(self, start: int, end: int) -> Callable:
        """Every forward over the clip so far (controls as a context item, the committed frames clean before the
        chunk's), under the mask that reproduces what each frame saw in the K/V rollout."""
        visible = causal.visibility(self.plan, end, self.controls is not None).to(self.parts.device)
        visible = visible.repeat_interleave(self.tokens, 0).repeat_interleave(self.tokens, 1)

        def forward(latents, t, text, noisy, fps, tracks, sp=None, context=(), hooks=None):
            whole = torch.cat([self.latents[:, :, :start], latents], dim=2)
            items = [] if self.controls is None else [self.controls[:, :, :end]]
            previous = [layer.self_attn.media_attention for layer in self.model.layers]
            self.model.use_media_attention(masked_media_attention(visible))
            try:
                out = self.model(whole, t, text, list(range(start, end)), fps, tracks, context=items, hooks=hooks)
            finally:
                for layer, attend in zip(self.model.layers, previous):
                    layer.self_attn.media_attention = attend
            out.vision = out.vision[:, :, start:]
            return out

        return forward

    def keep(self, k: int, latents: torch.Tensor, tracks: list, progress: StageCallback | None) -> None:
        start, end = self.plan.chunks[k + self.done]
        self.latents[:, :, start - self.origin : end - self.origin] = latents
        last = k + 1 == self.count
        if self.cache is not None and (self.open or not last):  # committed frame by frame (a batch's last never is)
            for f in range(start, end):
                self.commit(latents[:, :, f - start : f - start + 1], f)
        if last:
            if self.actions is not None and self.origin == 0:
                self.latents[:, :, :1] = self.first_latents
            self.done += self.count
            if not self.open and self.r.output == "frames":
                self.cache = None  # the history's memory goes back before the whole clip is decoded
                self.frames = self.parts.codec.decode(self.latents, tile=self.r.vae_tile,
                                                      progress=stage(progress, "decode"), fast=self.fast)

    @property
    def result(self) -> Generation:
        return Generation(self.latents.cpu(), self.frames, self.s)


def for_plan(parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int],
             parallel: Parallel | None) -> Run:
    """The kind of run resolved settings `s` make."""
    if parallel is not None and (r.sound_use or r.action is not None):
        raise InputError("sound and action generation run on one process; turn sequence and CFG parallelism off")
    if s.rollout is not None:
        return Rollout(parts, s, r, cond_ids, parallel)
    if s.transfer is not None:
        return Controlled(parts, s, r, cond_ids, uncond_ids, parallel)
    if s.chunks is not None:
        return Continued(parts, s, r, cond_ids, uncond_ids)
    return Single(parts, s, r, cond_ids, uncond_ids)


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
        latents = parts.denoiser.start_latents(shape, w.noise or generator, w.held)
        tracks = run.tracks(w, generator)
        parts.denoiser.encode_prompts(w.guidance.cond, w.guidance.uncond, w.settings, parallel, progress)
        latents = parts.denoiser.denoise(latents, w.settings, w.guidance, w.held, generator, run.steps(callback, k),
                                         parallel, tracks, cache, w.forward, w.step_noise)
        run.keep(k, latents, tracks, progress)
    return replace(run.result, cache=cache and cache.report())
