"""VAE decode: time and peak memory of tiled vs untiled, ours vs diffusers, measured in one run.

Each decode runs in a fresh process on the same seeded latents; peak resident memory is counted from
just before the decode (Linux /proc). The VAE has the Wan 2.2 structure with reduced channel counts
(so a CPU can decode 720p); the relative numbers are what matters. Not a test.

    python benchmarks/bench_vae.py [--width 1280 --height 720 --frames 5] [--base-dim 32 --decoder-dim 48]
"""

import argparse
import sys
import tempfile
from pathlib import Path

from measure import ROOT, run_child

CHILD = r"""
import json, time, torch
torch.set_grad_enabled(False)

z = torch.randn(1, 48, {latent_frames}, {h}, {w}, generator=torch.Generator().manual_seed(0))
if {which!r} == "ours":
    from pathlib import Path
    from cosmos3_runtime.pipeline import load_vae
    from cosmos3_runtime.vae import TileSpec
    vae = load_vae(Path({ckpt!r}) / "vae", torch.device("cpu"), torch.float32)
    tile = TileSpec({tile}, {overlap}) if {tiled} else None
    decode = lambda: vae.decode(z, tile=tile)
else:
    from diffusers import AutoencoderKLWan
    vae = AutoencoderKLWan.from_pretrained({ckpt!r} + "/vae", torch_dtype=torch.float32).eval()
    if {tiled}:
        vae.enable_tiling({tile} * 16, {tile} * 16, ({tile} - {overlap}) * 16, ({tile} - {overlap}) * 16)
    decode = lambda: vae.decode(z).sample
memory = PeakMemory()
start = time.perf_counter()
out = decode()
seconds = time.perf_counter() - start
peak = memory.mb()
torch.save(out, {out_path!r})
print(json.dumps(dict(seconds=seconds, peak_mb=peak)))
"""


def run(which: str, tiled: bool, checkpoint: Path, args, out_path: Path) -> dict:
    code = CHILD.format(which=which, tiled=tiled, ckpt=str(checkpoint), out_path=str(out_path),
                        latent_frames=1 + (args.frames - 1) // 4, h=args.height // 16, w=args.width // 16,
                        tile=args.tile, overlap=args.overlap)
    return run_child(code, f"{which} decode")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--base-dim", type=int, default=32, help="encoder width (release: 160)")
    parser.add_argument("--decoder-dim", type=int, default=48, help="decoder width (release: 256)")
    parser.add_argument("--tile", type=int, default=24, help="tile size in latents (x16 pixels)")
    parser.add_argument("--overlap", type=int, default=8, help="tile overlap in latents")
    args = parser.parse_args()

    import torch

    sys.path.insert(0, str(ROOT))
    from cosmos3_runtime.tiny import vae_config, write_vae

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp)
        write_vae(checkpoint / "vae", vae_config(0, args.base_dim, args.decoder_dim), seed=0, dtype=torch.float32)
        print(f"decoding {args.width}x{args.height}x{args.frames} with a Wan 2.2-structured VAE "
              f"(decoder width {args.decoder_dim}), fp32 on CPU; tiles {args.tile * 16}px, overlap {args.overlap * 16}px")
        results, outputs = {}, {}
        for which in ("ours", "diffusers"):
            for tiled in (False, True):
                name = f"{which} {'tiled' if tiled else 'untiled'}"
                path = checkpoint / f"{which}-{tiled}.pt"
                results[name] = run(which, tiled, checkpoint, args, path)
                outputs[name] = torch.load(path)
    print(f"{'':20}{'seconds':>10}{'peak RSS MiB':>14}{'max |diff| vs ours untiled':>30}")
    for name, r in results.items():
        diff = (outputs[name] - outputs["ours untiled"]).abs().max().item()
        print(f"{name:20}{r['seconds']:10.2f}{r['peak_mb']:14.0f}{diff:30.2e}")

    def ratio(a, b, key):
        return results[a][key] / results[b][key]

    print(f"ours tiled / ours untiled: time {ratio('ours tiled', 'ours untiled', 'seconds'):.2f}x, "
          f"peak memory {ratio('ours tiled', 'ours untiled', 'peak_mb'):.2f}x")
    print(f"ours / diffusers untiled: time {ratio('ours untiled', 'diffusers untiled', 'seconds'):.2f}x, "
          f"peak memory {ratio('ours untiled', 'diffusers untiled', 'peak_mb'):.2f}x")
    print(f"ours / diffusers tiled: time {ratio('ours tiled', 'diffusers tiled', 'seconds'):.2f}x, "
          f"peak memory {ratio('ours tiled', 'diffusers tiled', 'peak_mb'):.2f}x")


if __name__ == "__main__":
    main()
