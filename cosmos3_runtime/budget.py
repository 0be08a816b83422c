"""How much memory a request needs, checked against its device before anything is allocated.

The estimate counts what one generation holds at its peak beyond the loaded weights: the fp32
sampling state and the per-prompt text K/V caches throughout, plus the largest of its phases: the text
tower over the prompt, the media tower over the media tokens during the steps (attention runs in
memory-efficient kernels, so no L x L score matrix), or the VAE decode (its working set, measured on the
virtual device, and the output frames). It is a lower bound of the real peak, so a request it refuses cannot run; one it passes
can still run out of memory if other programs take the device in the meantime.
"""

import os
from dataclasses import dataclass

import torch

from .devices import facts
from .errors import InputError
from .geometry import SPATIAL_FACTOR, latent_frames as chunk_latent_frames

GIB = 1024**3
STATE_COPIES = 10  # fp32 latent-sized tensors alive during a step (noise, latents, velocities, UniPC history ...)
# The decode's peak working set, in decoder-width full-resolution frames (decoder_dim x H x W values): measured on the
# virtual device (tests/test_gpu_faults.py) at the released widths for 256p to 720p, in bf16 and fp32, 18.95-19.02
# (a tile of a tiled decode: 19.2). Independent of the clip's length: the decoder streams one latent frame at a time.
DECODE_PEAK_FRAMES = 19.5


# Parts held only during one phase of a run, which never overlap: the prompt through the text tower, the steps, the
# decode. The others (the sampling state, the text K/V) are held throughout.
PHASES = ({"text tower"}, {"media tower", "rotary tables", "control window"}, {"VAE decode", "decoded frames"})


@dataclass(frozen=True)
class Estimate:
    """Bytes a request needs, by part (beyond the weights)."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        """The peak: what is held throughout, plus the largest phase."""
        phased = set().union(*PHASES)
        held = sum(n for name, n in self.parts.items() if name not in phased)
        return held + max(sum(self.parts.get(name, 0) for name in phase) for phase in PHASES)

    def describe(self) -> str:
        shown = ", ".join(f"{name} {gib(n)}" for name, n in self.parts.items() if n >= GIB // 100)
        return f"{gib(self.total)} ({shown})"


def gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def estimate(config, vae_config, s, cond_tokens: int, uncond_tokens: int, dtype: torch.dtype, tile=None,
             device: torch.device | None = None) -> Estimate:
    """The memory of a generation under settings `s` on `device` (None: as on a CPU); `vae_config` None: no decode;
    `tile` a TileSpec or None."""
    b = torch.finfo(dtype).bits // 8
    H, I, A, K, D = (config.hidden_size, config.intermediate_size, config.num_attention_heads,
                     config.num_key_value_heads, config.head_dim)
    h, w = s.height // SPATIAL_FACTOR, s.width // SPATIAL_FACTOR
    chunks = s.chunks  # a chunked run holds one chunk at a time (a transfer its controls beside it in the sequence)
    latent_frames = s.latent_frames if chunks is None else chunk_latent_frames(chunks.chunk)
    controls = 0 if s.transfer is None else len(s.transfer.hints)
    latent = config.latent_channel * latent_frames * h * w
    p = config.latent_patch_size
    media_tokens = latent_frames * -(-h // p) * -(-w // p) * (1 + controls)
    mlp_width = I * (3 if config.hidden_act == "silu" else 2)  # gate, up and product / up and its square
    per_token = (3 * H + mlp_width + (2 * A + 4 * K) * D) * b  # hidden, residual, normed; MLP; q, k, v, out
    longest_text = max(cond_tokens, uncond_tokens)
    # the media attention's keys and values: grouped, plus a copy expanded to the query heads where SDPA needs it
    kv_heads = K if device is None or facts(device).grouped_kv(dtype, D) else K + A
    prompts = cond_tokens + (uncond_tokens if s.guidance_scale != 1.0 else 0)
    parts = {
        "latents": STATE_COPIES * latent * 4,
        "text K/V cache": config.num_hidden_layers * prompts * 2 * K * D * b,
        "text tower": longest_text * per_token,
        "media tower": media_tokens * per_token + (longest_text + media_tokens) * 2 * kv_heads * D * b,
        "rotary tables": (longest_text + media_tokens) * D * (2 * b + 8),
    }
    if controls:  # a control's pixels for one chunk, on the device while it is encoded
        parts["control window"] = 3 * chunks.chunk * s.height * s.width * b
    if vae_config is not None:
        tile_px = tile.size * SPATIAL_FACTOR if tile is not None else None
        th, tw = (min(s.height, tile_px), min(s.width, tile_px)) if tile_px else (s.height, s.width)
        parts["VAE decode"] = int(DECODE_PEAK_FRAMES * vae_config.decoder_dim * th * tw * b)
        frames = s.num_frames if chunks is None else chunks.chunk  # each decoded chunk goes to the CPU
        parts["decoded frames"] = 3 * frames * s.height * s.width * (b + 2 * 4)  # the decode's output, two fp32 copies
    return Estimate(parts)


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


def check(needed: Estimate, device: torch.device, advice: str = GENERATION_ADVICE) -> None:
    """Refuse a request whose estimate exceeds what `device` has free, naming the figures and what to lower."""
    available = available_bytes(device)
    if available is None or needed.total <= available:
        return
    raise InputError(f"this request needs at least {needed.describe()} on {device}, which has {gib(available)} free; "
                     f"{advice}")


def prompt_too_long(which: str, tokens, limit: int) -> InputError:
    return InputError(
        f"the {which} has {tokens} tokens, more than max_prompt_tokens {limit}; shorten it or raise "
        "max_prompt_tokens (official JSON captions are 1,600-2,900 tokens; text-tower memory and time grow with it)"
    )
