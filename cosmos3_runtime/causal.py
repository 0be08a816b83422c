"""Causal rollouts: NVIDIA's causal Cosmos3 checkpoints (Cosmos3-Nano-Sim-Transfer, Cosmos3-Nano-Sim-Bimanual) make a
clip chunk by chunk, each chunk denoised in a few fixed steps against the K/V of every frame committed before it, so a
clip can run for minutes at a constant cost per chunk.

Sim-Bimanual is conditioned on robot actions instead of a control clip: the first image is encoded into latent frame
0 and committed clean with four null action tokens (their values zeroed in every layer, their keys kept); each later
latent frame f is denoised and committed beside its four actions, rows [(f-1)*4, f*4) of the table, normalized by the
checkpoint's contract (`Embodiment`) and zero-padded to the action head's width. Action tokens are clean conditions:
no time embedding, no output; the last one of a frame sits at the frame's own temporal position.

Per chunk of latent frames ([1, C, C, ...]: latent 0 alone, then C at a time):
1. its control frames (Sim-Transfer's edge, blur, depth or segmentation clip, VAE-encoded) are committed clean in one
   forward: no time embedding, at the chunk's own temporal positions (control and RGB frames share them), their K/V
   appended to the history;
2. its RGB frames are denoised in the checkpoint's fixed SDE steps (σ·1000 timesteps, x0 = x − σ·v, then re-noised
   to the next σ), each forward attending to [text | history | itself], the history read, never written;
3. the denoised frames are committed one by one in order (each sees the history, the earlier frames of its chunk and
   itself), clean: a second forward, not the last step's K/V (those belong to noisy inputs).
Before each chunk the history keeps `sink` frames and the latest ones a `window` leaves room for (positions stay
absolute); a checkpoint that never evicts keeps all. `mode="recompute"` runs every denoising forward over the whole
clip so far instead, under the mask that reproduces what each frame saw: slower, for tests and doubters.

What the references differ on, and what this follows: the per-step noise seed (`seed_framework`, NVIDIA's framework's
newest formula; `seed_sglang`, SGLang's and the framework's older one, is one switch away); the clip is trimmed to
whole chunks, as SGLang does (the framework refuses other lengths); the whole clip is decoded at the end.
"""

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import CheckpointError, InputError
from .geometry import TEMPORAL_FACTOR, latent_frames, pixel_frames

log = logging.getLogger(__name__)

BLOCKS = ("cosmos3_nano_sim_bimanual", "cosmos_dreams")  # the causal block's key in transformer/config.json (new, old)
SIM_AUTO = ("cosmos3_nano_sim_auto", "Cosmos3NanoSimAutoPipeline", "cosmos3_multiview")
HINTS = ("edge", "blur", "depth", "seg")
TRAINED_HORIZON = 151  # latent frames of the chunkwise Sim-Transfer recipe (601 pixel frames)
DEFAULT_T_LIST = (1.0, 0.9375, 0.8333, 0.625)
# The trained 480p canvases, (width, height), by aspect ratio.
CANVASES = ((832, 480), (736, 544), (640, 640), (544, 736), (480, 832))
EMPHASIS = (" Follow the {hint} control video precisely: shape, contour, silhouette, position, and motion of every "
            "visible structure must align with the {hint} signal at every frame.")


ACTION_TOKENS = 4  # action rows per latent frame: one per pixel frame it covers
ACTION_SIGMAS = 2  # Sim-Bimanual's default steps a chunk: t_list[0] and t_list[2] ("step42", NVIDIA's pinned deploy)


