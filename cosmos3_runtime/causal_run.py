"""A causal rollout run (`causal.Rollout` is its plan): chunk by chunk, each denoised in the checkpoint's fixed steps
with its own noise seeds, against the frames committed before it; each chunk's frames decoded as the next samples
(`codec.ChunkDecode`: on a second CUDA stream), or, tiled, the clip once at the end.

Written once, in `CausalRun`: the chunks (a batch's are its plan's; a session's grow tick by tick, its plan
untouched), the seeds, each chunk's window, the clip's latents. Two strategies plug in:

- a conditioner per causal family, what conditions a chunk besides the prompt: `ControlClip` (Sim-Transfer: its
  control latents, committed clean before its frames) and `ActionTable` (Sim-Bimanual: latent frame 0 the first
  image, committed clean beside null action tokens; each later frame beside its four action rows); `Conditioner`
  itself conditions on nothing more. A session extends it tick by tick (`CausalRun.extend`).
- a history, what a chunk's forwards see of the frames before it: `KVHistory` (their K/V in a `MediaKV`: committed
  one forward each, evicted past the window) or `Recompute` (every forward over the clip so far, under the mask that
  reproduces what each frame saw: slower, for tests and doubters).

Both hand the forward its causal inputs explicitly (`denoiser.WindowInputs`: the start frame, the K/V, the attention,
the clean frames before and beside it); the denoiser calls the transformer itself.
"""

import math
from dataclasses import replace

import torch

from . import causal, chunk_step, kinds
from .codec import ChunkDecode
from .conditioning import preprocess_image, preprocess_video
from .denoiser import WindowInputs
from .errors import InputError
from .geometry import TEMPORAL_FACTOR, latent_size, pixel_frames
from .parallel import Parallel
from .request import Request
from .settings import Settings
from .tracks import Parts
from .transformer import VIDEO, MediaKV, Segment, attention, masked_media_attention
from .vae import StageCallback, stage
from .weights import precision
from .weights.fp8 import rounded_per_head
from .windows import CFG, Generation, Run, Window

RECOMPUTE_MASK = 2**30  # bool entries of the largest attention mask a recompute builds (1 GiB)


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The media attention (`causal_attention="fp8"`) over queries, keys and values rounded to e4m3 with a scale per
    key/value head (`rounded_per_head`): the inputs of torch's FP8 attention (its experimental FA3 kernel, Hopper with
    flash-attention 3 installed), computed by SDPA from the rounded values. Torch has no FP8 attention kernel that
    runs without FA3 (none on the CPU): this gives FP8 attention's error exactly, not its speed."""
    heads = k.shape[1]
    return attention(rounded_per_head(q, heads), rounded_per_head(k, heads), rounded_per_head(v, heads))


class Conditioner:
    """What conditions a chunk besides the prompt: here nothing. A causal family subclasses it."""

    first = 0  # chunks given, not denoised (latent frame 0: the first image)
    opening: torch.Tensor | None = None  # latent frame 0's clean latents, where given

    def clean(self, start: int, end: int) -> list[torch.Tensor]:
        """Clean latents at frames [start, end) committed before the chunk's own are denoised."""
        return []

    def context(self, end: int) -> list[Segment]:
        """Clean segments a recompute's forward runs before the clip's frames [0, end)."""
        return []

    def tracks(self, start: int, end: int) -> list[Segment]:
        """Clean segments of rows beside latent frames [start, end), in every forward over them."""
        return []

    def extend(self, more, ran: int) -> int:
        """A session's next conditions, the chunks up to latent frame `ran` run -> the latent frames they reach."""
        raise InputError("this rollout takes no conditions a tick at a time")


