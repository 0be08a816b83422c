"""The host overhead per causal chunk that the fixed-shape step (`cosmos3_runtime.chunk_step`) removes, measured on
this machine's CPU without a GPU.

A denoising forward's host work (Python, the dispatcher, and on a GPU a kernel launch per op or more) is what a CUDA
graph replay does not repeat. At the tiny checkpoints' widths on the CPU each op's arithmetic is a few microseconds,
so a forward's time is mostly that host work. One chunk with its history window full (framewise Sim-Transfer: the
sink, 6 recent frames and its control frame held; a tiny 48x32 frame, a 300-token prompt), at the tiny checkpoints'
depth (2 layers) and at Nano's (36 layers):

- before: the chunk's 4 denoising forwards run eagerly, and the aten ops one of them dispatches (each at least one
  kernel launch on a GPU);
- after: the same 4 steps through `ChunkStep` once captured: the copies into its static buffers, the rotary tables
  (once a chunk) and the velocity copied out; the replay itself is stubbed (a CUDA graph replay is one launch call
  for all of the forward's kernels; none was run here);
- the chunk's commits (eager in both): its control frame's and its frame's.

    python benchmarks/bench_chunk_step.py [--repeats 20]
"""

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosmos3_runtime.chunk_step import ChunkStep  # noqa: E402
from cosmos3_runtime.tiny import transformer_config  # noqa: E402
from cosmos3_runtime.transformer import Cosmos3Transformer, MediaKV, TransformerConfig  # noqa: E402

CPU = torch.device("cpu")
STEPS = 4


class Ops(TorchDispatchMode):
    """Counts the aten ops dispatched."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class Stub:
    """A replay that costs nothing: the capture's outputs returned (no graph runs without a GPU)."""

    def __init__(self, fn):
        self.out = fn()

    def __call__(self):
        return self.out


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(layers: int, repeats: int) -> dict:
    """Seconds of one chunk's 4 denoising forwards eager and through the step, and of its commits; aten ops of one
    forward."""
    config = TransformerConfig.from_dict({**transformer_config("gated"), "num_hidden_layers": layers})
    model = Cosmos3Transformer(config)
    held, tokens = 2 * 7 + 1, 2  # frames of history (control and RGB) and the chunk's control; patches a frame
    cache = MediaKV(config, (held + 2) * tokens, model.dtype, CPU)
    cache.frames = torch.arange(held).repeat_interleave(tokens)
    latents = torch.randn(1, config.latent_channel, 1, 2, 3)
    timestep = torch.tensor(937.5)
    with torch.inference_mode():
        text = model.encode_text(torch.zeros(300, dtype=torch.long), CPU)

        def forward(start: int, step=model, noisy=(0,)):
            return step(latents, timestep, text, list(noisy), 30.0, [],
                        hooks=replace(model.hooks, cache=cache, start_frame=start))

        def eager_chunk():
            for _ in range(STEPS):
                forward(held)

        step = ChunkStep(model, Stub)
        forward(held - 1, step)  # a first chunk at this shape runs eagerly
        forward(held, step)  # the second is captured
        starts = iter(range(held, 10**9))

        def stepped_chunk():
            start = next(starts)  # a new chunk each time: its rotary tables made once
            for _ in range(STEPS):
                forward(start, step)

        def commits():
            for _ in range(2):
                forward(held, noisy=())

        ops = Ops()
        with ops:
            forward(held)
        return {"eager": median_seconds(eager_chunk, repeats), "step": median_seconds(stepped_chunk, repeats),
                "commits": median_seconds(commits, repeats), "ops": ops.count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"Host overhead of a framewise chunk, tiny widths on the CPU, median of {args.repeats}, torch "
          f"{torch.__version__}, {torch.get_num_threads()} CPU threads\n")
    print("| layers | aten ops a denoising forward | 4 denoising forwards eager | through the fixed-shape step "
          "(replay stubbed) | ratio | 2 commits (eager in both) | whole chunk before / after |")
    print("|---|---|---|---|---|---|---|")
    for layers in (2, 36):
        m = measure(layers, args.repeats)
        before, after = m["eager"] + m["commits"], m["step"] + m["commits"]
        print(f"| {layers} | {m['ops']} | {m['eager'] * 1e3:.1f} ms | {m['step'] * 1e3:.2f} ms | "
              f"{m['eager'] / m['step']:.0f}x | {m['commits'] * 1e3:.1f} ms | {before * 1e3:.1f} / {after * 1e3:.1f} ms "
              f"({before / after:.1f}x) |")


if __name__ == "__main__":
    main()
