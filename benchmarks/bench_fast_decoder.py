"""The fast decoder (the Wan 2.2 tiny autoencoder's, `cosmos3_runtime.tiny_decoder`) against the VAE's decoder: time
and peak memory of decoding the same latents, each in a fresh process, and the ratio. Both have random weights at
their published widths (the VAE's decoder at Wan 2.2's released 256, the tiny one at TAEHV's 256/128/64/64), so the
times are those of the real architectures and the frames mean nothing. Not a test.

    python benchmarks/bench_fast_decoder.py [--width 832 --height 480 --latent-frames 2] [--decoder-dim 256]
"""

import argparse

from measure import run_child

CHILD = r"""
import json, time, torch
torch.set_grad_enabled(False)
torch.manual_seed(0)
z = torch.randn(1, 48, {latent_frames}, {h}, {w}, generator=torch.Generator().manual_seed(1))
if {which!r} == "fast":
    from cosmos3_runtime.tiny_decoder import TinyDecoder
    decode = TinyDecoder((256, 128, 64, 64), "normalized").eval().decode
else:
    from cosmos3_runtime.tiny import vae_config
    from cosmos3_runtime.vae import VAEConfig, WanVAE
    decode = WanVAE(VAEConfig.from_dict(vae_config(base_dim=16, decoder_base_dim={decoder_dim}))).eval().decode
memory = PeakMemory()
start = time.perf_counter()
frames = decode(z).shape[2]
print(json.dumps(dict(seconds=time.perf_counter() - start, peak_mb=memory.mb(), frames=frames)))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--latent-frames", type=int, default=2)
    parser.add_argument("--decoder-dim", type=int, default=256, help="the VAE decoder's base width (released: 256)")
    args = parser.parse_args()
    results = {}
    for which in ("fast", "vae"):
        results[which] = run_child(CHILD.format(which=which, latent_frames=args.latent_frames, h=args.height // 16,
                                                w=args.width // 16, decoder_dim=args.decoder_dim), f"{which} decode")
        r = results[which]
        print(f"{which:>4}: {r['frames']} frames at {args.width}x{args.height} in {r['seconds']:.1f} s "
              f"({r['seconds'] / r['frames']:.2f} s a frame), peak {r['peak_mb']:.0f} MiB", flush=True)
    fast, vae = results["fast"], results["vae"]
    print(f"fast / VAE: {fast['seconds'] / vae['seconds']:.3f}x the time ({vae['seconds'] / fast['seconds']:.1f}x "
          f"faster), {fast['peak_mb'] / vae['peak_mb']:.2f}x the peak memory")


if __name__ == "__main__":
    main()