class ControlClip(Conditioner):
    """Sim-Transfer: the control clip's latents, each chunk's committed clean at its own frames before its RGB
    frames (a recompute runs them as a context item). A batch's clip is encoded once; a session's as its ticks bring
    it, where the last left off, the latents of chunks run dropped (memory stays flat). A batch keeps no encoder
    state past its one encode (at 480p the stream's causal state is ~0.4 GB on the device)."""

    def __init__(self, parts: Parts, vae, s: Settings, r: Request, hint: str, open: bool):
        self.parts, self.dtype = parts, parts.denoiser.transformer.dtype
        self.encoder = vae.encode_stream() if open else None
        self.start = 0  # the latent frame `latents` starts at
        if open:
            shape = parts.denoiser.latent_shape(s)
            self.latents = torch.zeros(*shape[:2], 0, *shape[3:], device=parts.device)
        else:
            clip = preprocess_video(r.control_videos[hint], s.height, s.width)[:, :, : s.num_frames]
            self.latents = self.encode(clip)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Control pixels [1, 3, F, H, W] in [-1, 1], the clip's frames after those encoded so far (a session's
        encoder) -> their latents."""
        return self.parts.codec.encode_pixels(pixels.to(self.dtype), self.encoder)

    def clean(self, start: int, end: int) -> list[torch.Tensor]:
        return [self.latents[:, :, start - self.start : end - self.start]]

    def context(self, end: int) -> list[Segment]:
        return [Segment(VIDEO, self.latents[:, :, :end], [])]

    def extend(self, pixels: torch.Tensor, ran: int) -> int:
        """Control frames [1, 3, F, H, W] in [-1, 1]: the first frame alone, then 4 for each latent frame."""
        self.latents = torch.cat([self.latents[:, :, ran - self.start :], self.encode(pixels)], dim=2)
        self.start = ran
        return ran + self.latents.shape[2]


def first_image_latents(parts: Parts, image, s: Settings) -> torch.Tensor:
    """Sim-Bimanual's latent frame 0: the first image cover-resized and centre-cropped to the rollout's size, encoded
    (normalized)."""
    first = preprocess_image(image, s.height, s.width).unsqueeze(2)
    return parts.codec.encode_pixels(first.to(parts.denoiser.transformer.dtype))


class ActionTable(Conditioner):
    """Sim-Bimanual: latent frame 0 is the first image (cover-resized, centre-cropped, encoded), committed clean beside
    null action tokens before the first chunk; each later latent frame f is denoised and committed beside its four
    normalized action rows [(f-1)*4, f*4). A session's rows of chunks run are dropped (memory stays flat)."""

    first = 1

    def __init__(self, parts: Parts, s: Settings, r: Request, embodiment: causal.Embodiment, open: bool):
        self.embodiment, self.fps = embodiment, s.fps
        model = parts.denoiser.transformer
        self.width, self.device = model.config.action_dim, parts.device
        self.rows = torch.zeros(0, self.width, device=parts.device)  # normalized [n, width], read every forward
        self.dropped = 0  # rows before `rows`
        self.opening = first_image_latents(parts, r.action.image, s)
        if not open:  # (a batch without actions is refused with its plan: `Planner.check`)
            self.extend(torch.as_tensor(r.action.actions, dtype=torch.float32)[: s.num_frames - 1], 0)

    def tracks(self, start: int, end: int) -> list[Segment]:
        """Null tokens for frame 0, else the frames' rows of the table."""
        e, n = self.embodiment, causal.ACTION_TOKENS
        if start == 0:
            null = self.rows.new_zeros(n, self.width)
            return [Segment("action", null, [], self.fps, n, 0, e.domain_id, zeroed=True)]
        first, last = causal.action_rows(start, end)
        return [Segment("action", self.rows[first - self.dropped : last - self.dropped], [], self.fps, n, first + 1,
                        e.domain_id)]

    def extend(self, actions, ran: int) -> int:
        """Raw actions [n, width] (n a multiple of 4: one latent frame each 4)."""
        rows = self.embodiment.normalize(actions, self.width).to(self.device)
        if rows.shape[0] % causal.ACTION_TOKENS:
            raise InputError(f"actions come {causal.ACTION_TOKENS} rows to a latent frame: {rows.shape[0]} rows are "
                             f"not a multiple of {causal.ACTION_TOKENS}")
        done = max(ran - 1, 0) * causal.ACTION_TOKENS  # the rows of the frames run
        self.rows, self.dropped = torch.cat([self.rows[done - self.dropped :], rows]), done
        return 1 + (self.dropped + self.rows.shape[0]) // causal.ACTION_TOKENS