@dataclass(frozen=True)
class Embodiment:
    """One robot (or camera) a Sim-Bimanual checkpoint takes actions for, from its action contract: raw actions
    [n, width] map to the model's space as (a - offset) / scale (then asinh(.) / asinh(1) for "asinh" transforms)."""

    name: str
    domain_id: int
    width: int
    offset: tuple[float, ...]
    scale: tuple[float, ...]
    transform: str = "affine"  # or "asinh"

    def check(self, actions) -> torch.Tensor:
        """Raw actions as a float32 CPU table [n, width], or a refusal naming what is wrong with them."""
        a = torch.as_tensor(actions, dtype=torch.float32).cpu()
        if a.ndim != 2 or a.shape[1] != self.width:
            raise InputError(f"actions for {self.name} must be [n, {self.width}] (one row per frame), got {list(a.shape)}")
        if not torch.isfinite(a).all():
            raise InputError(f"actions for {self.name} hold NaN or infinite values (row "
                             f"{int((~torch.isfinite(a)).any(1).nonzero()[0])}); give finite numbers")
        return a

    def normalize(self, actions, model_width: int) -> torch.Tensor:
        """Raw actions [n, width] -> the model's [n, model_width] float32, zero-padded after normalizing."""
        n = (self.check(actions) - torch.tensor(self.offset)) / torch.tensor(self.scale)
        if self.transform == "asinh":
            n = torch.asinh(n) / torch.asinh(torch.tensor(1.0))
        return F.pad(n, (0, model_width - self.width))


def read_contract(conditioning: dict, source: str) -> tuple[tuple[Embodiment, ...], str, int]:
    """(embodiments, the default one's name, the model's action width) of a Sim-Bimanual action contract."""
    tokens = int(conditioning.get("action_tokens_per_frame", ACTION_TOKENS))
    if tokens != ACTION_TOKENS:
        raise CheckpointError(f"{source}: action_tokens_per_frame {tokens}; the pack runs {ACTION_TOKENS} (one per "
                              "pixel frame of a latent frame)")
    embodiments = []
    for name, entry in (conditioning.get("embodiments") or {}).items():
        transform = (entry.get("normalizer") or {}).get("transform") or {}
        kind = transform.get("type", "affine")
        width = int(entry["raw_action_dim"])
        offset, scale = transform.get("offset"), transform.get("scale")
        if kind not in ("affine", "asinh") or offset is None or scale is None or len(offset) != width or \
                len(scale) != width or any(float(v) == 0 for v in scale):
            raise CheckpointError(f"{source}: embodiment {name!r} has no usable normalizer (an affine or asinh "
                                  f"transform with {width} offsets and non-zero scales)")
        embodiments.append(Embodiment(name, int(entry["domain_id"]), width, tuple(map(float, offset)),
                                      tuple(map(float, scale)), kind))
    if not embodiments:
        raise CheckpointError(f"{source}: the action contract lists no embodiments")
    width, domains = int(conditioning.get("model_action_dim", 64)), int(conditioning.get("num_embodiment_domains", 32))
    for e in embodiments:
        if e.width > width or not 0 <= e.domain_id < domains:
            raise CheckpointError(f"{source}: embodiment {e.name!r} ({e.width} values, domain {e.domain_id}) does not "
                                  f"fit the action head ({width} values, {domains} domains)")
    default = conditioning.get("default_embodiment") or embodiments[0].name
    return tuple(embodiments), default, width


