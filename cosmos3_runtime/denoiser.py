"""The denoiser: the transformer and what its steps need around it. The prompts' text K/V (computed once per prompt
and kept for the last two, cond and uncond), the sampling schedule, the one sampling loop every run goes through
(`denoise`: a plain generation, each transfer chunk, each chunk of a long video) and a run's first latents. Runs,
windows and tracks step through it, never through the pipeline.
"""

from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from .checkpoint import Checkpoint
from .conditioning import Held
from .geometry import latent_size
from .offload import TextOffload
from .parallel import exchange_branches
from .schedulers import Schedule, checkpoint_schedule, distilled_schedule, stepper_for, unipc_schedule
from .settings import Settings
from .step_cache import StepCache
from .transformer import Cosmos3Transformer, MediaKV, Segment, TextKV
from .weights import precision

TEXT_CACHE_SIZE = 2  # the cond and uncond prompts of the latest request


@dataclass(frozen=True)
class WindowInputs:
    """What every forward of a window takes besides its latents, prompt and tracks: a causal chunk's history (its
    K/V, or the committed frames recomputed under a mask) and its clean conditions, handed to the transformer as
    arguments. The default is a window of its own, from latent frame 0."""

    cache: MediaKV | None = None  # the committed frames' K/V, read, never written
    start_frame: int = 0  # the window's first latent frame in the clip
    attention: Callable | None = None  # the media attention to run (a recompute's mask; None: the layers')
    context: tuple[Segment, ...] = ()  # clean segments before the video (a recompute's controls, committed frames)
    conditions: tuple[Segment, ...] = ()  # clean segments after the window's tracks (action tokens)
    forward: Callable | None = None  # what runs its forwards, with the transformer's arguments (a causal chunk's
    # fixed-shape step, `chunk_step.ChunkStep`); None: the transformer


WINDOW = WindowInputs()


