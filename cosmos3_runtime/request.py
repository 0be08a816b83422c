"""The generation request: every option of `Cosmos3Pipeline.generate`, defined once.

`Request` holds each option with its default and its help text. `generate(prompt, **options)`
builds one; the command line derives its flags from the fields (`add_arguments`), the ComfyUI
sampler and the worker pool build and pass the same object. Constructing a Request checks
everything that does not depend on the checkpoint (sizes, frame counts, the guidance interval,
names of choices), so a bad request fails before any weight is read. What depends on the
checkpoint's variant (defaults, distilled overrides) is resolved by `settings.resolve`.
"""

import argparse
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from .errors import InputError
from .geometry import SPATIAL_FACTOR
from .sound import as_audio
from .tiny_decoder import LATENT_SPACES
from .transfer import canonical
from .vae import TileSpec

SCHEDULES = ("auto", "unipc", "checkpoint", "distilled")
CACHES = ("seacache", "off")
PRECISION_POLICIES = ("checkpoint", "on", "off")
OUTPUTS = ("frames", "latents")
KEEP = ("first", "last")
CAUSAL_CACHES = ("kv", "recompute")
CAUSAL_SEEDS = ("auto", "framework", "sglang", "comfyui")
CAUSAL_HISTORY = ("device", "cpu", "fp8")
CAUSAL_ATTENTION = ("full", "fp8")
LONGEST_WINDOW = 201  # frames generated in one window by default; longer videos run in chunks (NVIDIA lists <= 200 at 720p)
DEFAULT_MAX_PROMPT_TOKENS = 16384  # official JSON captions are 1.6k-2.9k tokens; this bounds text-tower memory
MAX_SIZE = 8192  # pixels per side: far above anything Cosmos3 was trained on, below int32 index trouble


def option(default, help: str, flag: str | None = None, cli: bool = True, tri_state: bool = False,
           alias: str | None = None, **argparse_options):
    """A Request field: its default, help text, and its command-line flag (default --field-name).

    cli=False: no flag. tri_state: a bool-or-None field spelled auto/on/off. alias: an earlier name, still taken as a
    keyword option and a flag.
    """
    metadata = {"help": help, "flag": flag, "cli": cli, "tri_state": tri_state, "alias": alias,
                "argparse": argparse_options}
    return field(default=default, metadata=metadata)


def parse_guidance_interval(value, name: str = "guidance_interval") -> tuple[float, float] | str | None:
    """'auto' | 'off' (or None, '') | 'LOW,HIGH' | 'LOW-HIGH' | 'LOW HIGH' | (low, high), in timesteps."""
    if value is None or isinstance(value, str) and value.strip().lower() in ("", "off", "none"):
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        parts = [p for p in re.split(r"[,\s]+|(?<=\d)-(?=\d)", text) if p]
    else:
        parts = list(value) if isinstance(value, (tuple, list)) else [value]
    try:
        low, high = (float(p) for p in parts)
    except (TypeError, ValueError):
        raise InputError(
            f"{name} {value!r} must be 'auto', 'off' or 'LOW,HIGH' in timesteps 0-1000 (e.g. 400,1000)"
        ) from None
    if not 0 <= low <= high:
        raise InputError(f"{name} ({low:g}, {high:g}) must be LOW,HIGH with 0 <= LOW <= HIGH (timesteps)")
    return low, high


def parse_frame_indexes(value) -> tuple[int, ...] | None:
    """Latent frame numbers from '0,1' / '0 1' / a sequence of ints; None stays None."""
    if value is None:
        return None
    parts = [p for p in re.split(r"[,\s]+", value.strip()) if p] if isinstance(value, str) else list(value)
    try:
        frames = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise InputError(f"condition_frame_indexes {value!r} must be latent frame numbers like '0,1'") from None
    if not frames or min(frames) < 0:
        raise InputError(f"condition_frame_indexes {value!r} must be one or more latent frame numbers >= 0")
    return frames


