"""Generation speed and memory: our pipeline next to diffusers' Cosmos3OmniPipeline, in one run.

Same "small" random checkpoint, prompt, seed and settings on both sides; each pipeline runs in a
fresh process. Per-step time is the median of the steps after the first (timed from the step
callbacks); peak memory is resident memory counted from just before generation (Linux /proc). Also
printed: what one pass of the text tower costs, which diffusers pays in every forward and we pay
once per prompt. Not a test: numbers depend on the machine.

    python benchmarks/bench_generate.py [--width 256 --height 256 --frames 1 --steps 8 --prompt-words 300]
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from measure import ROOT, run_child

CHILD = r"""
import json, statistics, time, torch
torch.set_num_threads({threads})

args = json.loads({args!r})
stamps = []
if {which!r} == "ours":
    import cosmos3_runtime
    pipe = cosmos3_runtime.load({ckpt!r}, device="cpu", dtype=torch.float32)
    def run():
        return pipe.generate(args["prompt"], negative_prompt="", width=args["width"], height=args["height"],
                             num_frames=args["frames"], steps=args["steps"], guidance_scale=4.0, seed=0,
                             schedule="checkpoint", guidance_interval=None, json_captions=False, output="latents",
                             callback=lambda *a: stamps.append(time.perf_counter())).latents
else:
    from diffusers import Cosmos3OmniPipeline
    pipe = Cosmos3OmniPipeline.from_pretrained({ckpt!r}, torch_dtype=torch.float32, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    def on_step(p, i, t, kw):
        stamps.append(time.perf_counter())
        return {{}}
    def run():
        return pipe(args["prompt"], negative_prompt="", width=args["width"], height=args["height"],
                    num_frames=args["frames"], num_inference_steps=args["steps"], guidance_scale=4.0,
                    generator=torch.Generator("cpu").manual_seed(0), output_type="latent",
                    callback_on_step_end=on_step).video
memory = PeakMemory()
start = time.perf_counter()
latents = run()
total = time.perf_counter() - start
steps = [b - a for a, b in zip(stamps, stamps[1:])]
result = dict(step_s=statistics.median(steps), total_s=total, peak_mb=memory.mb())
if {which!r} == "ours":
    from cosmos3_runtime.request import Request
    _, ids, _ = pipe.planner.prepare(args["prompt"], Request(width=args["width"], height=args["height"],
                                                     num_frames=args["frames"]))
    t0 = time.perf_counter()
    for _ in range(3):
        pipe.transformer.encode_text(torch.tensor(ids))
    result["text_tower_s"] = (time.perf_counter() - t0) / 3
    result["text_tokens"] = len(ids)
torch.save(latents, {out!r})
print(json.dumps(result))
"""


def run(which: str, checkpoint: Path, args, out: Path) -> dict:
    payload = json.dumps({"prompt": args.prompt, "width": args.width, "height": args.height, "frames": args.frames,
                          "steps": args.steps})
    code = CHILD.format(threads=args.threads, args=payload, which=which, ckpt=str(checkpoint), out=str(out))
    return run_child(code, which)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--frames", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=300, help="prompt length (JSON captions run 1-3k tokens)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    words = "a robot arm slowly lifts a red cube above a wooden table while the camera pans left".split()
    args.prompt = " ".join(words[i % len(words)] for i in range(args.prompt_words))

    import torch

    sys.path.insert(0, str(ROOT))
    from cosmos3_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "ckpt", kind="gated", size="small")
        results = {name: run(name, checkpoint, args, Path(tmp) / f"{name}.pt") for name in ("ours", "diffusers")}
        latents = {name: torch.load(Path(tmp) / f"{name}.pt") for name in results}
    ours, ref = results["ours"], results["diffusers"]
    print(f"small gated checkpoint (hidden 512, 6 layers), {args.width}x{args.height}x{args.frames}, {args.steps} "
          f"steps, CFG 4 (2 forwards per step), {ours['text_tokens']}-token prompt, fp32 CPU, {args.threads} threads")
    print(f"{'':10}{'s/step':>10}{'total s':>10}{'peak RSS MiB':>14}")
    for name, r in results.items():
        print(f"{name:10}{r['step_s']:10.3f}{r['total_s']:10.2f}{r['peak_mb']:14.0f}")
    diff = (latents["ours"] - latents["diffusers"].float()).abs().max().item()
    print(f"final latents max |ours - diffusers| = {diff:.2e}")
    print(f"ratio ours/diffusers: time per step {ours['step_s'] / ref['step_s']:.2f}x, "
          f"total {ours['total_s'] / ref['total_s']:.2f}x, peak memory {ours['peak_mb'] / ref['peak_mb']:.2f}x")
    print(f"one text-tower pass ({ours['text_tokens']} tokens): {ours['text_tower_s'] * 1000:.1f} ms; diffusers "
          f"runs it in each of the {2 * args.steps} forwards, we run it once per prompt")


if __name__ == "__main__":
    main()
