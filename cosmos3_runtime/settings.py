"""Resolving a generation request against the checkpoint's variant.

Every field a user leaves unset (None, or "auto") gets the variant's default; every explicit value
wins, except on distilled checkpoints, whose step count, guidance 1.0 and fixed sigmas are part of
the weights. Whenever the runtime changes or ignores something the user asked for, it says so in
`Settings.notes` (also logged as a warning), never silently; the notes also name the action preset
applied (logged at INFO: a robot loop repeats the same request).

Resolving logs nothing: a run logs its notes once (`log_notes`), however often it was planned.

Defaults (the README's table): 81 frames at 24 fps, 35 steps, guidance 4.0 (Edge:
7.0 for images, 5.0 for video), flow shift 3.0 for images and Edge, 10.0 for other video; Edge sizes
640x640 (image) and 832x480 (video), others 1280x720; CFG on images only inside timesteps
[400, 1000]; audio-conditioned video 189 frames at guidance 6.
"""

import logging
from dataclasses import dataclass, field

import torch

from . import causal, chunks, keyframes, transfer
from .causal import CANVASES, TRAINED_HORIZON, Rollout, canvas_for, chunk_ranges, whole_chunks
from .checkpoint import Variant
from .conditioning import frame_count, frame_size
from .errors import InputError
from .action import FRAMEWORK_FPS, ActionRequest, canvas_size, vision_condition_frames
from .geometry import TEMPORAL_FACTOR, RunGeometry, latent_frames, pixel_frames, round_down_frames
from .kinds import SINGLE, Causal, Continued, Controlled, Kind
from .request import LONGEST_WINDOW, Request
from .schedulers import FLOW_MATCH_EULER
from .step_cache import CacheConfig
from .weights.precision import Policy, resolve as resolve_precision

log = logging.getLogger(__name__)

DEFAULT_FRAMES = 81
DEFAULT_FPS = 24.0
DEFAULT_STEPS = 35
DEFAULT_GUIDANCE = 4.0
AUDIO_FRAMES, AUDIO_GUIDANCE = 189, 6.0  # audio-conditioned video (NVIDIA's audio_image2video defaults)
EDGE_GUIDANCE = {"image": 7.0, "video": 5.0}
IMAGE_GUIDANCE_INTERVAL = (400.0, 1000.0)
NOT_DISTILLED = "schedule 'distilled' needs a distilled checkpoint (this one is multi-step)"
EDGE_SIZES = ((832, 480), (480, 832), (640, 480), (480, 640), (480, 480), (640, 640), (448, 256), (256, 448), (256, 256))


@dataclass(frozen=True)
class Settings:
    """A request resolved against the checkpoint's variant; frozen (a run's windows are `replace`d copies)."""

    width: int
    height: int
    num_frames: int
    fps: float
    steps: int
    guidance_scale: float
    flow_shift: float | None  # None: distilled, or the checkpoint schedule with its config's own shift
    schedule: str  # "unipc", "checkpoint" or "distilled"
    guidance_interval: tuple[float, float] | None
    negative_prompt: str
    use_system_prompt: bool
    # what people read the run as, in reports and notes: "t2i", "t2v", "i2v", "v2v", "keyframes", an action run's
    # mode, "transfer", "causal transfer", "causal actions"; code asks `kind` (or the fields), never this
    mode: str
    condition_frames: tuple[int, ...]  # conditioned latent frames
    kind: Kind  # the kind of run (`kinds`) and what only it has
    notes: list[str] = field(default_factory=list)
    # with its preset's values filled in (action runs). Common, not a kind's: an action rides on a one-window run
    # whose sources and tracks read it from the window's settings, as they read the image or the sound
    action: ActionRequest | None = None
    applied: int = 0  # the first `applied` notes say what was applied (INFO), the rest what changed (warnings)
    cache: CacheConfig | None = None  # the step cache (None: off)
    precision: Policy | None = None  # a quantized checkpoint's steps with 16-bit activations (None: its own
    # arithmetic throughout, or not quantized so)
    sigmas: tuple[float, ...] | None = None  # a fixed schedule's sigmas (None: the checkpoint's)

    @property
    def latent_frames(self) -> int:
        return latent_frames(self.num_frames)

    @property
    def geometry(self) -> RunGeometry:
        return self.kind.geometry(self)


