"""SeaCache against the cache off, at 35 steps, in one run: forwards skipped, wall time, and how far the result moves;
then compile (Request.compile: the media block through torch.compile's inductor) against eager.

    python benchmarks/bench_cache.py                 # CPU, about 7 minutes: T2V, I2V, transfer, sound; compile
    python benchmarks/bench_cache.py --only compile  # the compile table alone

Each case generates three times from the same seed: SeaCache off, at NVIDIA's settings before cosmos-framework PR
#225 (threshold 0.35, no cap on reuses in a row) and at the default now (0.25, at most 2 in a row), on the "small"
random checkpoints (6 layers, width 512) at 256x256, 17 frames, fp32, latents only (a transfer decodes its chunks).
Figures: the layer-stack runs the cache skipped (of every guidance pass of every step), the wall-time ratio to the
cache off, and the relative mean difference of the result (latents; a transfer's frames) from the uncached run. Random weights make the velocity field smoother than a trained model's, so the share
skipped here says little about real checkpoints; the ratio of time saved to forwards skipped does. The compile
table times T2V with the cache off: eager, the first compiled run (the compile included) and the next one, at the
same size. Not a test.
"""

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime.tiny import make_tiny_checkpoint  # noqa: E402

SIZE = dict(width=256, height=256, num_frames=17)
SETTINGS = {"before PR #225 (0.35, no cap)": dict(cache_threshold=0.35, cache_max_consecutive=0),
            "now (0.25, at most 2 in a row)": {}}


def cases(folder: Path) -> dict:
    gated = make_tiny_checkpoint(folder / "gated", kind="gated", size="small")
    sound = make_tiny_checkpoint(folder / "sound", kind="gated", size="small", sound=True)
    image = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    controls = {"edge": torch.rand(17, 256, 256, 3, generator=torch.Generator().manual_seed(1))}
    return {
        "T2V": (gated, dict(output="latents")),
        "I2V": (gated, dict(image=image, output="latents")),
        "transfer (edge: 3 passes a step)": (gated, dict(control_videos=controls)),
        "T2V with sound": (sound, dict(sound=True, output="latents")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--only", choices=("cache", "compile"), help="one of the two tables")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "compile":
            cache_table(Path(tmp), args.steps)
        if args.only != "cache":
            compile_table(Path(tmp), args.steps)


def compile_table(folder: Path, steps: int) -> None:
    root = make_tiny_checkpoint(folder / "compile", kind="gated", size="small")
    pipe = cosmos3_runtime.load(root, device="cpu", dtype="fp32")
    options = dict(SIZE, steps=steps, seed=3, negative_prompt="blurry", cache="off", output="latents")
    print(f"\ncompile vs eager: T2V, the same checkpoint and size, {steps} steps, cache off")
    print("| run | time | vs eager | result vs eager (relative mean difference) |")
    print("|---|---|---|---|")
    pipe.generate("a red ball rolls past a blue box", **{**options, "steps": 2})  # warm-up, prompts cached
    runs = {}
    for name, compiled in (("eager", False), ("compiled, first run (compiles)", True), ("compiled, next run", True)):
        start = time.perf_counter()
        result = pipe.generate("a red ball rolls past a blue box", compile=compiled, **options)
        runs[name] = (time.perf_counter() - start, result.latents)
    t_eager, eager = runs["eager"]
    for name, (seconds, latents) in runs.items():
        moved = ((latents - eager).abs().mean() / eager.abs().mean()).item()
        print(f"| {name} | {seconds:.1f} s | {seconds / t_eager:.2f}x | {moved:.2e} |", flush=True)


def cache_table(folder: Path, steps: int) -> None:
    print(f"SeaCache vs off: 'small' random checkpoints, {SIZE['width']}x{SIZE['height']}x{SIZE['num_frames']}, "
          f"{steps} steps, fp32 on {torch.get_num_threads()} CPU threads")
    print("| case | SeaCache | forwards skipped | time on / off | result vs off (relative mean difference) |")
    print("|---|---|---|---|---|")
    for name, (root, extra) in cases(folder).items():
        pipe = cosmos3_runtime.load(root, device="cpu", dtype="fp32")
        options = dict(SIZE, steps=steps, seed=3, negative_prompt="blurry", **extra)
        pipe.generate("a red ball rolls past a blue box", **{**options, "steps": 2})  # warm-up, prompts cached
        start = time.perf_counter()
        off = pipe.generate("a red ball rolls past a blue box", cache="off", **options)
        t_off = time.perf_counter() - start
        for setting, cache_options in SETTINGS.items():
            start = time.perf_counter()
            on = pipe.generate("a red ball rolls past a blue box", **cache_options, **options)
            t_on = time.perf_counter() - start
            ran, skipped = (int(w) for w in on.cache.split(": ")[1].replace(" forwards run,", "").split()[:2])
            a, b = (on.latents, off.latents) if off.latents is not None else (on.frames, off.frames)
            moved = ((a - b).abs().mean() / b.abs().mean()).item()
            print(f"| {name} | {setting} | {skipped} of {ran + skipped} | {t_on / t_off:.2f}x ({t_on:.1f} / "
                  f"{t_off:.1f} s) | {moved:.4f} |", flush=True)


if __name__ == "__main__":
    main()