@dataclass(frozen=True)
class CausalConfig:
    """A causal checkpoint's rollout, from its transformer config's causal block."""

    chunk_size: int  # latent frames per chunk after the first (1: framewise)
    window_frames: int | None  # latent frames of history a chunk attends to, sinks and itself included (None: all)
    sink_frames: int
    t_list: tuple[float, ...]  # the fixed sigmas, shift applied
    hints: tuple[str, ...]  # the controls it takes (Sim-Transfer); () for none
    emphasize_control: bool  # the control sentence is added to the prompt by default
    source: str
    embodiments: tuple[Embodiment, ...] = ()  # Sim-Bimanual's action contract; () for a control-video checkpoint
    default_embodiment: str | None = None
    action_width: int = 0  # the action head's input width (actions are zero-padded to it)
    text_max_tokens: int | None = None  # the text cache's length (Sim-Bimanual: 512)

    @property
    def takes_actions(self) -> bool:
        return bool(self.embodiments)

    def sigmas(self, steps: int | None = None) -> tuple[float, ...]:
        """The sigmas each chunk walks: the whole t_list, or for Sim-Bimanual by default (`steps` None or
        `ACTION_SIGMAS`) t_list[0] and t_list[2] ("step42")."""
        if not self.takes_actions or len(self.t_list) < 3 or (steps or ACTION_SIGMAS) == len(self.t_list):
            return self.t_list
        return self.t_list[0], self.t_list[2]

    def embodiment(self, name: str | None) -> Embodiment:
        """The embodiment `name` (None: the contract's default); others are refused with the list."""
        name = self.default_embodiment if name is None else name
        for e in self.embodiments:
            if e.name == name:
                return e
        known = ", ".join(f"{e.name} ({e.width} values)" for e in self.embodiments)
        raise InputError(f"this Sim-Bimanual checkpoint takes actions for {known}; domain {name!r} is not one of them")

    def describe(self) -> str:
        history = "all history" if self.window_frames is None else \
            f"window {self.window_frames}, sink {self.sink_frames}"
        conditions = (f"actions for {', '.join(e.name for e in self.embodiments)}" if self.takes_actions else
                      f"controls {', '.join(self.hints)}")
        return (f"causal rollout: chunks of {self.chunk_size} latent frame{'s' * (self.chunk_size > 1)}, {history}, "
                f"{len(self.t_list)} SDE steps, {conditions}")


def read_config(transformer_raw: dict, pipeline_class: str, source: str) -> CausalConfig | None:
    """The causal block of a transformer config (None: not a causal checkpoint); what the pack cannot run is refused
    by name."""
    if pipeline_class in SIM_AUTO or transformer_raw.get("backbone_type") in SIM_AUTO or SIM_AUTO[0] in transformer_raw:
        raise CheckpointError(f"{source}: Cosmos3-Nano-Sim-Auto (multiview driving with LiDAR) is not supported yet; "
                              "the pack runs Cosmos3-Nano-Sim-Transfer")
    key = next((k for k in BLOCKS if isinstance(transformer_raw.get(k), dict)), None)
    if key is None:
        return None
    block = transformer_raw[key]
    conditioning = block.get("conditioning") or {}
    mode = conditioning.get("mode", "action" if "embodiments" in conditioning or transformer_raw.get("action_gen")
                            else "control_video")
    if mode not in ("control_video", "action"):
        raise CheckpointError(f"{source}: a causal checkpoint conditioned on {mode!r} is not supported; the pack runs "
                              "Cosmos3-Nano-Sim-Transfer (control_video) and Cosmos3-Nano-Sim-Bimanual (action)")
    if mode == "action" and key != BLOCKS[0]:
        raise CheckpointError(f"{source}: legacy Cosmos-Dreams metadata ({key!r}) for an action checkpoint; "
                              f"re-export it with its {BLOCKS[0]!r} block (Cosmos3-Nano-Sim-Bimanual), as vLLM-Omni asks")
    sampler = block.get("fixed_step_sampler_config") or {}
    if sampler.get("sample_type", "sde") != "sde":
        raise CheckpointError(f"{source}: sampler {sampler.get('sample_type')!r} in {key}; only 'sde' is known")
    actions = read_contract(conditioning, f"{source} [{key}]") if mode == "action" else ((), None, 0)
    hints = () if mode == "action" else tuple(conditioning.get("hints") or HINTS)
    unknown = [h for h in hints if h not in HINTS]
    if unknown:
        raise CheckpointError(f"{source}: control hints {unknown} in {key}; known: {', '.join(HINTS)}")
    chunk = int(block.get("chunk_size", 4))
    window = block.get("window_frames")
    if conditioning.get("no_eviction", False) or (mode == "control_video" and chunk > 1):  # chunkwise Sim-Transfer
        window = None  # keeps every frame
    sink = int(block.get("sink_frames", 0) or 0)
    if chunk < 1 or (window is not None and int(window) < sink + chunk + 1):
        raise CheckpointError(f"{source}: chunk_size {chunk}, window_frames {window}, sink_frames {sink} in {key} "
                              "leave no room for history")
    return CausalConfig(chunk, None if window is None else int(window), sink,
                        tuple(float(t) for t in sampler.get("t_list", DEFAULT_T_LIST)), hints,
                        bool(conditioning.get("emphasize_control_in_prompt", mode == "control_video")),
                        f"{source} [{key}]", *actions,
                        int(block["text_cache_max_len"]) if mode == "action" and "text_cache_max_len" in block else None)


