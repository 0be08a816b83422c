"""Prompt, schedule, conditioning and sampler nodes.

Size, frame count and fps are set once, on the sampler (0 = the checkpoint variant's default); they
reach the prompt's metadata, the latent size and, through the decode node's fps output, the video.
"""

from ..cosmos3_runtime import keyframes
from ..cosmos3_runtime.checkpoint import PIPELINE_CLASSES, Variant
from ..cosmos3_runtime.errors import InputError, reworded
from ..cosmos3_runtime.geometry import SPATIAL_FACTOR, latent_frames
from ..cosmos3_runtime.pipeline import prompt_list
from ..cosmos3_runtime.prompts import parse_caption
from ..cosmos3_runtime.request import CACHES, KEEP, MAX_SIZE, SCHEDULES, Request, help_of, parse_frame_indexes
from ..cosmos3_runtime.schedulers import distilled_schedule, unipc_schedule
from ..cosmos3_runtime.settings import resolve as resolve_settings
from . import services
from .core.prompt_marker import Refusing, refusing
from .guardrails import GUARDRAIL_INPUT, check_prompt
from .prompting import prompt_inputs, prompt_options


def auto_help(name: str) -> str:
    return f"{help_of(name)}; 0 = automatic"


def size_widgets() -> dict:
    """The width and height widgets of the samplers (0: the variant's default)."""
    return {name: ("INT", {"default": 0, "min": 0, "max": MAX_SIZE, "step": SPATIAL_FACTOR, "tooltip": auto_help(name)})
            for name in ("width", "height")}


def seed_widget() -> tuple:
    return ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True,
                    "tooltip": help_of("seed")})


class Cosmos3TextEncode:
    DESCRIPTION = "A prompt (prose or a JSON caption) and a negative prompt, with the metadata templates to apply."
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("COSMOS3_TEXT",)
    RETURN_NAMES = ("text",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": prompt_inputs("the sampler")}

    def encode(self, prompt, negative_prompt, system_prompt, resolution_template, duration_template, json_captions):
        kind = "JSON caption" if json_captions and parse_caption(prompt) is not None else "prose"
        text = {"prompt": prompt, "negative_prompt": negative_prompt,
                **prompt_options(system_prompt, resolution_template, duration_template, json_captions)}
        shots = prompt_list(prompt)
        if len(shots) > 1:
            kind = f"{len(shots)} prompts, one per chunk of a long video"
        return {"ui": {"text": [f"prompt read as {kind}"]}, "result": (text,)}


class Cosmos3Scheduler:
    DESCRIPTION = ("Sampling schedule: automatic, flow UniPC with a flow shift, the checkpoint's own, or distilled. Also "
                   "its sigmas (SIGMAS) for core sampling nodes: connect the model for the checkpoint's own values "
                   "(a distilled checkpoint's fixed list: sample it with the lcm sampler at cfg 1).")
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("COSMOS3_SCHEDULE", "SIGMAS")
    RETURN_NAMES = ("schedule", "sigmas")
    OUTPUT_TOOLTIPS = ("for Cosmos3 Sampler", "for SamplerCustomAdvanced: the exact grid Cosmos3 Sampler walks")
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "schedule": (list(SCHEDULES), {"default": "auto", "tooltip": help_of("schedule")}),
                "steps": ("INT", {"default": 0, "min": 0, "max": 1000, "tooltip": auto_help("steps")}),
                "flow_shift": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01,
                               "tooltip": auto_help("flow_shift")}),
            },
            "optional": {
                "model": ("COSMOS3_MODEL", {"tooltip": "the checkpoint (sigmas: its variant's defaults and distilled "
                          "list; without it, a multi-step checkpoint is assumed)"}),
                "latent": ("LATENT", {"tooltip": "sigmas: a 1-frame latent takes the image defaults (flow shift 3)"}),
            },
        }

    def build(self, schedule, steps, flow_shift, model=None, latent=None):
        options = {"schedule": schedule, "steps": steps or None, "flow_shift": flow_shift or None}
        frames = 1 if latent is not None and latent["samples"].shape[2] == 1 else None
        sigmas = schedule_sigmas(model.pipeline if model is not None else None, options, frames)
        return (options, sigmas)


