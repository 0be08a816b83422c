"""bf16 against fp32 for the decoders at their released widths: the Wan 2.2 VAE and the sound tokenizer.

    python benchmarks/bench_precision.py            # CPU, about two minutes

Random weights in the released shapes (VAE: base_dim 160, decoder 256, 705 M parameters; sound tokenizer: decoder
320 wide, channel multipliers up to 16, 473 M parameters), rounded to bf16 as the released files hold them, so only
the arithmetic differs. Figures: PSNR of the decoded frames (0..1) and of the encoder's latents' relative error;
SNR of the decoded waveform. Each variant against the fp32 decode of the same weights, from the same run. Not a test.
"""

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cosmos3_runtime.sound import Snake, SoundConfig, SoundTokenizer  # noqa: E402
from cosmos3_runtime.tiny import vae_config  # noqa: E402
from cosmos3_runtime.vae import VAEConfig, WanVAE  # noqa: E402

BF16 = torch.bfloat16


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return 10 * math.log10(1.0 / (a - b).pow(2).mean().item())


def snr(reference: torch.Tensor, x: torch.Tensor) -> float:
    return 10 * math.log10(reference.pow(2).sum().item() / (reference - x).pow(2).sum().item())


def pixels(decoded: torch.Tensor) -> torch.Tensor:
    return (decoded.float() / 2 + 0.5).clamp(0, 1)


def copy_in(model: torch.nn.Module, dtype: torch.dtype, weights: dict) -> torch.nn.Module:
    model = model.to(dtype)
    model.load_state_dict(weights)
    return model


@torch.no_grad()
def vae() -> None:
    config = VAEConfig.from_dict(vae_config(base_dim=160, decoder_base_dim=256))
    torch.manual_seed(0)
    fp32 = WanVAE(config)
    g = torch.Generator().manual_seed(0)
    for name, p in fp32.named_parameters():
        if name.endswith("gamma"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    fp32 = fp32.to(BF16).float()  # the weights as released: bf16 values
    bf16 = copy_in(WanVAE(config), BF16, fp32.state_dict())
    z = torch.randn(1, 48, 3, 8, 8, generator=g)  # 9 frames of 128x128
    start = time.perf_counter()
    reference = pixels(fp32.decode(fp32.denormalize(z)))
    seconds = time.perf_counter() - start
    print(f"VAE, {sum(p.numel() for p in fp32.parameters()) / 1e6:.0f} M parameters, 9 frames of 128x128 "
          f"(fp32 decode {seconds:.1f} s on this CPU)")
    print("| variant | decoded frames PSNR against fp32 |")
    print("|---|---|")
    print(f"| bf16 VAE (statistics in fp32, as loaded) | {psnr(pixels(bf16.decode(bf16.denormalize(z))), reference):.1f} dB |")
    low_stats = (z.to(BF16) / (1 / torch.tensor(config.latents_std, dtype=BF16)).view(1, -1, 1, 1, 1)
                 + torch.tensor(config.latents_mean, dtype=BF16).view(1, -1, 1, 1, 1))
    print(f"| bf16 VAE, statistics in bf16 (diffusers) | {psnr(pixels(bf16.decode(low_stats)), reference):.1f} dB |")
    frames = torch.rand(1, 3, 9, 128, 128, generator=g) * 2 - 1
    exact = fp32.normalize(fp32.encode(frames))
    low = bf16.normalize(bf16.encode(frames.to(BF16)))
    print(f"\nVAE encode, bf16 against fp32: relative mean error of the latents "
          f"{((low - exact).abs().mean() / exact.abs().mean()).item():.4f}")


@torch.no_grad()
def sound() -> None:
    g = torch.Generator().manual_seed(0)
    fp32 = SoundTokenizer(SoundConfig(), with_encoder=False)
    for name, p in fp32.named_parameters():  # as the tiny checkpoints draw them, at full width
        value = torch.randn(p.shape, generator=g)
        if name.endswith(("alpha", "beta", "bias")):
            value = 0.1 * value
        elif name.endswith("weight_g"):
            value = 0.4 + 0.05 * value.abs()
        p.copy_(value.to(BF16).float())
    bf16 = copy_in(SoundTokenizer(SoundConfig(), with_encoder=False), BF16, fp32.state_dict())
    z = torch.randn(64, 25, generator=g)  # one second
    start = time.perf_counter()
    reference = fp32.decode(z)
    seconds = time.perf_counter() - start
    print(f"\nSound tokenizer decoder, {sum(p.numel() for p in fp32.parameters()) / 1e6:.0f} M parameters, one second at "
          f"48 kHz (fp32 decode {seconds:.1f} s on this CPU)")
    print("| variant | waveform SNR against fp32 |")
    print("|---|---|")
    print(f"| bf16 | {snr(reference, bf16.decode(z).float()):.1f} dB |")
    original = Snake.forward
    Snake.forward = lambda self, x: original(self, x.float()).to(x.dtype)
    try:
        print(f"| bf16, Snake activations in fp32 | {snr(reference, bf16.decode(z).float()):.1f} dB |")
    finally:
        Snake.forward = original
    print("| fp32 (the runtime's default under any model dtype) | exact |")


if __name__ == "__main__":
    torch.manual_seed(0)
    vae()
    sound()
