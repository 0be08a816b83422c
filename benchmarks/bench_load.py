"""Load time and peak memory of our loader next to diffusers' `from_pretrained`, in one run.

Each load runs in a fresh Python process, and peak resident memory is counted from just before the
load (Linux /proc), so the numbers are comparable; the script prints both and their ratio. Not a test: numbers depend
on the machine.

    python benchmarks/bench_load.py [--size small] [--dtype bf16] [--repeats 3]
"""

import argparse
import sys
import tempfile
from pathlib import Path

from measure import ROOT, run_child

CHILD = r"""
import json, time, torch
dtype = getattr(torch, {dtype!r})

if {which!r} == "ours":
    from cosmos3_runtime.pipeline import Checkpoint, load_transformer
    load = lambda: load_transformer(Checkpoint({ckpt!r}), torch.device("cpu"), dtype)
else:
    from diffusers import Cosmos3OmniTransformer
    load = lambda: Cosmos3OmniTransformer.from_pretrained({ckpt!r} + "/transformer", torch_dtype=dtype)
memory = PeakMemory()  # counted from here, after the imports
start = time.perf_counter()
model = load()
seconds = time.perf_counter() - start
load_peak = memory.mb()
params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
for p in model.parameters():  # read every weight, as the first forward pass will
    p.sum()
touched_peak = memory.mb()
print(json.dumps(dict(seconds=seconds, peak_mb=load_peak, touched_mb=touched_peak, params_mb=params_mb)))
"""


def measure(which: str, checkpoint: Path, dtype: str) -> dict:
    return run_child(CHILD.format(dtype=dtype, which=which, ckpt=str(checkpoint)), f"{which} load")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", help="tiny checkpoint size (see cosmos3_runtime.tiny.SIZES)")
    parser.add_argument("--kind", default="gated", choices=["gated", "edge"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from cosmos3_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(tmp, kind=args.kind, size=args.size, shards=4)
        size_mb = sum(f.stat().st_size for f in (checkpoint / "transformer").glob("*.safetensors")) / 2**20
        print(f"checkpoint: {args.size} {args.kind}, {size_mb:.0f} MiB of bf16 safetensors; loading as {args.dtype}")
        results = {}
        for which in ("ours", "diffusers"):
            runs = [measure(which, checkpoint, args.dtype) for _ in range(args.repeats)]
            results[which] = {
                "seconds": min(r["seconds"] for r in runs),
                "peak_mb": min(r["peak_mb"] for r in runs),
                "touched_mb": min(r["touched_mb"] for r in runs),
                "params_mb": runs[0]["params_mb"],
            }
    ours, ref = results["ours"], results["diffusers"]
    print("peak RSS is counted from just before the load; 'after use' once every weight has been read")
    print(f"{'':10}{'load s':>10}{'peak RSS MiB':>14}{'after use MiB':>15}{'weights MiB':>13}")
    for name, r in results.items():
        print(f"{name:10}{r['seconds']:10.3f}{r['peak_mb']:14.0f}{r['touched_mb']:15.0f}{r['params_mb']:13.0f}")
    print(f"ratio ours/diffusers: load time {ours['seconds'] / ref['seconds']:.2f}x, "
          f"peak RSS during load {ours['peak_mb'] / ref['peak_mb']:.2f}x, "
          f"peak RSS after use {ours['touched_mb'] / ref['touched_mb']:.2f}x, "
          f"weights kept {ours['params_mb'] / ref['params_mb']:.2f}x")


if __name__ == "__main__":
    main()