# Sigmas without a checkpoint: a gated multi-step one's defaults (35 steps, flow shift 10 for video, 3 for images).
MULTI_STEP = Variant(is_edge=False, is_distilled=False, distilled_sigmas=None, stochastic_distilled=False,
                     has_action=False, has_sound=False, has_sound_tokenizer=False, default_use_system_prompt=True,
                     pipeline_class=PIPELINE_CLASSES[0], scheduler_class="UniPCMultistepScheduler")


class SigmasNeedTheModel(Refusing):
    refusal = ("Cosmos3 Scheduler's sigmas for the 'checkpoint' and 'distilled' schedules read the checkpoint: connect "
               "the model to it")


def schedule_sigmas(pipe, options: dict, frames: int | None):
    """The sigmas (float32, ending in 0) Cosmos3 Sampler would walk for these options."""
    request = Request.build(**options, num_frames=frames)
    if pipe is not None and pipe.variant.causal is not None:  # (its settings need a control clip or actions)
        return distilled_schedule(pipe.variant.causal.sigmas(request.steps), True).sigmas  # for SamplerARVideo
    if pipe is not None:
        return pipe.denoiser.schedule_for(resolve_settings(pipe.variant, request)).sigmas
    if request.schedule not in ("auto", "unipc"):  # (the schedule output still serves Cosmos3 Sampler)
        return refusing(SigmasNeedTheModel)
    s = resolve_settings(MULTI_STEP, request)
    return unipc_schedule(s.steps, s.flow_shift).sigmas


class MediaCondition:
    """A node that makes the sampler's `media` input (the conditioning of a run)."""

    CATEGORY = "cosmos3/conditioning"
    RETURN_TYPES = ("COSMOS3_MEDIA",)
    RETURN_NAMES = ("media",)
    FUNCTION = "condition"


class Cosmos3ImageToVideo(MediaCondition):
    DESCRIPTION = "Condition the first frame of the video on an image (resized to cover the sampler's size, centre-cropped)."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE", {"tooltip": "the first frame; of a batch, the first image is used"})}}

    def condition(self, image):
        if image.shape[0] > 1:
            services.log.warning("Cosmos3 image-to-video: using the first of %d images", image.shape[0])
        return ({"image": image[:1]},)