class Denoiser:
    def __init__(self, transformer: Cosmos3Transformer, checkpoint: Checkpoint, device: torch.device):
        self.transformer, self.checkpoint, self.device = transformer, checkpoint, device
        self.text_offload: TextOffload | None = None  # the text tower kept elsewhere between prompts
        self.text_cache: OrderedDict[tuple, TextKV] = OrderedDict()
        self.hooks = transformer.hooks  # the running generation's (its media block compiled or not)
        # told of the text tower's and the media tower's outputs during a generation (its finite check), else None
        self.observe: Callable[..., None] | None = None

    def text_kv(self, ids: list[int]) -> TextKV:
        """The prompt's per-layer text K/V, computed once and kept for the last two prompts (cond, uncond)."""
        key = self.text_key(ids)
        if key in self.text_cache:
            self.text_cache.move_to_end(key)
        else:
            on_device = self.text_offload.on(self.device) if self.text_offload is not None else nullcontext()
            with on_device:  # an offloaded text tower visits the compute device for this prompt only
                self.text_cache[key] = self.transformer.encode_text(torch.tensor(ids, dtype=torch.long), self.device)
            while len(self.text_cache) > TEXT_CACHE_SIZE:
                self.text_cache.popitem(last=False)
            if self.observe is not None:
                kv = self.text_cache[key]
                self.observe("the text tower", self.transformer.text_dtype, *kv.keys, *kv.values)
        return self.text_cache[key]

    @staticmethod
    def text_key(ids: list[int]) -> tuple:
        return tuple(ids), precision.runs_native("text")  # a quantized text tower's K/V depend on its precision

    def encode_prompts(self, cond_ids, uncond_ids, s: Settings, parallel, progress) -> None:
        """The prompts' text K/V made before the first step (they are cached for it), each reported as "text". A
        CFG-parallel rank encodes what its branch needs, in its first step."""
        if parallel is not None and parallel.cfg is not None:
            return
        prompts = [cond_ids] + ([uncond_ids] if s.guidance_scale != 1.0 else [])
        new = any(self.text_key(ids) not in self.text_cache for ids in prompts)
        on_device = self.text_offload.on(self.device) if self.text_offload is not None and new else nullcontext()
        with on_device:  # an offloaded text tower visits the device once for both prompts
            for done, ids in enumerate(prompts, 1):
                self.text_kv(ids)
                if progress is not None:
                    progress("text", done, len(prompts))

    def schedule_for(self, s: Settings) -> Schedule:
        variant = self.checkpoint.variant
        if s.schedule == "distilled":
            return distilled_schedule(s.sigmas or variant.distilled_sigmas, variant.stochastic_distilled)
        if s.schedule == "checkpoint":
            native = bool(self.checkpoint.model_index.get("use_native_flow_schedule", False))
            return checkpoint_schedule(self.checkpoint.scheduler_config(), s.steps, s.flow_shift, native)
        return unipc_schedule(s.steps, s.flow_shift)

    def denoise(self, latents, s: Settings, guidance, held: Held | None, generator, callback, parallel, tracks: list = (),
                cache: StepCache | None = None, inputs: WindowInputs = WINDOW,
                step_noise: Callable[[int], torch.Generator] | None = None):
        """The sampling loop over the video latents and the tracks beside them (sound, action): the one loop every
        mode runs (a plain generation, each transfer chunk, each chunk of a long video).

        `guidance` says which forward passes each step runs and how their velocities combine (`CFG`, or
        transfer's). A track (see `tracks.TRACKS`) gives the transformer its tokens (`tokens()`, a `Segment`) and
        takes its combined velocity (`step`). `cache` (SeaCache) may skip a pass's layer stack. `inputs`: what every
        forward takes besides (a causal chunk's history and conditions); `step_noise(i)`, the generator step i
        re-noises from (default `generator` throughout).
        """
        schedule = self.schedule_for(s)
        stepper = stepper_for(schedule)
        noisy = [f for f in range(s.latent_frames) if f not in s.condition_frames]
        window_hooks = replace(self.hooks, cache=inputs.cache, start_frame=inputs.start_frame,
                               attention=inputs.attention)
        sp, cfg = (parallel.sp, parallel.cfg) if parallel is not None else (None, None)
        if cache is not None:
            cache.begin(len(schedule))
        # The schedule goes to the device once (the model's timesteps, the previews' sigmas); guidance and the cache
        # decide on host copies: a step reads nothing back from the device but the cache's one figure.
        timesteps, sigmas = schedule.timesteps.to(latents.device), schedule.sigmas.to(latents.device)

        def velocities(k, ids, context) -> list[torch.Tensor]:
            # The conditional branch of a CFG-parallel job never encodes the unconditional prompt.
            hooks = window_hooks if cache is None else replace(window_hooks, stack=cache.layers(k))  # each pass its own
            out = (inputs.forward or self.transformer)(latents, timesteps[i], self.text_kv(ids), noisy, s.fps,
                                                       [*(track.tokens() for track in tracks), *inputs.conditions],
                                                       sp=sp, context=[*inputs.context, *context], hooks=hooks)
            return [out.vision.float()] + [v.float() for v in out.tracks[: len(tracks)]]

        for i, t in enumerate(schedule.timesteps.tolist()):
            if cache is not None:
                cache.step(i, latents, t, sp)
            # Each pass runs at its own text length: padding one to the other's would leave zero keys that the
            # (unmasked) media attention still weights.
            passes = guidance.passes(t)
            with precision.for_step(s.precision, i, len(schedule)):
                if cfg is not None and len(passes) == 2:  # one pass per rank group, exchanged (no tracks)
                    outputs = [[v] for v in exchange_branches(cfg, velocities(cfg.rank, *passes[cfg.rank])[0])]
                else:
                    outputs = [velocities(k, *p) for k, p in enumerate(passes)]
            combined = guidance.combine(t, outputs)
            velocity = combined[0]
            if callback is not None:  # the model's current guess of the result: what previews should show
                denoised = latents - sigmas[i] * velocity
            latents = stepper.step(velocity, latents, generator if step_noise is None else step_noise(i))
            for track, track_velocity in zip(tracks, combined[1:]):
                track.step(track_velocity, generator)
            if held is not None:  # conditioned frames stay exactly at their clean latents
                latents = held.hold(latents)
            if callback is not None:
                callback(i + 1, len(schedule), denoised)
        if self.observe is not None:
            self.observe("the media tower", self.transformer.dtype, latents, *(track.latents for track in tracks))
        return latents

    def start_latents(self, shape: tuple, generator: torch.Generator, held: Held | None) -> torch.Tensor:
        """A run's first latents: noise drawn from `generator` (on the CPU, so every device draws the same), with the
        held frames at their clean latents."""
        noise = torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device)
        return noise if held is None else held.hold(noise)

    def latent_shape(self, s: Settings) -> tuple[int, ...]:
        return (1, self.transformer.config.latent_channel, s.latent_frames, *latent_size(s.height, s.width))
