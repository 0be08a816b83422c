"""Loading a Cosmos3 checkpoint, and generating images and videos with it."""

import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from . import budget, causal, runs, timing, transfer
from .checkpoint import Checkpoint, Variant, read_json, resolve
from .codec import Codec
from .denoiser import Denoiser
from .errors import CheckpointError, InputError
from .guardrails import Guardrails, load as load_guardrails
from .kinds import Causal, Continued, Controlled
from .offload import BlockSwap, TextOffload
from .parallel import Parallel
from .progress import Report
from .prompts import PromptOptions, negative_text, positive_text
from .geometry import SPATIAL_FACTOR, TEMPORAL_FACTOR
from .request import DEFAULT_MAX_PROMPT_TOKENS, Request
from .action import action_prompt
from .sound import SoundTokenizer, check_encoder, load_sound_tokenizer
from .running import running
from .windows import Generation, StepCallback
from .step_cache import StepCache
from .session import Session, TransferSession, check_checkpoint as check_session_checkpoint, session_request
from .settings import Settings, log_notes, resolve as resolve_settings
from .tokenizer import PromptTokenizer
from .transformer import (Cosmos3Transformer, checkpoint_key_mapper, linear_layers, load_dtype, media_block,
                          pathway_of, split_dtypes)
from . import reasoner as reasoning
from .vae import Progress, StageCallback, TileSpec, VAEConfig, WanVAE
from .weights import detect, folder_format
from .weights.files import load_weights
from .weights.format import WeightFormat
from .weights.gguf import GGUF
from .weights.local_fp8 import check_mode

log = logging.getLogger(__name__)

