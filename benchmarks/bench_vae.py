"""VAE decode: time and peak memory of tiled vs untiled, ours vs diffusers, measured in one run; and, with
`--count`, the FLOPs and bytes moved of one decode at the released shapes, ours vs diffusers, counted.

Each decode runs in a fresh process on the same seeded latents; peak resident memory is counted from
just before the decode (Linux /proc). The VAE has the Wan 2.2 structure with reduced channel counts
(so a CPU can decode 720p); the relative numbers are what matters. Not a test.

`--count` decodes nothing: both VAEs run on the meta device (shapes only) at the released widths in bf16 while every
aten op is counted: FLOPs by `torch.utils.flop_counter`, bytes as what each op reads and writes as called (the
distinct elements of its tensor arguments and results; views and allocations move nothing, a copy's or fill's
destination is only written). That is the traffic of the ops as written, one pass each (a fused kernel moves less, a
convolution's reuse of its input is not counted), so bytes / bandwidth is the floor for running them one by one.

    python benchmarks/bench_vae.py [--width 1280 --height 720 --frames 5] [--base-dim 32 --decoder-dim 48] [--untiled]
    python benchmarks/bench_vae.py --count [--width 832 --height 480 --frames 81] [--gpu B200]
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from bench_roofline import GPUS
from measure import ROOT, BytesMoved, run_child

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
    parser.add_argument("--width", type=int, default=None, help="default 1280 (--count: 832)")
    parser.add_argument("--height", type=int, default=None, help="default 720 (--count: 480)")
    parser.add_argument("--frames", type=int, default=None, help="default 5 (--count: 81)")
    parser.add_argument("--base-dim", type=int, default=32, help="encoder width (release: 160)")
    parser.add_argument("--decoder-dim", type=int, default=48, help="decoder width (release: 256)")
    parser.add_argument("--tile", type=int, default=24, help="tile size in latents (x16 pixels)")
    parser.add_argument("--overlap", type=int, default=8, help="tile overlap in latents")
    parser.add_argument("--untiled", action="store_true", help="time untiled decodes only")
    parser.add_argument("--count", action="store_true", help="count FLOPs and bytes at the released widths instead")
    parser.add_argument("--gpu", choices=GPUS, default="H200", help="--count: the floors on this GPU's data sheet")
    args = parser.parse_args()
    size = (832, 480, 81) if args.count else (1280, 720, 5)
    args.width, args.height, args.frames = (given or default for given, default in
                                            zip((args.width, args.height, args.frames), size))

    sys.path.insert(0, str(ROOT))
    from cosmos3_runtime.tiny import vae_config, write_vae

    if args.count:
        count(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp)
        write_vae(checkpoint / "vae", vae_config(0, args.base_dim, args.decoder_dim), seed=0, dtype=torch.float32)
        print(f"decoding {args.width}x{args.height}x{args.frames} with a Wan 2.2-structured VAE "
              f"(decoder width {args.decoder_dim}), fp32 on CPU; tiles {args.tile * 16}px, overlap {args.overlap * 16}px")
        results, outputs = {}, {}
        for which in ("ours", "diffusers"):
            for tiled in (False,) if args.untiled else (False, True):
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

    pairs = [("ours untiled", "diffusers untiled")]
    if not args.untiled:
        pairs = [("ours tiled", "ours untiled"), *pairs, ("ours tiled", "diffusers tiled")]
    for a, b in pairs:
        print(f"{a} / {b}: time {ratio(a, b, 'seconds'):.2f}x, peak memory {ratio(a, b, 'peak_mb'):.2f}x")


def count(args) -> None:
    """FLOPs and bytes moved of one bf16 decode at the released widths, ours and diffusers', on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    from cosmos3_runtime.tiny import vae_config
    from cosmos3_runtime.vae import VAEConfig, WanVAE

    config = vae_config(base_dim=160, decoder_base_dim=256)
    latents = torch.empty(1, 48, 1 + (args.frames - 1) // 4, args.height // 16, args.width // 16, device="meta")
    with torch.device("meta"):
        vaes = {"ours": WanVAE(VAEConfig.from_dict(config)).to(torch.bfloat16)}
        try:
            from diffusers import AutoencoderKLWan
            from diffusers.utils import logging

            logging.set_verbosity_error()  # its advice on casting with .to() does not apply to shapes
            vaes["diffusers"] = AutoencoderKLWan(**{k: v for k, v in config.items() if not k.startswith("_")}).to(
                torch.bfloat16)
        except ImportError:
            print("(diffusers is not installed: ours only)")
    decode = {"ours": lambda: vaes["ours"].decode(latents),
              "diffusers": lambda: vaes["diffusers"].decode(latents.to(torch.bfloat16)).sample}
    gpu = GPUS[args.gpu]
    print(f"one decode of {args.width}x{args.height}x{args.frames} ({latents.shape[2]} latent frames), released widths, "
          f"bf16, counted on the meta device; floors from the {args.gpu}'s data sheet ({gpu['bandwidth'] / 1e12:g} TB/s, "
          f"{gpu['bf16'] / 1e12:g} dense bf16 TFLOP/s)")
    totals = {}
    for name in vaes:
        # the bytes mode, entered last, sees the ops as called (the flop counter under it decomposes some)
        with torch.inference_mode(), FlopCounterMode(display=False) as flops, BytesMoved() as moved:
            decode[name]()
        convolutions = sum(b for op, (_, b) in moved.by_op.items() if op.startswith("conv"))
        total = sum(b for _, b in moved.by_op.values())
        totals[name] = total
        flop = flops.get_total_flops()
        compute_s, rest_s = flop / gpu["bf16"], (total - convolutions) / gpu["bandwidth"]
        print(f"\n{name}: {flop / 1e12:.0f} TFLOP, {total / 1e9:.0f} GB moved ({convolutions / 1e9:.0f} GB by "
              f"convolutions, {(total - convolutions) / 1e9:.0f} GB by the rest)")
        print(f"  floors: compute {compute_s:.3f} s, bandwidth {total / gpu['bandwidth']:.3f} s, op by op "
              f"(convolutions at the compute floor, the rest at the bandwidth floor) {compute_s + rest_s:.3f} s")
        for op, (calls, b) in sorted(moved.by_op.items(), key=lambda item: -item[1][1])[:8]:
            print(f"  {op:32}{calls:7} calls{b / 1e9:10.1f} GB")
    if len(totals) == 2:
        print(f"\nours / diffusers: bytes moved {totals['ours'] / totals['diffusers']:.2f}x")


if __name__ == "__main__":
    main()