def resolve(variant: Variant, request: Request) -> Settings:
    """The settings of a request: its kind's own resolver (the kind and the fields it decides), then the fields
    every kind shares; what was applied listed before what was changed or ignored (`log_notes` logs them)."""
    applied: list[str] = []  # what was applied for the request (reported, logged at INFO)
    notes: list[str] = []  # what of the request was changed or ignored (reported, logged as warnings)
    r = request  # already checked for everything that does not depend on the variant
    if variant.causal is not None:
        kind, fields = (_bimanual if variant.causal.takes_actions else _causal)(variant, r, notes)
    else:
        given = [f"{name} {value!r}" for name, value, unset in _causal_options(r) if value != unset]
        if given:
            notes.append(f"{', '.join(given)} ignored: this checkpoint is not causal (those options are for causal "
                         "checkpoints such as Cosmos3-Nano-Sim-Transfer and Sim-Bimanual)")
        kind, fields = _transfer(variant, r, notes) if r.control_videos is not None else \
            _video(variant, r, applied, notes)
    precision = _precision(variant, r, notes)
    return Settings(kind=kind, **fields, precision=precision, notes=applied + notes, applied=len(applied))


def _video(variant: Variant, r: Request, applied: list[str], notes: list[str]) -> tuple[Kind, dict]:
    """A video (or an image) in one window, or in chunks (a long video); an action run in one window."""
    if r.action is not None:
        r = _action_request(variant, r, applied, notes)
    # Frames decide image vs video; variant defaults follow the requested count, before rounding.
    requested_frames = int(r.num_frames or (AUDIO_FRAMES if r.audio is not None else DEFAULT_FRAMES))
    is_image = requested_frames == 1  # defaults follow the request; the mode follows the rounded count
    kind = "image" if is_image else "video"
    if r.keyframes is not None:  # checked at the requested count: -1 must be the last frame
        keyframes.place(r.keyframes, requested_frames)
    num_frames = round_down_frames(requested_frames)
    if num_frames != requested_frames:
        notes.append(f"num_frames {requested_frames} rounded to {num_frames} (frame counts are 1 + 4k)")
    if num_frames == 1 and (r.has_image or r.has_video or r.keyframes is not None):
        raise InputError("num_frames is 1 (text-to-image): image and video conditioning need a video (num_frames >= 5)")

    if r.sound_use:
        _check_sound(variant, num_frames, r.sound_use)
    width, height = _size(variant, r, is_image, notes)
    fps = DEFAULT_FPS if r.fps is None else float(r.fps)
    if r.audio is not None:
        _audio_notes(r, num_frames, fps, applied, notes)

    schedule = r.schedule
    if variant.is_distilled:
        if schedule in ("unipc", "checkpoint"):
            raise InputError(f"this is a distilled checkpoint: it samples only with its fixed sigmas (schedule "
                             f"'auto' or 'distilled'), not {schedule!r}")
        schedule = "distilled"
        steps = len(variant.distilled_sigmas)
        if r.steps is not None and r.steps != steps:
            notes.append(f"distilled checkpoint: steps {r.steps} ignored, it always takes its {steps} fixed steps")
        guidance = 1.0
        if r.guidance_scale is not None and r.guidance_scale != 1.0:
            notes.append(f"distilled checkpoint: guidance {r.guidance_scale} forced to 1.0 (guidance is distilled in)")
        if r.flow_shift is not None:
            notes.append("distilled checkpoint: flow_shift ignored (its sigmas are fixed)")
        if r.negative_prompt:
            notes.append("distilled checkpoint: negative prompt ignored (no classifier-free guidance)")
        shift, interval = None, None
    else:
        if schedule == "distilled":
            raise InputError(NOT_DISTILLED)
        schedule = "unipc" if schedule == "auto" else schedule
        if schedule == "checkpoint" and variant.scheduler_class == FLOW_MATCH_EULER:
            notes.append(f"schedule 'checkpoint': the shipped {FLOW_MATCH_EULER} (this checkpoint declares no "
                         "fixed sigma list, so it is multi-step), Euler steps on its flow grid")
        steps = DEFAULT_STEPS if r.steps is None else int(r.steps)
        guidance = _default_guidance(variant, kind, r) if r.guidance_scale is None else float(r.guidance_scale)
        shift = r.flow_shift if r.flow_shift is not None else default_flow_shift(variant, is_image)
        if schedule == "checkpoint":  # the shipped config as it is, unless a shift is asked for explicitly
            shift = r.flow_shift
        interval = _guidance_interval(r.guidance_interval, is_image)

    mode, condition_frames = _mode(r, num_frames == 1, latent_frames(num_frames))
    if r.action is not None:
        mode = r.action.mode
        condition_frames = vision_condition_frames(r.action, latent_frames(num_frames))
    use_system_prompt = variant.default_use_system_prompt if r.use_system_prompt is None else r.use_system_prompt
    cache = _cache(r, len(condition_frames) < latent_frames(num_frames), notes)
    long_video = _long_video(r, num_frames, notes, applied)
    return SINGLE if long_video is None else Continued(long_video), dict(
        width=width, height=height, num_frames=num_frames, fps=fps, steps=steps, guidance_scale=guidance,
        flow_shift=shift, schedule=schedule, guidance_interval=interval,
        negative_prompt="" if variant.is_distilled or r.negative_prompt is None else r.negative_prompt,
        use_system_prompt=bool(use_system_prompt), mode=mode, condition_frames=condition_frames, action=r.action,
        cache=cache)