def parse_tile(value) -> TileSpec | None:
    """A TileSpec, (size, overlap), None/0 (no tiling), or a tile size in latents (overlap a quarter of it)."""
    if value is None or isinstance(value, TileSpec):
        return value
    if isinstance(value, (tuple, list)):
        return TileSpec(*value)
    size = int(value)
    if size < 0:
        raise InputError(f"vae_tile {value!r} must be a tile size in latents (0: no tiling)")
    return TileSpec(size, size // 4) if size else None


@dataclass(frozen=True)
class Request:
    """What one generation asks for. None (or "auto") means the checkpoint variant's default."""

    negative_prompt: str | None = option(None, "negative prompt: prose or a JSON caption (default: empty)")
    width: int | None = option(None, "frame width, a multiple of 16 (auto: 832 Edge video, 640 Edge image, else 1280)",
                               type=int)
    height: int | None = option(None, "frame height, a multiple of 16 (auto: 480 Edge video, 640 Edge image, else 720)",
                                type=int)
    num_frames: int | None = option(None, "1 for an image; video frame counts are 1 + 4k, others round down "
                                    "(auto: 81)", flag="--frames", type=int)
    fps: float | None = option(None, "frames per second, stated in the prompt and the video file (auto: 24; 30 for "
                               "causal checkpoints and transfers, wsm 10, the CLI keeping the control clip's; an "
                               "action run its preset's)", type=float)
    steps: int | None = option(None, "sampling steps (auto: 35; distilled checkpoints always take their own 4)",
                               type=int)
    guidance_scale: float | None = option(None, "classifier-free guidance (auto: 4, Edge 5 for video and 7 for "
                                          "images; distilled: always 1)", flag="--guidance", type=float)
    flow_shift: float | None = option(None, "flow shift of the UniPC grid (auto: 3 for images and Edge, 10 for "
                                      "other video)", type=float)
    schedule: str = option("auto", "auto (fixed sigmas on distilled checkpoints, else unipc), unipc (shifted flow "
                           "grid), checkpoint (the shipped scheduler_config.json), distilled", choices=SCHEDULES)
    guidance_interval: Any = option("auto", "timesteps where guidance applies: auto ([400, 1000] for images, every "
                                    "step for video), off, or LOW,HIGH")
    seed: int = option(0, "noise seed (the same seed gives the same result on every device)", type=int)
    image: Any = option(None, "image to condition the first frame on (image-to-video); CLI: an image file")
    video: Any = option(None, "clip to condition the first latent frames on (video-to-video); CLI: a video file")
    condition_latents: Any = option(None, "video-to-video from an encoded clip: raw VAE latents [1, 48, T, h, w] (a "
                                    "ComfyUI LATENT) instead of `video`", cli=False)
    condition_frame_indexes: Any = option(None, "video-to-video: latent frames held to the clip, e.g. 0,1 "
                                          "(latent f covers video frames up to 4f; auto: 0,1)",
                                          flag="--condition-frames")
    condition_video_keep: str = option("first", "video-to-video: condition on the first or the last frames of the "
                                       "clip", flag="--keep", choices=KEEP)
    use_system_prompt: bool | None = option(None, "system prompt on or off (auto: the checkpoint's "
                                            "default_use_system_prompt)", flag="--system-prompt", tri_state=True)
    add_resolution_template: bool = option(True, "append 'This video is of HxW resolution.' to prose prompts "
                                           "(negated on the negative)", flag="--resolution-template")
    add_duration_template: bool = option(True, "append 'The video is N seconds long and is of F FPS.' to prose "
                                         "video prompts (negated on the negative)", flag="--duration-template")
    json_captions: bool = option(True, "read a prompt that is a JSON object as a structured caption (resolution, "
                                 "duration and fps filled in); off: every prompt is prose")
    max_sequence_length: int | None = option(None, "cut prompts to this many tokens (with a warning; default: no "
                                             "cut)", type=int)
    max_prompt_tokens: int = option(DEFAULT_MAX_PROMPT_TOKENS, "refuse prompts longer than this many tokens (raise "
                                    "it for very long captions)", type=int)
    output: str = option("frames", "frames (decoded) or latents (no VAE decode)", cli=False)
    vae_tile: Any = option(None, "decode in tiles of this many latents, overlap a quarter (0: no tiling)",
                           flag="--tile", type=int)
    fast_decoder: str | None = option(None, "decode the frames with the Wan 2.2 tiny autoencoder in this file "
                                      "(taew2_2 or lighttaew2_2, .safetensors or .pth, as ComfyUI's models/vae_approx "
                                      "holds them) instead of the VAE: many times faster, softer detail; not for long "
                                      "videos or transfers, which encode each chunk's frames again")
    fast_decoder_latents: str = option("auto", "the latents the fast decoder's file takes: auto (by its name: "
                                       "lighttae* the VAE's raw latents, as lightx2v decodes them; others the "
                                       "model's normalized latents, as TAEHV's), normalized or raw",
                                       choices=LATENT_SPACES)
    action: Any = option(None, "an ActionRequest: policy, forward or inverse dynamics (checkpoints with an action "
                         "head); it sets the frame count, size and conditioning", cli=False)
    sound: bool = option(False, "generate the sound track with the video (checkpoints with a sound head and a sound "
                         "tokenizer, such as Nano)")
    sound_trim: bool = option(True, "trim the waveform to the video's duration, int(frames / fps * sample_rate) "
                              "samples; off: the full latent length")
    audio: Any = option(None, "audio-conditioned video (checkpoints with a sound head and a sound encoder, such as "
                        "Nano): a soundtrack the video follows, held as its sound (auto: 189 frames, guidance 6); "
                        "resampled, trimmed or padded with silence to the video's duration, and the output's sound. A "
                        "file (wav, flac, mp3, a video's sound track) or a waveform")
    control_videos: Any = option(None, "transfer: control clips by hint, {edge|blur|depth|seg|wsm: clip} (each in a form "
                                 "`video` takes); the output follows them, frame for frame. CLI: --control HINT=FILE "
                                 "(repeatable), or --control edge:PRESET=FILE / blur:PRESET=FILE to derive the control "
                                 "from a source clip (presets very_low ... very_high)", flag="--control",
                                 action="append")
    control_guidance: float | None = option(None, "transfer: how strongly the output follows the controls, 1 = no "
                                            "control guidance (auto: the model authors' 1.5; seg 2, wsm 3)", type=float)
    control_guidance_interval: Any = option("auto", "transfer: timesteps where control guidance applies: auto or off "
                                            "(every step), or LOW,HIGH")
    chunk_frames: int | None = option(None, "transfer and long videos: frames per chunk, rounded up to 1 + 4k (auto: "
                                      "transfer: the whole clip up to 93 frames, 101 for a world-scenario map alone; "
                                      f"video: one window up to {LONGEST_WINDOW} frames, else chunks of 93)", type=int)
    chunk_overlap_frames: int | None = option(None, "transfer and long videos: frames each chunk takes from the end of "
                                              "the previous one, generated again there and kept once (auto: 1; a long "
                                              "video's are 1 + 4k: whole latent frames)", type=int)
    causal_cache: str = option("kv", "causal checkpoints (Sim-Transfer): kv (each chunk attends to the K/V its history "
                               "left, kept across chunks) or recompute (every forward over the whole clip so far "
                               "under the matching mask: the same result, far slower; a reference)",
                               choices=list(CAUSAL_CACHES))
    causal_window: int | None = option(None, "causal checkpoints: latent frames of history a chunk attends to, its "
                                       "sinks and itself included; fewer bound the K/V memory (auto: the "
                                       "checkpoint's; all history where it never evicts)", type=int)
    causal_history: str = option("device", "causal checkpoints: how the K/V history is kept: device; cpu (CPU memory, "
                                 "each layer's brought to the device as it runs: far less GPU memory, more transfer, "
                                 "the same result); or fp8 (on the device in fp8, a scale per token and head: about "
                                 "half of bf16, close to the same result)", choices=list(CAUSAL_HISTORY))
    causal_attention: str = option("full", "causal checkpoints: the media attention's inputs: full (the activations' "
                                   "precision) or fp8 (queries, keys and values rounded to e4m3 with a scale per key/value "
                                   "head, as an FP8 attention kernel reads them; computed from the rounded values: the "
                                   "error of FP8 attention, not its speed)", choices=list(CAUSAL_ATTENTION))
    causal_seeds: str = option("auto", "causal checkpoints: the per-step noise seeds, framework (seed + chunk start "
                               "x 1000003 + (step + 1) x 9176, NVIDIA's framework's newest Sim-Transfer code) or "
                               "sglang (step x 9176, SGLang's and the framework's Sim-Bimanual code), comfyui (framewise "
                               "Sim-Transfer and Sim-Bimanual: block x 1000 + step from one noise over the clip, "
                               "ComfyUI's SamplerARVideo); auto: "
                               "framework for Sim-Transfer, sglang for Sim-Bimanual",
                               choices=list(CAUSAL_SEEDS))
    emphasize_control: bool | None = option(None, "causal Sim-Transfer: add the sentence telling the model to follow "
                                            "the control clip precisely (auto: the checkpoint's setting)",
                                            tri_state=True)
    keyframes: Any = option(None, "keyframes held in the video (first-last frame to video, or any frame): {frame: image "
                            "or clip}, negative frames counting from the end (-1: the last; a clip there ends on it). "
                            "A still holds the latent frame that holds its frame (4 frames), a clip every latent frame "
                            "it covers. CLI: --keyframe FRAME=FILE, an image or a video file (repeatable)",
                            flag="--keyframe", action="append")
    check_memory: bool = option(True, "estimate the memory a request needs and refuse it when the device does not "
                                "have it")
    cache: str = option("seacache", "step cache: seacache (NVIDIA's SeaCache, as their framework runs Cosmos3: a "
                        "guidance pass whose input changed little since its last full run reuses that run's "
                        "residual instead of the layer stack) or off", choices=list(CACHES))
    cache_threshold: float = option(0.25, "SeaCache: the accumulated change of the filtered latents before a pass "
                                    "runs in full again; higher skips more (0: never skips)", type=float)
    cache_max_consecutive: int = option(2, "SeaCache: at most this many steps in a row reuse a pass's residual before "
                                        "it runs in full (0: no cap)", type=int)
    cache_residual_order: int = option(1, "SeaCache: how a skipped pass extrapolates the stored residuals: 0 reuses "
                                       "the last, 1 linear, 2 quadratic", type=int)
    precision_policy: str = option("checkpoint", "quantized checkpoints whose files calibrate the activations too "
                                   "(official FP8, NVFP4): checkpoint (its step policy: 16-bit activations, W8A16 "
                                   "or W4A16, on the first and last 3 steps, its own arithmetic between, W8A8 or "
                                   "W4A4 where FP4 matmuls run; distilled ones their own throughout), off (its own "
                                   "throughout), on (the first/last policy even where the checkpoint declares none)",
                                   choices=PRECISION_POLICIES, alias="fp8_policy")
    precision_first_steps: int | None = option(None, "quantized checkpoints: steps with 16-bit activations at the "
                                               "start (auto: the checkpoint's, 3)", type=int, alias="fp8_first_steps")
    precision_last_steps: int | None = option(None, "quantized checkpoints: steps with 16-bit activations at the end "
                                              "(auto: the checkpoint's, 3)", type=int, alias="fp8_last_steps")
    compile: bool | None = option(None, "compile the transformer's media block with torch.compile (one compile "
                                  "serves every layer; the first run pays it, and once more at a new size): auto (on "
                                  "a CUDA GPU where torch.compile can make kernels, i.e. Triton is installed; eager "
                                  "elsewhere, and for the causal recompute and sequence parallelism), on or off",
                                  tri_state=True)

    def __post_init__(self):
        set_ = object.__setattr__  # frozen: normalise in place once
        set_(self, "guidance_interval", parse_guidance_interval(self.guidance_interval))
        set_(self, "control_guidance_interval", parse_guidance_interval(self.control_guidance_interval,
                                                                        "control_guidance_interval"))
        set_(self, "condition_frame_indexes", parse_frame_indexes(self.condition_frame_indexes))
        set_(self, "vae_tile", parse_tile(self.vae_tile))
        set_(self, "audio", as_audio(self.audio))
        for name, choices in (("schedule", SCHEDULES), ("condition_video_keep", KEEP), ("output", OUTPUTS),
                              ("cache", CACHES), ("causal_cache", CAUSAL_CACHES), ("causal_seeds", CAUSAL_SEEDS),
                              ("causal_history", CAUSAL_HISTORY), ("causal_attention", CAUSAL_ATTENTION),
                              ("fast_decoder_latents", LATENT_SPACES)):
            if getattr(self, name) not in choices:
                raise InputError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.fast_decoder is not None:
            set_(self, "fast_decoder", str(self.fast_decoder))
            if self.vae_tile is not None:
                raise InputError("vae_tile tiles the VAE's decode; the fast decoder decodes whole frames in little "
                                 "memory: give one of them")
        if self.negative_prompt is not None and not isinstance(self.negative_prompt, str):
            raise InputError(f"negative_prompt must be a string, got {type(self.negative_prompt).__name__}")
        for name in ("width", "height"):
            value = getattr(self, name)
            if value is not None and (value <= 0 or value % SPATIAL_FACTOR or value > MAX_SIZE):
                other = self.height if name == "width" else self.width
                raise InputError(
                    f"{name} {value} must be a positive multiple of {SPATIAL_FACTOR} up to {MAX_SIZE} (Cosmos3 "
                    f"latents are 1/{SPATIAL_FACTOR} of the frame); for example {_nearest(value)}"
                    + ("" if other is None else f" (size asked: {self.width}x{self.height}, WxH)")
                )
        positive = {"num_frames": self.num_frames, "steps": self.steps, "max_prompt_tokens": self.max_prompt_tokens,
                    "max_sequence_length": self.max_sequence_length, "causal_window": self.causal_window}
        for name, value in positive.items():
            if value is not None and value < 1:
                raise InputError(f"{name} must be at least 1, got {value}")
        if self.fps is not None and not self.fps > 0:
            raise InputError(f"fps must be positive, got {self.fps}")
        if not self.cache_threshold >= 0:
            raise InputError(f"cache_threshold must be 0 or more (0: never skips), got {self.cache_threshold}")
        if isinstance(self.cache_max_consecutive, bool) or not isinstance(self.cache_max_consecutive, int) \
                or self.cache_max_consecutive < 0:
            raise InputError(f"cache_max_consecutive must be a whole number, 0 or more (0: no cap), got "
                             f"{self.cache_max_consecutive!r}")
        if self.cache_residual_order not in (0, 1, 2):
            raise InputError(f"cache_residual_order must be 0, 1 or 2, got {self.cache_residual_order}")
        if self.precision_policy not in PRECISION_POLICIES:
            raise InputError(f"precision_policy must be one of {', '.join(PRECISION_POLICIES)}, got "
                             f"{self.precision_policy!r}")
        for name in ("precision_first_steps", "precision_last_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise InputError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if sum(x is not None for x in (self.image, self.video, self.condition_latents)) > 1:
            raise InputError("give one of an image (image-to-video), a video or condition latents (video-to-video)")
        if self.audio is not None and self.sound:
            raise InputError("audio (a soundtrack the video follows, which is then its sound) does not combine with "
                             "sound (a soundtrack generated with the video): give one of them")
        if self.action is not None and (self.image is not None or self.video is not None):
            raise InputError("an action run takes its observation from the ActionRequest (its image or video)")
        if self.keyframes is not None:
            given = [name for name in ("image", "video", "condition_latents", "condition_frame_indexes", "action",
                                       "control_videos") if getattr(self, name) is not None]
            if given:
                raise InputError(f"keyframes set the conditioning themselves; they do not combine with {', '.join(given)} "
                                 "(a first frame is the keyframe at 0)")
        if self.chunk_frames is not None and self.chunk_frames < 1:
            raise InputError(f"chunk_frames must be at least 1, got {self.chunk_frames}")
        if self.chunk_overlap_frames is not None and self.chunk_overlap_frames < 0:
            raise InputError(f"chunk_overlap_frames must be 0 or more, got {self.chunk_overlap_frames}")
        if self.control_videos is not None:
            self._check_transfer()
        elif self.control_guidance is not None:
            raise InputError("control_guidance is a transfer option: give control_videos too")

    def _check_transfer(self) -> None:
        object.__setattr__(self, "control_videos", canonical(self.control_videos))
        others = [name for name, given in (("image", self.image is not None), ("video", self.has_video),
                                           ("action", self.action is not None), ("sound", self.sound),
                                           ("audio", self.audio is not None)) if given]
        if others:
            raise InputError(f"transfer (control_videos) does not combine with {' or '.join(others)}: the controls set "
                             "the whole clip")
        if self.output != "frames":
            raise InputError("a transfer returns frames, not latents (output='frames'): a chunked transfer decodes "
                             "every chunk to start the next one from it")
        if self.control_guidance is not None and not self.control_guidance >= 0:
            raise InputError(f"control_guidance must be 0 or more (1: no control guidance), got {self.control_guidance}")

    @property
    def sound_use(self) -> str | None:
        """What of the request needs the sound head: "audio conditioning", "sound", or None."""
        return "audio conditioning" if self.audio is not None else "sound" if self.sound else None

    @property
    def has_image(self) -> bool:
        return self.image is not None

    @property
    def has_video(self) -> bool:
        return self.video is not None or self.condition_latents is not None

    @classmethod
    def build(cls, base: "Request | None" = None, **options) -> "Request":
        """A Request from keyword options (over `base` if given; earlier names of options, `ALIASES`, taken too);
        unknown names are an error listing the valid ones."""
        for old in set(options) & set(ALIASES):
            if ALIASES[old] in options:
                raise InputError(f"{old} is {ALIASES[old]}'s earlier name: give one of them")
            options[ALIASES[old]] = options.pop(old)
        unknown = sorted(set(options) - OPTION_NAMES)
        if unknown:
            raise InputError(f"unknown generation option(s) {', '.join(unknown)}; options are "
                             f"{', '.join(sorted(OPTION_NAMES))}")
        if base is None:
            return cls(**options)
        return replace(base, **options) if options else base


    def plain(self) -> dict:
        """The options as builtin values (for another process, which imports the runtime under another name)."""
        options = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.vae_tile is not None:
            options["vae_tile"] = (self.vae_tile.size, self.vae_tile.overlap)
        if self.audio is not None:
            options["audio"] = (self.audio.waveform, self.audio.sample_rate)
        return options


OPTION_NAMES = frozenset(f.name for f in fields(Request))
ALIASES = {f.metadata["alias"]: f.name for f in fields(Request) if f.metadata["alias"]}  # earlier name -> option
HELP = {f.name: f.metadata["help"] for f in fields(Request)}


def help_of(name: str) -> str:
    """The help text of a Request field (the CLI and the ComfyUI tooltips show the same words)."""
    return HELP[name]


def _nearest(value: int) -> int:
    return min(max(SPATIAL_FACTOR, round(value / SPATIAL_FACTOR) * SPATIAL_FACTOR), MAX_SIZE)


# --- the command line's view of the same fields ----------------------------------------------------

TRI_STATE = {"auto": None, "on": True, "off": False}


def cli_flag(f) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One flag per Request field (except those marked cli=False; `only`: those named), with its help text and
    default."""
    for f in cli_fields(only):
        options = dict(f.metadata["argparse"])
        default = f.default if f.default is not MISSING else None
        if f.metadata["tri_state"]:
            options.update(choices=list(TRI_STATE), default="auto")
        elif isinstance(default, bool):
            options.update(action=argparse.BooleanOptionalAction, default=default)
        else:
            options.update(default=default, metavar=cli_flag(f)[2:].upper().replace("-", "_"))
        help_text = f.metadata["help"]
        if options["default"] is not None:
            help_text += f" [default: {options['default']}]"
        aliases = ["--" + f.metadata["alias"].replace("_", "-")] if f.metadata["alias"] else []
        parser.add_argument(cli_flag(f), *aliases, dest=f.name, help=help_text, **options)


def cli_fields(only: tuple[str, ...] | None = None) -> list:
    """The Request fields the command line sets (`only`: those named)."""
    return [f for f in fields(Request) if f.metadata["cli"] and (only is None or f.name in only)]


def options_from_args(args: argparse.Namespace, only: tuple[str, ...] | None = None) -> dict:
    """Request keyword options from parsed flags (files for image/video are read by the caller; `only`: the fields
    `add_arguments` was given)."""
    return {f.name: TRI_STATE[getattr(args, f.name)] if f.metadata["tri_state"] else getattr(args, f.name)
            for f in cli_fields(only)}