# The sound tokenizer decodes in fp32 whatever the model's dtype: in bf16 its Snake activations (sin(a x) of a
# coarsely rounded x) leave a noise floor about 48 dB under the signal (benchmarks/bench_precision.py), for 0.5 B
# parameters decoded once per clip.
SOUND_DTYPE = torch.float32
BYTES_PER_TOKEN_BOUND = 64  # no tokenizer makes a token of more than this many UTF-8 bytes

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A usable torch device; a device this machine or torch build lacks is a clear error."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise InputError(f"unknown device {device!r}; use cpu, cuda, cuda:N or auto") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            build = "CPU-only" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            raise InputError(f"device {device!r} asked for, but CUDA is not available (torch {torch.__version__}, "
                             f"{build} build, {torch.cuda.device_count()} GPUs visible); install a CUDA build of "
                             "torch or use --device cpu")
        if (resolved.index or 0) >= torch.cuda.device_count():
            raise InputError(f"device {device!r} asked for, but only {torch.cuda.device_count()} GPU(s) are visible")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`None`/"auto": bf16 on accelerators (the released precision), fp32 on CPU."""
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype in DTYPES:
        resolved = DTYPES[dtype]
    else:
        raise InputError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(sorted(DTYPES))}")
    return resolved


def load_transformer(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, linear_class: type | None = None,
                     weights: WeightFormat | None = None, media: bool = True) -> Cosmos3Transformer:
    """The transformer in its files' format (`weights.detect` unless given: a quantized format's layers keep their
    weights quantized); `media=False`: the text tower alone."""
    weights = weights or detect(checkpoint)
    config = checkpoint.transformer_config()
    rename = checkpoint_key_mapper(config, media)
    requested, dtype = dtype, load_dtype(dtype)
    with torch.device("meta"), linear_layers(linear_class):
        model = Cosmos3Transformer(config, media)
        weights.build(model, rename, pathway_of)
    weights.read(model, dtype, device, rename, keep_fp32=("time_embedder.",))
    split_dtypes(model, requested)
    return model


def load_vae(folder: Path, device: torch.device, dtype: torch.dtype) -> WanVAE:
    """A VAE from its folder (config.json + diffusion_pytorch_model.safetensors)."""
    config_path = folder / "config.json"
    config = VAEConfig.from_dict(read_json(config_path), source=str(config_path))
    with torch.device("meta"):
        vae = WanVAE(config)
    load_weights(vae, folder, dtype, device)
    return vae


@dataclass
class Plan:
    """A generation resolved once: the request, its settings, token ids and memory estimate. Hosts read `estimate`
    (ComfyUI's memory manager makes room for it) and `settings.notes`, then `generate(plan)` runs it as it is."""

    prompt: Any
    request: Request
    settings: Settings
    cond_ids: list[int]
    uncond_ids: list[int]
    estimate: budget.Estimate


class Planner:
    """What requests need from a checkpoint, from its config files and tokenizer alone (no weight is read): resolved
    settings, token ids, and the memory a generation takes on `device`. `planner(path)` makes one; a loaded
    `Cosmos3Pipeline` plans with its own (`pipe.planner`)."""

    def __init__(self, checkpoint: Checkpoint, tokenizer, transformer_config, vae_config, device, dtype,
                 weights: WeightFormat):
        self.checkpoint = checkpoint
        self.weights = weights  # the transformer's format (its layers' memory at work is part of the plan)
        self.tokenizer = tokenizer
        self.transformer_config = transformer_config
        self.vae_config = vae_config  # None: no VAE (latents only)
        self.device = device
        self.dtype = dtype

    @property
    def variant(self) -> Variant:
        return self.checkpoint.variant

    def plan(self, prompt, request: Request | None = None, **options) -> "Plan":
        """A generation resolved once (settings, token ids, memory estimate; nothing is checked against the device
        or logged yet): `check` refuses it, `generate` runs it."""
        r = Request.build(request, **options)
        s, cond_ids, uncond_ids = self.prepare(prompt, r)
        return Plan(prompt, r, s, cond_ids, uncond_ids, self.memory_estimate(s, r, len(cond_ids), len(uncond_ids)))

    def check(self, plan: "Plan", output_only: bool = False, session: bool = False) -> None:
        """What `generate` refuses up front: a Sim-Bimanual run without its actions (unless the plan opens a
        `session`, which takes them tick by tick), then the memory check (unless the request turns it off);
        `output_only`: the host memory its output takes alone, where a GPU's room is made later (`budget.check`)."""
        kind = plan.settings.kind
        e = kind.rollout.embodiment if isinstance(kind, Causal) else None
        if e is not None and not session and plan.request.action.actions is None:
            raise InputError(f"this Sim-Bimanual run needs the actions to roll out, a table [N, {e.width}] for "
                             f"{e.name} (N a multiple of 4): the action request's actions (CLI --actions FILE, a .csv, "
                             ".json or .npy table); to give them a chunk at a time, open a session (pipe.session in "
                             "Python, or the HTTP session route)")
        if not plan.request.check_memory:
            return
        try:
            budget.check(plan.estimate, self.device, output_only=output_only)
        except InputError as exc:
            offer = self.history_that_fits(plan) if isinstance(kind, Causal) else None
            if offer is None:
                raise
            raise InputError(f"{exc}; or {offer}") from None

    def duration(self, plan: "Plan") -> "timing.Timing | None":
        """About how long `plan` takes on this device (`timing.generation`), on the CPU only: a GPU's rate is not what
        one short measurement shows (None there)."""
        if self.device.type != "cpu":
            return None
        s = plan.settings
        decode = plan.request.output == "frames" or s.kind.chunks is not None  # a chunked run decodes each chunk
        return timing.generation(self.transformer_config, self.vae_config, s.geometry, s.steps, len(plan.cond_ids),
                                 decode, self.dtype, self.device)

    def history_that_fits(self, plan: "Plan") -> str | None:
        """What a causal rollout that does not fit can change to fit: its K/V history in CPU memory (on a GPU), or
        the largest history window (latent frames) that fits; None when neither does."""
        s, rollout = plan.settings, plan.settings.kind.rollout
        c = rollout.config

        def fits(**changes) -> bool:
            changed = replace(s, kind=Causal(replace(rollout, **changes)))
            return budget.fits(self.memory_estimate(changed, plan.request, len(plan.cond_ids), len(plan.uncond_ids)),
                               self.device)

        if self.device.type != "cpu" and rollout.history == "device" and fits(history="cpu"):
            return "keep the K/V history in CPU memory: causal_history 'cpu' fits (the same result, more transfer)"
        if rollout.history == "device" and fits(history="fp8"):
            return "keep the K/V history in fp8: causal_history 'fp8' fits (close to the same result)"
        for window in range((rollout.window_frames or rollout.latent_frames) - 1, c.sink_frames + c.chunk_size, -1):
            if fits(window_frames=window):
                return f"keep less history: causal_window {window} fits"
        return None

    def token_ids(self, texts: tuple[str, str], system: str | None, max_length=None,
                  max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS):
        """(cond ids, uncond ids) of the conditional and unconditional texts; texts over `max_tokens` are refused."""
        if self.tokenizer is None:
            raise InputError("this pipeline was loaded without its tokenizer")
        ids = []
        for name, text in zip(("prompt", "negative_prompt"), texts):
            if len(text.encode("utf-8")) > max_tokens * BYTES_PER_TOKEN_BOUND:  # surely too long: skip tokenizing
                raise budget.prompt_too_long(name, f"over {len(text) // BYTES_PER_TOKEN_BOUND}", max_tokens)
            encoded = self.tokenizer.encode(text, system, max_length)
            if len(encoded) > max_tokens:
                raise budget.prompt_too_long(name, len(encoded), max_tokens)
            ids.append(encoded)
        return tuple(ids)

    def prepare(self, prompt, r: Request) -> tuple[Settings, list[int], list[int]]:
        """Resolved settings and the (cond, uncond) token ids of a request. A long video given a prompt per chunk
        (`prompt_list`) has each chunk's ids in its kind (`Continued.prompt_ids`), and returns the longest as the cond
        ids."""
        prompts = prompt_list(prompt)
        s = resolve_settings(self.variant, r)
        if r.audio is not None:
            check_encoder(self.checkpoint.path("sound_tokenizer"), r.audio)
        if not prompts[0].strip():
            s = replace(s, notes=s.notes + ["the prompt is empty: the video is unconditioned (only the checkpoint's "
                                            "templates guide it), so what it shows is arbitrary; write a prompt"])
        kind = s.kind
        frames = s.num_frames if kind.chunks is None else kind.chunks.chunk  # each chunk's prompt: its own duration
        prompt_options = PromptOptions(frames, s.height, s.width, s.fps, s.use_system_prompt,
                                       r.add_resolution_template, r.add_duration_template, r.json_captions)
        if len(prompts) > 1 and (not isinstance(kind, Continued) or len(prompts) != kind.chunks.count):
            count = f"{kind.chunks.count} chunks" if isinstance(kind, Continued) else "one window"
            raise InputError(f"{len(prompts)} prompts were given for {count}: give one prompt, or one per chunk of a "
                             "long video (set the frame count and chunk_frames for as many chunks)")
        system = prompt_options.system_prompt
        negative = negative_text(s.negative_prompt, prompt_options)
        max_tokens = r.max_prompt_tokens
        if isinstance(kind, Causal) and kind.rollout.embodiment is not None:  # verbatim, no system prompt (Sim-Bimanual)
            texts, system = [(prompts[0], "")], None
            max_tokens = min(max_tokens, kind.rollout.config.text_max_tokens or max_tokens)  # its text cache's length
        elif isinstance(kind, Causal):  # with its control, duration and resolution sentences, under the transfer prompt
            c = kind.rollout
            texts = [(causal.prompt_text(prompts[0], c.hint, c.emphasize, s.num_frames, s.fps, s.height, s.width), "")]
            system = transfer.SYSTEM_PROMPT if s.use_system_prompt else None
        elif isinstance(kind, Controlled):  # verbatim, under the transfer system prompt
            texts, system = [(prompts[0], s.negative_prompt)], transfer.SYSTEM_PROMPT if s.use_system_prompt else None
        elif s.action is not None:  # the structured action caption; the negative prompt as given
            texts = [(action_prompt(prompts[0], s.action.view_point, s.num_frames, s.fps, s.height, s.width),
                      s.negative_prompt)]
        else:
            texts = [(positive_text(p, prompt_options), negative) for p in prompts]
        ids = [self.token_ids(t, system, r.max_sequence_length, max_tokens) for t in texts]
        if len(ids) > 1:
            s = replace(s, kind=replace(kind, prompt_ids=tuple(cond for cond, _ in ids)))
        return s, max((cond for cond, _ in ids), key=len), ids[0][1]

    def memory_estimate(self, s: Settings, r: Request, cond_tokens: int, uncond_tokens: int) -> budget.Estimate:
        frames_out = r.output == "frames" or isinstance(s.kind, Controlled)  # a transfer's output is its frames
        decoded = frames_out or s.kind.chunks is not None  # a long video decodes each chunk for the next
        return budget.estimate(self.transformer_config, self.vae_config, s.geometry, cond_tokens, uncond_tokens,
                               self.dtype, r.vae_tile, self.device, decode=decoded, frames_out=frames_out,
                               encoded_frames=s.kind.encoded_frames(s, r.condition_latents is not None),
                               weights=self.weights, cache=s.cache)


def counting(plan: Plan, part: str, num_bytes: int) -> Plan:
    """The plan with `num_bytes` more held on its device throughout, as `part` (a guardrail kept there)."""
    if not num_bytes:
        return plan
    return replace(plan, estimate=replace(plan.estimate, parts={**plan.estimate.parts, part: num_bytes}))


def prompt_list(prompt) -> list[str]:
    """The prompt(s) of a request: a string, or one per chunk of a long video, as a list of strings or a string
    holding a JSON list of strings (a JSON object stays one structured caption)."""
    if isinstance(prompt, str) and prompt.lstrip().startswith("["):
        try:
            parsed = json.loads(prompt)
        except ValueError:
            parsed = None
        if isinstance(parsed, list):
            prompt = parsed
    prompts = list(prompt) if isinstance(prompt, (list, tuple)) else [prompt]
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise InputError(f"prompt must be a string, or a list of strings (one per chunk of a long video), got "
                         f"{prompt!r:.80}")
    empty = [i for i, p in enumerate(prompts, 1) if not p.strip()]
    if len(prompts) > 1 and empty:  # in a list, surely a mistake (a chunk would be unconditioned)
        raise InputError(f"prompt {empty[0]} of the {len(prompts)} in the list (chunk {empty[0]}) is empty; give "
                         "every chunk its prompt")
    return prompts


class Cosmos3Pipeline:
    """A loaded checkpoint: its variant, its components, its `planner`, and `generate` (a `runner.Runner` in this
    process)."""

    local = True

    def __init__(self, checkpoint: Checkpoint, transformer, vae, tokenizer, device, dtype, sound_tokenizer=None, *,
                 weights: WeightFormat):
        self.codec = Codec(vae, sound_tokenizer, device)
        self.denoiser = Denoiser(transformer, checkpoint, device)
        self.parts = runs.Parts(self.denoiser, self.codec)  # what a run works with
        self.checkpoint, self.dtype, self.weights = checkpoint, dtype, weights
        self.planner = Planner(checkpoint, tokenizer, transformer.config, None if vae is None else vae.config, device,
                               dtype, weights)
        self.block_swap: BlockSwap | None = None
        self.transformer_file: Path | None = None  # the GGUF file the transformer came from, if any
        self.host: dict = {}  # what a host application attaches to this pipeline (ComfyUI's model patchers)
        self.linear_class: type | None = None  # how the transformer was built: the Reasoner's parts are built alike
        self._reasoner: reasoning.Reasoner | None = None
        self._default_guardrails: Guardrails | None = None  # NVIDIA's, once a run asked for guardrails=True

    @property
    def variant(self) -> Variant:
        return self.checkpoint.variant

    @property
    def device(self) -> torch.device:
        """Where runs go, and the denoiser's and the codec's (a host that moves the pipeline for a node sets it)."""
        return self.codec.device

    @device.setter
    def device(self, device: torch.device) -> None:
        self.codec.device = self.denoiser.device = device

    @property
    def transformer(self) -> Cosmos3Transformer:
        return self.denoiser.transformer

    @transformer.setter
    def transformer(self, transformer: Cosmos3Transformer) -> None:
        self.denoiser.transformer = transformer

    @property
    def vae(self) -> WanVAE | None:
        return self.codec.vae

    @vae.setter
    def vae(self, vae: WanVAE | None) -> None:
        self.codec.vae = vae

    @property
    def sound_tokenizer(self) -> SoundTokenizer | None:
        return self.codec.sound_tokenizer

    def plan(self, prompt, request: Request | None = None, **options) -> Plan:
        """A generation resolved once (`Planner.plan`): a host reads its estimate and notes, then `generate(plan)`."""
        return self.planner.plan(prompt, request, **options)

    def __repr__(self) -> str:
        return f"Cosmos3Pipeline({str(self.checkpoint.root)!r}, {self.variant.describe()}, {self.dtype}, {self.device})"

    def to(self, device: str | torch.device) -> "Cosmos3Pipeline":
        """Move the weights (and drop cached prompt K/V, which lived on the old device).

        Offloaded parts (`use_low_vram`) stay where they live; only the rest moves.
        """
        device = torch.device(device)
        held = set()
        for part in (self.denoiser.text_offload, self.block_swap):
            held.update(map(id, part.held()) if part is not None else ())
        for p in self.transformer.parameters():
            if id(p) not in held:
                p.data = p.data.to(device)
        self.codec.to(device)
        if self._reasoner is not None:
            self._reasoner.to(device)
        self.device = self.planner.device = device
        self.denoiser.text_cache.clear()
        return self

    def use_low_vram(self, offload_text: bool = False, blocks_to_swap: int = 0, home: str = "cpu") -> None:
        """Text tower on `home` between prompts, and/or the media pathway of `blocks_to_swap` layers streamed
        from CPU memory (see `offload`). Results stay bit-identical."""
        if offload_text:
            self.denoiser.text_offload = TextOffload(self.transformer, torch.device(home))
            if self._reasoner is not None:  # they share the text tower
                self._reasoner.text_offload = self.denoiser.text_offload
        if blocks_to_swap:
            self.block_swap = BlockSwap(self.transformer, blocks_to_swap)
            self.transformer.hooks = replace(self.transformer.hooks, layer=self.block_swap)

    @property
    def reasoner(self) -> reasoning.Reasoner:
        """The Reasoner on this pipeline's text tower; its own parts are read from the checkpoint on first use."""
        return self._reasoner or self.load_reasoner()

    def load_reasoner(self) -> reasoning.Reasoner:
        """Read the Reasoner's own parts (head, vision tower) onto this pipeline's device, built like the transformer."""
        weights = self.weights if self.transformer_file is None else folder_format(self.checkpoint)  # (not in a GGUF)
        self._reasoner = reasoning.Reasoner.load(self.checkpoint, self.transformer, self.device,
                                                 self.transformer.text_dtype, self.linear_class, weights)
        self._reasoner.text_offload = self.denoiser.text_offload
        return self._reasoner

    def reason(self, question: str, **options) -> reasoning.Answer:
        """Answer a question about images, a video or nothing (`Reasoner.reason`)."""
        return self.reasoner.reason(question, **options)

    def upsample_prompt(self, prompt: str, **options) -> "reasoning.Upsampled":
        """A short prompt as the JSON caption the generator was trained on (`Reasoner.upsample_prompt`)."""
        return self.reasoner.upsample_prompt(prompt, **options)

    def chat(self, messages: list[dict], images=(), videos=(), **options) -> reasoning.Answer:
        """Answer the last user turn of a conversation (`Reasoner.chat`)."""
        return self.reasoner.chat(messages, images, videos, **options)

    @torch.inference_mode()
    def generate(
        self,
        prompt: str,
        request: Request | None = None,
        *,
        callback: StepCallback | None = None,
        parallel: Parallel | None = None,
        progress: StageCallback | None = None,
        interrupt: Callable[[], None] | None = None,
        guardrails: Guardrails | bool | None = None,
        progress_bar: bool | None = None,
        **options,
    ) -> Generation:
        """Generate an image (num_frames=1) or a video from a prompt, optionally conditioned on an image or video.

        `prompt` may be a `Plan` (`plan(prompt, request)`, made once: a host reads its estimate and notes first).
        `options` are the fields of `Request` (negative_prompt, width, height, num_frames, fps, steps,
        guidance_scale, flow_shift, schedule, guidance_interval, seed, image, video, ...; see its help
        texts), or pass a ready `request` (options then override its fields). Unset options take the
        checkpoint variant's defaults (`settings.resolve`); what was changed or ignored is listed in
        `result.settings.notes`. Before anything is allocated the prompt length and the memory the
        request needs are checked (`budget`), so an oversized request is refused with the figure.
        `callback(step, total, denoised)` runs after every step with the model's current estimate of
        the clean latents (for previews); an exception from it cancels the run and leaves the
        pipeline ready for the next one. `progress(stage, done, total)` reports the stages around the
        steps: "text" (prompts encoded), "chunk" (transfer chunks begun), "decode" (latent frames).
        `interrupt()` is a host's Cancel: raise from it to cancel; it is checked between transformer layers and VAE
        frames, so a cancel does not wait for a step's end (`cancel`).
        `parallel` (from `parallel.init_from_env`) runs the call on every rank of a torchrun job with
        sequence and/or CFG parallelism; every rank gets the same result. It takes no `interrupt`: ranks cancel at
        step boundaries, from `callback`, once they agree (as `workers` does).
        `guardrails` (`guardrails.load()`, or True: NVIDIA's, loaded once per pipeline): every prompt checked before
        anything runs, the frames through its video checks (none of NVIDIA's: its video classifier is disabled
        upstream) and their faces pixelated before they are returned (`GuardrailBlocked` names what blocked a run;
        latents are returned unchecked); a guardrail kept on this device is counted in the memory check.
        `progress_bar`: on stderr, the run's stages and steps (`progress.Report`), after the note of how long a CPU run
        takes; None (auto): on where stderr is a terminal and the caller passes neither `callback` nor `progress` (a
        host, such as ComfyUI's nodes, reports progress its own way), on the main rank of a parallel run.
        """
        if not self.transformer.has_media:
            raise InputError("this pipeline was loaded with parts='reasoner' (no generator weights); load it with "
                             "parts='all' to generate")
        if interrupt is not None and parallel is not None:
            raise InputError("interrupt stops one rank between layers, where the others would wait for it; cancel a "
                             "parallel run from its step callback once every rank agrees")
        if isinstance(prompt, Plan):
            if request is not None or options:
                raise InputError("generate(plan) runs the plan as it was made; plan again to change its options")
            plan = prompt
        else:
            plan = self.plan(prompt, request, **options)
        log_notes(plan.settings)
        plan, guardrails = self._admitted(plan, guardrails)
        if progress_bar is None:
            progress_bar = callback is None and progress is None and sys.stderr.isatty() and (
                parallel is None or parallel.is_main)
        if progress_bar:
            report = Report.on_stderr()
            guess = self.planner.duration(plan)
            if guess is not None:
                report.write(timing.note(guess, lambda options: ", ".join(f"{k}={v}" for k, v in options.items())))
            callback, progress = report.around(callback, progress)
        s = plan.settings
        eager_because = ("the causal recompute's mask changes every chunk" if isinstance(s.kind, Causal) and
                         s.kind.rollout.mode == "recompute" else
                         "sequence parallelism" if parallel is not None and parallel.sp is not None else None)
        block = media_block(plan.request.compile, self.device, eager_because)
        with running(self.parts, s, block, interrupt, guardrails, progress) as guarded:
            run = runs.for_plan(self.parts, s, plan.request, plan.cond_ids, plan.uncond_ids, parallel)
            cache = None if s.cache is None else StepCache(s.cache, self.transformer.dtype)
            result = runs.execute(run, self.parts, int(plan.request.seed), callback, parallel, progress, cache)
            if result.frames is not None:
                result = replace(result, frames=guarded(result.frames))
        return result

    def session(self, prompt, request: Request | None = None, guardrails: Guardrails | bool | None = None,
                control: str | None = None, **options) -> "Session | TransferSession":
        """A causal rollout driven one chunk at a time: the only way a session opens. Sim-Bimanual: `with
        pipe.session(prompt, action=ActionRequest(mode="forward_dynamics", image=first, domain="agibotworld")) as s:
        frames = s.tick(actions)` (see `Session`). Sim-Transfer: `pipe.session(prompt, control="edge", num_frames=201,
        width=832, height=480, seed=1)`, an episode of `num_frames` whose ticks bring its control frames (see
        `TransferSession`). `prompt` may be a `Plan` of `session_request(...)` (a host plans before it loads). Refused
        at open, before anything runs, when its history would not fit (the plan's run fills the window, or is the
        episode). `guardrails` (as `generate` takes them): the prompt checked at open (and at a reset's), its memory
        counted, every tick's faces pixelated (a tick it blocks fails)."""
        check_session_checkpoint(self.variant)
        if isinstance(prompt, Plan):
            if request is not None or control is not None or options:
                raise InputError("session(plan) opens the plan as it was made; plan again to change its options")
            plan = prompt
        else:
            plan = self.plan(prompt, session_request(self.variant, request, control, **options))
        plan, guardrails = self._admitted(plan, guardrails, session=True)

        def replan(prompt, request: Request, **changes) -> Plan:  # a reset's next episode, admitted alike
            return self._admitted(self.plan(prompt, request, **changes), guardrails, session=True)[0]

        session = Session if self.variant.causal.takes_actions else TransferSession
        return session(self.parts, plan, replan, guardrails)

    def _admitted(self, plan: Plan, guardrails: Guardrails | bool | None, session: bool = False
                  ) -> tuple[Plan, Guardrails | None]:
        """The plan a run (or a session) may start, and its guardrail: what the planner refuses of it refused before
        the guardrail loads, every prompt through the guardrail, a guardrail kept on this device counted in its memory,
        then the planner's check (`Planner.check`). The guardrail is the run's own, or for True NVIDIA's
        (`guardrails.load`, on the CPU, its files fetched once if missing, as the CLI's --guardrails does), loaded on
        first use and kept for the next runs."""
        if guardrails is True:
            if self._default_guardrails is None:
                self.planner.check(plan, session=session)  # (NVIDIA's stays on the CPU: nothing on the device's plan)
                self._default_guardrails = load_guardrails(allow_download=True)
            guardrails = self._default_guardrails
        elif guardrails is not None and guardrails is not False and not isinstance(guardrails, Guardrails):
            raise InputError(f"guardrails must be True (NVIDIA's, from the cosmos-guardrail package), a Guardrails "
                             f"(cosmos3_runtime.load_guardrails(device=..., ...)) or None, got {guardrails!r:.80}")
        guardrails = guardrails or None
        if guardrails is not None:
            guardrails.check_prompts(prompt_list(plan.prompt))
            plan = counting(plan, "guardrails", guardrails.resident_bytes(self.device))
        self.planner.check(plan, session=session)
        return plan, guardrails

    def decode_sound(self, sound_latents: torch.Tensor, seconds: float | None = None) -> torch.Tensor:
        return self.codec.decode_sound(sound_latents, seconds)

    def encode(self, frames: torch.Tensor, progress: Progress | None = None, raw: bool = False) -> torch.Tensor:
        return self.codec.encode(frames, progress, raw)

    def decode(self, latents: torch.Tensor, tile: TileSpec | None = None, progress: Progress | None = None,
               raw: bool = False) -> torch.Tensor:
        return self.codec.decode(latents, tile, progress, raw)

    def raw_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return self.codec.raw_latents(latents)


def load(
    path: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    vae_dtype: str | torch.dtype | None = None,
    load_vae_weights: bool = True,
    local_files_only: bool | None = None,
    offload_text: bool = False,
    blocks_to_swap: int = 0,
    quantize: str | None = None,
    linear_class: type | None = None,
    transformer_file: str | os.PathLike | None = None,
    parts: str = "all",
) -> Cosmos3Pipeline:
    """Load a Cosmos3 checkpoint from a folder or a Hugging Face repo id (`namespace/repo[/subfolder]`).

    `dtype` is the transformer's precision, `vae_dtype` the VAE's (default: the same).
    `load_vae_weights=False` skips the VAE (for latent-only work). Low VRAM: `offload_text=True` keeps
    the text tower in CPU memory except while a prompt is encoded; `blocks_to_swap=N` streams the media
    pathway of N layers from CPU memory during each forward (both bit-identical); `quantize="fp8"`
    stores the transformer's linear weights as fp8 with per-channel scales (about half the memory), upcast at use;
    "fp8_scaled" also runs the media blocks' matmuls in fp8 (GPUs of compute capability 9.0+; see `quantize`).
    With any of them the weights are read into CPU memory first and only what stays on the device
    is moved there. `linear_class`: a host's nn.Linear subclass for the transformer's linear layers
    (ComfyUI passes its cast-weight layers, so its memory manager can stream them per layer).
    GGUF: a single .gguf file in transformer/, or `transformer_file` (a .gguf anywhere), replaces the
    safetensors shards; its quantized linear weights stay quantized in memory, as NVIDIA's official FP8 and ModelOpt's
    NVFP4 folders' do (`weights.detect` finds the format; `quantize` applies to dense files only).
    `parts="reasoner"` loads only what `reason` needs (the text tower, the Reasoner's head and vision tower): no
    media tower, no VAE. The default, "all", serves both; its Reasoner parts are read on the first question.
    """
    if parts not in ("all", "reasoner"):
        raise InputError(f"parts must be 'all' or 'reasoner', got {parts!r}")
    reasoner_only = parts == "reasoner"
    if reasoner_only and blocks_to_swap:
        raise InputError("blocks_to_swap streams the generator's media tower, which parts='reasoner' does not load; "
                         "leave it at 0 (offload_text and quantize apply)")
    load_vae_weights = load_vae_weights and not reasoner_only
    if blocks_to_swap < 0:
        raise InputError(f"blocks_to_swap must be 0 or more, got {blocks_to_swap}")
    device = resolve_device(device)
    quantize = check_mode(quantize, device)
    dtype = resolve_dtype(dtype, device)
    vae_dtype = dtype if vae_dtype is None else resolve_dtype(vae_dtype, device)
    components = ("transformer", "tokenizer", "reasoner") + (("vae",) if load_vae_weights else ())
    checkpoint = Checkpoint(resolve(path, components=components, local_files_only=local_files_only))
    tokenizer = PromptTokenizer(checkpoint.tokenizer_dir())
    weights = detect(checkpoint, transformer_file, quantize)
    low_vram = offload_text or blocks_to_swap or quantize
    transformer = load_transformer(checkpoint, torch.device("cpu") if low_vram else device, dtype, linear_class,
                                   weights, media=not reasoner_only)
    vae = load_vae(checkpoint.path("vae"), device, vae_dtype) if load_vae_weights else None
    if vae is not None:
        check_geometry(vae.config, transformer.config, checkpoint.path("vae", "config.json"))
    sound_tokenizer = None
    if load_vae_weights and checkpoint.variant.has_sound_tokenizer:
        folder = checkpoint.path("sound_tokenizer")
        if not folder.is_dir():
            raise CheckpointError(f"model_index.json declares a sound_tokenizer but {folder} is missing; download "
                                  "the checkpoint's sound_tokenizer/ folder again")
        sound_tokenizer = load_sound_tokenizer(folder, device, SOUND_DTYPE)
    pipe = Cosmos3Pipeline(checkpoint, transformer, vae, tokenizer, device, dtype, sound_tokenizer, weights=weights)
    pipe.transformer_file = weights.file.path if isinstance(weights, GGUF) else None
    pipe.linear_class = linear_class
    if low_vram:
        pipe.use_low_vram(offload_text, blocks_to_swap)  # swapped and offloaded parts stay in CPU memory
        pipe.to(device)  # the rest goes to the device
    if reasoner_only:  # its parts now, not on the first question
        pipe.load_reasoner()
    return pipe


def planner(path: str | os.PathLike, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
            load_vae_weights: bool = True, local_files_only: bool | None = None, quantize: str | None = None,
            transformer_file: str | os.PathLike | None = None) -> Planner:
    """What `load` with these arguments would plan requests with, from the checkpoint's config files and tokenizer
    (no weight is read; the loading options `load` refuses are refused here too, a GGUF file's header read):
    `planner(path).check(planner(path).plan(prompt, request))` refuses what `generate` would refuse up front (the
    variant's refusals, prompt length, memory) before minutes of loading."""
    device = resolve_device(device)
    checkpoint = Checkpoint(resolve(path, components=("tokenizer",), local_files_only=local_files_only))
    weights = detect(checkpoint, transformer_file, quantize, headers=False)  # (configs and a GGUF header only)
    vae_config = None
    if load_vae_weights:
        source = checkpoint.path("vae", "config.json")
        vae_config = VAEConfig.from_dict(read_json(source), source=str(source))
    return Planner(checkpoint, PromptTokenizer(checkpoint.tokenizer_dir()), checkpoint.transformer_config(), vae_config,
                   device, resolve_dtype(dtype, device), weights)


def check_geometry(vae: VAEConfig, transformer, source: Path) -> None:
    """The latent geometry requests are validated against (before loading) must be this checkpoint's."""
    expected = (SPATIAL_FACTOR, TEMPORAL_FACTOR, transformer.latent_channel)
    found = (vae.scale_factor_spatial, vae.scale_factor_temporal, vae.z_dim)
    if found != expected:
        raise CheckpointError(f"{source}: spatial/temporal factors and channels {found} differ from Cosmos3's "
                              f"{expected} (and the transformer's latent_channel); not a Cosmos3 VAE")
