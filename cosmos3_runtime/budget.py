"""How much memory a request needs, checked against its device before anything is allocated.

The estimate counts what one generation holds at its peak beyond the loaded weights: the fp32 sampling state, the
per-prompt text K/V caches, SeaCache's stored residuals, a long run's overlap frames and media K/V kept across
forwards (`RunGeometry.history_frames`) throughout, plus the largest
of its phases: the VAE encode of its conditioning frames (or a transfer chunk's controls), the text tower over the
prompt, the media tower over the media tokens during the steps (attention runs in memory-efficient kernels, so no
L x L score matrix; what a quantized format's layers hold at work, `WeightFormat.step_bytes`), or the VAE decode
(working sets measured on the virtual device, and the output frames). Whole runs on the virtual device at the
released shapes (a long video, a transfer with SeaCache, an FP8 run) peak within 10 % of it (tests/test_gpu_faults.py);
one it passes can still run out of memory if other programs take the device in the meantime.

What a run hands back is held in host memory as it accumulates (`Estimate.host`): its latents and, where decoded,
its frames, the whole clip of a long video or a transfer, however small each chunk is on the device. They are
checked against the host's free memory (on the CPU, together with the rest: there it is one memory), so a request
whose output cannot fit is refused at once, not after hours of chunks.
"""

import math
import os
from dataclasses import dataclass, field

import torch

from .devices import facts
from .errors import InputError
from .geometry import SPATIAL_FACTOR, RunGeometry
from .step_cache import CacheConfig

GIB = 1024**3
STATE_COPIES = 10  # fp32 latent-sized tensors alive during a step (noise, latents, velocities, UniPC history ...)
# The decode's peak working set, in decoder-width full-resolution frames (decoder_dim x H x W values): measured on the
# virtual device (tests/test_gpu_faults.py) at the released widths for 256p to 720p, in bf16 and fp32, 18.95-19.02
# (a tile of a tiled decode: 19.2). Independent of the clip's length: the decoder streams one latent frame at a time.
DECODE_PEAK_FRAMES = 19.5
# What a streamed decode (`vae.DecodeStream`) keeps between its pieces, each causal layer's last frames: 6.98 such
# frames measured on the virtual device at 832x480 in bf16.
DECODE_STATE_FRAMES = 7.0
# The encode's, in encoder-width (base_dim) full-resolution frames beside its input pixels, measured the same way:
# 12.45 for clips of 5 to 93 frames (the encoder streams four frames at a time), 3.09 for one frame.
ENCODE_PEAK_FRAMES, ENCODE_PEAK_ONE = 12.5, 3.1


# Parts held only during one phase of a run, which never overlap: the conditioning through the VAE encoder, the
# prompt through the text tower, the steps, the decode. The others (the sampling state, the text K/V, SeaCache's
# residuals, the frames a later chunk starts from) are held throughout.
PHASES = ({"VAE encode"}, {"text tower"}, {"media tower", "rotary tables"}, {"VAE decode"})
STEPS = 2  # the phase of the steps, which also holds the weight format's parts (`Estimate.weights_at_work`)