def chunk_ranges(latents: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) latent frames of each chunk: latent 0 alone, then `chunk` at a time (the last may be short)."""
    return [(0, 1)] + [(s, min(s + chunk, latents)) for s in range(1, latents, chunk)]


def whole_chunks(pixel: int, chunk: int) -> int:
    """The most pixel frames, at most `pixel`, that fill whole chunks (1 + 4·chunk·k)."""
    return pixel_frames(1 + (latent_frames(pixel) - 1) // chunk * chunk)


def seed_framework(seed: int, chunk_start: int, block: int, step: int | None) -> int:
    """NVIDIA's framework: a chunk's first noise from seed + its start frame; step k's re-noising from
    seed + start·1 000 003 + (k + 1)·9 176 (its newest code starts at one: step 0's seed would repeat frame 0's)."""
    return seed + chunk_start if step is None else seed + chunk_start * 1_000_003 + (step + 1) * 9_176


def seed_sglang(seed: int, chunk_start: int, block: int, step: int | None) -> int:
    """SGLang's (and the framework's older) seeds: the step term is k·9 176."""
    return seed + chunk_start if step is None else seed + chunk_start * 1_000_003 + step * 9_176


def seed_comfyui(seed: int, chunk_start: int, block: int, step: int | None) -> int:
    """ComfyUI's SamplerARVideo (`sample_ar_video`): step k of block b re-noises from seed + b·1 000 + k, its blocks
    the chunks the rollout denoises, counted from 0 (a framewise Sim-Transfer's start at latent frame 0; Sim-Bimanual's
    after frame 0, the image the sampler is given); the first noise is the clip's, drawn once from the seed as
    ComfyUI's noise nodes draw it (`CLIP_NOISE`), each chunk its frames of it."""
    return seed if step is None else seed + block * 1000 + step


SEEDS = {"framework": seed_framework, "sglang": seed_sglang, "comfyui": seed_comfyui}
CLIP_NOISE = {"comfyui"}  # formulas whose chunks start from their frames of one noise over the clip


def canvas_for(height: int, width: int) -> tuple[int, int]:
    """The trained 480p canvas (width, height) nearest a clip's aspect ratio."""
    return min(CANVASES, key=lambda c: abs(math.log(c[0] / c[1]) - math.log(width / height)))


def prompt_text(caption: str, hint: str | None, emphasize: bool, frames: int, fps: float, height: int,
                width: int) -> str:
    """The prompt as the checkpoint was trained on it: the caption, the control sentence (`emphasize`), then the
    duration and resolution sentences."""
    text = caption.strip()
    if emphasize and hint is not None:
        text = text.rstrip() + EMPHASIS.format(hint=hint)
    rate = max(1, int(round(fps)))
    for sentence in (f"The video is {frames / rate:.1f} seconds long and is of {rate} FPS.",
                     f"This video is of {height}x{width} resolution."):
        text = text.rstrip(".") + ". " + sentence if text else sentence
    return text