def _causal_options(r: Request) -> tuple[tuple[str, object, object], ...]:
    """(name, value, value when unset) of the options only causal checkpoints read."""
    return (("causal_cache", r.causal_cache, "kv"), ("causal_window", r.causal_window, None),
            ("causal_history", r.causal_history, "device"), ("causal_attention", r.causal_attention, "full"),
            ("causal_seeds", r.causal_seeds, "auto"),
            ("emphasize_control", r.emphasize_control, None))


def _precision(variant: Variant, r: Request, notes: list[str]) -> Policy | None:
    return resolve_precision(variant.quantization, r.precision_policy, r.precision_first_steps, r.precision_last_steps,
                             notes)


DEFAULT_CHUNK = 93  # frames per chunk of a long video (the chunk NVIDIA's servers make transfers in)


def _long_video(r: Request, num_frames: int, notes: list[str], applied: list[str]) -> chunks.Chunks | None:
    """The chunks of a video longer than one window (or than an explicit chunk_frames), else None."""
    if num_frames == 1 or (r.chunk_frames is None and num_frames <= LONGEST_WINDOW):
        return None
    plan = chunks.split(num_frames, r.chunk_frames, r.chunk_overlap_frames, DEFAULT_CHUNK, 1, notes, "long video")
    if plan.count == 1:
        return None
    refused = [what for what, given in (("sound", r.sound), ("keyframes", r.keyframes is not None),
                                        ("an action", r.action is not None)) if given]
    if refused:
        raise InputError(f"{num_frames} frames run in {plan.count} chunks of {plan.chunk}, and {refused[0]} is made "
                         f"in one window: lower the frame count to {plan.chunk} or less (or raise chunk_frames)"
                         + (" (a soundtrack given as audio runs in chunks)" if r.sound else ""))
    if (plan.overlap - 1) % TEMPORAL_FACTOR:
        raise InputError(f"a long video's chunk_overlap_frames must be 1 + 4k (whole latent frames carried from chunk to "
                         f"chunk), got {plan.overlap}: use {round_down_frames(max(1, plan.overlap))}")
    applied.append(f"long video: {num_frames} frames in {plan.count} chunks of {plan.chunk}, each after the first "
                 f"continuing from the last {plan.overlap} frame{'s' * (plan.overlap > 1)} of the one before")
    return plan


def _cache(r: Request, noisy_video: bool, notes: list[str]) -> CacheConfig | None:
    """The step cache of a request: SeaCache unless turned off; off where no video frame is noisy (the framework
    decides from the noisy video: an action or sound run over a wholly given clip is not cached)."""
    if r.cache == "off":
        return None
    if not noisy_video:
        notes.append("SeaCache off: no video frame is generated (it decides from the noisy video)")
        return None
    return CacheConfig(threshold=float(r.cache_threshold), max_consecutive=r.cache_max_consecutive,
                       residual_order=int(r.cache_residual_order))


def log_notes(settings: Settings) -> None:
    """Log a run's notes once: what was applied at INFO, what was changed or ignored as warnings."""
    for i, note in enumerate(settings.notes):
        log.log(logging.INFO if i < settings.applied else logging.WARNING, note)