@dataclass(frozen=True)
class Estimate:
    """Bytes a request needs beyond the weights, by part: on its device (`parts`), and in host memory for its output
    (`host`); `weights_at_work` names the parts the weight format's layers hold during the steps."""

    parts: dict[str, int]
    host: dict[str, int] = field(default_factory=dict)
    weights_at_work: tuple[str, ...] = ()

    @property
    def phases(self) -> list[set[str]]:
        return [phase | set(self.weights_at_work) if i == STEPS else phase for i, phase in enumerate(PHASES)]

    @property
    def total(self) -> int:
        """The device's peak: what is held throughout, plus the largest phase."""
        phases = self.phases
        phased = set().union(*phases)
        held = sum(n for name, n in self.parts.items() if name not in phased)
        return held + max(sum(self.parts.get(name, 0) for name in phase) for phase in phases)

    @property
    def host_total(self) -> int:
        return sum(self.host.values())

    def describe(self, host: bool = False) -> str:
        """The device's peak and its parts; `host`: the output's parts too, added (one memory, on the CPU)."""
        parts = {**self.parts, **self.host} if host else self.parts
        shown = ", ".join(f"{name} {gib(n)}" for name, n in parts.items() if n >= GIB // 100)
        return f"{gib(self.total + (self.host_total if host else 0))} ({shown})"


def gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def estimate(config, vae_config, g: RunGeometry, cond_tokens: int, uncond_tokens: int, dtype: torch.dtype, tile=None,
             device: torch.device | None = None, *, decode: bool = True, frames_out: bool = False,
             encoded_frames: int = 0, weights=None, cache: CacheConfig | None = None) -> Estimate:
    """The memory of a generation of geometry `g` on `device` (None: as on a CPU); `vae_config` None: no VAE work;
    `tile` a TileSpec or None; `decode`: frames are decoded (a long video decodes every chunk); `frames_out`: the
    run hands back its frames; `encoded_frames`: the most pixel frames one encode takes (the kind's `encoded_frames`);
    `weights`: the transformer's `WeightFormat` (None: dense); `cache`: its step cache (None: off)."""
    b = torch.finfo(dtype).bits // 8
    H, I, A, K, D = (config.hidden_size, config.intermediate_size, config.num_attention_heads,
                     config.num_key_value_heads, config.head_dim)
    # a chunked run holds one chunk at a time (a transfer its controls beside it in the sequence)
    (h, w), latent_frames, controls = g.latent_size, g.window_latent_frames, g.controls
    latent = config.latent_channel * latent_frames * h * w
    p = config.latent_patch_size
    video_tokens = latent_frames * -(-h // p) * -(-w // p)
    media_tokens = video_tokens * (1 + controls)
    # Per token, beside the stack's input, a layer's input, its residual and normed input (4 H): the MLP's three
    # I-wide tensors (gate, its SiLU, their product; Edge: up, its ReLU, the square) or the attention's q, k, v and
    # output, whichever is larger (they never coexist); whole forwards on the virtual device peak within 5 % of it.
    hidden_bytes, mlp_bytes, attention_bytes = 4 * H * b, 3 * I * b, (2 * A + 4 * K) * D * b
    longest_text = max(cond_tokens, uncond_tokens)
    # The rows the media attention reads, one layer at a time: [text ; media] joined (`torch.cat`) without a history;
    # with one (a causal rollout's: the chunk's own rows among them), [text ; history] read in place where the history
    # lives on the device as it is (its slabs hold the text before it), else (CPU memory beside a GPU, fp8) through a
    # workspace the layers share (`MediaKV`). Plus a copy in the dtype attention runs in where that differs, and one
    # expanded to the query heads where SDPA needs it (`DeviceFacts.grouped_kv`).
    history = g.history_frames * (video_tokens // latent_frames + g.history_extra_rows)  # earlier forwards' K/V rows
    in_place = g.history_memory == "device" or g.history_memory == "cpu" and (device is None or device.type == "cpu")
    attended = longest_text + (history or media_tokens)
    converted = device is not None and facts(device).attention_dtype(dtype) != dtype
    expanded = 0 if device is None or facts(device).grouped_kv(dtype, D) else attended * 2 * A * D * b
    read_kv = expanded + (attended * 2 * K * D * b if converted or not history else 0)
    prompts = cond_tokens + (uncond_tokens if g.guided else 0)
    parts = {
        "latents": STATE_COPIES * latent * 4,
        "text K/V cache": config.num_hidden_layers * prompts * 2 * K * D * b,
        "text tower": longest_text * (hidden_bytes + max(mlp_bytes, attention_bytes)),
        "media tower": media_tokens * hidden_bytes + max(media_tokens * mlp_bytes,
                                                         media_tokens * attention_bytes + read_kv),
        "rotary tables": (longest_text + media_tokens) * D * (2 * b + 8),
    }
    kept = {}
    if history:  # held throughout: every layer's keys and values (fp8: a float32 scale per token and head beside)
        rows, per_value = (history, 1 + 4 / D) if g.history_memory == "fp8" else \
            (history + longest_text * in_place, b)  # the slabs hold the text before it
        kept["media K/V cache"] = int(config.num_hidden_layers * rows * 2 * K * D * per_value)
        if not in_place:
            parts["media K/V workspace"] = attended * 2 * K * D * b
    if g.history_memory != "cpu":
        parts.update(kept)
    if history and g.history_memory == "device" and device is not None and facts(device).cuda:
        # the chunk step's CUDA graph (`chunk_step`) keeps one denoising forward's activations in a pool of its own
        parts["chunk step graph"] = parts["media tower"]
    at_work = {} if weights is None else weights.step_bytes(config, media_tokens, dtype, device)
    parts.update(at_work)
    if cache is not None:  # each guidance pass keeps its last full runs' residuals (the control-free one: the video's)
        tokens = media_tokens * (1 + g.guided) + video_tokens * g.control_guided
        parts["SeaCache residuals"] = tokens * (cache.residual_order + 1) * H * b
    if g.windows > 1 and g.overlap:  # the decoded frames the next chunk starts from (float32)
        parts["overlap frames"] = 3 * g.overlap * g.height * g.width * 4
    if vae_config is not None and encoded_frames:
        peak = ENCODE_PEAK_ONE if encoded_frames == 1 else ENCODE_PEAK_FRAMES
        parts["VAE encode"] = int((peak * vae_config.base_dim + 3 * encoded_frames) * g.height * g.width * b)
    if vae_config is not None and decode:
        tile_px = tile.size * SPATIAL_FACTOR if tile is not None else None
        th, tw = (min(g.height, tile_px), min(g.width, tile_px)) if tile_px else (g.height, g.width)
        working = DECODE_PEAK_FRAMES * vae_config.decoder_dim * th * tw * b
        streamed = g.decoded_piece is not None and tile is None
        frames = g.decoded_piece if streamed else g.decoded_frames or g.window_frames
        out = 3 * frames * g.height * g.width  # as it grows, then float32 in 0..1
        decoding = int(max(working + out * b, out * (b + 2 * 4)))
        if streamed and device is not None and device.type == "cuda":  # on a second stream, beside the sampling
            parts["VAE decode beside the steps"] = decoding
        else:
            parts["VAE decode"] = decoding
            if streamed:  # its causal state, held from chunk to chunk
                parts["VAE decode state"] = int(DECODE_STATE_FRAMES * vae_config.decoder_dim * g.height * g.width * b)
    host = output(config, g, frames_out, latents_out=not controls, on_cpu=device is None or device.type == "cpu")
    return Estimate(parts, {**host, **(kept if g.history_memory == "cpu" else {})}, tuple(at_work))


def output(config, g: RunGeometry, frames_out: bool, latents_out: bool, on_cpu: bool) -> dict[str, int]:
    """What a run of geometry `g` hands back, in host memory: its latents (not a transfer's) and its frames, float32.
    A one-window run on the CPU decodes its frames where they stay, which the decode phase counts already."""
    host = {}
    if latents_out:
        host["output latents"] = config.latent_channel * g.total_latent_frames * math.prod(g.latent_size) * 4
    if frames_out and (g.windows > 1 or not on_cpu):
        host["output frames"] = g.total_frames * g.height * g.width * 3 * 4
    return host


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can still get on `device` (None when unknown)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                info = dict(line.split(":", 1) for line in f)
            return int(info["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            pages = getattr(os, "sysconf", lambda _: -1)("SC_AVPHYS_PAGES")
            return pages * os.sysconf("SC_PAGE_SIZE") if pages > 0 else None
    return None


GENERATION_ADVICE = ("lower the size or the frame count, decode tiled (vae_tile), or shorten the prompt "
                     "(check_memory=False skips this check)")


def fits(needed: Estimate, device: torch.device) -> bool:
    """Whether the estimate fits what `device` has free and its output what the host has (on the CPU, one memory)."""
    return _fits_device(needed, device) and (device.type == "cpu" or _fits_host(needed))


def _fits_device(needed: Estimate, device: torch.device) -> bool:
    available = available_bytes(device)
    return available is None or needed.total + (needed.host_total if device.type == "cpu" else 0) <= available


def _fits_host(needed: Estimate) -> bool:
    host = available_bytes(torch.device("cpu"))
    return host is None or needed.host_total <= host


def check(needed: Estimate, device: torch.device, advice: str = GENERATION_ADVICE, output_only: bool = False) -> None:
    """Refuse a request whose estimate exceeds what `device` has free, or whose output exceeds the host's free memory,
    naming the figures and what to lower. `output_only`: the output's part alone on a GPU (before a host such as
    ComfyUI has made room there: the whole check comes then); on the CPU, one memory, everything together."""
    on_cpu = device.type == "cpu"
    if (on_cpu or not output_only) and not _fits_device(needed, device):
        available = available_bytes(device)
        raise InputError(f"this request needs at least {needed.describe(host=on_cpu)} on {device}, which has "
                         f"{gib(available)} free; {advice}")
    if on_cpu:
        return
    host = available_bytes(torch.device("cpu"))
    if host is not None and needed.host_total > host:
        shown = ", ".join(f"{name} {gib(n)}" for name, n in needed.host.items())
        raise InputError(f"this request's output needs {gib(needed.host_total)} of host memory ({shown}), and the "
                         f"host has {gib(host)} free; {advice}")


def prompt_too_long(which: str, tokens, limit: int) -> InputError:
    return InputError(
        f"the {which} has {tokens} tokens, more than max_prompt_tokens {limit}; shorten it or raise "
        "max_prompt_tokens (official JSON captions are 1,600-2,900 tokens; text-tower memory and time grow with it)"
    )
