"""Transfer speed and memory: ours next to diffusers' modular transfer (Cosmos3OmniBlocks), in one run.

Same "small" random checkpoint, caption, control clip, seed and settings (text guidance 3 and control guidance
1.5: three forwards per step) on both sides, each in a fresh process. Time per chunk is the median over the
chunks (from the step callbacks: the chunk's steps, plus its encode and decode); peak memory is resident memory
counted from just before generation (Linux /proc). Not a test: numbers depend on the machine.

    python benchmarks/bench_transfer.py [--width 256 --height 256 --frames 17 --chunk 9 --steps 4 --hints edge,depth]
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from measure import ROOT, run_child

CHILD = r"""
import json, statistics, time, numpy as np, torch
torch.set_num_threads({threads})

args = json.loads({args!r})
rng = np.random.default_rng(0)
clips = {{h: rng.integers(0, 256, (args["frames"], args["height"], args["width"], 3), dtype=np.uint8)
          for h in args["hints"]}}
caption = json.dumps({{"temporal_caption": " ".join(["a robot arm lifts a red cube"] * 40)}})
stamps = []
if {which!r} == "ours":
    import cosmos3_runtime
    pipe = cosmos3_runtime.load({ckpt!r}, device="cpu", dtype=torch.float32)
    def run():
        return pipe.generate(caption, negative_prompt="", control_videos=clips, width=args["width"],
                             height=args["height"], chunk_frames=args["chunk"], steps=args["steps"], guidance_scale=3.0,
                             control_guidance=1.5, fps=24.0, flow_shift=10.0, schedule="unipc", seed=0,
                             callback=lambda *a: stamps.append(time.perf_counter())).frames.numpy()
else:
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import diffusers_reference as ref
    pipe = ref.transfer_pipeline(Path({ckpt!r}))
    unipc_step = type(pipe.scheduler).step
    def step(self, *a, **k):  # the end of each denoising step (diffusers' modular loop has no step callback)
        out = unipc_step(self, *a, **k)
        stamps.append(time.perf_counter())
        return out
    type(pipe.scheduler).step = step
    def run():
        controls = {{h: torch.from_numpy(c).permute(0, 3, 1, 2).float() / 255 for h, c in clips.items()}}
        return pipe(prompt=caption, negative_prompt="", control_videos=controls, height=args["height"],
                    width=args["width"], num_video_frames_per_chunk=args["chunk"], num_conditional_frames=1, fps=24.0,
                    num_inference_steps=args["steps"], guidance_scale=3.0, control_guidance=1.5,
                    generator=torch.Generator("cpu").manual_seed(0), output_type="np", output="videos")
memory = PeakMemory()
start = time.perf_counter()
frames = run()
total = time.perf_counter() - start
per_chunk = args["steps"]
ends = [start] + stamps[per_chunk - 1 :: per_chunk]
chunks = [b - a for a, b in zip(ends, ends[1:])]
np.save({out!r}, frames)
print(json.dumps(dict(chunk_s=statistics.median(chunks), chunks=len(chunks), total_s=total, peak_mb=memory.mb())))
"""


def run(which: str, checkpoint: Path, args, out: Path) -> dict:
    payload = json.dumps({"width": args.width, "height": args.height, "frames": args.frames, "chunk": args.chunk,
                          "steps": args.steps, "hints": args.hints.split(",")})
    code = CHILD.format(threads=args.threads, args=payload, which=which, ckpt=str(checkpoint), out=str(out),
                        tests=str(ROOT / "tests"))
    return run_child(code, which)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--chunk", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hints", default="edge", help="comma-separated control hints")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np

    sys.path.insert(0, str(ROOT))
    from cosmos3_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "ckpt", kind="gated", size="small")
        results = {name: run(name, checkpoint, args, Path(tmp) / f"{name}.npy") for name in ("ours", "diffusers")}
        frames = {name: np.load(Path(tmp) / f"{name}.npy") for name in results}
    ours, ref = results["ours"], results["diffusers"]
    print(f"small gated checkpoint (hidden 512, 6 layers), {args.width}x{args.height}, {args.frames} frames in "
          f"{ours['chunks']} chunks of {args.chunk}, controls {args.hints}, {args.steps} steps, guidance 3 and "
          f"control guidance 1.5 (3 forwards per step), fp32 CPU, {args.threads} threads")
    print(f"{'':10}{'s/chunk':>10}{'total s':>10}{'peak RSS MiB':>14}")
    for name, r in results.items():
        print(f"{name:10}{r['chunk_s']:10.2f}{r['total_s']:10.2f}{r['peak_mb']:14.0f}")
    print(f"stitched frames max |ours - diffusers| = {np.abs(frames['ours'] - frames['diffusers']).max():.2e}")
    print(f"ratio ours/diffusers: time per chunk {ours['chunk_s'] / ref['chunk_s']:.2f}x, total "
          f"{ours['total_s'] / ref['total_s']:.2f}x, peak memory {ours['peak_mb'] / ref['peak_mb']:.2f}x")


if __name__ == "__main__":
    main()
