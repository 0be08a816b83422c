"""SeaCache against the cache off, at 35 steps, in one run: forwards skipped, wall time, and how far the result moves.

    python benchmarks/bench_cache.py                 # CPU, about 5 minutes: T2V, I2V, transfer, sound

Each case generates twice from the same seed, SeaCache on (NVIDIA's defaults: threshold 0.35, residual order 1)
and off, on the "small" random checkpoints (6 layers, width 512) at 256x256, 17 frames, fp32, latents only (a
transfer decodes its chunks). Figures: the layer-stack runs the cache skipped (of every guidance pass of every
step), the wall-time ratio on/off, and the relative mean difference of the result (latents; a transfer's frames)
from the uncached run. Random weights make the velocity field smoother than a trained model's, so the share
skipped here says little about real checkpoints; the ratio of time saved to forwards skipped does. Not a test.
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
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"SeaCache vs off: 'small' random checkpoints, {SIZE['width']}x{SIZE['height']}x{SIZE['num_frames']}, "
          f"{args.steps} steps, fp32 on {torch.get_num_threads()} CPU threads")  # fmt: skip
    print("| case | forwards skipped | time on / off | result vs off (relative mean difference) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (root, extra) in cases(Path(tmp)).items():
            pipe = cosmos3_runtime.load(root, device="cpu", dtype="fp32")
            options = dict(SIZE, steps=args.steps, seed=3, negative_prompt="blurry", **extra)
            pipe.generate("a red ball rolls past a blue box", **{**options, "steps": 2})  # warm-up, prompts cached
            runs = {}
            for cache in ("off", "seacache"):
                start = time.perf_counter()
                result = pipe.generate("a red ball rolls past a blue box", cache=cache, **options)
                runs[cache] = (time.perf_counter() - start, result)
            (t_off, off), (t_on, on) = runs["off"], runs["seacache"]
            ran, skipped = (int(w) for w in on.cache.split(": ")[1].replace(" forwards run,", "").split()[:2])
            a, b = (on.latents, off.latents) if off.latents is not None else (on.frames, off.frames)
            moved = ((a - b).abs().mean() / b.abs().mean()).item()
            print(f"| {name} | {skipped} of {ran + skipped} | {t_on / t_off:.2f}x ({t_on:.1f} / {t_off:.1f} s) "
                  f"| {moved:.4f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