def _transfer(variant: Variant, r: Request, notes: list[str]) -> tuple[Controlled, dict]:
    """A transfer: the model authors' recommended values where the request leaves them unset."""
    if variant.is_distilled:
        raise InputError("transfer (control_videos) needs a multi-step checkpoint such as Cosmos3-Nano or "
                         "Cosmos3-Super: distilled checkpoints have no transfer schedule (diffusers has none, SGLang "
                         "refuses them)")
    if variant.is_edge:
        raise InputError("transfer (control_videos) runs on Cosmos3-Nano and Cosmos3-Super, the checkpoints NVIDIA "
                         "documents for control-to-video; Edge is refused, as SGLang refuses it")
    if r.schedule == "distilled":
        raise InputError(NOT_DISTILLED)
    plan = transfer.controls_for(r.control_videos, r.num_frames, r.chunk_frames, r.chunk_overlap_frames, r.control_guidance,
                         None if r.control_guidance_interval == "auto" else r.control_guidance_interval, notes)
    width, height = _size(variant, r, plan.total == 1, notes)
    notes.extend(transfer.resize_notes(r.control_videos, height, width))
    guidance, _, fps = transfer.recommended(plan.hints)
    schedule = "unipc" if r.schedule == "auto" else r.schedule
    shift = r.flow_shift if r.flow_shift is not None or schedule == "checkpoint" else transfer.DEFAULT_SHIFT
    return Controlled(plan), dict(
        width=width, height=height, num_frames=plan.total, fps=fps if r.fps is None else float(r.fps),
        steps=transfer.DEFAULT_STEPS if r.steps is None else int(r.steps),
        guidance_scale=guidance if r.guidance_scale is None else float(r.guidance_scale), flow_shift=shift,
        schedule=schedule, guidance_interval=None if r.guidance_interval == "auto" else r.guidance_interval,
        negative_prompt=r.negative_prompt or "", use_system_prompt=r.use_system_prompt is not False,
        mode="transfer", condition_frames=(), cache=_cache(r, True, notes))


def _causal_refusals(variant: Variant, r: Request, steps: tuple[int, ...]) -> None:
    """What no causal checkpoint takes, refused by name."""
    c = variant.causal
    for name, value, allowed in (("guidance_scale", r.guidance_scale, (1.0,)), ("steps", r.steps, steps),
                                 ("control_guidance", r.control_guidance, (1.0,))):
        if value is not None and value not in allowed:
            raise InputError(f"this causal checkpoint is distilled to {' or '.join(map(str, steps))} steps at guidance "
                             f"1: {name} {value:g} cannot apply; leave it unset (or {allowed[0]:g})")
    if r.schedule not in ("auto", "distilled"):
        raise InputError(f"this causal checkpoint samples only with its fixed sigmas, not schedule {r.schedule!r}")
    if r.compile and r.causal_cache == "recompute":
        raise InputError("compile runs the K/V rollout; the recompute reference runs eagerly (its mask changes every "
                         "chunk): leave compile on auto or off, or use causal_cache 'kv'")
    if r.chunk_frames is not None:  # (an overlap alone, a sampler's widget, means nothing without them)
        raise InputError("a causal checkpoint's chunks are its own (latent frame 0, then "
                         f"{c.chunk_size} at a time): leave chunk_frames unset")
    if r.causal_attention == "fp8" and r.causal_cache == "recompute":
        raise InputError("causal_attention 'fp8' rounds the K/V rollout's attention inputs; causal_cache 'recompute' is "
                         "the full-precision reference it is measured against: leave one of them unset")
    if r.causal_seeds == "comfyui" and c.chunk_size != 1 and not c.takes_actions:
        raise InputError("causal_seeds 'comfyui' counts SamplerARVideo's equal blocks: a framewise Sim-Transfer's "
                         "chunks, or Sim-Bimanual's after its first image; this checkpoint's chunks are latent frame 0, "
                         f"then {c.chunk_size} at a time: give framework, sglang or auto")


def _history_window(c, r: Request) -> int | None:
    window = c.window_frames if r.causal_window is None else r.causal_window
    if window is not None and window < c.sink_frames + c.chunk_size + 1:
        raise InputError(f"causal_window {window} leaves no history beside the {c.sink_frames} sink frames and a chunk "
                         f"of {c.chunk_size}: give at least {c.sink_frames + c.chunk_size + 1}")
    return window


