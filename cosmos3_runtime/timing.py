"""How long a generation will take on this machine, roughly, before anything is loaded.

The FLOPs of one transformer forward and of the VAE decode are counted on the meta device from the checkpoint's
configs (`torch.utils.flop_counter`: shapes only, no weight read, well under a second at released sizes), then
divided by the rate this device reaches on a matmul and on a 3-D convolution, measured in a fraction of a second.
Real runs add what the count leaves out (elementwise work, memory traffic, Python), so the figure is a floor: the
command line and the Python API's progress bar say it before a CPU run, where a default request can take hours.
"""

import time
from dataclasses import dataclass
from functools import cache

import torch
from torch.utils.flop_counter import FlopCounterMode

from .geometry import RunGeometry
from .transformer import VIDEO, Cosmos3Transformer, Segment, TextKV
from .vae import WanVAE

META = torch.device("meta")


@dataclass(frozen=True)
class Timing:
    forward_flops: float  # one transformer forward (one guidance pass)
    forwards: int  # every pass of every step (of every chunk)
    decode_flops: float  # the whole VAE decode (0: latents only)
    seconds: float

    def describe(self) -> str:
        decode = f", VAE decode {self.decode_flops / 1e12:.3g} TFLOP" if self.decode_flops else ""
        return (f"about {duration(self.seconds)} at this device's measured matmul and convolution speed "
                f"({self.forwards} transformer forwards of {self.forward_flops / 1e12:.3g} TFLOP{decode})")


QUICK_LOOK = {"num_frames": 17, "width": 256, "height": 256, "steps": 8}  # a request a CPU makes in about a minute


def note(t: Timing, spell) -> str:
    """What a run says before it starts on the CPU: how long it takes, and past 10 minutes a quicker request to try
    first, `spell(QUICK_LOOK)` writing its options in the words of the interface that was used."""
    return f"on the CPU this takes {t.describe()}" + (f"; {spell(QUICK_LOOK)} is a quick look" if t.seconds > 600
                                                        else "")


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def generation(transformer_config, vae_config, g: RunGeometry, steps: int, cond_tokens: int, decode: bool,
               dtype: torch.dtype, device: torch.device) -> Timing:
    """The estimate of a run of geometry `g` and `steps` steps per window (a chunked run counts its chunks, a transfer
    its controls)."""
    latent_frames, (h, w), chunks = g.window_latent_frames, g.latent_size, g.windows
    forward = forward_flops(transformer_config, (latent_frames, h, w), cond_tokens, g.controls, dtype)
    forwards = steps * g.passes * chunks
    decoded = chunks * decode_flops(vae_config, latent_frames, h, w, dtype) if decode and vae_config else 0.0
    matmul, convolution = rates(device, dtype, vae_config.decoder_dim if vae_config else 32)
    return Timing(forward, forwards, decoded, forwards * forward / matmul + decoded / convolution)


def forward_flops(config, grid: tuple[int, int, int], text_tokens: int, contexts: int, dtype: torch.dtype) -> float:
    with torch.device(META):
        model = Cosmos3Transformer(config).to(dtype)
    kv = [torch.empty(text_tokens, config.num_key_value_heads, config.head_dim, device=META, dtype=dtype)] * len(
        model.layers)
    latents = torch.empty(1, config.latent_channel, *grid, device=META)
    controls = [Segment(VIDEO, latents, [])] * contexts
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(latents, torch.tensor(900), TextKV(text_tokens, kv, kv), context=controls)
    return float(counter.get_total_flops())


def decode_flops(vae_config, latent_frames: int, h: int, w: int, dtype: torch.dtype) -> float:
    """The decode of the first latent frame (one output frame), plus each later one (four) as the second costs."""
    with torch.device(META):
        vae = WanVAE(vae_config).to(dtype)
    counts = []
    for frames in (1, 2):
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            vae.decode(torch.empty(1, vae_config.z_dim, frames, h, w, device=META))
        counts.append(counter.get_total_flops())
    return float(counts[0] + (latent_frames - 1) * (counts[1] - counts[0]))


@cache
def rates(device: torch.device, dtype: torch.dtype, channels: int = 32) -> tuple[float, float]:
    """FLOP/s this device reaches on a 1024-wide matmul and on a 3x3x3 convolution of the VAE decoder's width (each
    timed for about 0.1 s; narrow convolutions run far below a CPU's matmul speed)."""
    a = torch.randn(1024, 1024, device=device).to(dtype)
    side = max(16, min(96, int(3_000_000 / channels**2) // 16 * 16))  # about the same work whatever the width
    x = torch.randn(1, channels, 6, side, side, device=device).to(dtype)
    kernel = torch.randn(channels, channels, 3, 3, 3, device=device).to(dtype)
    matmul = timed(lambda: a @ a, 2 * 1024**3, device)
    outputs = 4 * (side - 2) ** 2
    convolution = timed(lambda: torch.nn.functional.conv3d(x, kernel), 2 * channels**2 * 27 * outputs, device)
    return matmul, convolution


def timed(work, flops: float, device: torch.device, budget: float = 0.1) -> float:
    work()  # warm-up
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget:
        work()
        runs += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return flops * runs / (time.perf_counter() - start)