class KVHistory:
    """The committed frames' K/V in a `MediaKV` sized for the plan's history: before each chunk the conditioner's
    opening and clean frames are committed and the frames past the window evicted; each chunk's forwards read it; its
    denoised frames are committed one by one after it (each seeing the history, the earlier frames of its chunk and
    itself), clean: a second forward, not the last step's K/V (those belong to noisy inputs). A batch's last chunk is
    never committed."""

    def __init__(self, run: "CausalRun"):
        plan, device, model = run.plan, run.parts.device, run.model
        home = torch.device("cpu") if plan.history == "cpu" else device
        rows = plan.history_frames() * (run.tokens + plan.action_tokens)
        self.cache = MediaKV(model.config, rows, model.dtype, home, pinned=home.type == "cpu" and device.type == "cuda",
                             fp8=plan.history == "fp8")
        self.step = chunk_step.for_run(model, device, plan.history)  # the denoising forwards' (None: eager)
        self.attention = fp8_attention if plan.attention == "fp8" else None  # every forward's, commits' too

    def window(self, run: "CausalRun", start: int, end: int) -> WindowInputs:
        plan, conditioner = run.plan, run.conditioner
        if start == 1 and conditioner.opening is not None:
            self.commit(run, conditioner.opening, 0)
        if plan.window_frames is not None:
            self.cache.evict(plan.sink_frames, plan.recent(start))
        for clean in conditioner.clean(start, end):  # in one forward before the chunk's own frames
            self.commit(run, clean, start)
        return WindowInputs(cache=self.cache, start_frame=start, attention=self.attention,
                            conditions=tuple(conditioner.tracks(start, end)), forward=self.step)

    def keep(self, run: "CausalRun", latents: torch.Tensor, start: int, end: int, last: bool) -> None:
        if run.open or not last:
            for f in range(start, end):
                self.commit(run, latents[:, :, f - start : f - start + 1], f)

    def commit(self, run: "CausalRun", latents: torch.Tensor, start: int) -> None:
        """Append the K/V of clean frames at latent frame `start` (no time embedding: no frame is noisy), in the
        precision of a chunk's last step (a quantized checkpoint's step policy: a clean forward is where the steps
        end; outside the steps the media pathway would run its native arithmetic whatever the policy says)."""
        clean = torch.zeros((), device=latents.device)  # (made there: no copy to the device per commit)
        denoiser, end, steps = run.parts.denoiser, start + latents.shape[2], run.s.steps
        with precision.for_step(run.s.precision, steps - 1, steps):
            run.model(latents, clean, denoiser.text_kv(run.cond_ids), [], run.s.fps, run.conditioner.tracks(start, end),
                      hooks=replace(denoiser.hooks, cache=self.cache, start_frame=start, attention=self.attention))
        self.cache.append()