@dataclass(frozen=True)
class Rollout:
    """A resolved causal request: its chunks, what history each keeps and how it samples."""

    config: CausalConfig
    hint: str | None  # the control (Sim-Transfer), None without
    chunks: tuple[tuple[int, int], ...]  # latent [start, end) of each chunk
    window_frames: int | None  # history window in latent frames (None: all)
    sink_frames: int
    mode: str = "kv"  # "kv": the rolling K/V cache; "recompute": every forward over the whole clip so far
    seeds: str = "framework"  # the per-step noise seeds (`SEEDS`)
    history: str = "device"  # how the K/V history is kept: "device", "cpu" (each layer's brought as it runs), "fp8"
    emphasize: bool = False  # the control sentence goes into the prompt
    embodiment: Embodiment | None = None  # Sim-Bimanual: whose actions condition the frames (latent 0: the image)
    attention: str = "full"  # the media attention's inputs: "full", or "fp8" (`causal_run.fp8_attention`)

    @property
    def latent_frames(self) -> int:
        return self.chunks[-1][1] if self.chunks else 0  # (none yet: a session before its first tick)

    @property
    def chunk_pixels(self) -> int:
        """Pixel frames of the longest chunk."""
        return TEMPORAL_FACTOR * max(end - start for start, end in self.chunks)

    def recent(self, start: int) -> int:
        """How many of the latest frames of history the chunk starting at `start` keeps beside the sinks. Sim-Transfer's
        window holds the sinks, those and the chunk itself; Sim-Bimanual's holds history only (vLLM-Omni's
        append_dense_kv_history keeps the last window_frames frames, the chunk attends to them and itself)."""
        chunk = 0 if self.embodiment is not None else next(end - s for s, end in self.chunks if s == start)
        return start if self.window_frames is None else max(self.window_frames - self.sink_frames - chunk, 0)

    def kept(self, start: int) -> list[int]:
        """The latent frames of history the chunk starting at `start` attends to."""
        earlier, recent = list(range(start)), self.recent(start)
        return sorted(set(earlier[: self.sink_frames]) | set(earlier[max(len(earlier) - recent, 0) :] if recent else []))

    def history_frames(self) -> int:
        """The most latent frames of K/V held at once (control and RGB frames counted apart)."""
        pairs = 2 if self.hint is not None else 1
        return pairs * max(len(self.kept(start)) + end - start for start, end in self.chunks)

    @property
    def action_tokens(self) -> int:
        """Rows of K/V a latent frame holds beside its vision tokens (its action tokens)."""
        return ACTION_TOKENS if self.embodiment is not None else 0


def action_rows(start: int, end: int) -> tuple[int, int]:
    """The action table's rows [first, last) that condition latent frames [start, end) (start >= 1)."""
    return (start - 1) * ACTION_TOKENS, (end - 1) * ACTION_TOKENS


def visibility(plan: Rollout, end: int, controls: bool) -> torch.Tensor:
    """Which latent frames saw which in a rollout up to latent frame `end` (the last chunk's being denoised), as bool
    [n, n] over the frames [controls 0..end ; RGB 0..end] (no control rows without controls): what a single forward
    over them needs as its mask to equal the rolling K/V cache. Each chunk sees the history it kept (`kept`); its
    control frames see each other; its RGB frames see its control frames, and the earlier ones of their chunk and
    themselves once committed, each other while being denoised."""
    chunk_of = torch.zeros(end, dtype=torch.long)
    for k, (start, stop) in enumerate(plan.chunks):
        chunk_of[start:min(stop, end)] = k
    starts = [start for start, _ in plan.chunks]
    kept = torch.zeros(end, end, dtype=torch.bool)  # kept[f, g]: f's chunk attended to g's frame of history
    for f in range(end):
        kept[f, plan.kept(starts[chunk_of[f]])] = True
    frame = torch.arange(end)
    same = chunk_of[:, None] == chunk_of[None, :]
    current = chunk_of == chunk_of[end - 1]  # the chunk being denoised
    rgb_rgb = kept | same & ((frame[None, :] <= frame[:, None]) | current[:, None])
    if not controls:
        return rgb_rgb
    ctrl_ctrl = kept | same
    ctrl_rgb = kept  # a control chunk is committed before its RGB frames exist
    rgb_ctrl = kept | same
    return torch.cat([torch.cat([ctrl_ctrl, ctrl_rgb], 1), torch.cat([rgb_ctrl, rgb_rgb], 1)], 0)