class ClipCondition(MediaCondition):
    """Video-to-video conditioning: a clip (SOURCE input) and which of its latent frames are held fixed."""

    SOURCE: tuple[str, str, str, str]  # (input name, type, tooltip, Request field it fills)

    @classmethod
    def INPUT_TYPES(cls):
        name, kind, tooltip, _ = cls.SOURCE
        return {
            "required": {
                name: (kind, {"tooltip": tooltip}),
                "condition_frames": ("STRING", {"default": "0,1", "tooltip": help_of("condition_frame_indexes")}),
                "keep": (list(KEEP), {"default": "first", "tooltip": help_of("condition_video_keep")}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, condition_frames):
        return services.words.validation(lambda: parse_frame_indexes(condition_frames), condition_frames)

    def media(self, clip, condition_frames: str, keep: str):
        return ({self.SOURCE[3]: clip, "condition_frame_indexes": parse_frame_indexes(condition_frames),
                 "condition_video_keep": keep},)


class Cosmos3VideoToVideo(ClipCondition):
    DESCRIPTION = "Condition the first latent frames of the video on a clip (frames resized to the sampler's size)."
    SOURCE = ("video", "IMAGE", "the conditioning clip as an IMAGE batch", "video")

    def condition(self, video, condition_frames, keep):
        return self.media(video, condition_frames, keep)


class Cosmos3LatentToVideo(ClipCondition):
    DESCRIPTION = ("Condition the first latent frames of the video on an encoded clip: a LATENT from Cosmos3 VAE Encode "
                   "or ComfyUI's own VAE Encode with the Wan 2.2 VAE (the sampler's size must be the clip's).")
    SOURCE = ("samples", "LATENT", help_of("condition_latents"), "condition_latents")

    def condition(self, samples, condition_frames, keep):
        return self.media(samples["samples"], condition_frames, keep)


class Cosmos3Keyframes(MediaCondition):
    DESCRIPTION = ("First-last frame (and any-frame) to video: images or clips held at frames of the video. A still "
                   "holds the latent frame that holds its frame (4 frames), a clip every latent frame it covers; the "
                   "rest is generated. Connect it to the sampler's media; its frame count is the sampler's.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "frames": ("INT", {"default": 81, "min": 5, "max": 4097, "step": 4, "tooltip": "frames of the video, "
                           "1 + 4k (the sampler's frames stays 0 or says the same)"}),
            },
            "optional": {
                "start": ("IMAGE", {"tooltip": "the first frame (one image) or the opening clip (an IMAGE batch)"}),
                "end": ("IMAGE", {"tooltip": "the last frame (one image) or the closing clip (an IMAGE batch)"}),
                "middle": ("IMAGE", {"tooltip": "stills in between, one per frame number in middle_frames"}),
                "middle_frames": ("STRING", {"default": "", "tooltip": "the frames the middle images are held at, "
                                  "e.g. 40, 80 (negative: from the end)"}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, frames, middle_frames=""):
        return services.words.validation(lambda: (parse_middle_frames(middle_frames), keyframes.check_frames(frames)),
                                   middle_frames)

    def condition(self, frames, start=None, end=None, middle=None, middle_frames=""):
        at = parse_middle_frames(middle_frames)
        given = {} if start is None else {0: still_or_clip(start)}
        if middle is not None:
            if len(at) != middle.shape[0]:
                raise InputError(f"middle has {middle.shape[0]} image(s) and middle_frames names {len(at)} frame(s); "
                                 "give one frame number per image")
            given.update({f: middle[i : i + 1] for i, f in enumerate(at)})
        if end is not None:
            given[-1] = still_or_clip(end)
        if not given:
            raise InputError("Cosmos3 Keyframes needs at least one keyframe: connect start, end or middle")
        placed = keyframes.place(given, frames)
        locked = keyframes.locked(placed)
        report = [f"{frames} frames, {latent_frames(frames)} latent frames; held: {', '.join(map(str, locked))}",
                  *(k.describe() for k in placed)]
        return {"ui": {"text": report}, "result": ({"keyframes": given, "num_frames": frames},)}


def still_or_clip(images):
    """An IMAGE batch: one image is a still, several a clip."""
    return images if images.shape[0] > 1 else images[:1]


def parse_middle_frames(text: str) -> list[int]:
    parts = [p for p in str(text).replace(",", " ").split() if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise InputError(f"middle_frames {text!r} must be frame numbers like 40, 80") from None


class Cosmos3Sampler:
    DESCRIPTION = ("Generates Cosmos3 latents: text-to-image (frames = 1), text-to-video, image- or video-to-video, "
                   "and actions with an action input.")
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("LATENT", "COSMOS3_ACTIONS")
    RETURN_NAMES = ("latent", "actions")
    OUTPUT_TOOLTIPS = ("the video latents", "the predicted actions (policy, inverse dynamics), else None")
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("COSMOS3_MODEL",),
                "text": ("COSMOS3_TEXT",),
                **size_widgets(),
                "frames": ("INT", {"default": 0, "min": 0, "max": 4097, "tooltip": auto_help("num_frames")}),
                "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 240.0, "step": 0.5, "tooltip": auto_help("fps")}),
                "guidance": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 30.0, "step": 0.1, "round": 0.01,
                             "tooltip": auto_help("guidance_scale")}),
                "guidance_interval": ("STRING", {"default": "auto", "tooltip": help_of("guidance_interval")}),
                "seed": seed_widget(),
                "sound": ("BOOLEAN", {"default": False, "tooltip": help_of("sound") + "; decode it with Cosmos3 "
                          "Sound Decode"}),
            },
            "optional": {
                "schedule": ("COSMOS3_SCHEDULE", {"tooltip": "default: automatic"}),
                "media": ("COSMOS3_MEDIA", {"tooltip": "an image (image-to-video) or clip (video-to-video)"}),
                "action": ("COSMOS3_ACTION", {"tooltip": "an action run (Cosmos3 Action): sets size, frames and "
                           "conditioning"}),
                **speed_widgets(),
                "chunk_frames": ("INT", {"default": 0, "min": 0, "max": 4097, "tooltip": auto_help("chunk_frames")}),
                "chunk_overlap_frames": ("INT", {"default": 1, "min": 1, "max": 61, "step": 4,
                                         "tooltip": help_of("chunk_overlap_frames")}),
                "audio": ("AUDIO", {"tooltip": "audio-conditioned video (Load Audio): " + help_of("audio").split(". A file")[0]
                          + ". Cosmos3 Sound Decode hands that soundtrack on"}),
                **GUARDRAIL_INPUT,
                **cache_widgets(),
            },
            "hidden": {"node_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, width, height, guidance_interval):
        """Checked when the prompt is queued, before any model loads (linked values arrive as None)."""
        widgets = {"width": width, "height": height, "guidance_interval": guidance_interval}
        return services.words.validation(lambda: Request.build(**sampler_options({k: v for k, v in widgets.items() if v is not None})),
                        widgets, SAMPLER_WORDS)

    def sample(self, model, text, width, height, frames, fps, guidance, guidance_interval, seed, sound=False,
               schedule=None, media=None, action=None, cache="seacache", compile=True, chunk_frames=0,
               chunk_overlap_frames=1, audio=None, guardrail=None, cache_threshold=0.25, cache_max_consecutive=2,
               node_id=None):
        media = dict(media or {})
        frames = media_frames(frames, media.pop("num_frames", None))
        widgets = dict(width=width, height=height, frames=frames, fps=fps, guidance=guidance,
                       guidance_interval=guidance_interval, seed=seed, sound=sound, cache=cache,
                       compile=compile_option(compile), chunk_frames=chunk_frames,
                       chunk_overlap_frames=chunk_overlap_frames, cache_threshold=cache_threshold,
                       cache_max_consecutive=cache_max_consecutive)
        prompt = text["prompt"]
        options = {k: v for k, v in text.items() if k != "prompt"}
        progress = services.progress.RunProgress(node_id)
        check_prompt(guardrail, prompt)  # before anything loads

        with services.words.widget_words(SAMPLER_WORDS):
            request = Request.build(**options, **sampler_options(widgets), **(schedule or {}), **media,
                                    action=action, audio=audio, output="latents")
            plan = model.plan(prompt, request)
            # ComfyUI makes room for the run itself, not only for the weights
            with model.use(memory_required=model.memory_needed(plan)) as pipe:
                result = pipe.generate(plan, callback=progress.step, progress=progress.stage,
                                       interrupt=services.progress.check_interrupt)
                raw = pipe.raw_latents(result.latents)  # ComfyUI's LATENT holds the VAE's own latents
        s = result.settings
        report = [f"{s.mode}: {s.width}x{s.height}, {s.num_frames} frames at {s.fps:g} fps",
                  f"{s.steps} steps ({s.schedule}), guidance {s.guidance_scale:g}"
                  + (f" in timesteps {s.guidance_interval[0]:g}-{s.guidance_interval[1]:g}" if s.guidance_interval else "")
                  + (f", flow shift {s.flow_shift:g}" if s.flow_shift is not None else ""),
                  *([result.cache] if result.cache else []), *(reworded(note, SAMPLER_WORDS) for note in s.notes)]
        latent = {"samples": raw, "cosmos3": {"fps": s.fps, "num_frames": s.num_frames, "mode": s.mode}}
        if result.sound is not None or result.sound_latents is not None:
            latent["cosmos3"].update(sound_latents=result.sound_latents, sample_rate=result.sample_rate)
            if result.sound is not None:  # an audio-conditioned run: its sound is the soundtrack it held
                latent["cosmos3"]["soundtrack"] = result.sound
            held = "" if result.sound_latents is None else f"{result.sound_latents.shape[1]} latent frames "
            report.append(f"sound: {held}at {result.sample_rate} Hz"
                          + (", the soundtrack held" if result.sound is not None else ""))
        actions = None
        if result.actions is not None:
            a = s.action
            actions = {"actions": result.actions, "domain": a.domain, "mode": a.mode, "preset": a.preset, "fps": s.fps,
                       "units": "dataset" if a.stats is not None else "normalized"}
            report.append(f"actions: {result.actions.shape[0]} x {result.actions.shape[1]} ({a.domain}, {a.preset})")
        return {"ui": {"text": report}, "result": (latent, actions)}


# Sampler widget -> Request field; 0 means "automatic" (None) for the numeric ones.
SAMPLER_FIELDS = {"width": "width", "height": "height", "frames": "num_frames", "fps": "fps",
                  "guidance": "guidance_scale", "guidance_interval": "guidance_interval", "seed": "seed",
                  "sound": "sound", "cache": "cache", "compile": "compile", "chunk_frames": "chunk_frames",
                  "chunk_overlap_frames": "chunk_overlap_frames", "cache_threshold": "cache_threshold",
                  "cache_max_consecutive": "cache_max_consecutive"}


def speed_widgets() -> dict:
    """The step cache's switch and compile, optional (API prompts and workflows made before them run with SeaCache
    on and compile auto). The cache's residual order keeps NVIDIA's default here (the API, CLI and HTTP routes take
    it)."""
    return {"cache": (list(CACHES), {"default": "seacache", "tooltip": help_of("cache") + " (residual order 1, as "
                      "NVIDIA's framework runs it)"}),
            "compile": ("BOOLEAN", {"default": True, "tooltip": help_of("compile") + ". This switch: on is auto, off "
                        "is off"})}


def cache_widgets() -> dict:
    """SeaCache's two knobs, last among a sampler's optional widgets (workflows saved before them keep their values in
    place and run NVIDIA's defaults)."""
    return {"cache_threshold": ("FLOAT", {"default": 0.25, "min": 0.0, "max": 5.0, "step": 0.01, "round": 0.001,
                                "tooltip": help_of("cache_threshold")}),
            "cache_max_consecutive": ("INT", {"default": 2, "min": 0, "max": 1000,
                                      "tooltip": help_of("cache_max_consecutive")})}


def compile_option(widget: bool) -> bool | None:
    """The compile switch as a Request's compile: on is auto (compiled where it can be), off is off."""
    return None if widget else False


ZERO_IS_AUTO = ("width", "height", "frames", "fps", "guidance", "chunk_frames")


def media_frames(widget: int, from_media: int | None) -> int:
    """The sampler's frame count: its widget, or the media's (Cosmos3 Keyframes sets one) when the widget is 0."""
    if from_media is None or widget in (0, from_media):
        return from_media or widget
    raise InputError(f"the sampler's frames is {widget} and its keyframes are placed in {from_media} frames; set "
                     "frames to 0 (or the same number) on the sampler")


def words_of(fields: dict, **extra: str) -> dict:
    """Request fields -> what a node's user sees (its widgets, and `extra` names), for its errors and notes."""
    return {field: widget for widget, field in fields.items() if field != widget} | extra


SAMPLER_WORDS = words_of(SAMPLER_FIELDS, vae_tile="tiled decoding (Cosmos3 VAE Decode)")


def sampler_options(widgets: dict) -> dict:
    return {SAMPLER_FIELDS[k]: (v or None) if k in ZERO_IS_AUTO else v for k, v in widgets.items()}