class Recompute:
    """Every forward over the clip so far (the conditioner's context first, then the committed frames, clean, from
    latent frame 0 before the chunk's), under the mask that reproduces what each frame saw in the K/V rollout
    (`causal.visibility`)."""

    def __init__(self, run: "CausalRun"):
        plan = run.plan
        self.controls = plan.hint is not None
        rows = (1 + self.controls) * plan.latent_frames * run.tokens
        if rows * rows > RECOMPUTE_MASK:
            raise InputError(f"causal_cache 'recompute' is a reference for short clips: {plan.latent_frames} latent "
                             f"frames need a {rows}x{rows} attention mask; use causal_cache 'kv' (the same result) or "
                             "fewer frames")

    def window(self, run: "CausalRun", start: int, end: int) -> WindowInputs:
        visible = causal.visibility(run.plan, end, self.controls).to(run.parts.device)
        visible = visible.repeat_interleave(run.tokens, 0).repeat_interleave(run.tokens, 1)
        committed = [Segment(VIDEO, run.latents[:, :, :start], [])] if start else []
        return WindowInputs(start_frame=start, attention=masked_media_attention(visible),
                            context=(*run.conditioner.context(end), *committed),
                            conditions=tuple(run.conditioner.tracks(start, end)))

    def keep(self, run: "CausalRun", latents: torch.Tensor, start: int, end: int, last: bool) -> None:
        pass