def _bimanual(variant: Variant, r: Request, notes: list[str]) -> tuple[Causal, dict]:
    """A Sim-Bimanual checkpoint's rollout: the first image and N actions (N a multiple of 4) make 1 + N frames, at
    the 480p canvas nearest the image's shape, 30 fps, two fixed steps a chunk ("step42"; steps=4: the whole
    t_list), guidance 1, no system prompt; what it cannot take is refused by name."""
    c = variant.causal
    a = r.action
    if a is None or r.control_videos:
        raise InputError("this is a causal Sim-Bimanual checkpoint: it makes a robot video from a first image and "
                         f"actions ({', '.join(f'{e.name}: [N, {e.width}]' for e in c.embodiments)}); give "
                         "action=ActionRequest(mode='forward_dynamics', image=..., actions=..., domain=...) (CLI "
                         "--action-mode forward_dynamics --image FILE --actions FILE --domain NAME)")
    if a.mode != "forward_dynamics" or a.image is None:
        raise InputError(f"this Sim-Bimanual checkpoint rolls actions out from a first image: action mode "
                         f"{a.mode!r}{'' if a.image is not None else ' without an image'} cannot run; give "
                         "mode='forward_dynamics' and the first frame as the image")
    embodiment = c.embodiment(a.domain)
    full = len(c.t_list)
    _causal_refusals(variant, r, (causal.ACTION_SIGMAS, full))
    if r.causal_cache != "kv":
        raise InputError("causal_cache 'recompute' is the Sim-Transfer reference; Sim-Bimanual runs 'kv'")
    if r.sound_use:
        raise InputError(f"this Sim-Bimanual checkpoint has no sound head: {r.sound_use} cannot apply; "
                         + ("leave audio unset" if r.audio is not None else "turn sound off"))
    if r.negative_prompt:
        notes.append("causal checkpoint: negative prompt ignored (guidance 1)")
    window = _history_window(c, r)
    if a.actions is None:  # a session (`Session`): planned as a run long enough that its history fills the window
        if window is None:
            raise InputError("this checkpoint keeps its whole history, which grows every tick; give causal_window "
                             "(latent frames of history) to run it as a session")
        if r.num_frames is not None:
            raise InputError("a session has no length (it runs as long as ticks come): leave num_frames unset")
        actions = torch.zeros(c.chunk_size * causal.ACTION_TOKENS * (window // c.chunk_size + 2), embodiment.width)
    else:
        actions = embodiment.check(a.actions)  # before anything loads
    rows = actions.shape[0] if r.num_frames is None else int(r.num_frames) - 1
    if rows > actions.shape[0]:
        raise InputError(f"num_frames {r.num_frames} needs {rows} actions (one per frame after the first); "
                         f"{actions.shape[0]} were given")
    if rows < causal.ACTION_TOKENS or rows % causal.ACTION_TOKENS:
        fits = max(causal.ACTION_TOKENS, rows - rows % causal.ACTION_TOKENS)
        raise InputError(f"Sim-Bimanual makes 1 + N frames from N actions, N a multiple of {causal.ACTION_TOKENS} "
                         f"(one latent frame each): {rows} actions cannot; give {fits}")
    if rows < actions.shape[0]:
        notes.append(f"Sim-Bimanual: the first {rows} of {actions.shape[0]} actions used (num_frames {rows + 1})")
    frames = rows + 1
    if r.width is None and r.height is None:
        h, w = frame_size(a.clip())
        width, height = canvas_for(h, w)
    else:
        width, height = _size(variant, r, False, notes)
    if (r.steps or causal.ACTION_SIGMAS) != full and full < 3:
        raise InputError(f"this checkpoint's t_list has {full} sigmas: give steps={full}")
    sigmas = c.sigmas(r.steps)
    rollout = Rollout(c, None, tuple(chunk_ranges(latent_frames(frames), c.chunk_size)), window, c.sink_frames,
                      "kv", "sglang" if r.causal_seeds == "auto" else r.causal_seeds, r.causal_history, False,
                      embodiment, r.causal_attention)
    return Causal(rollout), dict(
        width=width, height=height, num_frames=frames, fps=30.0 if r.fps is None else float(r.fps), steps=len(sigmas),
        guidance_scale=1.0, flow_shift=None, schedule="distilled", guidance_interval=None, negative_prompt="",
        use_system_prompt=False, mode="causal actions", condition_frames=(), sigmas=tuple(sigmas))


def _causal(variant: Variant, r: Request, notes: list[str]) -> tuple[Causal, dict]:
    """A Sim-Transfer checkpoint's rollout: one control clip, its frames trimmed to whole chunks, a trained 480p
    canvas, the fixed steps at guidance 1; what it cannot take is refused by name."""
    c = variant.causal
    if not r.control_videos:
        raise InputError(f"this is a causal Sim-Transfer checkpoint: it makes a video from a caption and one control "
                         f"clip ({', '.join(c.hints)}); give control_videos={{hint: clip}} (CLI --control HINT=FILE)")
    if len(r.control_videos) != 1 or next(iter(r.control_videos)) not in c.hints:
        raise InputError(f"this causal checkpoint takes one control clip, one of {', '.join(c.hints)}; got "
                         f"{', '.join(r.control_videos)}")
    steps = len(c.t_list)
    _causal_refusals(variant, r, (steps,))
    history = r.causal_history
    if r.causal_cache == "recompute" and history != "device":
        notes.append(f"causal_history {history!r} ignored: causal_cache 'recompute' keeps no K/V history (each forward "
                     "runs over the whole clip so far)")
        history = "device"
    if r.negative_prompt:
        notes.append("causal checkpoint: negative prompt ignored (guidance 1)")
    (hint, clip), = r.control_videos.items()
    available = frame_count(clip)
    requested = available if r.num_frames is None else min(int(r.num_frames), available)
    if r.num_frames is not None and r.num_frames > available:
        notes.append(f"causal rollout: num_frames {r.num_frames} capped at the control clip's {available} frames")
    frames = whole_chunks(round_down_frames(requested), c.chunk_size)
    if frames < pixel_frames(1 + c.chunk_size):
        raise InputError(f"a causal rollout makes latent frame 0 and then chunks of {c.chunk_size}: {requested} frames "
                         f"are not one chunk; give at least {pixel_frames(1 + c.chunk_size)}")
    if frames != requested:
        notes.append(f"causal rollout: {requested} frames trimmed to {frames} (whole chunks of {c.chunk_size} latent "
                     f"frames: 1 + {TEMPORAL_FACTOR * c.chunk_size}k)")
    height, width = frame_size(clip)
    if r.width is None and r.height is None:
        width, height = canvas_for(height, width)
    else:
        width, height = _size(variant, r, False, notes)
        if (width, height) not in CANVASES:
            notes.append(f"causal Sim-Transfer was trained at 480p canvases ({', '.join(f'{w}x{h}' for w, h in CANVASES)}); "
                         f"{width}x{height} may look worse")
    window = _history_window(c, r)
    latents = latent_frames(frames)
    if window is None and latents > TRAINED_HORIZON:
        notes.append(f"causal rollout: {latents} latent frames exceed the trained horizon of {TRAINED_HORIZON} "
                     f"({pixel_frames(TRAINED_HORIZON)} frames); quality may degrade past it")
    emphasize = c.emphasize_control if r.emphasize_control is None else bool(r.emphasize_control)
    rollout = Rollout(c, hint, tuple(chunk_ranges(latents, c.chunk_size)), window, c.sink_frames, r.causal_cache,
                      "framework" if r.causal_seeds == "auto" else r.causal_seeds, history, emphasize,
                      attention=r.causal_attention)
    return Causal(rollout), dict(
        width=width, height=height, num_frames=frames, fps=30.0 if r.fps is None else float(r.fps), steps=steps,
        guidance_scale=1.0, flow_shift=None, schedule="distilled", guidance_interval=None, negative_prompt="",
        use_system_prompt=r.use_system_prompt is not False, mode="causal transfer", condition_frames=())


def _action_request(variant: Variant, r: Request, applied: list[str], notes: list[str]) -> Request:
    """The request an action run samples with: its preset's values where the request leaves them unset,
    chunk + 1 frames on the action canvas."""
    if not variant.has_action:
        raise InputError("this checkpoint has no action head (action_gen in transformer/config.json); action "
                         "generation needs one, such as Edge-Policy-DROID")
    if variant.is_distilled:
        raise InputError("distilled checkpoints do not generate actions; use a multi-step checkpoint")
    action = r.action.resolved(variant.default_action_preset)
    preset = action.settings
    applied.append(f"action preset '{action.preset}' ({preset.source}); explicit values win")
    height, width = canvas_size(action.clip(), action.resolution_tier)
    for name, value, fixed in (("num_frames", r.num_frames, action.num_frames), ("width", r.width, width),
                               ("height", r.height, height)):
        if value is not None and value != fixed:
            notes.append(f"action: {name} {value} ignored; the action run uses {fixed} (chunk size and canvas)")
    fps = FRAMEWORK_FPS.get(action.domain, preset.fps) if action.preset == "framework" else preset.fps

    def unset_or(name: str, default):
        return default if getattr(r, name) is None else getattr(r, name)

    return Request.build(
        r, action=action, num_frames=action.num_frames, width=width, height=height, fps=unset_or("fps", fps),
        steps=unset_or("steps", preset.steps), guidance_scale=unset_or("guidance_scale", preset.guidance_scale),
        flow_shift=unset_or("flow_shift", preset.flow_shift), use_system_prompt=unset_or("use_system_prompt",
        preset.use_system_prompt), schedule=preset.schedule if r.schedule == "auto" else r.schedule,
        guidance_interval=None if r.guidance_interval == "auto" else r.guidance_interval,
    )


def _check_sound(variant: Variant, num_frames: int, what: str) -> None:
    """Refuse sound (`what`: "sound" or "audio conditioning") where the checkpoint or the request cannot have it."""
    if not variant.has_sound:
        raise InputError(f"this checkpoint has no sound head (sound_gen in transformer/config.json); {what} needs a "
                         "sound-capable checkpoint such as Cosmos3-Nano")
    if not variant.has_sound_tokenizer:
        raise InputError(f"this checkpoint has a sound head but no sound_tokenizer in model_index.json, so {what} "
                         "cannot work (it encodes and decodes sound)")
    if variant.is_distilled:
        raise InputError(f"distilled checkpoints do not generate sound ({what}); use a multi-step checkpoint such as "
                         "Nano")
    if num_frames == 1:
        raise InputError(f"{what} needs a video (num_frames >= 5), not a single image")


def _audio_notes(r: Request, num_frames: int, fps: float, applied: list[str], notes: list[str]) -> None:
    """Say how the soundtrack was fitted to the video (trimmed, or padded with silence)."""
    seconds, given = num_frames / fps, r.audio.seconds
    applied.append(f"audio conditioning: the video follows the soundtrack, its {seconds:.2f} s held as the sound")
    if given > seconds + 1e-6:
        notes.append(f"audio: the soundtrack's {given:.2f} s trimmed to the video's {seconds:.2f} s (more frames cover "
                     "more of it)")
    elif given < seconds - 1e-6:
        notes.append(f"audio: the soundtrack's {given:.2f} s padded with silence to the video's {seconds:.2f} s")


def _size(variant: Variant, r: Request, is_image: bool, notes: list[str]) -> tuple[int, int]:
    if r.width is None and r.height is None:
        if variant.is_edge:
            return (640, 640) if is_image else (832, 480)
        return 1280, 720
    width = 1280 if r.width is None else int(r.width)
    height = 720 if r.height is None else int(r.height)
    if variant.is_edge and (width, height) not in EDGE_SIZES and r.action is None:  # action canvases are trained
        listed = ", ".join(f"{w}x{h}" for w, h in EDGE_SIZES)
        notes.append(f"Edge was trained at 256p and 480p; {width}x{height} may look worse. Trained sizes: {listed}")
    return width, height


def _default_guidance(variant: Variant, kind: str, r: Request) -> float:
    if r.audio is not None:
        return AUDIO_GUIDANCE
    return EDGE_GUIDANCE[kind] if variant.is_edge else DEFAULT_GUIDANCE


def default_flow_shift(variant: Variant, is_image: bool) -> float:
    if is_image or variant.is_edge:
        return 3.0
    return 10.0


def _guidance_interval(value, is_image: bool) -> tuple[float, float] | None:
    """The request's interval (already parsed: "auto", None or (low, high))."""
    if value == "auto":
        return IMAGE_GUIDANCE_INTERVAL if is_image else None
    return value


def _mode(r: Request, is_image: bool, latents: int) -> tuple[str, tuple[int, ...]]:
    if is_image:
        return "t2i", ()
    if r.keyframes is not None:
        return "keyframes", keyframes.locked(keyframes.place(r.keyframes, pixel_frames(latents)))
    if r.has_image:
        return "i2v", (0,)
    if r.has_video:
        frames = tuple(sorted(set(r.condition_frame_indexes if r.condition_frame_indexes is not None else (0, 1))))
        if frames[-1] >= latents:
            raise InputError(
                f"condition_frame_indexes {list(frames)} must be latent frames in [0, {latents - 1}] "
                f"({latents} latent frames for this many video frames)"
            )
        return "v2v", frames
    return "t2v", ()