class CausalRun(Run):
    """A causal rollout (`causal`), batch or session. A session (`open`) rolls on tick by tick: `extend` adds the
    next conditions and the chunks they make, and each call of `execute` runs the chunks not run yet, its latents
    only those of the chunks it ran."""

    chunked = True

    def __init__(self, parts: Parts, s: Settings, r: Request, cond_ids: list[int], uncond_ids: list[int],
                 parallel: Parallel | None, open: bool = False):
        """`uncond_ids` is unused (guidance 1.0: no unconditional pass), taken as every run in `runs.RUNS` takes it."""
        if parallel is not None:
            raise InputError("a causal rollout runs on one process; turn sequence and CFG parallelism off")
        vae = parts.codec.vae_for("a causal rollout (it encodes its first frame or control clip and decodes the clip)")
        self.parts, self.s, self.r, self.cond_ids, self.open = parts, s, r, cond_ids, open
        self.fast = parts.codec.fast_decoder(r.fast_decoder, r.fast_decoder_latents)  # loaded (or refused) first
        self.plan: causal.Rollout = s.kind.rollout
        self.model = parts.denoiser.transformer
        self.tokens = math.prod(-(-n // self.model.config.latent_patch_size) for n in latent_size(s.height, s.width))
        if self.plan.embodiment is not None:
            self.conditioner = ActionTable(parts, s, r, self.plan.embodiment, open)
        elif self.plan.hint is not None:
            self.conditioner = ControlClip(parts, vae, s, r, self.plan.hint, open)
        else:
            self.conditioner = Conditioner()
        self.history = KVHistory(self) if self.plan.mode == "kv" else Recompute(self)
        self.seed, self.seeds = int(r.seed), causal.SEEDS[self.plan.seeds]
        self.clip_noise = None  # a formula's one noise over the clip (`causal.CLIP_NOISE`), drawn as ComfyUI draws it
        if self.plan.seeds in causal.CLIP_NOISE:
            if open:
                raise InputError(f"causal_seeds {self.plan.seeds!r} draws the first noise over the whole clip, which a "
                                 "session does not know ahead; give framework, sglang or auto")
            generator = torch.Generator("cpu").manual_seed(self.seeds(self.seed, 0, 0, None))
            self.clip_noise = parts.denoiser.start_latents(parts.denoiser.latent_shape(s), generator, None)
        # the chunks known: a batch's, or a session's so far (its history is sized for the planned run's)
        self.chunks = self.plan.chunks[: self.conditioner.first] if open else self.plan.chunks
        self.done = self.conditioner.first  # chunks run so far
        self.count = len(self.chunks) - self.done
        self.latents = self.buffer()
        self.frames: torch.Tensor | None = None
        # each chunk's frames decoded as the next samples (a session's always; a tiled decode waits for the clip)
        clip = None if open else pixel_frames(self.chunks[-1][1])  # a batch's frames, known: one buffer, no join
        streamed = open or r.output == "frames" and r.vae_tile is None
        self.decoder = ChunkDecode(parts.codec, self.fast, clip) if streamed else None
        self.decoded = 0  # latent frames handed to the decoder

    def buffer(self) -> torch.Tensor:
        """The latents of the chunks the next `execute` runs (with latent 0 when it starts the clip)."""
        end = self.chunks[-1][1] if self.chunks else 0  # (none yet: a session before its first tick)
        start = self.chunks[self.done][0] if self.done < len(self.chunks) else end
        self.origin = 0 if self.done == self.conditioner.first else start
        shape = self.parts.denoiser.latent_shape(self.s)
        return torch.zeros(*shape[:2], end - self.origin, *shape[3:], device=self.parts.device)

    def extend(self, conditions) -> None:
        """A session's next conditions (control frames, actions: `Conditioner.extend`) and the chunks they make."""
        reach = self.conditioner.extend(conditions, self.chunks[self.done - 1][1] if self.done else 0)
        self.chunks = tuple(causal.chunk_ranges(reach, self.plan.config.chunk_size))
        self.count = len(self.chunks) - self.done
        self.latents = self.buffer()

    def window(self, k: int) -> Window:
        start, end = self.chunks[k + self.done]
        block = k + self.done - self.conditioner.first  # among the chunks denoised
        frames = pixel_frames(end) if start == 0 else TEMPORAL_FACTOR * (end - start)  # latent frame 0 holds one
        chunk = replace(self.s, kind=kinds.SINGLE, num_frames=frames)
        noise = torch.Generator("cpu").manual_seed(self.seeds(self.seed, start, block, None))
        first = None if self.clip_noise is None else self.clip_noise[:, :, start:end]
        return Window(chunk, None, CFG(self.cond_ids, self.cond_ids, 1.0, None), noise, first,
                      lambda i: torch.Generator("cpu").manual_seed(self.seeds(self.seed, start, block, i)),
                      self.history.window(self, start, end))

    def keep(self, k: int, latents: torch.Tensor, tracks: list, progress: StageCallback | None) -> None:
        start, end = self.chunks[k + self.done]
        self.latents[:, :, start - self.origin : end - self.origin] = latents
        if self.conditioner.opening is not None and start - self.origin == 1:  # once, before frame 0 is decoded
            self.latents[:, :, :1] = self.conditioner.opening
        last = k + 1 == self.count
        if self.decoder is not None:  # queued before the commits, which it runs beside
            self.decoder.add(self.latents[:, :, self.decoded - self.origin : end - self.origin],
                             stage(progress, "decode"))
            self.decoded = end
        self.history.keep(self, latents, start, end, last)
        if last:
            self.done += self.count
            if not self.open and self.r.output == "frames":
                self.history = None  # its memory goes back before the decode's last chunk is waited for
                self.frames = self.decoder.take() if self.decoder is not None else self.parts.codec.decode(
                    self.latents, tile=self.r.vae_tile, progress=stage(progress, "decode"), fast=self.fast)

    @property
    def result(self) -> Generation:
        return Generation(self.latents.cpu(), self.frames, self.s)


class HostBlocks:
    """A batch rollout whose steps a host's block sampler takes (ComfyUI's SamplerARVideo, `sample_ar_video`): it
    calls `forward` for each step of a block, then once at sigma 0 with the denoised block, which commits it. A
    rollout that starts from a given frame (Sim-Bimanual's first image) takes it from the host's first call, at sigma 0
    over latent frame 0 (ARVideoI2V's `initial_latent`): what the host gives is the clip's frame 0. The history is the
    run's own (`KVHistory`: its window, sinks, control frames); the host's cache is a dict whose `end` it counts in
    frames x ceil(h/2) x ceil(w/2) rows, each forward adding its block's and the sampler taking them back after every
    forward but the commit: here only counted and checked, so a cache handled otherwise is refused instead of
    silently diverging."""

    def __init__(self, run: CausalRun):
        if not isinstance(run.history, KVHistory):
            raise InputError("a host's block sampler drives the K/V history: causal_cache 'kv'")
        self.run, self.block, self.inputs = run, None, None
        config = run.plan.config  # the fixed lists a host may walk (Sim-Bimanual: its default two steps, or all)
        self.schedules = [torch.tensor([*sigmas, 0.0]) for sigmas in dict.fromkeys((config.sigmas(), config.t_list))]
        self.checked = None  # the host's sigmas, once checked (every forward hands them again)

    def check_sigmas(self, sigmas: torch.Tensor) -> None:
        """The host's sigmas must be one of the checkpoint's fixed lists; checked once (a read back from the device)."""
        if sigmas is self.checked:
            return
        given = sigmas.flatten().float().cpu()
        if not any(len(given) == len(fixed) and torch.allclose(given, fixed, atol=1e-4) for fixed in self.schedules):
            fixed = " or ".join(str([round(v, 4) for v in fixed.tolist()]) for fixed in self.schedules)
            raise InputError(f"this causal checkpoint samples with its fixed sigmas {fixed}, not "
                             f"{[round(v, 4) for v in given.tolist()]}: take them from Cosmos3 Scheduler with the "
                             "model connected")
        self.checked = sigmas

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, cache: dict, start: int) -> torch.Tensor:
        """One forward over the block at latent frame `start` -> its velocity (at sigma 0: the commit, zeros)."""
        run, end = self.run, start + x.shape[2]
        rows = math.prod(-(-n // 2) for n in x.shape[3:])  # the sampler's rows per frame (not the history's)
        if cache.get("end") != start * rows:
            raise InputError(f"the Cosmos3 causal cache holds {cache.get('end')} rows at latent frame {start}, not the "
                             f"{start * rows} SamplerARVideo keeps: sample this MODEL with SamplerARVideo")
        first, clean = run.conditioner.first, not bool(timestep.any())
        if start == 0 and end == first and clean:  # the given frame: the clip's frame 0, committed before chunk 1
            run.conditioner.opening, velocity = x, torch.zeros_like(x)
        elif (start, end) in run.chunks[first:]:
            velocity = self.step(x, timestep, start, end, clean)
        else:
            raise InputError(self.refusal(start, end))
        cache["end"] += x.shape[2] * rows
        return velocity

    def step(self, x: torch.Tensor, timestep: torch.Tensor, start: int, end: int, clean: bool) -> torch.Tensor:
        run = self.run
        if self.block != start:  # the block's first forward: its history evicted, its given frames committed
            self.block, self.inputs = start, run.history.window(run, start, end)
        if clean:  # sigma 0: the denoised block, committed (the sampler keeps its input)
            run.history.keep(run, x, start, end, False)
            return torch.zeros_like(x)
        denoiser, inputs = run.parts.denoiser, self.inputs
        hooks = replace(denoiser.hooks, cache=inputs.cache, start_frame=start, attention=inputs.attention)
        return run.model(x, timestep, denoiser.text_kv(run.cond_ids), list(range(x.shape[2])), run.s.fps,
                         list(inputs.conditions), hooks=hooks).vision

    def refusal(self, start: int, end: int) -> str:
        run, size = self.run, self.run.plan.config.chunk_size
        if run.conditioner.first and start < run.conditioner.first:
            return ("this Sim-Bimanual checkpoint rolls out from its first image as latent frame 0: give it to "
                    "SamplerARVideo through the MODEL of Cosmos3 Sim Actions (core) (or ARVideoI2V)")
        if size > 1 and not run.conditioner.first:
            return (f"this chunkwise Sim-Transfer checkpoint rolls out latent frame 0 alone, then {size} at a time, "
                    "which SamplerARVideo's equal blocks cannot give: sample it with Cosmos3 Sim-Transfer Sampler")
        return (f"SamplerARVideo gave latent frames [{start}, {end}); this checkpoint was trained on chunks of {size} "
                f"latent frame(s) after frame 0: set num_frame_per_block to {size}")
